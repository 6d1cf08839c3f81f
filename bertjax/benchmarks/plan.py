"""`python -m bertjax.benchmark plan --config=configs/bert_large.py --topology=v5p-128
[--mesh=d,f,t ...] [--remat=none,full] [--batch_size=N] [--max_batch] [--num_slices=2]
[--first_fit] [--summary]`

Plans a pod before it is booked. The real train step (bertjax's trainer: model,
optimizer, shardings from the logical-axis rules, donated state) is compiled ahead of
time for the chips of a TPU topology: `jax.experimental.topologies` gives abstract
devices of any slice and `libtpu` (the `tpu` extra) the TPU compiler, so no TPU is
needed. For each candidate (a mesh layout with a remat policy), per chip:

- params and optimizer state: the bytes of that chip's shards (exact, from the
  shardings);
- temporaries and peak from the TPU compiler's buffer assignment (`memory_analysis()`);
  peak = arguments + temporaries + outputs not aliased to the donated arguments + the
  program; it fits when the compiler accepts the program and the peak is at most the
  HBM the compiler offers a program (`bertjax.benchmarks.flops.CHIPS`);
- with `--max_batch`, the largest global batch that fits: the per-chip batch doubled,
  then bisected (to `--batch_tolerance`), every try a real compile (the compiler
  refuses a program over HBM, quickly);
- compile time, and the compiler's FLOPs and bytes accessed per chip
  (`cost_analysis()`; it counts a scanned loop's body once) next to `bertjax.benchmarks.flops`
  (model FLOPs / chips), with the roofline bound max(FLOPs / peak FLOP/s, bytes / HBM
  bandwidth), the larger FLOP count of the two: a lower bound on the step time, not a
  prediction. No step time or MFU is claimed from a compile.

The chosen launch is the first candidate, in the order given (every --mesh with the
first --remat policy, then with the next), that fits at the batch: list the cheapest
first (no remat before remat, data parallelism before FSDP before tensor parallelism);
`--first_fit` compiles no further, `--summary` prints the choice as one markdown row.
`--topology`: an accelerator type as Cloud TPU names it (v4-8, v5e-256, v5p-128,
v6e-8), a topology (v5p:4x4x4) or `cpu:N` (N fake CPU devices, the CPU compiler: an
estimate for GPUs; give --hbm_gb). `--num_slices=2` plans a multi-slice job: the mesh
sizes are per slice and `config.mesh.dcn_*` split the axes across slices (default
dcn_data = the number of slices).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import re
import sys
import time

import flax.linen as nn
import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from bertjax.benchmarks import flops as flops_lib, gpu_target, xplane
from bertjax.errors import ConfigError
from bertjax import objectives as objectives_lib
from bertjax.data import pipeline
from bertjax.model.config import REMAT_POLICIES

GIB = 2.0 ** 30
# Cloud TPU generations: the topology prefix, whether an accelerator type counts
# TensorCores (2 per chip) rather than chips, and whether the slice is a 3D torus.
GENERATIONS = {"v4": ("v4", True, True), "v5p": ("v5p", True, True),
               "v5e": ("v5e", False, False), "v6e": ("v6e", False, False)}


def define_flags() -> None:
  config_flags.DEFINE_config_file("config", None, "Recipe file.", lock_config=True)
  flags.DEFINE_string("topology", None, "v5p-128, v5e-256, v4-8, v6e-8, v5p:4x4x4, cpu:8.")
  flags.DEFINE_integer("num_slices", 1, "Slices of --topology joined over DCN.")
  flags.DEFINE_multi_string("mesh", ["-1,1,1", "1,-1,1"],
                            "A layout 'data,fsdp,tensor' per slice, -1 fills the chips "
                            "left (repeat the flag: in order of preference).")
  flags.DEFINE_list("remat", [], "Remat policies to try, each over every --mesh, in order "
                    f"({', '.join(REMAT_POLICIES)}; default: the config's).")
  flags.DEFINE_integer("batch_size", 0, "Global batch (0: config.train.batch_size).")
  flags.DEFINE_bool("max_batch", False, "Find each fitting candidate's largest global "
                    "batch by bisection (a compile per try).")
  flags.DEFINE_float("batch_tolerance", 0.0, "--max_batch: stop bisecting once the "
                     "batch that does not fit is within this fraction of the one that does "
                     "(0: exact; 0.125: fewer compiles).")
  flags.DEFINE_bool("first_fit", False, "Stop at the first candidate that fits.")
  flags.DEFINE_bool("summary", False, "Print the chosen launch as one markdown row.")
  flags.DEFINE_bool("init", False, "Also compile each candidate's initialisation of the "
                    "parameters (a fresh run's first program): its compile seconds.")
  flags.DEFINE_float("hbm_gb", 0.0, "HBM per device in GB (default: the chip's).")
  flags.DEFINE_string("json", "", "Also write every figure to this file.")
  flags.mark_flags_as_required(["config", "topology"])


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str  # As given.
  devices: list  # Abstract TPU devices (or CPU devices).
  chip: flops_lib.Chip | None
  hbm_bytes: float


def _torus_dims(chips: int, three_d: bool) -> tuple[int, ...]:
  """Cloud TPU's slice shape for a chip count: double the smallest side, the last of
  equal ones (v5p-128 = 64 chips -> 4x4x4, v5e-256 -> 16x16, v4-8 -> 2x2x1)."""
  dims = [1, 1, 1] if three_d else [1, 1]
  while int(np.prod(dims)) < chips:
    i = max(j for j, d in enumerate(dims) if d == min(dims))
    if three_d and int(np.prod(dims)) == 1:
      dims = [2, 2, 1]
      continue
    dims[i] *= 2
  if int(np.prod(dims)) != chips:
    raise ConfigError(f"--topology: {chips} chips is not a slice size bertjax knows; give "
                      "the topology itself, e.g. --topology=v5p:4x4x8.")
  return tuple(dims)


def _compile_only_libtpu(accelerator: str) -> None:
  """Without a TPU attached, libtpu cannot read the VM's metadata (it warns) and guards
  the absent chips with a lockfile (a second process could not plan at the same time);
  these values describe the local host only, never the compiled topology."""
  if not glob.glob("/dev/accel*") and not glob.glob("/dev/vfio"):
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def topology(name: str, num_slices: int = 1, hbm_gb: float = 0.0) -> Topology:
  """The abstract devices of `name` (see the module docstring) x `num_slices`."""
  if m := re.fullmatch(r"cpu:(\d+)", name):
    if not hbm_gb:
      raise ConfigError("--topology=cpu:N plans with the CPU compiler: give the device "
                        "memory, e.g. --hbm_gb=80 for an H100.")
    if num_slices > 1:
      raise ConfigError("--topology=cpu:N plans one slice; drop --num_slices.")
    try:
      jax.config.update("jax_num_cpu_devices", int(m[1]))
    except RuntimeError:  # The CPU backend is up already (JAX_NUM_CPU_DEVICES).
      pass
    devices = jax.devices("cpu")
    if len(devices) < int(m[1]):
      raise ConfigError(f"--topology={name}: only {len(devices)} CPU devices; plan "
                        "before JAX starts, or set JAX_NUM_CPU_DEVICES.")
    return Topology(name, devices[:int(m[1])], None, hbm_gb * 1e9)
  if gpu := gpu_target.parse(name):
    if num_slices > 1:
      raise ConfigError(f"--topology={name}: slices are TPU's; name GPU hosts as "
                        "h200:HOSTSxGPUS (e.g. h200:2x8).")
    devices = gpu_target.devices(*gpu)
    chip = flops_lib.chip(devices[0])
    return Topology(name, devices, chip, hbm_gb * 1e9 if hbm_gb else chip.hbm_bytes)
  if m := re.fullmatch(r"(v4|v5p|v5e|v6e)-(\d+)", name):
    prefix, per_core, three_d = GENERATIONS[m[1]]
    chips = int(m[2]) // (2 if per_core else 1)
    dims = _torus_dims(chips, three_d)
  elif m := re.fullmatch(r"(v4|v5p|v5e|v6e):(\d+(?:x\d+){1,2})", name):
    prefix, per_core, three_d = GENERATIONS[m[1]]
    dims = tuple(int(d) for d in m[2].split("x"))
  else:
    raise ConfigError(f"--topology={name}: use an accelerator type (v4-8, v5e-256, "
                      "v5p-128, v6e-8), a topology (v5p:4x4x4), GPUs (h100, h200:8, "
                      "h200:2x8) or cpu:N.")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  _compile_only_libtpu(f"{m[1]}-{int(np.prod(dims)) * (2 if per_core else 1)}")
  wrap = tuple(d >= 4 for d in dims) if three_d and min(dims) >= 4 else tuple(
      d == 16 for d in dims)
  try:
    devices = topologies.get_topology_desc(
        f"{prefix}:{'x'.join(map(str, dims))}", platform="tpu",
        chip_config_name="megacore" if per_core else "default",
        chips_per_host_bounds=tuple(min(d, 2) for d in dims) + (1,) * (3 - len(dims)),
        wrap=wrap + (False,) * (3 - len(wrap)), num_slices=num_slices).devices
  except (RuntimeError, ValueError) as e:
    hint = ("install the TPU compiler: pip install -e '.[tpu]'" if "libtpu" in str(e)
            or "plugin" in str(e).lower() else "check the topology")
    raise ConfigError(f"--topology={name}: {str(e).splitlines()[0]}; {hint}.") from e
  chip = flops_lib.chip(devices[0])
  return Topology(name, list(devices), chip, hbm_gb * 1e9 if hbm_gb else chip.hbm_bytes)


def is_retrieval(config) -> bool:
  """Whether `config` trains an embedding model (configs/finetune/retrieval.py), a
  sparse one (configs/finetune/sparse.py) or a multi-vector one
  (configs/finetune/colbert.py): its step is the contrastive one
  (`bertjax.tasks.retrieval`), at task.max_seq_length."""
  from bertjax.tasks.base import RETRIEVER_TASKS  # pylint: disable=g-import-not-at-top
  return "task" in config and config.task.name in RETRIEVER_TASKS


def is_rerank(config) -> bool:
  """Whether `config` trains a reranker (configs/finetune/rerank.py): fine-tuning's
  step over groups of task.group_size (query, document) pairs (`bertjax.tasks.rerank`)."""
  return "task" in config and config.task.name == "rerank"


def batch_spec(config, batch_size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """Shapes and dtypes of the global batch of `batch_size` examples a plan compiles the
  step for, from their owners: the contrastive step's (`retrieval.batch_spec`), or
  pretraining's at one length, rows of max_seq_length with max_predictions_per_seq
  masked slots, as the pipeline makes them (`pipeline.batch_spec`; plan a length phase
  with --config.data.max_seq_length=T --config.data.max_predictions_per_seq=P)."""
  if is_retrieval(config):
    from bertjax.tasks import retrieval  # pylint: disable=g-import-not-at-top
    return retrieval.batch_spec(config, batch_size)
  if is_rerank(config):
    from bertjax.tasks import rerank  # pylint: disable=g-import-not-at-top
    return rerank.batch_spec(config, batch_size)
  nsp = pipeline.sentence_pairs(objectives_lib.from_config(config).fields)
  return pipeline.batch_spec(config.data, nsp, batch_size, config.data.max_seq_length,
                             config.data.max_predictions_per_seq)


def row_length(config) -> int:
  """T, the tokens of a row of the batch the plan compiles (`batch_spec`'s ids; of a
  contrastive step, a document's: the longest)."""
  spec = batch_spec(config, 1)
  return spec["doc_input_ids" if is_retrieval(config) else "input_ids"][0][-1]


def shard_bytes(tree, shardings) -> int:
  """Bytes one device holds of `tree` (abstract arrays) placed on `shardings`."""
  return sum(int(np.prod(s.shard_shape(a.shape))) * a.dtype.itemsize
             for a, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))


