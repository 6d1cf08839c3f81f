"""Span-based NER (the textbook's §11.5.2): every span of up to `max_span_length`
words is a candidate; its representation is [s_i; e_j; g_ij] with s_i = FFN_start(h of
the span's first token), e_j = FFN_end(h of its last token) and g_ij the tokens of the
span pooled by their mean or by self-attention (a learned score per token, softmaxed
within the span); an FFN over that vector classifies the span as NULL or an entity
type. Spans are classified independently, so nested entities are predicted as they
come (`allow_nested`), or a greedy pass keeps the most probable non-overlapping spans.
Scored by span precision / recall / F1 (typed, exact boundaries).

Examples: JSON lines {'words': [...], 'entities': [{'start': i, 'end': j, 'label'}]}
(word indices, end inclusive; entities may nest), or CoNLL BIO files (flat).
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.tasks import metrics
from bertjax.errors import ConfigError, DataError
from bertjax.model import family_of, layers
from bertjax.tasks import base, readers

NULL = "NULL"
POOLING = ("mean", "attention")


class SpanHead(nn.Module):
  """Span classifier over the encoder's last hidden states."""

  config: Any  # the model config (any family)
  num_labels: int  # NULL included (index 0).
  pooling: str

  @nn.compact
  def __call__(self, out: dict, batch: dict, deterministic: bool) -> dict:
    """Batch: span_start / span_end [B, S] token positions (inclusive). -> `logits`
    [B, S, K] float32."""
    cfg = self.config
    family = family_of(cfg)
    drop = nn.Dropout(cfg.classifier_dropout)
    h = drop(out["last_hidden_state"], deterministic=deterministic)
    T, E = h.shape[1], h.shape[2]

    def ffn(name):
      return lambda x: nn.gelu(layers.dense(cfg, E, ("embed", "mlp"), name)(x))

    take = jax.vmap(lambda x, idx: x[idx])  # [B, T, E], [B, S] -> [B, S, E]
    s = ffn("start_ffn")(take(h, batch["span_start"]))
    e = ffn("end_ffn")(take(h, batch["span_end"]))
    t = jnp.arange(T)
    inside = ((t[None, None, :] >= batch["span_start"][..., None])
              & (t[None, None, :] <= batch["span_end"][..., None]))  # [B, S, T]
    if self.pooling == "attention":
      a = family.output_layer(cfg, 1, "pool_score")(h)[..., 0].astype(jnp.float32)  # [B, T]
      w = jax.nn.softmax(jnp.where(inside, a[:, None, :], -1e9), axis=-1)
    else:
      w = inside / jnp.maximum(inside.sum(-1, keepdims=True), 1)
    g = jnp.einsum("bst,bte->bse", w.astype(h.dtype), h)
    x = jnp.concatenate([s, e, g], axis=-1)  # [B, S, 3E]
    x = nn.gelu(layers.dense(cfg, E, ("hidden", "mlp"), "span_ffn")(x))
    x = drop(x, deterministic=deterministic)
    logits = layers.dense(cfg, self.num_labels, ("mlp", "classes"), "span_classifier")(x)
    return {"logits": logits.astype(jnp.float32)}


def _from_bio(example: dict) -> dict:
  """A CoNLL sentence's BIO tags -> entity spans."""
  return {"words": example["words"],
          "entities": [{"start": i, "end": j, "label": kind}
                       for kind, i, j in metrics.tag_spans(example["tags"])]}


def entity_set(entities: Sequence[dict]) -> set[tuple[str, int, int]]:
  return {(str(x["label"]), int(x["start"]), int(x["end"])) for x in entities}


