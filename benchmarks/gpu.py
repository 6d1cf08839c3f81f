"""The GPU check: `python -m benchmarks gpu [--out=DIR --budget_s=510
--parts=a,b --dry_run]`.

Runs, each part in a process of its own with a time cap (a failure, a crash or a hang
is recorded and the rest goes on), in this order, until `--budget_s` is spent (a part
that cannot start with enough time left is skipped and says so). The caps fit a fresh
machine (H200, 2026-11-27/28: smoke 29 s; a base-sized `benchmark train` process 60-130
s; BERT-large's start-up alone took 208 s before its initialisation drew with the
threefry kernel). Issue 46's targets come first, nothing measured before is repeated
there; one call of 510 s runs the first five, a second (`--parts=levers,tests`) the
levers and the GPU tests:

  smoke            versions and devices; a bf16 matmul; one call of each attention path;
                   the initialisation with the threefry kernel against the unrolled
                   rounds (the same parameters for a seed)
  bert_large_512   BERT-large at 512, batch 32, bf16, attention dropout off, from a
                   fresh process with no compilation cache: the first step's time after
                   the process started (target 30 s) and MFU (target 45%)
  bert_base_128    BERT-base at 128, batch 256, bf16, attention dropout off (cuDNN): MFU
                   (target 50%), the step pipelined as the trainer runs it, start-up;
                   two more steps profiled (`benchmark train --profile_dir`): device
                   time by category, the largest ops, the trace kept
  modernbert_1024  ModernBERT-base (the recipe), 1,024 tokens, 4 documents a row
                   (target 40% MFU)
  bert_base_128_dropout_hf
                   the recipe as is, attention dropout 0.1 (the XLA path), against
                   Hugging Face with its dropout (target 1.3x)
  levers           `benchmarks levers` at bert_base_128's sizes (one process, one compile
                   a variant): the former programs (activations' residuals kept,
                   positions gathered), the PRNG implementation, the threefry kernel in
                   the step, XLA flags (no CUDA graphs, no Triton GEMM, cuDNN
                   LayerNorm): each variant's step with and without a host sync between
                   steps, the bytes its kernels move
  tests            the suite under `BERTJAX_TEST_PLATFORM=gpu`, 8 pytest-xdist workers
                   sharing the GPU (the machine's 16 cores; most tests are the CPU's
                   work): `--tests` first (what has not passed on a GPU yet), then
                   every other test file in order, until through or the cap; each
                   test's outcome recorded
  bert_large_512_scanned
                   bert_large_512 with scanned layers (one layer's program compiled)
  bert_base_128_hf, bert_large_512_hf, modernbert_1024_hf
                   against Hugging Face (`benchmark train --compare=hf`, interleaved
                   steps on the one GPU)
  kernels          `benchmark kernels --mode=errors`: cuDNN and the Pallas kernel
                   against XLA, bf16 and fp32, forward and gradients, padded and packed
                   rows, windows: errors and times
  memory           `benchmark kernels --mode=memory`: packed rows at 512 and 8,192
                   tokens, the Pallas kernel against XLA's mask
  bert_base_128_packed, bert_large_512_packed
                   4 documents a row (the Pallas kernel)
  max_batch        BERT-large at 512: the largest batch each framework fits (--max_batch)

Writes DIR/gpu.json (every part: status, seconds, command, results), DIR/gpu.txt (the
table), DIR/tests.log (pytest's output) and DIR/profile.xplane.pb (bert_base_128's
trace, when under 12 MiB), and prints every part's output, then the table last. `--dry_run` runs
the same parts at tiny sizes (tiny configs, a few tokens: on a CPU in minutes;
tests/test_benchmark_gpu.py runs it); `--parts` runs some of them. The compilation
cache (`--cache_dir`, under the repository root, which the device machine keeps
between calls) serves every part but the fresh-start ones.

On the device machine (no package index; its image lacks grain, ml_collections,
array_record: launch/gpu_wheels.py builds them as wheels into .wheels/), from the
repository root, with `.wheels` carried:

  bash launch/gpu_check.sh                        # the first call
  bash launch/gpu_check.sh --parts=levers,tests   # the second
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl import flags

from benchmarks import gpu_report

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The tests part's first files: what has not passed on a GPU (the H200 sessions of
# 2026-11-27 stopped inside test_modernbert_numerics; test_electra_numerics' released
# networks failed there, since fixed; test_model's one-hot embeddings and
# test_init_values' threefry kernel are newer), then the files that passed there; every
# other test file follows (`test_files`).
GPU_TESTS = ("tests/test_init_values.py", "tests/test_modernbert_numerics.py",
             "tests/test_electra_numerics.py", "tests/test_model.py",
             "tests/test_hf_numerics.py", "tests/test_family_conformance.py",
             "tests/test_attention.py", "tests/test_bf16_numerics.py",
             "tests/test_attention_paths.py", "tests/test_modernbert_gradients.py")
PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
            "flax", "optax", "orbax-checkpoint", "chex", "numpy", "torch", "transformers",
            "triton", "grain", "ml_collections", "array_record", "tensorboardX")


def define_flags() -> None:
  flags.DEFINE_string("out", "/tmp/bertjax_gpu", "Output folder (the device tool "
                      "returns what is written under $OUT).")
  flags.DEFINE_float("budget_s", 510.0, "Seconds for all the parts together.")
  flags.DEFINE_list("parts", [], "Run these parts only (default: all).")
  flags.DEFINE_list("tests", list(GPU_TESTS), "The tests part's first pytest targets "
                    "(every other test file follows; in a dry run, these alone).")
  flags.DEFINE_bool("dry_run", False, "Every part at tiny sizes (any platform).")
  flags.DEFINE_string("cache_dir", ".jax_cache", "JAX's compilation cache for the parts "
                      "(relative: to the repository root; a rerun on a warm machine "
                      "compiles less). '' for none.")
  flags.DEFINE_enum("part", "", ["", "smoke"], "Internal: run one in-process part.")
  flags.DEFINE_string("json", "", "Internal: the --part's results file.")


@dataclasses.dataclass
class Part:
  """One step of the check: `argv` (after the interpreter; '{json}' and '{dir}' are
  this part's results file and scratch folder), at most `cap_s` seconds; not started
  with less than `need_s` of the budget left (it would only time out), or when `skip`
  says why not; `fresh`: without the compilation cache (a fresh machine's start)."""

  name: str
  kind: str  # smoke, kernels, memory, train, tests, levers
  argv: list[str]
  cap_s: float
  need_s: float = 30.0
  skip: str = ""
  fresh: bool = False


def test_files(first: list[str]) -> list[str]:
  """`first`, then every other tests/test_*.py in name order (pytest runs files in the
  order given; a folder would re-collect them in its own)."""
  rest = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "tests",
                                                                          "test_*.py")))
  return list(first) + [p for p in rest if p not in first]


