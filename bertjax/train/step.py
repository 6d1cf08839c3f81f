"""Pure train and eval steps: `(state, batch) -> (state, metrics)`.

Batch keys (global arrays, leading dim B): input_ids, attention_mask, token_type_ids
[B, T]; masked_lm_positions, masked_lm_ids, masked_lm_weights [B, P];
next_sentence_labels [B] (NSP only); optionally position_ids, segment_ids [B, T];
span_left_positions, span_right_positions, span_relative_positions [B, P] (SBO only:
the SBO loss is the mean cross-entropy of the same targets as the MLM loss).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax

from bertjax.model import BertForPreTraining
from bertjax.train import spikes

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "masked_lm_positions",
                "position_ids", "segment_ids", "span_left_positions",
                "span_right_positions", "span_relative_positions")


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # [] int32, steps taken (batches consumed; skipped spikes included)
  params: Any
  opt_state: Any

  def fields(self) -> dict[str, Any]:
    """{field name: value}: what `Checkpointer.save` stores and `restore` targets."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _loss_sums(model: BertForPreTraining, params, batch, rng, deterministic: bool):
  """Summed (not averaged) losses and correct counts over the batch's predictions."""
  inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
  out = model.apply({"params": params}, **inputs, deterministic=deterministic,
                    rngs=None if deterministic else {"dropout": rng})
  logits, labels = out["mlm_logits"], batch["masked_lm_ids"]  # [B, P, V], [B, P]
  weights = batch["masked_lm_weights"]
  xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  sums = {"mlm_loss": jnp.sum(xent * weights),
          "mlm_correct": jnp.sum((jnp.argmax(logits, -1) == labels) * weights)}
  if "sbo_logits" in out:
    sbo = optax.softmax_cross_entropy_with_integer_labels(out["sbo_logits"], labels)
    sums["sbo_loss"] = jnp.sum(sbo * weights)
    sums["sbo_correct"] = jnp.sum((jnp.argmax(out["sbo_logits"], -1) == labels) * weights)
  if "nsp_logits" in out:
    nsp_w = batch.get("example_weights", jnp.ones(labels.shape[:1], jnp.float32))
    nsp_labels = batch["next_sentence_labels"]
    sums["nsp_loss"] = jnp.sum(optax.softmax_cross_entropy_with_integer_labels(
        out["nsp_logits"], nsp_labels) * nsp_w)
    sums["nsp_correct"] = jnp.sum((jnp.argmax(out["nsp_logits"], -1) == nsp_labels) * nsp_w)
  return sums


def _counts(batch) -> dict[str, jax.Array]:
  counts = {"mlm": jnp.sum(batch["masked_lm_weights"])}
  if "next_sentence_labels" in batch:
    counts["nsp"] = jnp.sum(batch.get(
        "example_weights", jnp.ones(batch["next_sentence_labels"].shape, jnp.float32)))
  return counts


def _objective(sums, counts):
  """Mean MLM cross-entropy over the chosen tokens (+ mean NSP cross-entropy, + mean
  SBO cross-entropy over the same tokens)."""
  loss = sums["mlm_loss"] / jnp.maximum(counts["mlm"], 1.0)
  if "sbo_loss" in sums:
    loss = loss + sums["sbo_loss"] / jnp.maximum(counts["mlm"], 1.0)
  if "nsp_loss" in sums:
    loss = loss + sums["nsp_loss"] / jnp.maximum(counts["nsp"], 1.0)
  return loss


def make_train_step(model: BertForPreTraining, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, seed: int, grad_accum_steps: int = 1
                    ) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
  """The train step. Dropout RNG is folded from (seed, step). With gradient
  accumulation the batch is split into `grad_accum_steps` micro-batches whose summed
  gradients equal the full batch's exactly (losses are normalised by whole-batch counts)."""

  def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(jax.random.key(seed), state.step)
    counts = _counts(batch)

    def grads_of(micro, micro_rng):
      def loss_fn(params):
        sums = _loss_sums(model, params, micro, micro_rng, deterministic=False)
        return _objective(sums, counts), sums
      return jax.grad(loss_fn, has_aux=True)(state.params)

    if grad_accum_steps == 1:
      grads, sums = grads_of(batch, rng)
    else:
      # Row r of micro-batch i is global row r * A + i: each device keeps its own rows.
      micro = jax.tree.map(
          lambda x: jnp.swapaxes(x.reshape(-1, grad_accum_steps, *x.shape[1:]), 0, 1), batch)

      def body(carry, xs):
        i, mb = xs
        g, s = grads_of(mb, jax.random.fold_in(rng, i))
        return jax.tree.map(jnp.add, carry, (g, s)), None

      zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(
          lambda: grads_of(jax.tree.map(lambda x: x[0], micro), rng)))
      (grads, sums), _ = jax.lax.scan(
          body, zeros, (jnp.arange(grad_accum_steps), micro))

    loss = _objective(sums, counts)
    metrics = _metrics(sums, counts)
    optimizer_steps = state.step  # Steps the optimizer took: the schedule's position.
    if isinstance(state.opt_state, spikes.SpikeState):  # skip_step_on_spikes
      updates, opt_state = tx.update(grads, state.opt_state, state.params, loss=loss)
      optimizer_steps = state.step - state.opt_state.skipped
      metrics["skipped"] = opt_state.last_skipped.astype(jnp.float32)
      metrics["skipped_steps"] = opt_state.skipped.astype(jnp.float32)
    else:
      updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["loss"] = loss
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["param_norm"] = optax.tree.norm(params)
    metrics["learning_rate"] = schedule(optimizer_steps)
    return TrainState(state.step + 1, params, opt_state), metrics

  return train_step


def _metrics(sums, counts):
  m = {"mlm_loss": sums["mlm_loss"] / jnp.maximum(counts["mlm"], 1.0),
       "mlm_accuracy": sums["mlm_correct"] / jnp.maximum(counts["mlm"], 1.0)}
  if "sbo_loss" in sums:
    m["sbo_loss"] = sums["sbo_loss"] / jnp.maximum(counts["mlm"], 1.0)
    m["sbo_accuracy"] = sums["sbo_correct"] / jnp.maximum(counts["mlm"], 1.0)
  if "nsp_loss" in sums:
    m["nsp_loss"] = sums["nsp_loss"] / jnp.maximum(counts["nsp"], 1.0)
    m["nsp_accuracy"] = sums["nsp_correct"] / jnp.maximum(counts["nsp"], 1.0)
  return m


def make_eval_step(model: BertForPreTraining) -> Callable[[Any, dict], dict]:
  """`(params, batch) -> sums`: summed losses, correct counts and counts (no dropout);
  sum over batches on the host, then divide (`eval_metrics`)."""

  def eval_step(params, batch):
    sums = _loss_sums(model, params, batch, None, deterministic=True)
    sums.update({f"{k}_count": v for k, v in _counts(batch).items()})
    return sums

  return eval_step


def eval_metrics(totals: dict[str, float]) -> dict[str, float]:
  """Accumulated eval sums -> means."""
  counts = {"mlm": totals["mlm_count"], "nsp": totals.get("nsp_count", 0.0)}
  return {k: float(v) for k, v in _metrics(totals, counts).items()}