def platform_dtype(config, platform: str) -> str:
  """config.model.dtype, where '' is what `platform` (the one compiled for, not this
  host's) resolves it to."""
  from bertjax.model.config import default_dtype  # pylint: disable=g-import-not-at-top
  return config.model.dtype or np.dtype(default_dtype(platform)).name


def abstract_state(trainer):
  """`trainer`'s TrainState as abstract arrays on its shardings (nothing allocated)."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      trainer.abstract, trainer.shardings)


def compile_step(config, devices, batch_size: int):
  """The trainer's jitted step compiled for `devices` (abstract arrays: nothing is
  allocated), `config.model.dtype=''` as the devices' platform resolves it (as
  `attention_impl=''` is: `attention.target_platform`). Returns (trainer, compiled,
  seconds). Programs for compile-only (TPU topology, GPU target) devices stay out of
  JAX's persistent cache: it cannot load them back."""
  from bertjax.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.train.batch_size = batch_size  # The step's check: divisible by the data axes.
    config.model.dtype = platform_dtype(config, devices[0].platform)
  mesh = mesh_lib.create_mesh(config.mesh, devices)
  if is_retrieval(config):
    trainer = _retrieval_setup(config, mesh, batch_size)
  elif is_rerank(config):
    trainer = _rerank_setup(config, mesh, batch_size)
  else:
    trainer = state_lib.build_trainer(config, mesh)
  with (jax.set_mesh(trainer.mesh), nn.logical_axis_rules(trainer.rules),
        gpu_target.cudnn_checks(devices[0])):
    state = abstract_state(trainer)
    batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=trainer.batch_sharding)
             for k, (shape, dtype) in batch_spec(config, batch_size).items()}
    with _no_cache_unless_attached(devices[0]):
      start = time.perf_counter()
      compiled = trainer.train_step.lower(state, batch).compile()
  return trainer, compiled, time.perf_counter() - start