def _bench(name: str, *args: str) -> list[str]:
  """A benchmark's argv: this folder's own (`python -m benchmarks gpu`, `levers`), else
  the package's tool (`python -m bertjax.benchmark train`, `kernels`)."""
  ours = os.path.isfile(os.path.join(REPO, "benchmarks", f"{name}.py"))
  return ["-m", "benchmarks" if ours else "bertjax.benchmark", name, *args, "--json={json}"]


def plan(dry: bool, tests: list[str]) -> list[Part]:
  """The parts in order; `dry`: the same flags at tiny sizes (and only `tests`)."""
  def sized(real: str, tiny: str) -> list[str]:
    return (tiny if dry else real).split()

  def train(config: str, tiny: str, seq: int, batch: int, *extra: str) -> list[str]:
    return _bench("train", *sized(f"--config=configs/{config}.py --seq={seq} "
                                  f"--batch={batch}",
                                  f"--config=configs/{tiny}.py --seq=32 --batch=2 "
                                  "--steps=2 --warmup=0"),
                  dtype, *extra)

  dtype = "--dtype=" + ("fp32" if dry else "bf16")  # bf16 matmuls crawl on a CPU.
  no_dropout = "--config.model.attention_dropout_rate=0.0"
  heads = "--heads=2 --head_dim=16 --window=8 --docs=3 --repeats=1"
  large = lambda *extra: train("bert_large", "bert_tiny", 512, 32, no_dropout, *extra)  # noqa: E731
  return [
      Part("smoke", "smoke",
           _bench("gpu", "--part=smoke", *(["--dry_run"] if dry else [])), 60, 20),
      Part("bert_large_512", "train", large(), 200, 120, fresh=True),
      Part("bert_base_128", "train",
           train("bert_base", "bert_tiny", 128, 256, no_dropout,
                 "--profile_dir={dir}/trace"), 150, 90),
      Part("modernbert_1024", "train",
           train("modernbert_base", "modernbert_tiny", 1024, 32, "--docs_per_row=4"),
           150, 90),
      Part("bert_base_128_dropout_hf", "train",
           train("bert_base", "bert_tiny", 128, 256, "--compare=hf"), 200, 120),
      # A second call: `--parts=levers,tests` (the first five take the first's budget).
      Part("levers", "levers", _bench("levers", *sized(
          "--config=configs/bert_base.py --seq=128 --batch=256 --steps=10 "
          "--variants=base,activations_saved,position_gather,unsafe_rbg,threefry_kernel,"
          "no_command_buffer,no_triton_gemm,cudnn_layer_norm",
          "--config=configs/bert_tiny.py --seq=32 --batch=2 --steps=2 --warmup=0 "
          "--variants=base,activations_saved"), dtype, no_dropout), 300, 150),
      Part("tests", "tests", ["-m", "pytest", "-v", "-n", "2" if dry else "8",
                              "-p", "no:cacheprovider", "-rfE",
                              *(tests if dry else test_files(tests))], 540, 60),
      Part("bert_large_512_scanned", "train", large("--config.model.scan_layers=True"),
           200, 120, fresh=True),
      Part("bert_base_128_hf", "train", train("bert_base", "bert_tiny", 128, 256,
                                              no_dropout, "--compare=hf"), 200, 120),
      Part("bert_large_512_hf", "train", large("--compare=hf"), 220, 120),
      Part("modernbert_1024_hf", "train",
           train("modernbert_base", "modernbert_tiny", 1024, 32, "--docs_per_row=4",
                 "--compare=hf"), 220, 120),
      Part("kernels", "kernels", _bench("kernels", "--mode=errors", *sized(
          "", f"--batch=1 --seq=64 {heads} --cases=packed_window")), 120, 60),
      Part("memory", "memory", _bench("kernels", "--mode=memory", *sized(
          "", f"--lengths=64 --tokens=128 {heads}")), 90, 30),
      Part("bert_base_128_packed", "train",
           train("bert_base", "bert_tiny", 128, 256, no_dropout, "--docs_per_row=4"),
           200, 100),
      Part("bert_large_512_packed", "train", large("--docs_per_row=4"), 200, 100),
      Part("max_batch", "train", large("--compare=hf", "--max_batch",
                                       "--batch_tolerance=0.25"), 600, 90,
           skip="dry run: --max_batch starts a process per try" if dry else ""),
  ]


