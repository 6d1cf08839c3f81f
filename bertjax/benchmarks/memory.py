"""`python -m bertjax.benchmark memory --config=configs/bert_large.py --mesh=1,8,1 ...`

Per-device memory of the sharded train step for each mesh layout, found by compiling
it ahead of time (`jit(...).lower(...).compile()`) for fake CPU devices: nothing is
allocated, so a pod-sized layout is planned on a laptop. Columns (per device):
parameters and optimizer state (from their shardings, exact), temporaries (XLA's
buffer assignment for the step: activations, gradients, collectives' buffers) and the
peak (arguments + temporaries + non-donated outputs). With `--device_memory_gb` each
layout is compiled at two batch sizes and the largest global batch that fits is
extrapolated linearly; with `--time_steps` the step also runs on the CPU devices
(small configs only) and its mean wall time is shown.

Temporaries come from the CPU compiler: TPU and GPU compilers fuse and schedule
differently, so treat them as an estimate (parameters and optimizer state are exact).
"""

from __future__ import annotations

import time

import flax.linen as nn
import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Recipe file.", lock_config=True)
_MESH = flags.DEFINE_multi_string(
    "mesh", ["8,1,1", "1,8,1", "2,2,2", "1,2,4"],
    "A layout 'data,fsdp,tensor' (repeat the flag for several); fake CPU devices are "
    "created for the largest.")
_BATCH = flags.DEFINE_integer("batch_size", 0, "Global batch (0: the config's).")
_MEMORY = flags.DEFINE_float("device_memory_gb", 0.0, "Memory per device (GiB), e.g. 16 "
                             "for TPU v5e, 32 for v4, 80 for H100; 0 skips the max batch.")
_STEPS = flags.DEFINE_integer("time_steps", 0, "Also run and time this many steps (0: "
                              "compile only).")

GIB, MIB = 2.0 ** 30, 2.0 ** 20


def _batch_spec(config, batch_size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  T, P = config.data.max_seq_length, config.data.max_predictions_per_seq
  spec = {"input_ids": ((batch_size, T), np.int32), "attention_mask": ((batch_size, T), np.int32),
          "token_type_ids": ((batch_size, T), np.int32),
          "masked_lm_positions": ((batch_size, P), np.int32),
          "masked_lm_ids": ((batch_size, P), np.int32),
          "masked_lm_weights": ((batch_size, P), np.float32)}
  if config.model.nsp:
    spec["next_sentence_labels"] = ((batch_size,), np.int32)
  return spec


def _random_batch(config, batch_size: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  out = {}
  for k, (shape, dtype) in _batch_spec(config, batch_size).items():
    high = {"input_ids": config.model.vocab_size, "masked_lm_ids": config.model.vocab_size,
            "masked_lm_positions": config.data.max_seq_length, "token_type_ids": 2,
            "next_sentence_labels": 2}.get(k)
    out[k] = rng.integers(0, high, shape).astype(dtype) if high else np.ones(shape, dtype)
  return out


def _shard_bytes(tree, shardings) -> int:
  """Bytes one device holds of `tree` (abstract arrays) placed on `shardings`."""
  return sum(int(np.prod(s.shard_shape(a.shape))) * a.dtype.itemsize
             for a, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)))


