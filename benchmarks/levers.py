"""The GPU efficiency levers of issue 46, side by side in one process: `python -m
benchmarks levers --config=CONFIG [--batch=N --seq=L --dtype=bf16 --steps=5
--variants=base,unsafe_rbg,... --topology=h200 --json=F]`.

Builds `benchmark train`'s step (the recipe's jitted train step on its synthetic rows,
one device) once per variant and reports for each: the compiled program's instruction
counts (fusions, library calls, RNG and the integer ops threefry expands into,
scatters, erf), the bytes its kernels move by source (`xplane.kernel_bytes`), XLA's
cost analysis where the platform has one, temporary memory, compile seconds, and the
step time both with a host sync after every step (as `benchmark train` times) and
with the steps dispatched back to back, one sync at the end (as the trainer runs
them), from one initialised state. On a CPU the times are only ratios; the counts and
bytes are the program's. `--topology=h200` (or h100; `bertjax.benchmarks.gpu_target`)
compiles for that GPU on a machine without one and runs nothing: the GPU program's
counts, bytes and memory, no times. Variants (`VARIANTS`):

  base              the recipe as it is (activations rematerialised in the backward
                    pass, position tables read by a one-hot matmul off the CPU)
  activations_saved the activations' residuals kept for the backward pass instead
                    (`layers.ACTIVATIONS` without `jax.checkpoint`: bertjax before
                    2026-12-01; the same values)
  position_gather   absolute positions gathered, their gradient a scatter-add
                    (bertjax before 2026-12-01; the same values)
  unsafe_rbg, rbg   config.train.prng_impl: the train step's dropout key of that PRNG
                    implementation (the parameters' initialisation untouched): other
                    dropout masks for a seed
  threefry_kernel   the step's threefry bits from JAX's GPU kernel
                    (`compilation.threefry_kernel`, which the initialisation uses):
                    the same masks
  no_command_buffer, no_triton_gemm, cudnn_layer_norm
                    XLA GPU compiler options for this step only (GPU only: skipped on
                    other platforms)

  python -m benchmarks levers --config=configs/bert_base.py --batch=8 --seq=128
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time

import flax.linen as nn
import jax
from absl import flags

from benchmarks import gpu_report
from bertjax import objectives as objectives_lib
from bertjax.benchmarks import gpu_target, plan as plan_lib, xplane
from bertjax.benchmarks import train as train_bench
from bertjax.errors import ConfigError
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import compilation, state as state_lib

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Variant:
  prng_impl: str = ""  # config.train.prng_impl
  patch: str = ""  # a model patch (`patched`)
  options: tuple = ()  # XLA compiler options
  gpu_only: bool = False
  threefry_kernel: bool = False


VARIANTS = {
    "base": Variant(),
    "activations_saved": Variant(patch="activations_saved"),
    "position_gather": Variant(patch="position_gather"),
    "unsafe_rbg": Variant(prng_impl="unsafe_rbg"),
    "rbg": Variant(prng_impl="rbg"),
    "threefry_kernel": Variant(threefry_kernel=True, gpu_only=True),
    "no_command_buffer": Variant(options=(("xla_gpu_enable_command_buffer", ""),),
                                 gpu_only=True),
    "no_triton_gemm": Variant(options=(("xla_gpu_enable_triton_gemm", False),),
                              gpu_only=True),
    "cudnn_layer_norm": Variant(options=(("xla_gpu_enable_cudnn_layer_norm", True),),
                                gpu_only=True),
}


def define_flags() -> None:
  """Its own flags; --config, --batch, --seq, --dtype, --steps, --warmup and --json
  are `benchmark train`'s."""
  flags.DEFINE_list("variants", list(VARIANTS), f"Of {list(VARIANTS)}.")
  flags.DEFINE_string("topology", "", "Compile for this GPU (h100, h200) without one, "
                      "running nothing ('': the attached device).")


@contextlib.contextmanager
def patched(patch: str):
  """The model patch of a variant, undone on exit."""
  from bertjax.model import layers  # pylint: disable=g-import-not-at-top
  saved = (dict(layers.ACTIVATIONS), layers.gelu, layers.POSITION_ONE_HOT_ROWS)
  if patch == "activations_saved":
    for name, fn in saved[0].items():
      layers.ACTIVATIONS[name] = fn.__wrapped__  # jax.checkpoint's function
    layers.gelu = layers.ACTIVATIONS["gelu"]
  elif patch == "position_gather":
    layers.POSITION_ONE_HOT_ROWS = 0
  try:
    yield
  finally:
    layers.ACTIVATIONS.update(saved[0])
    layers.gelu, layers.POSITION_ONE_HOT_ROWS = saved[1:]