# ---- Running the parts.


def _run(argv: list[str], log_path: str, timeout_s: float, env: dict) -> tuple[int, bool]:
  """(exit status, timed out): `argv` in a process group of its own, its output to
  `log_path`; past `timeout_s` the group is stopped (SIGTERM, then SIGKILL)."""
  with open(log_path, "w") as log:
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                            start_new_session=True)
    try:
      return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
      for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
          os.killpg(proc.pid, sig)
        except ProcessLookupError:
          break
        try:
          proc.wait(timeout=wait)
          break
        except subprocess.TimeoutExpired:
          continue
      return proc.wait(), True


def _reason(log: str) -> str:
  """The line of a failed part's output that says why (its last error line)."""
  lines = [line.strip() for line in log.splitlines() if line.strip()]
  errors = [line for line in lines if re.search(r"error|Error|Exception|FAILED|Killed",
                                                line)]
  return ((errors or lines or ["no output"])[-1])[:300]


def run_parts(parts: list[Part], budget_s: float, out: str, env: dict) -> dict:
  """Runs `parts` in order within `budget_s` (each within what is left of it); returns
  {name: record}."""
  scratch = tempfile.mkdtemp(prefix="bertjax_gpu_")
  deadline = time.monotonic() + budget_s
  records = {}
  for part in parts:
    folder = os.path.join(scratch, part.name)
    os.makedirs(folder)
    json_path, log_path = os.path.join(folder, "result.json"), os.path.join(folder, "log")
    argv = [sys.executable] + [a.replace("{json}", json_path).replace("{dir}", folder)
                               for a in part.argv]
    record = records[part.name] = {"kind": part.kind, "command": " ".join(argv[1:])}
    left = deadline - time.monotonic()
    if part.skip or left < part.need_s:
      record.update(status="skipped",
                    reason=part.skip or f"{max(left, 0):.0f} s of the budget left")
      print(f"== {part.name}: skipped ({record['reason']})", flush=True)
      continue
    timeout = min(part.cap_s, left)
    print(f"== {part.name} (at most {timeout:.0f} s): {record['command']}", flush=True)
    start = time.monotonic()
    rc, timed_out = _run(argv, log_path, timeout, {
        k: v for k, v in env.items() if not (part.fresh and k == "JAX_COMPILATION_CACHE_DIR")})
    record["seconds"] = round(time.monotonic() - start, 1)
    with open(log_path, errors="replace") as f:
      log = f.read()
    print(log, end="" if log.endswith("\n") else "\n", flush=True)
    if part.kind == "tests":
      record["result"] = gpu_report.pytest_counts(log)
      shutil.copy(log_path, os.path.join(out, "tests.log"))
    elif os.path.exists(json_path):
      with open(json_path) as f:
        record["result"] = json.load(f)
    if timed_out:
      record.update(status="timed out", reason=f"stopped after {timeout:.0f} s")
    elif rc:
      record.update(status="failed", reason=f"exit {rc}: {_reason(log)}")
    elif part.kind == "tests" and not record["result"]["ok"]:
      record.update(status="failed", reason=record["result"]["summary"])
    else:
      record["status"] = "ok"
    _keep_trace(folder, out)
    print(f"== {part.name}: {record['status']} in {record['seconds']} s"
          + (f" ({record['reason']})" if "reason" in record else ""), flush=True)
  return records


