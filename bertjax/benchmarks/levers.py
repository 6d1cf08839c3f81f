"""The GPU efficiency levers of issue 46, side by side in one process: `python -m
bertjax.benchmark levers --config=CONFIG [--batch=N --seq=L --dtype=bf16 --steps=5
--variants=base,unsafe_rbg,... --json=F]`.

Builds `benchmark train`'s step (the recipe's jitted train step on its synthetic rows,
one device) once per variant, from one initialised state, and reports for each: the
compiled program's instruction counts (fusions, library calls, RNG and the integer ops
threefry expands into, scatters, erf), XLA's cost analysis (FLOPs, bytes accessed,
transcendentals), compile seconds, and the step time both with a host sync after every
step (as `benchmark train` times) and with the steps dispatched back to back, one sync
at the end (as the trainer runs them). On a CPU the times are only ratios; the counts
and bytes are the program's. Variants (`VARIANTS`):

  base              the recipe as it is
  unsafe_rbg, rbg   config.train.prng_impl: the train step's dropout key of that PRNG
                    implementation (the parameters' initialisation untouched): other
                    dropout masks for a seed
  gelu_recompute    BERT's exact GELU with a custom VJP that saves only its input and
                    recomputes erf in the backward pass (same forward values; a model
                    change, patched here for the measurement)
  position_one_hot  absolute position embeddings (512 rows) looked up by a one-hot
                    matmul, as `Embed` does for tables of <= ONE_HOT_ROWS rows (its
                    gradient a matmul, not a scatter-add; a model change, patched here)
  no_command_buffer, no_triton_gemm, cudnn_layer_norm
                    XLA GPU compiler options for this step only (GPU only: skipped on
                    other platforms)

  python -m bertjax.benchmark levers --config=configs/bert_base.py --batch=8 --seq=128
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import flags

from bertjax import objectives as objectives_lib
from bertjax.benchmarks import train as train_bench
from bertjax.errors import ConfigError
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import state as state_lib

FLAGS = flags.FLAGS

# name -> (PRNG implementation or '', model patch or '', XLA compiler options, GPU only)
VARIANTS = {
    "base": ("", "", {}, False),
    "unsafe_rbg": ("unsafe_rbg", "", {}, False),
    "rbg": ("rbg", "", {}, False),
    "gelu_recompute": ("", "gelu_recompute", {}, False),
    "position_one_hot": ("", "position_one_hot", {}, False),
    "no_command_buffer": ("", "", {"xla_gpu_enable_command_buffer": ""}, True),
    "no_triton_gemm": ("", "", {"xla_gpu_enable_triton_gemm": False}, True),
    "cudnn_layer_norm": ("", "", {"xla_gpu_enable_cudnn_layer_norm": True}, True),
}


def define_flags() -> None:
  """Its own flags; --config, --batch, --seq, --dtype, --steps, --warmup and --json
  are `benchmark train`'s."""
  flags.DEFINE_list("variants", list(VARIANTS), f"Of {list(VARIANTS)}.")


@jax.custom_vjp
def gelu_recompute(x):
  """Exact GELU, x * Phi(x), saving only x for the backward pass."""
  return nn.gelu(x, approximate=False)


def _gelu_fwd(x):
  return gelu_recompute(x), x


def _gelu_bwd(x, g):
  f = x.astype(jnp.float32)
  cdf = 0.5 * jax.lax.erfc(-f / jnp.sqrt(2.0).astype(jnp.float32))
  pdf = jnp.exp(-0.5 * f * f) / jnp.sqrt(2 * jnp.pi).astype(jnp.float32)
  return ((g.astype(jnp.float32) * (cdf + f * pdf)).astype(x.dtype),)


gelu_recompute.defvjp(_gelu_fwd, _gelu_bwd)


@contextlib.contextmanager
def patched(patch: str):
  """The model patch of a variant, undone on exit."""
  from bertjax.model import bert, layers  # pylint: disable=g-import-not-at-top
  saved = (bert.TransformerBlock.activation, layers.ONE_HOT_ROWS)
  if patch == "gelu_recompute":
    bert.TransformerBlock.activation = staticmethod(lambda cfg, h: gelu_recompute(h))
  elif patch == "position_one_hot":
    layers.ONE_HOT_ROWS = 512
  try:
    yield
  finally:
    bert.TransformerBlock.activation = staticmethod(saved[0])
    layers.ONE_HOT_ROWS = saved[1]


