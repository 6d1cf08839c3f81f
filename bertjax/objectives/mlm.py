"""Masked-LM ('mlm', BERT's): the mean cross-entropy of the chosen tokens' original ids
(`config.data.masked_lm_prob` of the tokens, 80/10/10), predicted by the 'mlm' head at
the masked positions only; held out beside the accuracy of always predicting the
training corpus's most frequent token. `predicting` builds any objective that predicts
the masked tokens (SpanBERT's SBO; a generator's MLM), with its own name.

Batch fields: masked_lm_positions, masked_lm_ids [B, P] int32, masked_lm_weights
[B, P] float32 (0: a padding prediction).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.objectives.base import Objective

FIELDS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


def prediction_sums(name: str, logits: jax.Array, batch: dict) -> dict[str, jax.Array]:
  """{name_loss, name_correct}: the cross-entropy and the hits of `logits` [B, P, V]
  against the masked tokens' ids, summed with their weights."""
  labels, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]  # [B, P]
  xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return {f"{name}_loss": jnp.sum(xent * weights),
          f"{name}_correct": jnp.sum((jnp.argmax(logits, -1) == labels) * weights)}


def predicting(name: str, logits: Callable[[dict], jax.Array], *,
               heads: tuple[str, ...] = (), fields: tuple[str, ...] = FIELDS,
               check: Callable[[Any], None] | None = None,
               flops: Callable[[Any, int, int, int], dict[str, float]] | None = None,
               **extra) -> Objective:
  """An objective predicting the masked tokens from `logits(outputs)` [B, P, V]: loss
  `name`_loss, the mean cross-entropy over the predictions (their count `name`, the sum
  of masked_lm_weights), and `name`_accuracy."""

  def metrics(sums, counts):
    n = jnp.maximum(counts[name], 1.0)
    return {f"{name}_loss": sums[f"{name}_loss"] / n,
            f"{name}_accuracy": sums[f"{name}_correct"] / n}

  return Objective(
      name=name, fields=fields, heads=heads, check=check, flops=flops,
      sums=lambda out, batch: prediction_sums(name, logits(out), batch),
      counts=lambda batch: {name: jnp.sum(batch["masked_lm_weights"])},
      loss=lambda sums, counts: sums[f"{name}_loss"] / jnp.maximum(counts[name], 1.0),
      metrics=metrics, metric_names=(f"{name}_loss", f"{name}_accuracy"), **extra)


def _most_frequent_hits(batch: dict, facts: dict) -> dict[str, float]:
  """How many of the batch's predictions (weighted) are the most frequent token."""
  hits = (batch["masked_lm_ids"] == facts["most_frequent_token"]) * batch["masked_lm_weights"]
  return {"mlm_most_frequent_correct": float(np.sum(hits))}


def _baseline(totals: dict) -> dict[str, float]:
  """The accuracy of always predicting the most frequent token."""
  return {"mlm_accuracy_most_frequent_baseline":
          totals["mlm_most_frequent_correct"] / max(totals["mlm_count"], 1)}


OBJECTIVE = predicting("mlm", lambda out: out["mlm_logits"], heads=("mlm",),
                       eval_sums=_most_frequent_hits, eval_metrics=_baseline)
