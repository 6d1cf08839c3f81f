"""Next-sentence prediction ('nsp', BERT's): whether segment B follows segment A in the
corpus (label 0) or comes from another document (1), the mean cross-entropy of the
'nsp' head (a 2-way linear layer on the pooled [CLS] vector) over the examples. Its
field, `next_sentence_labels` [B] int32, makes the rows BERT's sentence pairs
(`bertjax.data.builders`); held-out batches weigh their padding examples 0
(`example_weights` [B] float32). Its FLOPs are the family's (the pooler and the head:
`Family.head_flops`).
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from bertjax.errors import ConfigError
from bertjax.objectives.base import Objective, example_weights

FIELDS = ("next_sentence_labels",)


def _sums(out: dict, batch: dict) -> dict:
  logits, labels = out["nsp_logits"], batch["next_sentence_labels"]
  weights = example_weights(batch)
  return {"nsp_loss": jnp.sum(optax.softmax_cross_entropy_with_integer_labels(
              logits, labels) * weights),
          "nsp_correct": jnp.sum((jnp.argmax(logits, -1) == labels) * weights)}


def _metrics(sums: dict, counts: dict) -> dict:
  n = jnp.maximum(counts["nsp"], 1.0)
  return {"nsp_loss": sums["nsp_loss"] / n, "nsp_accuracy": sums["nsp_correct"] / n}


def _check(config) -> None:
  """The head reads the pooler; the rows are sentence pairs, not packed documents."""
  if not config.model.get("pooler", True):
    raise ConfigError("the 'nsp' objective (config.objectives) reads the pooled [CLS] "
                      "vector: set config.model.pooler=True or drop 'nsp'.")
  if config.data.isolate_documents:
    raise ConfigError("the 'nsp' objective (config.objectives) trains on sentence pairs "
                      "but config.data.isolate_documents=True applies to packed rows: set "
                      "isolate_documents=False or drop 'nsp'.")


OBJECTIVE = Objective(
    name="nsp", fields=FIELDS, heads=("nsp",), check=_check, sums=_sums,
    counts=lambda batch: {"nsp": jnp.sum(example_weights(batch))},
    loss=lambda sums, counts: sums["nsp_loss"] / jnp.maximum(counts["nsp"], 1.0),
    metrics=_metrics, metric_names=("nsp_loss", "nsp_accuracy"))