def compile_init(trainer):
  """`trainer`'s initialisation of the parameters (a fresh run's first program,
  `Setup.init_program`, as `init_params` lowers it) compiled for its mesh's devices:
  (compiled, seconds)."""
  from bertjax.train import compilation  # pylint: disable=g-import-not-at-top
  with _no_cache_unless_attached(trainer.mesh.devices.flat[0]), compilation.threefry_kernel():
    start = time.perf_counter()
    compiled = trainer.init_program().lower(jax.ShapeDtypeStruct((), np.int32)).compile()
    return compiled, time.perf_counter() - start


@contextlib.contextmanager
def _no_cache_unless_attached(device):
  cache = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", cache and device in jax.devices())
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)


def _retrieval_setup(config, mesh, batch_size: int):
  """The contrastive step's `Setup` of an embedding model of `config.model` (random
  weights: shapes are what a plan needs), fine-tuning's optimizer."""
  from bertjax import model as model_lib  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import finetune, retrieval  # pylint: disable=g-import-not-at-top
  model_cfg = model_lib.config_from(config.model)
  sample = {k: np.zeros((1, *shape[1:]), dtype)
            for k, (shape, dtype) in batch_spec(config, batch_size).items()}
  return retrieval.build(config, model_cfg, sample,
                         finetune.make_optimizer(config, model_cfg, 1000), mesh)[1]


