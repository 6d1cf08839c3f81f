"""Sequence classification, single sentence or sentence pair, and regression (STS-B).

The pooler's output on `[CLS]` (dense + tanh; for an encoder without one, RoBERTa's:
dropout, a head-owned dense + tanh) -> dropout -> linear; softmax cross-entropy over
the labels, or mean squared error on one output for regression (as Hugging Face's
*ForSequenceClassification, into which `bertjax.hf.convert --to=hf` exports it).
Fields of an example are named by `config.task.text_a`, `text_b` ('' for single
sentences) and `label`.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bertjax.tasks import metrics
from bertjax.data.tokenizer import truncate_longest_first
from bertjax.errors import ConfigError, DataError
from bertjax.model import family_of
from bertjax.tasks import base, readers


class ClassifierHead(nn.Module):
  config: Any  # the model config (any family)
  num_outputs: int

  @nn.compact
  def __call__(self, out: dict, batch: dict, deterministic: bool) -> dict:
    """-> `logits` [B, K] float32 (K = 1 for regression)."""
    family = family_of(self.config)
    x = family.task_features(self.config, out, deterministic, pooled=True)  # [B, E]
    return {"logits": family.output_layer(self.config, self.num_outputs, "classifier")(x)
                      .astype(jnp.float32)}


class Classification(base.Task):
  name = "classification"
  packing = "cls"

  def __init__(self, task_cfg, tokenizer, max_seq_length):
    super().__init__(task_cfg, tokenizer, max_seq_length)
    self.regression = bool(task_cfg.regression)
    unknown = [m for m in task_cfg.metrics if m not in metrics.CLASSIFICATION_METRICS]
    if unknown:
      raise ConfigError(f"config.task.metrics has unknown {unknown}; use "
                        f"{sorted(metrics.CLASSIFICATION_METRICS)}.")
    self.default_metric = task_cfg.metrics[0]

  def _fields(self, path: str) -> tuple[str, str, str]:
    """The (text_a, text_b, label) fields of `path`'s rows: `config.task.tfds_fields`
    for a tfds: input when set (TFDS names GLUE's columns its own way), else
    `config.task.text_a`, `text_b`, `label`."""
    if path.startswith(readers.TFDS_PREFIX) and self.cfg.tfds_fields:
      return tuple(self.cfg.tfds_fields)
    return self.cfg.text_a, self.cfg.text_b, self.cfg.label

  def read(self, path: str, split: str) -> list[dict]:
    """Examples {'text_a', 'text_b' (None for single sentences), 'label' ('' when the
    file has none), 'index' (the row's GLUE index, when the file has one)}."""
    rows = readers.read(path, split, self._read_tsv, self.cfg.labels)
    text_a, text_b, label_field = self._fields(path)
    fields = [text_a] + ([text_b] if text_b else [])
    out = []
    for row in rows:
      missing = [f for f in fields if f not in row]
      if missing:
        raise DataError(f"{path}: a row lacks the field(s) {missing} named by "
                        f"config.task.text_a / text_b; it has {sorted(row)}.")
      label = row.get(label_field, "")
      example = {"text_a": str(row[text_a]), "text_b": str(row[text_b]) if text_b else None,
                 "label": "" if label is None else str(label)}
      index = row.get("idx", row.get("index"))  # TFDS's idx, GLUE test files' index
      if index is not None:
        example["index"] = int(index)
      out.append(example)
    if self.regression:
      for e in out:
        try:
          float(e["label"] or "nan")
        except ValueError:
          raise DataError(f"{path}: regression target {e['label']!r} is not a number.") from None
    else:
      base.check_labels([e["label"] for e in out], self.cfg.labels, "label", path)
    return out

  def _read_tsv(self, path: str) -> list[dict[str, str]]:
    """GLUE TSV rows; a headerless config reads a file whose first row names the
    `test_text_a` column by its header (CoLA: train/dev have none, test.tsv has
    'index<TAB>sentence')."""
    header = self.cfg.header
    if not header and self.cfg.test_text_a:
      header = self.cfg.test_text_a in readers.first_row(path)
    rows = readers.read_tsv(path, header)
    if header and not self.cfg.header:
      rows = [dict(r, **{self.cfg.text_a: r[self.cfg.test_text_a]}) for r in rows]
    return rows

  def fit_labels(self, train: Sequence[dict]) -> list[str]:
    if self.regression:
      return []
    return base.label_vocab(self.cfg.labels, [e["label"] for e in train], "labels")

  def _label_index(self, label: str) -> int:
    return self.labels.index(label) if label in self.labels else -1

  def featurize(self, examples: Sequence[dict], train: bool) -> base.Features:
    del train
    tok, T = self.tokenizer, self.max_seq_length
    ids_a = tok.tokenize_batch([e["text_a"] for e in examples])
    pairs = examples and examples[0]["text_b"] is not None
    ids_b = tok.tokenize_batch([e["text_b"] for e in examples]) if pairs else None
    rows = [truncate_longest_first(a, ids_b[i], T - tok.num_special(True)) if pairs
            else (a[:T - tok.num_special(False)], None) for i, a in enumerate(ids_a)]
    arrays = base.encode_rows(tok, rows, T)
    if self.regression:
      arrays["labels"] = np.array([float(e["label"] or "nan") for e in examples], np.float32)
      arrays["label_weights"] = np.isfinite(arrays["labels"]).astype(np.float32)
      arrays["labels"] = np.nan_to_num(arrays["labels"])
    else:
      arrays["labels"] = np.array([self._label_index(e["label"]) for e in examples],
                                  np.int32)
      arrays["label_weights"] = (arrays["labels"] >= 0).astype(np.float32)
    return base.Features(arrays, np.arange(len(examples)), [None] * len(examples))

  def head(self, config) -> nn.Module:
    return ClassifierHead(config, 1 if self.regression else len(self.labels))

  def loss(self, outputs, batch):
    w = batch["label_weights"] * batch["example_weights"]
    if self.regression:
      err = (outputs["logits"][..., 0] - batch["labels"]) ** 2
      return jnp.sum(err * w), jnp.sum(w)
    return base.masked_xent(outputs["logits"], batch["labels"], w)

  def predict_outputs(self, outputs):
    return {"logits": outputs["logits"]}

  def decode(self, outputs, features, examples):
    logits = outputs["logits"]
    if self.regression:
      return [float(x) for x in logits[:, 0]]
    return [self.labels[i] for i in np.argmax(logits, -1)]

  def score(self, predictions, examples):
    if self.regression:
      pred = np.asarray(predictions, np.float64)
      gold = np.asarray([float(e["label"]) for e in examples], np.float64)
    else:
      pred = [self._label_index(p) for p in predictions]
      gold = [self._label_index(e["label"]) for e in examples]  # -1: never seen in training
    return {m: metrics.CLASSIFICATION_METRICS[m](pred, gold) for m in self.cfg.metrics}