def _keep_trace(folder: str, out: str, limit: int = 12 * 2**20) -> None:
  """A part's profiler trace (bert_base_128's) into `out` (profile.xplane.pb) when it
  is small enough to come back from the device machine."""
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      if name.endswith(".xplane.pb") and os.path.getsize(path) <= limit:
        shutil.copy(path, os.path.join(out, "profile.xplane.pb"))


def smoke(dry: bool) -> dict:
  """Seconds on a GPU: the environment (`jax.print_environment_info`: versions,
  devices, nvidia-smi), a bf16 matmul's TFLOP/s, one bf16 forward + backward of each
  attention path against float32 XLA (packed rows with a window; cuDNN: padded), and
  the initialisation's parameters with the threefry kernel against the unrolled
  rounds' (`_init_with_kernel`)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bertjax.benchmarks import kernels  # pylint: disable=g-import-not-at-top

  info = jax.print_environment_info(return_string=True)
  print(info, flush=True)
  gpu = jax.default_backend() == "gpu"
  n = 256 if dry else 8192
  a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in range(2))
  matmul = jax.jit(jnp.matmul)
  result = {"environment": info, "platform": jax.default_backend(),
            "devices": [d.device_kind for d in jax.devices()],
            "matmul_size": n,
            "matmul_tflops": 2 * n**3 / kernels.median_ms(matmul, a, b, repeats=10) / 1e9,
            "attention": {}}
  sizes = (1, 64, 2, 16, 8, 3) if dry else (2, 512, 8, 64, 64, 4)
  for impl, case in (("xla", "packed_window"), ("pallas_gpu", "packed_window"),
                     ("cudnn", "padded")):
    if impl == "cudnn" and not gpu:
      result["attention"][impl] = "skipped: cuDNN needs a GPU"
      continue
    q, k, v, padding, segments, window, w = kernels.inputs(case, *sizes)
    with jax.default_matmul_precision("highest"):
      (_, ref), _ = kernels.step("xla", padding, segments, window)(q, k, v, w)
    half = (q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), w)
    (_, out), grads = kernels.step(impl, padding, segments, window)(*half)
    finite = all(bool(jnp.isfinite(g).all()) for g in (out, *grads))
    error = float(jnp.max(jnp.abs(out - ref)) / jnp.max(jnp.abs(ref)))
    result["attention"][impl] = f"{case}: out error {error:.1e}" + (
        "" if finite else ", NOT FINITE")
  result["init_threefry_kernel"] = _init_with_kernel()
  return result


def _init_with_kernel() -> str:
  """bert_tiny's initial parameters drawn with the threefry kernel (what
  `Setup.init_params` uses) against the unrolled rounds'."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import recipe  # pylint: disable=g-import-not-at-top
  from bertjax.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import compilation, state as state_lib  # pylint: disable=g-import-not-at-top
  config = recipe("bert_tiny")
  trainer = state_lib.build_trainer(config, mesh_lib.create_mesh(config.mesh,
                                                                 jax.devices()[:1]))
  seed = state_lib.seed_scalar(config.seed)
  unrolled = jax.tree.leaves(jax.device_get(trainer.init_program()(seed)))
  with compilation.threefry_kernel():
    kernel = jax.tree.leaves(jax.device_get(trainer.init_program()(seed)))
  differ = sum(not np.array_equal(a, b) for a, b in zip(unrolled, kernel))
  return (f"{differ} of {len(kernel)} arrays DIFFER" if differ else
          f"the same {len(kernel)} arrays")