def _rerank_setup(config, mesh, batch_size: int):
  """Fine-tuning's `Setup` of a reranker of `config.model` (random weights)."""
  from bertjax import model as model_lib  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import finetune, rerank  # pylint: disable=g-import-not-at-top
  model_cfg = model_lib.config_from(config.model)
  sample = {k: np.zeros((1, *shape[1:]), dtype)
            for k, (shape, dtype) in batch_spec(config, batch_size).items()}
  task = rerank.Rerank(config.task, None, config.task.max_seq_length)
  return finetune.build(config, task, model_cfg, sample, 1000, mesh)


def model_flops(config, batch_size: int) -> float:
  """Model FLOPs of a step: pretraining's objectives', or the contrastive step's."""
  if is_retrieval(config):
    from bertjax import model as model_lib  # pylint: disable=g-import-not-at-top
    from bertjax.tasks import retrieval  # pylint: disable=g-import-not-at-top
    return retrieval.train_flops(config, model_lib.config_from(config.model), batch_size)
  if is_rerank(config):
    from bertjax import model as model_lib  # pylint: disable=g-import-not-at-top
    from bertjax.tasks import rerank  # pylint: disable=g-import-not-at-top
    return rerank.train_flops(config, model_lib.config_from(config.model), batch_size)
  spec = batch_spec(config, batch_size)
  T, P = spec["input_ids"][0][1], spec["masked_lm_positions"][0][1]
  return objectives_lib.from_config(config).train_flops(batch_size, T, P)["total"]


