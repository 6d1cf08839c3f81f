"""The GPU check, in one call: `python -m bertjax.benchmark gpu [--out=DIR
--budget_s=510 --parts=a,b --dry_run]`.

Runs, each part in a process of its own with a time cap (a failure, a crash or a hang
is recorded and the rest goes on), in this order, until `--budget_s` is spent (a part
that cannot start with enough time left is skipped and says so). The caps come from
the first run on an H200 (2026-11-27): smoke 29 s, kernels 56 s, and a base-sized
`benchmark train` process about 130 s alone (compile 31 s; the phases of its start-up
are printed as they end), more with Hugging Face beside it. One call of 510 s runs the
first four parts; a second call (`--parts=`) the next ones:

  smoke            versions and devices; a bf16 matmul; one call of each attention path
  bert_base_128    BERT-base at 128, batch 256, bf16, attention dropout off (as the
                   README's GPU targets: cuDNN for padded rows): MFU, tokens/s, memory,
                   start-up; two more steps profiled (`benchmark train --profile_dir`):
                   device time by category, the largest ops
  bert_base_128_hf the same against Hugging Face (`benchmark train --compare=hf`,
                   interleaved steps on the one GPU)
  tests            the suite's GPU tests (`BERTJAX_TEST_PLATFORM=gpu`, --tests)
  bert_large_512_hf, modernbert_1024, modernbert_1024_hf
                   BERT-large at 512, batch 32, against Hugging Face; ModernBERT-base
                   (the recipe), 1,024 tokens, 4 documents a row, alone and against it
  kernels          `benchmark kernels --mode=errors`: cuDNN and the Pallas kernel
                   against XLA, bf16 and fp32, forward and gradients, padded and packed
                   rows, windows: errors and times
  memory           `benchmark kernels --mode=memory`: packed rows at 512 and 8,192
                   tokens, the Pallas kernel against XLA's mask
  bert_base_128_packed, bert_large_512_packed
                   4 documents a row (the Pallas kernel)
  bert_base_128_dropout
                   the recipe as is: attention dropout 0.1 (the XLA path)
  levers           `benchmark levers` at bert_base_128's sizes (issue 46; one process,
                   one compile a variant): the PRNG implementation, GELU recomputed in
                   the backward pass, one-hot position embeddings, XLA flags (no CUDA
                   graphs, no Triton GEMM, cuDNN LayerNorm): each variant's step with
                   and without a host sync between steps, its bytes accessed
  max_batch        BERT-large at 512: the largest batch each framework fits (--max_batch)

Writes DIR/gpu.json (every part: status, seconds, command, results), DIR/gpu.txt (the
table), DIR/tests.log (pytest's output) and DIR/profile.xplane.pb (bert_base_128's
trace, when under 12 MiB), and prints every part's output, then the table last. `--dry_run` runs
the same parts at tiny sizes (tiny configs, a few tokens: on a CPU in minutes;
tests/test_benchmark_gpu.py runs it); `--parts` runs some of them.

On the device machine (no package index; its image lacks grain, ml_collections,
array_record: launch/gpu_wheels.py builds them as wheels into .wheels/), from the
repository root, with `.wheels` carried:

  bash launch/gpu_check.sh          # installs .wheels, runs this with a time limit
"""

from __future__ import annotations

import dataclasses
import datetime
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

from bertjax.benchmarks import gpu_report

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tests part's default: what has not passed on a GPU first (the H200 sessions of
# 2026-11-27 stopped inside test_modernbert_numerics; test_electra_numerics' released
# networks failed there, since fixed; test_model's one-hot embedding is newer), then the
# files that passed there.
GPU_TESTS = ("tests/test_modernbert_numerics.py", "tests/test_electra_numerics.py",
             "tests/test_model.py", "tests/test_hf_numerics.py", "tests/test_attention.py",
             "tests/test_bf16_numerics.py", "tests/test_attention_paths.py",
             "tests/test_modernbert_gradients.py")
PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
            "flax", "optax", "orbax-checkpoint", "chex", "numpy", "torch", "transformers",
            "triton", "grain", "ml_collections", "array_record", "tensorboardX")


def define_flags() -> None:
  flags.DEFINE_string("out", "/tmp/bertjax_gpu", "Output folder (the device tool "
                      "returns what is written under $OUT).")
  flags.DEFINE_float("budget_s", 510.0, "Seconds for all the parts together.")
  flags.DEFINE_list("parts", [], "Run these parts only (default: all).")
  flags.DEFINE_list("tests", list(GPU_TESTS), "The tests part's pytest targets.")
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
  says why not."""

  name: str
  kind: str  # smoke, kernels, memory, train, tests
  argv: list[str]
  cap_s: float
  need_s: float = 30.0
  skip: str = ""


def _bench(name: str, *args: str) -> list[str]:
  return ["-m", "bertjax.benchmark", name, *args, "--json={json}"]


def plan(dry: bool, tests: list[str]) -> list[Part]:
  """The parts in order; `dry`: the same flags at tiny sizes."""
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
  return [
      Part("smoke", "smoke",
           _bench("gpu", "--part=smoke", *(["--dry_run"] if dry else [])), 60, 20),
      Part("bert_base_128", "train",
           train("bert_base", "bert_tiny", 128, 256, no_dropout,
                 "--profile_dir={dir}/trace"), 200, 100),
      Part("bert_base_128_hf", "train", train("bert_base", "bert_tiny", 128, 256,
                                              no_dropout, "--compare=hf"), 200, 120),
      Part("tests", "tests", ["-m", "pytest", "-v", "-n", "0", "-p", "no:cacheprovider",
                              "-rfE", *tests], 150, 60),
      # A second call: `--parts=` these (the first four take the first call's budget).
      Part("bert_large_512_hf", "train", train("bert_large", "bert_tiny", 512, 32,
                                               no_dropout, "--compare=hf"), 220, 120),
      Part("modernbert_1024", "train",
           train("modernbert_base", "modernbert_tiny", 1024, 32, "--docs_per_row=4"),
           200, 100),
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
      Part("bert_large_512_packed", "train",
           train("bert_large", "bert_tiny", 512, 32, no_dropout, "--docs_per_row=4"),
           200, 100),
      Part("bert_base_128_dropout", "train", train("bert_base", "bert_tiny", 128, 256),
           200, 100),
      Part("levers", "levers", _bench("levers", *sized(
          "--config=configs/bert_base.py --seq=128 --batch=256 --steps=10 "
          "--variants=base,unsafe_rbg,rbg,gelu_recompute,position_one_hot,"
          "no_command_buffer,no_triton_gemm,cudnn_layer_norm",
          "--config=configs/bert_tiny.py --seq=32 --batch=2 --steps=2 --warmup=0 "
          "--variants=base,unsafe_rbg"), dtype, no_dropout), 420, 150),
      Part("max_batch", "train", train("bert_large", "bert_tiny", 512, 32, no_dropout,
                                       "--compare=hf", "--max_batch",
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
    rc, timed_out = _run(argv, log_path, timeout, env)
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
  devices, nvidia-smi), a bf16 matmul's TFLOP/s, and one bf16 forward + backward of
  each attention path against float32 XLA (packed rows with a window; cuDNN: padded)."""
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
  return result


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
