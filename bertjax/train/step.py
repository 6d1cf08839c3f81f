"""The pure train step every run shares: `(state, batch) -> (state, metrics)`.

What is trained is an `Objective` (pretraining's: `bertjax.train.objective`; each
fine-tuning task's: `bertjax.tasks.finetune`). The step draws dropout from (seed, step),
gives each row its own key where the objective asks for one (`row_keys`: the same
whichever micro-batch or device the row lands in), splits the batch into
`grad_accum_steps` micro-batches whose gradients add up to the whole batch's exactly,
applies the optimizer (whose `skip_spikes` wrapper may drop the update), and adds the
step's metrics to the log window held in the state, so the numbers logged for a step do
not depend on where a run was interrupted and resumed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax

from bertjax.objectives.base import row_keys
from bertjax.train import spikes

# config.train.prng_impl: the train step key's PRNG implementation ('' = JAX's default).
PRNG_IMPLS = ("", "threefry2x32", "rbg", "unsafe_rbg")

# Metrics of every step besides the objective's own (`Objective.metric_names`).
STEP_METRICS = ("loss", "grad_norm", "param_norm", "learning_rate")


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # [] int32, steps taken (batches consumed; skipped spikes included)
  params: Any
  opt_state: Any
  # The current log window (`new_window`): sums of the metrics of its accepted steps.
  window: Any

  def fields(self) -> dict[str, Any]:
    """{field name: value}: what `Checkpointer.save` stores and `restore` targets."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class Objective:
  """What the trainer minimises, given as sums so that micro-batches add up exactly.

  init: rng -> the parameters, boxed in `nn.Partitioned` (traced: no memory when
    shapes are all that is asked).
  sums: (params, batch, dropout rng or None: deterministic) -> {name: []} losses and
    correct counts summed over the batch's targets (rows weighing 0 add nothing).
  counts: batch -> {name: []} the denominators, from the batch alone.
  loss: (sums, counts) -> [] the objective; linear in `sums`.
  metrics: (sums, counts) -> {name: []} logged each step, named `metric_names`.
  row_keys: `sums` reads batch['row_keys'] ([B] keys, `row_keys`: one a row, from the
    step's key and the row's index in the step's batch), so that what it draws for a
    row (RTD's generator samples) is the same with any `grad_accum_steps` and mesh.
  """

  init: Callable[[jax.Array], Any]
  sums: Callable[[Any, dict, jax.Array | None], dict[str, jax.Array]]
  counts: Callable[[dict], dict[str, jax.Array]]
  loss: Callable[[dict, dict], jax.Array]
  metrics: Callable[[dict, dict], dict[str, jax.Array]]
  metric_names: tuple[str, ...]
  row_keys: bool = False


def new_window(objective: Objective) -> dict[str, Any]:
  """An empty log window: the metric sums over its accepted (not skipped) steps, their
  count, and the current and the window's longest runs of skipped steps."""
  zero = lambda dtype=jnp.float32: jnp.zeros((), dtype)
  return {"sums": {k: zero() for k in (*objective.metric_names, *STEP_METRICS)},
          "steps": zero(), "skip_run": zero(jnp.int32),
          "longest_skip_run": zero(jnp.int32)}