def _out_of_memory(error: Exception) -> bool:
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text


def plan(config, topo: Topology, batch_size: int, init: bool = False) -> dict:
  """One compile of `config` (its mesh and model settings) at `batch_size` on `topo`.
  Per chip, bytes: params, opt_state, batch (exact), temp, peak (the compiler's);
  `fits`; flops / bytes_accessed (the compiler's), model_flops (bertjax.benchmarks.flops / chips);
  roofline_s; compile_s (with `init`, init_compile_s). A program over HBM: `fits` False
  and `error` set."""
  from bertjax.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  try:
    trainer, compiled, seconds = compile_step(config, topo.devices, batch_size)
  except Exception as e:  # pylint: disable=broad-except
    if not _out_of_memory(e):
      raise
    return {"batch_size": batch_size, "fits": False, "error": str(e).splitlines()[0][:300],
            "compile_s": time.perf_counter() - start}
  mem, cost = compiled.memory_analysis(), compiled.cost_analysis() or {}
  chips = len(topo.devices)
  batch = {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in batch_spec(config, batch_size).items()}
  r = {
      "batch_size": batch_size,
      "per_chip_batch": batch_size // mesh_lib.data_parallel_size(trainer.mesh, trainer.rules),
      "params": shard_bytes(trainer.abstract.params, trainer.shardings.params),
      "opt_state": shard_bytes(trainer.abstract.opt_state, trainer.shardings.opt_state),
      "batch": shard_bytes(batch, {k: trainer.batch_sharding for k in batch}),
      "arguments": mem.argument_size_in_bytes, "temp": mem.temp_size_in_bytes,
      "outputs": mem.output_size_in_bytes, "aliased": mem.alias_size_in_bytes,
      "program": mem.generated_code_size_in_bytes, "compile_s": seconds,
      "flops": float(cost.get("flops", 0.0)),
      "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
      "model_flops": model_flops(config, batch_size) / chips,
  }
  if not cost:  # A compile for a GPU target: the bytes its kernels move instead.
    r["bytes_accessed"] = 1e9 * xplane.kernel_bytes(
        xplane.compiled_program(compiled))["total"]["GB"]
  r["peak"] = r["arguments"] + r["temp"] + r["outputs"] - r["aliased"] + r["program"]
  r["fits"] = r["peak"] <= topo.hbm_bytes
  if init:
    program, r["init_compile_s"] = compile_init(trainer)
    r["init_instructions"] = xplane.hlo_counts(program.as_text())
  if topo.chip:  # Each term a lower bound (a scanned loop's body is counted once).
    r["roofline_s"] = max(max(r["flops"], r["model_flops"]) / (topo.chip.peak_bf16_tflops
                                                               * 1e12),
                          r["bytes_accessed"] / (topo.chip.hbm_gbps * 1e9))
  return r