def with_prng(config, impl: str):
  """A copy of `config` whose train step draws from `impl` (config.train.prng_impl)."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.train.prng_impl = impl
  return config


def measure(trainer, state, data, steps: int, warmup: int, variant: Variant,
            run: bool = True):
  """(state, record) of one variant: compile, counts, bytes, memory and (with `run`)
  times. `state` and `data`: arrays, or abstract ones when not `run`."""
  start = time.perf_counter()
  with (compilation.threefry_kernel() if variant.threefry_kernel
        else contextlib.nullcontext()), gpu_target.cudnn_checks(trainer.mesh.devices.flat[0]):
    lowered = trainer.train_step.lower(state, data)
  compiled = lowered.compile(compiler_options=dict(variant.options) or None)
  compile_s = time.perf_counter() - start
  cost = compiled.cost_analysis() or {}
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  mem = compiled.memory_analysis()
  record = {"compile_s": compile_s, **xplane.hlo_counts(compiled.as_text()),
            "kernel_GB": xplane.kernel_bytes(xplane.compiled_program(compiled)),
            "temp_GiB": mem.temp_size_in_bytes / 2**30,
            "flops": float(cost.get("flops", 0.0)),
            "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
            "transcendentals": float(cost.get("transcendentals", 0.0))}
  if not run:
    return state, record
  seed = trainer.train_step.seed
  for _ in range(warmup):
    state, _ = compiled(state, data, seed)
  jax.block_until_ready(state)
  synced = []
  for _ in range(steps):
    t = time.perf_counter()
    state, metrics = compiled(state, data, seed)
    jax.block_until_ready(metrics["loss"])
    synced.append(time.perf_counter() - t)
  t = time.perf_counter()
  for _ in range(steps):
    state, metrics = compiled(state, data, seed)
  jax.block_until_ready(metrics["loss"])
  record.update(step_ms_synced=1e3 * sorted(synced)[len(synced) // 2],
                step_ms_pipelined=1e3 * (time.perf_counter() - t) / steps,
                loss=float(metrics["loss"]))
  return state, record


def run(config, batch: int, seq: int, predictions: int, variants: list[str],
        steps: int, warmup: int, topology: str = "") -> dict:
  target = gpu_target.parse(topology) if topology else None
  if topology and not target:
    raise ConfigError(f"--topology={topology}: a GPU to compile for: "
                      f"{', '.join(gpu_target.TARGETS)}.")
  devices = gpu_target.devices(*target)[:1] if target else jax.devices()[:1]
  live = not (target and gpu_target.compile_only(devices[0]))
  config.model.dtype = plan_lib.platform_dtype(config, devices[0].platform)
  gpu = devices[0].platform == "gpu"
  mesh = mesh_lib.create_mesh(config.mesh, devices)
  trainer = state_lib.build_trainer(config, mesh)
  host = train_bench.synthetic_batch(config, batch, seq, predictions,
                                     objectives_lib.from_config(config).fields, 0)
  with jax.set_mesh(trainer.mesh), nn.logical_axis_rules(trainer.rules):
    if live:
      state = trainer.init_state(config)  # The default PRNG: the recipe's parameters.
      data = mesh_lib.put_batch(host, trainer.batch_sharding)
    else:
      state = plan_lib.abstract_state(trainer)
      data = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=trainer.batch_sharding)
              for k, v in host.items()}
  out = {}
  for name in variants:
    variant = VARIANTS[name]
    if variant.gpu_only and not gpu:
      out[name] = {"skipped": "a GPU compiler option"}
      continue
    with patched(variant.patch):
      built = state_lib.build_trainer(with_prng(config, variant.prng_impl), mesh)  # Anew.
      with jax.set_mesh(built.mesh), nn.logical_axis_rules(built.rules):
        state, out[name] = measure(built, state, data, steps, warmup, variant, live)
    print(f"{name}: {format_record(out[name])}", flush=True)
  return {"device": devices[0].device_kind, "platform": devices[0].platform,
          "compile_only": not live, "batch": batch, "seq": seq,
          "dtype": config.model.dtype,
          "variants": out}


def format_record(r: dict) -> str:
  if "skipped" in r:
    return f"skipped ({r['skipped']})"
  times = (f"step {r['step_ms_synced']:.1f} ms synced, {r['step_ms_pipelined']:.1f} "
           "pipelined; " if "step_ms_synced" in r else "")
  return (f"{times}kernels move {r['kernel_GB']['total']['GB']:.2f} GB, temporaries "
          f"{r['temp_GiB']:.2f} GiB; {r['fusion']} fusions, {r['custom-call']} custom "
          f"calls, {r['rng-bit-generator']} rng ops, "
          f"{r['threefry ops (shift, xor, or)']} shift/xor/or, {r['scatter']} scatters, "
          f"{r['erf']} erf; compile {r['compile_s']:.1f} s")


def main(argv):
  del argv
  f = FLAGS
  unknown = sorted(set(f.variants) - set(VARIANTS))
  if unknown:
    raise ConfigError(f"--variants: unknown {unknown}; of {list(VARIANTS)}")
  if f.topology:
    gpu_target.before_jax_starts()
  config = f.config
  batch, seq, predictions = train_bench.sized(config, f.batch, f.seq, f.dtype)
  result = run(config, batch, seq, predictions, f.variants, max(f.steps, 1), f.warmup,
               f.topology)
  if f.json:
    with open(f.json, "w") as out:
      json.dump(result, out, indent=1, default=float)
  print(gpu_report.levers_table(result))