def plan(config, layout: tuple[int, int, int], batch_size: int, time_steps: int = 0,
         batch_sizes: tuple[int, ...] = ()) -> dict:
  """Per-device bytes of one layout (and the temporaries at extra `batch_sizes`)."""
  from bertjax.parallel import mesh as mesh_lib
  from bertjax.train import state as state_lib

  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = layout
  trainer = state_lib.build_trainer(
      config, mesh_lib.create_mesh(config.mesh, jax.devices()[:int(np.prod(layout))]))
  abstract, shardings, bsh = trainer.abstract, trainer.shardings, trainer.batch_sharding
  step = trainer.train_step
  result = {"params": _shard_bytes(abstract.params, shardings.params),
            "opt_state": _shard_bytes(abstract.opt_state, shardings.opt_state)}
  with jax.set_mesh(trainer.mesh), nn.logical_axis_rules(trainer.rules):
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         abstract, shardings)
    temps = {}
    for b in (batch_size, *batch_sizes):
      batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=bsh)
               for k, (shape, dtype) in _batch_spec(config, b).items()}
      start = time.perf_counter()
      compiled = step.lower(state, batch).compile()
      if b == batch_size:
        result["compile_s"] = time.perf_counter() - start
        mem = compiled.memory_analysis()
        result["temp"] = mem.temp_size_in_bytes
        result["peak"] = (mem.argument_size_in_bytes + mem.temp_size_in_bytes
                          + mem.output_size_in_bytes - mem.alias_size_in_bytes)
      temps[b] = compiled.memory_analysis().temp_size_in_bytes
    result["temp_by_batch"] = temps
    if time_steps:
      live = trainer.init_state(config)
      batch = mesh_lib.put_batch(_random_batch(config, batch_size), bsh)
      live, _ = step(live, batch)  # Compile and warm up.
      jax.block_until_ready(live)
      start = time.perf_counter()
      for _ in range(time_steps):
        live, metrics = step(live, batch)
      jax.block_until_ready(metrics)
      result["step_s"] = (time.perf_counter() - start) / time_steps
  return result


def max_batch(result: dict, memory_bytes: float, multiple: int) -> int:
  """Largest global batch (a multiple of the data-parallel size) whose extrapolated
  peak fits: temporaries grow linearly with the batch, the rest is fixed."""
  (b0, t0), (b1, t1) = sorted(result["temp_by_batch"].items())[:2]
  per_example = max((t1 - t0) / (b1 - b0), 1.0)  # Bytes per device per global example.
  fixed = result["peak"] - per_example * b0  # The peak at batch 0.
  fits = int((memory_bytes - fixed) // per_example)
  return max(fits // multiple * multiple, 0)


def main(argv) -> None:
  del argv
  from bertjax.errors import ConfigError

  config = _CONFIG.value
  layouts = []
  for text in _MESH.value:
    try:
      layouts.append(tuple(int(x) for x in text.split(",")))
    except ValueError:
      layouts.append(())
    if len(layouts[-1]) != 3 or min(layouts[-1]) < 1:
      raise ConfigError(f"--mesh={text}: give three positive sizes 'data,fsdp,tensor'.")
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", max(int(np.prod(m)) for m in layouts))
  batch_size = _BATCH.value or config.train.batch_size
  rows = []
  print(f"{config.model.num_layers} layers, hidden {config.model.hidden_size}, vocab "
        f"{config.model.vocab_size}; global batch {batch_size} x "
        f"{config.data.max_seq_length} tokens; {config.model.dtype} compute. Per device, MiB:")
  header = ["data,fsdp,tensor", "params", "opt state", "temporaries", "peak", "compile s"]
  if _STEPS.value:
    header.append("step s (CPU)")
  if _MEMORY.value:
    header.append(f"max batch @ {_MEMORY.value:g} GiB")
  for layout in layouts:
    dp = layout[0] * layout[1]
    if batch_size % dp:
      raise ConfigError(f"--batch_size={batch_size} is not divisible by data x fsdp = {dp} "
                        f"of --mesh={','.join(map(str, layout))}.")
    r = plan(config, layout, batch_size, _STEPS.value,
             (2 * batch_size,) if _MEMORY.value else ())
    row = [",".join(map(str, layout)), *(f"{r[k] / MIB:,.1f}" for k in
                                          ("params", "opt_state", "temp", "peak")),
           f"{r['compile_s']:.1f}"]
    if _STEPS.value:
      row.append(f"{r['step_s']:.3f}")
    if _MEMORY.value:
      row.append(str(max_batch(r, _MEMORY.value * GIB, dp)))
    rows.append(row)
  widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
  for r in [header, *rows]:
    print(" | ".join(c.rjust(w) for c, w in zip(r, widths)))