MAX_PER_UNIT = 4096  # The search's cap: rows a chip (a batch at the cap may fit more).


def largest_batch(config, topo: Topology, fitting: dict, unit: int, tolerance: float = 0.0,
                  max_per_unit: int = MAX_PER_UNIT) -> tuple[int, list[dict]]:
  """The largest global batch (a multiple of `unit`: data-parallel size x micro-
  batches) that fits, from a `plan` that fits: double, then bisect, each try a compile,
  until the smallest batch that does not fit is within `tolerance` of the largest that
  does (0: the next multiple). Returns (batch, the tries' plans); a batch at the cap
  (`max_per_unit` units) may not be the largest."""
  lo, hi, tries = fitting["batch_size"] // unit, None, []  # lo: 0 or a known fit.

  def fits(n: int) -> bool:
    tries.append(plan(config, topo, n * unit))
    _progress(tries[-1])
    return tries[-1]["fits"]

  while hi is None and lo < max_per_unit:
    n = min(max(2 * lo, 1), max_per_unit)
    lo, hi = (n, None) if fits(n) else (lo, n)
  while hi is not None and hi - lo > max(1, tolerance * lo):
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
  return lo * unit, tries


def _layout(text: str) -> tuple[int, int, int]:
  try:
    layout = tuple(int(x) for x in text.split(","))
  except ValueError:
    layout = ()
  if len(layout) != 3 or any(x == 0 or x < -1 for x in layout) or layout.count(-1) > 1:
    raise ConfigError(f"--mesh={text}: give three sizes 'data,fsdp,tensor' (one may "
                      "be -1: the chips left).")
  return layout


