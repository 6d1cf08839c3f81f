"""Pretraining's objective and held-out metrics: masked-LM (+ NSP, + SpanBERT SBO).

Batch keys (global arrays, leading dim B): input_ids, attention_mask, token_type_ids
[B, T]; masked_lm_positions, masked_lm_ids, masked_lm_weights [B, P];
next_sentence_labels [B] (NSP only); optionally position_ids, segment_ids [B, T];
span_left_positions, span_right_positions, span_relative_positions [B, P] (SBO only:
the SBO loss is the mean cross-entropy of the same targets as the MLM loss);
global_rope_theta [B] (a length phase's input, `Family.phase_inputs`). The model reads
the fields it declares (`stack.PreTraining.inputs`: the encoder's, its family's, each
head's); the rest stay in the batch for the losses.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertjax.train.step import Objective

def objective(model: nn.Module) -> Objective:
  """Mean MLM cross-entropy over the chosen tokens (+ mean NSP cross-entropy, + mean
  SBO cross-entropy over the same tokens)."""
  names = ["mlm_loss", "mlm_accuracy"]
  if "sbo" in model.heads:
    names += ["sbo_loss", "sbo_accuracy"]
  if "nsp" in model.heads:
    names += ["nsp_loss", "nsp_accuracy"]
  return Objective(
      init=model.init_params,
      sums=lambda params, batch, rng: _loss_sums(model, params, batch, rng),
      counts=_counts, loss=_loss, metrics=_metrics, metric_names=tuple(names))


def _loss_sums(model: nn.Module, params, batch, rng):
  """Summed (not averaged) losses and correct counts over the batch's predictions. The
  model gets the batch fields it reads (the span inputs of span masking only with an
  SBO head: a model without one trains on span-masked rows as on any others)."""
  inputs = {k: batch[k] for k in model.inputs if k in batch}
  out = model.apply({"params": params}, **inputs, deterministic=rng is None,
                    rngs=None if rng is None else {"dropout": rng})
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


def _loss(sums, counts):
  loss = sums["mlm_loss"] / jnp.maximum(counts["mlm"], 1.0)
  if "sbo_loss" in sums:
    loss = loss + sums["sbo_loss"] / jnp.maximum(counts["mlm"], 1.0)
  if "nsp_loss" in sums:
    loss = loss + sums["nsp_loss"] / jnp.maximum(counts["nsp"], 1.0)
  return loss


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


def make_eval_step(model: nn.Module) -> Callable[[Any, dict], dict]:
  """`(params, batch) -> sums`: summed losses, correct counts and counts (no dropout);
  sum over batches on the host, then divide (`eval_metrics`)."""

  def eval_step(params, batch):
    sums = _loss_sums(model, params, batch, None)
    sums.update({f"{k}_count": v for k, v in _counts(batch).items()})
    return sums

  return eval_step


def eval_metrics(totals: dict[str, float]) -> dict[str, float]:
  """Accumulated eval sums -> means."""
  counts = {"mlm": totals["mlm_count"], "nsp": totals.get("nsp_count", 0.0)}
  return {k: float(v) for k, v in _metrics(totals, counts).items()}