def versions() -> dict[str, str]:
  """Python's and each of PACKAGES' installed version (those installed)."""
  out = {"python": sys.version.split()[0]}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def main(argv):
  del argv
  f = FLAGS
  if f.part == "smoke":
    result = smoke(f.dry_run)
    result["versions"] = versions()
    with open(f.json, "w") as out:
      json.dump(result, out, indent=1)
    print(json.dumps(result, indent=1))
    return
  parts = plan(f.dry_run, f.tests)
  unknown = sorted(set(f.parts) - {p.name for p in parts})
  if unknown:
    from bertjax.errors import ConfigError  # pylint: disable=g-import-not-at-top
    raise ConfigError(f"--parts: unknown {unknown}; the parts are "
                      f"{[p.name for p in parts]}.")
  if f.parts:
    for p in parts:
      p.skip = p.skip or ("" if p.name in f.parts else "not in --parts")
  os.makedirs(f.out, exist_ok=True)
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  if f.cache_dir:
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(REPO, f.cache_dir))
  if f.dry_run:
    env["JAX_NUM_CPU_DEVICES"] = "1"  # On a CPU: one device, as the GPU machine has.
  else:
    env["BERTJAX_TEST_PLATFORM"] = "gpu"  # Read by the tests part's conftest only.
  started = datetime.datetime.now(datetime.timezone.utc)
  clock = time.monotonic()
  records = run_parts(parts, f.budget_s, f.out, env)
  result = {"started": started.strftime("%Y-%m-%d %H:%M UTC"), "dry_run": f.dry_run,
            "budget_s": f.budget_s, "seconds": round(time.monotonic() - clock, 1),
            "versions": versions(), "parts": records}
  table = gpu_report.table(result)
  with open(os.path.join(f.out, "gpu.json"), "w") as out:
    json.dump(result, out, indent=1, default=str)
  with open(os.path.join(f.out, "gpu.txt"), "w") as out:
    out.write(table + "\n")
  print(table)
