"""Multiple choice (SWAG): one sequence per choice, [CLS] context [SEP] start + ending
[SEP]; the pooler's output on `[CLS]` (a head-owned dense + tanh for an encoder
without one) -> dropout -> linear -> one scalar score per choice; softmax over the
choices, cross-entropy against the gold choice.
Examples: {'context', 'start', 'endings': [C], 'label'} (SWAG CSV or JSON lines;
every example has the same number of choices C).
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bertjax.tasks import metrics
from bertjax.data.tokenizer import truncate_longest_first
from bertjax.errors import DataError
from bertjax.model import family_of
from bertjax.tasks import base, readers


class ChoiceHead(nn.Module):
  config: Any  # the model config (any family)

  @nn.compact
  def __call__(self, out: dict, batch: dict, deterministic: bool) -> dict:
    """Encoder outputs of the [B*C, T] flattened choices -> `logits` [B, C] float32."""
    B, C = batch["input_ids"].shape[:2]
    family = family_of(self.config)
    x = family.task_features(self.config, out, deterministic, pooled=True,
                             dropout=False)  # [B*C, E]
    score = family.output_layer(self.config, 1, "scorer")(x)  # [B*C, 1]
    return {"logits": score.reshape(B, C).astype(jnp.float32)}


class MultipleChoice(base.Task):
  name = "multiple_choice"
  default_metric = "accuracy"

  def read(self, path: str, split: str) -> list[dict]:
    examples = readers.read(path, split, readers.read_swag)
    counts = {len(e["endings"]) for e in examples}
    if len(counts) > 1:
      raise DataError(f"{path}: examples have {sorted(counts)} choices; every example "
                      "needs the same number.")
    for e in examples:
      e.setdefault("start", "")
      e["label"] = int(e.get("label", -1))
      if not -1 <= e["label"] < len(e["endings"]):
        raise DataError(f"{path}: label {e['label']} is not the index of one of the "
                        f"{len(e['endings'])} endings (-1: none).")
    return examples

  def featurize(self, examples: Sequence[dict], train: bool) -> base.Features:
    """Per row: input_ids ... [C, T] (one sequence per choice); labels [] (-1: none)."""
    del train
    tok, T = self.tokenizer, self.max_seq_length
    C = len(examples[0]["endings"])
    contexts = tok.tokenize_batch([e["context"] for e in examples])
    endings = tok.tokenize_batch([f"{e['start']} {x}".strip() for e in examples
                                  for x in e["endings"]])
    rows = [truncate_longest_first(contexts[n], endings[n * C + c], T - tok.num_special(True))
            for n in range(len(examples)) for c in range(C)]
    arrays = {k: v.reshape(len(examples), C, T)
              for k, v in base.encode_rows(tok, rows, T).items()}
    arrays["labels"] = np.array([e["label"] for e in examples], np.int32)
    return base.Features(arrays, np.arange(len(examples)), [None] * len(examples))

  def head(self, config) -> nn.Module:
    return ChoiceHead(config)

  def loss(self, outputs, batch):
    w = (batch["labels"] >= 0) * batch["example_weights"]
    return base.masked_xent(outputs["logits"], batch["labels"], w)

  def predict_outputs(self, outputs):
    return {"logits": outputs["logits"]}

  def decode(self, outputs, features, examples):
    """The index of the chosen ending of each example."""
    return [int(i) for i in np.argmax(outputs["logits"], -1)]

  def score(self, predictions, examples):
    labelled = [(p, e["label"]) for p, e in zip(predictions, examples) if e["label"] >= 0]
    return {"accuracy": metrics.accuracy([p for p, _ in labelled], [g for _, g in labelled])
            if labelled else 0.0}
