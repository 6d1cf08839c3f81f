"""Where a train step's time goes: `python -m bertjax.benchmark profile --config=CONFIG
[--batch=N --seq=L --dtype=bf16 --docs_per_row=D --steps=2 --trace_dir=DIR --json=F]`.

Runs `benchmark train`'s step (the recipe's jitted train step on its synthetic rows,
on one device; the flags are `benchmark train`'s, --steps the traced steps) twice, then
`--steps` more under `jax.profiler.trace`, each with its batch put on the device anew
(the host's seconds for that measured around it), and prints the device time a step
by category and the largest ops (`bertjax.benchmarks.trace`). The trace stays in
--trace_dir (default: a new temporary folder); results go to --json.
"""

from __future__ import annotations

import json
import tempfile
import time

import flax.linen as nn
import jax
from absl import flags

from bertjax import writes
from bertjax import objectives as objectives_lib
from bertjax.benchmarks import trace
from bertjax.benchmarks import train as train_bench
from bertjax.errors import ConfigError
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import state as state_lib

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Its own flags; --config, --batch, --seq, --dtype, --docs_per_row, --steps (here:
  the traced steps, after two untraced ones) and --json are `benchmark train`'s."""
  flags.DEFINE_integer("top", 10, "Largest ops listed.")
  flags.DEFINE_string("trace_dir", "", "Where the trace goes (default: a new temporary "
                      "folder).")


def profile(config, batch: int, seq: int, predictions: int, docs_per_row: int,
            steps: int, trace_dir: str) -> dict:
  """Compiles the train step on one device, runs two steps, traces `steps` more (each
  with its batch put on the device anew) and summarizes the trace."""
  devices = jax.devices()[:1]
  trainer = state_lib.build_trainer(config, mesh_lib.create_mesh(config.mesh, devices))
  host = train_bench.synthetic_batch(config, batch, seq, predictions,
                                     objectives_lib.from_config(config).fields,
                                     docs_per_row)
  with jax.set_mesh(trainer.mesh), nn.logical_axis_rules(trainer.rules):
    state = trainer.init_state(config)
    data = mesh_lib.put_batch(host, trainer.batch_sharding)
    compiled = trainer.train_step.lower(state, data).compile()
    for _ in range(2):
      state, metrics = compiled(state, data, trainer.train_step.seed)
    jax.block_until_ready(metrics)
    put_s = step_s = 0.0
    with jax.profiler.trace(trace_dir):
      for _ in range(steps):
        start = time.perf_counter()
        data = jax.block_until_ready(mesh_lib.put_batch(host, trainer.batch_sharding))
        put_s += time.perf_counter() - start
        start = time.perf_counter()
        state, metrics = compiled(state, data, trainer.train_step.seed)
        jax.block_until_ready(metrics)
        step_s += time.perf_counter() - start
  return {"device": devices[0].device_kind, "platform": devices[0].platform,
          "batch": batch, "seq": seq, "docs_per_row": docs_per_row, "steps": steps,
          "step_ms": 1e3 * step_s / steps, "put_batch_ms": 1e3 * put_s / steps,
          **trace.analyze(trace_dir, compiled.as_text(), steps),
          "loss": float(metrics["loss"]), "trace_dir": trace_dir}


def main(argv):
  del argv
  f = FLAGS
  config = f.config
  batch, seq, predictions = train_bench.sized(config, f.batch, f.seq, f.dtype)
  if f.steps < 1:
    raise ConfigError("--steps must be at least 1.")
  trace_dir = f.trace_dir or tempfile.mkdtemp(prefix="bertjax_profile_")
  writes.claim(trace_dir, writes.BENCHMARK, "profile", flag="--trace_dir")
  writes.record(trace_dir, writes.BENCHMARK, "profile")
  result = profile(config, batch, seq, predictions, f.docs_per_row, f.steps, trace_dir)
  if f.json:
    with open(f.json, "w") as out:
      json.dump(result, out, indent=1)
  print(trace.format_table(result, f.top))