def with_prng(config, impl: str):
  """A copy of `config` whose train step draws from `impl` (config.train.prng_impl)."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.train.prng_impl = impl
  return config


_OPCODE = re.compile(r"=\s*(?:\([^=]*?\)|[\w\[\]{},:\d]+)\s+([\w\-]+)\(")


def hlo_counts(text: str) -> dict[str, int]:
  """Instruction counts of an optimized HLO module's text, fused computations
  included: fusions, custom calls (library GEMMs, attention), RNG ops, the integer
  ops threefry expands into, scatters, erf."""
  ops = collections.Counter(m.group(1) for m in _OPCODE.finditer(text))
  return {"instructions": sum(ops.values()), "fusion": ops["fusion"],
          "custom-call": ops["custom-call"],
          "rng-bit-generator": ops["rng-bit-generator"] + ops["rng"],
          "threefry ops (shift, xor, or)": sum(ops[k] for k in (
              "shift-left", "shift-right-logical", "xor", "or")),
          "scatter": ops["scatter"], "erf": ops["erf"]}


def measure(trainer, state, data, steps: int, warmup: int, options: dict):
  """(state, record) of one variant: compile, counts, cost, times."""
  start = time.perf_counter()
  lowered = trainer.train_step.lower(state, data)
  compiled = lowered.compile(compiler_options=options or None)
  compile_s = time.perf_counter() - start
  cost = compiled.cost_analysis() or {}
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
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
  pipelined = (time.perf_counter() - t) / steps
  record = {"compile_s": compile_s, **hlo_counts(compiled.as_text()),
            "flops": float(cost.get("flops", 0.0)),
            "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
            "transcendentals": float(cost.get("transcendentals", 0.0)),
            "step_ms_synced": 1e3 * sorted(synced)[len(synced) // 2],
            "step_ms_pipelined": 1e3 * pipelined, "loss": float(metrics["loss"])}
  return state, record


def run(config, batch: int, seq: int, predictions: int, variants: list[str],
        steps: int, warmup: int) -> dict:
  devices = jax.devices()[:1]
  gpu = devices[0].platform == "gpu"
  mesh = mesh_lib.create_mesh(config.mesh, devices)
  trainer = state_lib.build_trainer(config, mesh)
  host = train_bench.synthetic_batch(config, batch, seq, predictions,
                                     objectives_lib.from_config(config).fields, 0)
  out = {}
  with jax.set_mesh(trainer.mesh), nn.logical_axis_rules(trainer.rules):
    state = trainer.init_state(config)  # The default PRNG: the recipe's parameters.
    data = mesh_lib.put_batch(host, trainer.batch_sharding)
  for name in variants:
    impl, patch, options, gpu_only = VARIANTS[name]
    if gpu_only and not gpu:
      out[name] = {"skipped": "a GPU compiler option"}
      continue
    with patched(patch):
      variant = state_lib.build_trainer(with_prng(config, impl), mesh)  # Traced anew.
      with jax.set_mesh(variant.mesh), nn.logical_axis_rules(variant.rules):
        state, out[name] = measure(variant, state, data, steps, warmup, options)
    print(f"{name}: {format_record(out[name])}", flush=True)
  return {"device": devices[0].device_kind, "platform": devices[0].platform,
          "batch": batch, "seq": seq, "dtype": jnp.dtype(config.model.dtype).name
          if config.model.dtype else "", "variants": out}


def format_record(r: dict) -> str:
  if "skipped" in r:
    return f"skipped ({r['skipped']})"
  return (f"step {r['step_ms_synced']:.1f} ms synced, {r['step_ms_pipelined']:.1f} "
          f"pipelined; {r['bytes_accessed'] / 1e9:.2f} GB accessed, "
          f"{r['flops'] / 1e12:.3f} TFLOP, {r['transcendentals'] / 1e6:.0f} M "
          f"transcendentals; {r['fusion']} fusions, {r['custom-call']} custom calls, "
          f"{r['rng-bit-generator']} rng ops, {r['threefry ops (shift, xor, or)']} "
          f"shift/xor/or, {r['scatter']} scatters, {r['erf']} erf; compile "
          f"{r['compile_s']:.1f} s")


def main(argv):
  del argv
  f = FLAGS
  unknown = sorted(set(f.variants) - set(VARIANTS))
  if unknown:
    raise ConfigError(f"--variants: unknown {unknown}; of {list(VARIANTS)}")
  config = f.config
  batch, seq, predictions = train_bench.sized(config, f.batch, f.seq, f.dtype)
  result = run(config, batch, seq, predictions, f.variants, max(f.steps, 1), f.warmup)
  if f.json:
    with open(f.json, "w") as out:
      json.dump(result, out, indent=1)
  base = result["variants"].get("base", {})
  print(f"{'variant':18} {'synced ms':>9} {'piped ms':>9} {'GB accessed':>11} "
        f"{'vs base':>8} {'fusions':>7} {'rng':>4} {'shift/xor/or':>12} {'scatter':>7}")
  for name, r in result["variants"].items():
    if "skipped" in r:
      print(f"{name:18} skipped: {r['skipped']}")
      continue
    ratio = (r["bytes_accessed"] / base["bytes_accessed"]
             if base.get("bytes_accessed") else float("nan"))
    print(f"{name:18} {r['step_ms_synced']:9.1f} {r['step_ms_pipelined']:9.1f} "
          f"{r['bytes_accessed'] / 1e9:11.3f} {ratio:8.3f} {r['fusion']:7d} "
          f"{r['rng-bit-generator']:4d} {r['threefry ops (shift, xor, or)']:12d} "
          f"{r['scatter']:7d}")