def make_train_step(objective: Objective, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, grad_accum_steps: int = 1,
                    log_every: int = 1, prng_impl: str = ""
                    ) -> Callable[[TrainState, dict, jax.Array], tuple[TrainState, dict]]:
  """The train step `(state, batch, seed) -> (state, metrics)`: the run's seed (an
  int32 scalar) an argument, so that one compiled program serves every seed (a sweep,
  a benchmark's seeds); the step's randomness is `fold_in(key(seed), step)`, the same
  bits as with the seed a constant. With gradient accumulation the batch is split into
  `grad_accum_steps` micro-batches whose summed gradients equal the full batch's
  (losses are normalised by whole-batch counts). A log window starts at every step
  that is a multiple of `log_every` (counted before the step). `prng_impl` names the
  PRNG implementation of the step's key (`jax.random.key`'s impl: 'threefry2x32',
  'rbg', 'unsafe_rbg'; '' the default, threefry): it draws the dropout masks, so another
  one changes every mask of a seed's run. Where `objective.row_keys`, row r of the
  batch gets `row_keys(step key, r)` as batch['row_keys'] (in its micro-batch),
  whatever the micro-batches; dropout is drawn per micro-batch (key
  `fold_in(step key, i)`, over the micro-batch's shape), so only without dropout do
  accumulated micro-batches train exactly as the whole batch.

  Returns metrics: this step's (`STEP_METRICS`, the objective's; with spike skipping
  `skipped` and `skipped_steps`), and `window`: the means over the window's accepted
  steps so far (this step's values when it has none) with `skipped_steps`,
  `window_steps` and `longest_skip_run`.
  """

  def train_step(state: TrainState, batch: dict, seed: jax.Array
                 ) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(jax.random.key(seed, impl=prng_impl or None), state.step)
    counts = objective.counts(batch)
    # Each row's index in the step's batch, split into micro-batches with the rows.
    rows = jnp.arange(jax.tree.leaves(batch)[0].shape[0], dtype=jnp.int32)

    def grads_of(micro, micro_rows, micro_rng):
      if objective.row_keys:
        micro = {**micro, "row_keys": row_keys(rng, micro_rows)}

      def loss_fn(params):
        sums = objective.sums(params, micro, micro_rng)
        return objective.loss(sums, counts), sums
      return jax.grad(loss_fn, has_aux=True)(state.params)

    if grad_accum_steps == 1:
      grads, sums = grads_of(batch, rows, rng)
    else:
      # Row r of micro-batch i is global row r * A + i: each device keeps its own rows.
      micro, micro_rows = jax.tree.map(
          lambda x: jnp.swapaxes(x.reshape(-1, grad_accum_steps, *x.shape[1:]), 0, 1),
          (batch, rows))

      def body(carry, xs):
        i, mb, mr = xs
        g, s = grads_of(mb, mr, jax.random.fold_in(rng, i))
        return jax.tree.map(jnp.add, carry, (g, s)), None

      zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(
          lambda: grads_of(*jax.tree.map(lambda x: x[0], (micro, micro_rows)), rng)))
      (grads, sums), _ = jax.lax.scan(
          body, zeros, (jnp.arange(grad_accum_steps), micro, micro_rows))

    loss = objective.loss(sums, counts)
    metrics = dict(objective.metrics(sums, counts))
    optimizer_steps = state.step  # Steps the optimizer took: the schedule's position.
    skipped = jnp.zeros((), bool)
    if isinstance(state.opt_state, spikes.SpikeState):  # skip_step_on_spikes
      updates, opt_state = tx.update(grads, state.opt_state, state.params, loss=loss)
      optimizer_steps = state.step - state.opt_state.skipped
      skipped = opt_state.last_skipped
    else:
      updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics.update(loss=loss, grad_norm=optax.tree.norm(grads),
                   param_norm=optax.tree.norm(params),
                   learning_rate=schedule(optimizer_steps))
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    window = _add_to_window(state.window, metrics, skipped, state.step % log_every == 0)
    means = jax.tree.map(lambda s, m: jnp.where(window["steps"] > 0,
                                                s / jnp.maximum(window["steps"], 1.0), m),
                         window["sums"], metrics)
    out = dict(metrics, window=dict(means, window_steps=window["steps"],
                                     longest_skip_run=window["longest_skip_run"]))
    if isinstance(opt_state, spikes.SpikeState):
      out["skipped"] = skipped.astype(jnp.float32)
      out["skipped_steps"] = out["window"]["skipped_steps"] = (
          opt_state.skipped.astype(jnp.float32))
    return TrainState(state.step + 1, params, opt_state, window), out

  return train_step


def _add_to_window(window, metrics, skipped, fresh):
  """The window after a step: emptied first when `fresh`; a skipped step adds nothing
  to the sums (its values may be NaN) and extends the run of skips."""
  keep = lambda x: jnp.where(fresh, jnp.zeros_like(x), x)
  sums = jax.tree.map(lambda s, m: keep(s) + jnp.where(skipped, 0.0, m), window["sums"],
                      metrics)
  run = jnp.where(skipped, window["skip_run"] + 1, 0)
  return {"sums": sums, "steps": keep(window["steps"]) + jnp.where(skipped, 0.0, 1.0),
          "skip_run": run, "longest_skip_run": jnp.maximum(keep(window["longest_skip_run"]),
                                                           run)}