def candidate(config, layout, remat: str, num_slices: int):
  """`config` with the mesh `layout` (per slice) and `remat` policy."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = layout
    config.model.remat_policy = remat
    dcn = [int(config.mesh[f"dcn_{a}"]) for a in ("data", "fsdp", "tensor")]
    if num_slices > 1 and int(np.prod(dcn)) == 1:
      config.mesh.dcn_data = num_slices
    elif int(np.prod(dcn)) != num_slices:
      raise ConfigError(f"config.mesh.dcn_*={dcn} split the axes over {int(np.prod(dcn))} "
                        f"slices but --num_slices={num_slices}; make their product match.")
  return config


def _progress(r: dict) -> None:
  """One stderr line a compile (each takes minutes for a large model)."""
  where = f"mesh {r['mesh']}, remat {r['remat']}, " if "mesh" in r else ""
  peak = f"peak {r['peak'] / GIB:.2f} GiB, " if "peak" in r else ""
  print(f"plan: {where}global batch {r['batch_size']}: {peak}"
        f"{'fits' if r['fits'] else 'does not fit'} ({r.get('compile_s', 0):.0f} s)",
        file=sys.stderr, flush=True)


def _size(x: float, unit: float) -> str:
  return f"{x / unit:,.2f}"


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  config = f.config
  if gpu_target.parse(f.topology):
    gpu_target.before_jax_starts()
  topo = topology(f.topology, f.num_slices, f.hbm_gb)
  batch_size = f.batch_size or config.train.batch_size
  remats = f.remat or [config.model.remat_policy]
  for remat in remats:
    if remat not in REMAT_POLICIES:
      raise ConfigError(f"--remat={remat}: use one of {', '.join(REMAT_POLICIES)}.")
  if not 0 <= f.batch_tolerance < 1:
    raise ConfigError(f"--batch_tolerance={f.batch_tolerance} must lie in [0, 1).")
  layouts = [_layout(text) for text in f.mesh]
  m, chip = config.model, topo.chip
  slices = f" x {f.num_slices} slices" if f.num_slices > 1 else ""
  if not f.summary:
    print(f"L={m.num_layers} H={m.hidden_size} V={m.vocab_size}, global batch {batch_size}"
          f" x {row_length(config)} tokens"
          + (" (queries and documents: a contrastive step)" if is_retrieval(config) else "")
          + (f" (groups of {config.task.group_size} pairs: a reranker's step)"
             if is_rerank(config) else "")
          + f", {platform_dtype(config, topo.devices[0].platform)} compute, scan_layers="
          f"{m.scan_layers}, attention {m.attention_impl or repr('')}, "
          f"{config.train.optimizer}; {f.topology}{slices}: {len(topo.devices)} x "
          f"{chip.name if chip else topo.devices[0].device_kind}, HBM "
          f"{topo.hbm_bytes / GIB:.2f} GiB a chip"
          + (f" ({chip.source})" if chip and not f.hbm_gb else " (--hbm_gb)")
          + (". CPU compiler: temporaries are an estimate." if not chip else ""))
    if "task" not in config and config.data.length_phases:
      print(f"config.data.length_phases={tuple(config.data.length_phases)}: planned at "
            f"one length, max_seq_length={config.data.max_seq_length} with "
            f"{config.data.max_predictions_per_seq} predictions; plan each phase with "
            "--config.data.max_seq_length=T --config.data.max_predictions_per_seq=P.")
  rows, chosen = [], None
  for remat in remats:
    for layout in layouts:
      if chosen and f.first_fit:
        break
      c = candidate(config, layout, remat, f.num_slices)
      r = plan(c, topo, batch_size, f.init)
      r.update(mesh=",".join(map(str, layout)), remat=remat)
      _progress(r)
      if f.max_batch and r["fits"] and not (chosen and f.first_fit):
        unit = (batch_size // r["per_chip_batch"]) * c.train.grad_accum_steps
        r["max_batch"], tries = largest_batch(c, topo, r, unit, f.batch_tolerance)
        r["batch_unit"] = unit
        r["capped"] = r["max_batch"] >= MAX_PER_UNIT * unit
        r["max_batch_tries"] = [{k: t.get(k) for k in ("batch_size", "fits", "peak",
                                                       "compile_s")} for t in tries]
      chosen = chosen or (r if r["fits"] else None)
      rows.append(r)
  if f.summary:
    _summary(config, f, batch_size, topo, chosen, rows)
  else:
    _print_tables(rows, f.max_batch, chip is not None, m.scan_layers, f.init)
    if chosen:
      print(f"chosen (the first that fits): mesh {chosen['mesh']}, remat "
            f"{chosen['remat']}, {chosen['per_chip_batch']} rows a chip, peak "
            f"{chosen['peak'] / GIB:.2f} of {topo.hbm_bytes / GIB:.2f} GiB")
    else:
      print("none fits: try FSDP (--mesh=1,-1,1), --remat=full, a smaller --batch_size "
            "or config.train.grad_accum_steps")
  if f.json:
    with open(f.json, "w") as out:
      json.dump({"topology": f.topology, "num_slices": f.num_slices,
                 "chips": len(topo.devices), "hbm_bytes": topo.hbm_bytes,
                 "chip": dataclasses.asdict(chip) if chip else None,
                 "candidates": rows}, out, indent=1)


def _summary(config, f, batch_size: int, topo: Topology, chosen, rows) -> None:
  """The chosen launch as one markdown row under its header (repeated by every call:
  a loop of calls piped through `awk '!seen[$0]++'` makes one table)."""
  head = ["recipe", "pod", "global batch x length", "mesh d,f,t", "remat", "scan",
          "attention", "rows a chip", "peak GiB / HBM", "max global batch",
          "roofline bound ms", "compiles, s"]
  slices = f" x {f.num_slices}" if f.num_slices > 1 else ""
  where = [os.path.basename(config_flags.get_config_filename(f["config"])),
           f"{f.topology}{slices}", f"{batch_size} x {row_length(config)}"]
  tries = [t for r in rows for t in [r, *r.get("max_batch_tries", [])]]
  seconds = f"{len(tries)}, {sum(t['compile_s'] for t in tries):.0f}"
  if chosen is None:
    line = [*where, "none fits", *["-"] * 7, seconds]
  else:
    line = [*where, chosen["mesh"], chosen["remat"], str(config.model.scan_layers),
            config.model.attention_impl or "''", str(chosen["per_chip_batch"]),
            f"{chosen['peak'] / GIB:.1f} / {topo.hbm_bytes / GIB:.1f}",
            _max_batch(chosen), f"{1e3 * chosen['roofline_s']:.0f}" if topo.chip else "-",
            seconds]
  _table(head, [line])


def _print_tables(rows: list[dict], max_batch: bool, tpu: bool, scanned: bool,
                  init: bool = False) -> None:
  head = ["mesh d,f,t", "remat", "batch/chip", "params", "opt state", "temporaries", "peak",
          "fits", *(["max global batch"] if max_batch else []), "compile s",
          *(["init compile s"] if init else [])]
  small = max(r.get("peak", GIB) for r in rows) < GIB
  unit, name = (2.0 ** 20, "MiB") if small else (GIB, "GiB")
  print(f"\nPer chip, {name} (params and optimizer state exact; temporaries and peak "
        "from the compiler):\n")
  lines = []
  for r in rows:
    if "error" in r:
      lines.append([r["mesh"], r["remat"], "-", "-", "-", "-", "over HBM", "no",
                    *(["-"] if max_batch else []), "-", *(["-"] if init else [])])
      continue
    lines.append([r["mesh"], r["remat"], str(r["per_chip_batch"]),
                  *(_size(r[k], unit) for k in ("params", "opt_state", "temp", "peak")),
                  "yes" if r["fits"] else "no",
                  *([_max_batch(r)] if max_batch else []),
                  f"{r['compile_s']:.0f}",
                  *([f"{r['init_compile_s']:.1f}"] if init else [])])
  _table(head, lines)
  head = ["mesh d,f,t", "remat", "compiler TFLOP", "bertjax.benchmarks.flops TFLOP", "compiler GB "
          "accessed", *(["roofline bound ms"] if tpu else [])]
  counted = all(r.get("flops") for r in rows if "error" not in r)
  notes = ((["the roofline bound max(FLOPs / peak, bytes / HBM bandwidth) is a lower "
             "bound, not a step time"] if tpu else [])
           + ([] if counted else ["a GPU's compiler counts no FLOPs here; its GB are "
                                  "the bytes its kernels read and write"])
           + (["the compiler counts the scanned layers' body once"] if scanned else []))
  print("\nPer chip and step" + (f" ({'; '.join(notes)})" if notes else "") + ":\n")
  _table(head, [[r["mesh"], r["remat"], f"{r['flops'] / 1e12:.3f}" if r["flops"] else "-",
                 f"{r['model_flops'] / 1e12:.3f}", f"{r['bytes_accessed'] / 1e9:.1f}",
                 *([f"{1e3 * r['roofline_s']:.1f}"] if tpu else [])]
                for r in rows if "error" not in r])


def _max_batch(r: dict) -> str:
  """The largest batch that fitted; `(< N)`: the smallest that did not, when the
  search stopped short of the next multiple (--batch_tolerance)."""
  if "max_batch" not in r:
    return "-"
  over = [t["batch_size"] for t in r["max_batch_tries"] if not t["fits"]]
  if r["capped"] or not over:
    return f">= {r['max_batch']}"
  return f"{r['max_batch']}" + (f" (< {min(over)})" if min(over) > r["max_batch"]
                                + r["batch_unit"] else "")


def _table(head: list[str], lines: list[list[str]]) -> None:
  """A markdown table (pastes into docs/scaling.md as printed)."""
  print("| " + " | ".join(head) + " |")
  print("|" + "---|" * len(head))
  for line in lines:
    print("| " + " | ".join(line) + " |")