class SpanNER(base.Task):
  name = "span_ner"
  default_metric = "f1"

  def __init__(self, task_cfg, tokenizer, max_seq_length):
    super().__init__(task_cfg, tokenizer, max_seq_length)
    if task_cfg.pooling not in POOLING:
      raise ConfigError(f"config.task.pooling={task_cfg.pooling!r}: use one of {POOLING}.")
    if task_cfg.max_span_length < 1:
      raise ConfigError("config.task.max_span_length must be at least 1.")
    # Every span of <= L words among at most T - 2 words (one token each, at most).
    n, L = max_seq_length - 2, task_cfg.max_span_length
    self.num_spans = sum(max(0, n - k + 1) for k in range(1, L + 1))

  def read(self, path: str, split: str) -> list[dict]:
    examples = readers.read(path, split, lambda p: [_from_bio(e) for e in readers.read_conll(p)])
    if path.startswith(readers.TFDS_PREFIX):  # CoNLL-style: BIO tags
      examples = [_from_bio(e) for e in readers.words_and_tags(
          examples, self.cfg.tfds_fields, path)]
    for e in examples:
      for x in e.get("entities", []):
        if not 0 <= x["start"] <= x["end"] < len(e["words"]):
          raise DataError(f"{path}: entity {x} lies outside its {len(e['words'])} words "
                          "(start/end are word indices, end inclusive).")
    base.check_labels([x["label"] for e in examples for x in e.get("entities", [])],
                      self.cfg.labels, "entity label", path)
    return examples

  def fit_labels(self, train: Sequence[dict]) -> list[str]:
    kinds = base.label_vocab(self.cfg.labels, [x["label"] for e in train
                                                for x in e["entities"]], "entities")
    return [NULL] + [k for k in kinds if k != NULL]

  def featurize(self, examples: Sequence[dict], train: bool) -> base.Features:
    """Per row: input_ids ... [T]; span_start / span_end [S] token positions of each
    candidate's first and last subword; span_labels [S] (0 NULL, -1 padding or a label
    never seen in training); meta: the candidates' (first word, last word)."""
    del train
    T, L, S = self.max_seq_length, self.cfg.max_span_length, self.num_spans
    index = {k: i for i, k in enumerate(self.labels)}
    rows, starts, ends, labels, meta = [], [], [], [], []
    for e in examples:
      ids, first, last = [], [], []
      for pieces in base.word_pieces(self.tokenizer, e["words"]):
        if len(ids) + len(pieces) > T - 2:
          break  # Words past the length limit are never in a predicted span.
        first.append(1 + len(ids))
        ids += pieces
        last.append(len(ids))
      gold = {(x["start"], x["end"]): x["label"] for x in e.get("entities", [])}
      spans = [(i, j) for i in range(len(first)) for j in range(i, min(i + L, len(first)))]
      rows.append((ids, None))
      starts.append([first[i] for i, _ in spans])
      ends.append([last[j] for _, j in spans])
      labels.append([index.get(gold[s], -1) if s in gold else 0 for s in spans])
      meta.append(spans)
    arrays = base.encode_rows(self.tokenizer, rows, T)
    arrays["span_start"] = base.pad_rows(starts, S, 0)
    arrays["span_end"] = base.pad_rows(ends, S, 0)
    arrays["span_labels"] = base.pad_rows(labels, S, -1)
    return base.Features(arrays, np.arange(len(examples)), meta)

  def head(self, config) -> nn.Module:
    return SpanHead(config, len(self.labels), self.cfg.pooling)

  def loss(self, outputs, batch):
    w = (batch["span_labels"] >= 0) * batch["example_weights"][:, None]
    return base.masked_xent(outputs["logits"], batch["span_labels"], w)

  def predict_outputs(self, outputs):
    p = jax.nn.softmax(outputs["logits"], axis=-1)
    return {"labels": jnp.argmax(p, -1), "probs": jnp.max(p, -1)}

  def decode(self, outputs, features, examples):
    """Entities per example: [{'start', 'end', 'label', 'text'}] (word indices)."""
    out = []
    for labels, probs, spans, e in zip(outputs["labels"], outputs["probs"],
                                       features.meta, examples):
      found = [(float(probs[k]), i, j, self.labels[labels[k]])
               for k, (i, j) in enumerate(spans) if labels[k] != 0]
      if not self.cfg.allow_nested:  # Greedy: most probable first, no overlaps.
        kept = []
        for p, i, j, kind in sorted(found, reverse=True):
          if all(j < a or i > b for _, a, b, _ in kept):
            kept.append((p, i, j, kind))
        found = kept
      out.append([{"start": i, "end": j, "label": kind, "text": " ".join(e["words"][i:j + 1])}
                  for _, i, j, kind in sorted(found, key=lambda x: (x[1], x[2]))])
    return out

  def score(self, predictions, examples):
    return metrics.span_prf((entity_set(p) for p in predictions),
                            (entity_set(e["entities"]) for e in examples))
