"""Sequence labelling (BIO NER, POS): a linear layer over every token's last hidden
state, or with `config.task.features` the feature-based approach (a frozen encoder, a
BiLSTM or linear tagger over its layers: `bertjax/tasks/features.py`). Training labels
each word's first subword with its gold tag (the BERT paper's and `run_ner.py`'s
choice; `config.task.label_all_subwords` labels every subword); decoding reads each
word's tag off its first subword. Scored by seqeval-style entity precision / recall / F1
and word accuracy. Examples: {'words': [...], 'tags': [...]} (CoNLL columns or JSONL).
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bertjax.tasks import metrics
from bertjax.errors import DataError
from bertjax.model import family_of
from bertjax.tasks import base, features, readers


class TaggingHead(nn.Module):
  config: Any  # the model config (any family)
  num_tags: int

  @nn.compact
  def __call__(self, out: dict, batch: dict, deterministic: bool) -> dict:
    """-> `logits` [B, T, K] float32."""
    family = family_of(self.config)
    x = family.task_features(self.config, out, deterministic, pooled=False)  # [B, T, E]
    return {"logits": family.output_layer(self.config, self.num_tags, "tagger")(x)
                      .astype(jnp.float32)}


class Tagging(base.Task):
  name = "tagging"
  default_metric = "f1"
  token_arrays = (*base.TOKEN_KEYS, "labels")
  token_outputs = {"tags": 0}
  packing = "tokens"

  def __init__(self, task_cfg, tokenizer, max_seq_length):
    super().__init__(task_cfg, tokenizer, max_seq_length)
    self.feature_based = bool(task_cfg.features)
    # Workdirs written before the field existed trained every subword.
    self.all_subwords = bool(task_cfg.label_all_subwords
                             if "label_all_subwords" in task_cfg else True)
    if self.feature_based:
      features.check(task_cfg)
      self.packing = ""  # A BiLSTM over a packed row would read across its examples.

  def read(self, path: str, split: str) -> list[dict]:
    examples = readers.read(path, split,
                            lambda p: readers.read_conll(p, self.cfg.tag_column),
                            self.cfg.labels)
    if path.startswith(readers.TFDS_PREFIX):
      examples = readers.words_and_tags(examples, self.cfg.tfds_fields, path)
    for e in examples:
      if len(e["words"]) != len(e.get("tags", e["words"])):
        raise DataError(f"{path}: a sentence has {len(e['words'])} words but "
                        f"{len(e['tags'])} tags.")
    base.check_labels([t for e in examples for t in e.get("tags", [])], self.cfg.labels,
                      "tag", path)
    return examples

  def fit_labels(self, train: Sequence[dict]) -> list[str]:
    return base.label_vocab(self.cfg.labels, [t for e in train for t in e["tags"]], "tags")

  def featurize(self, examples: Sequence[dict], train: bool) -> base.Features:
    """Per row: input_ids ... [T]; labels [T] (the word's tag on its first subword, or
    on each with `label_all_subwords`; -1 elsewhere); meta: the word index of each
    token (-1 for specials / padding)."""
    del train
    T, budget = self.max_seq_length, self.max_seq_length - 2
    index = {t: i for i, t in enumerate(self.labels)}
    rows, labels, word_of = [], [], []
    for e in examples:
      ids, tags, words = [], [], []
      for w, pieces in enumerate(base.word_pieces(self.tokenizer, e["words"])):
        if len(ids) + len(pieces) > budget:
          break  # Words past the length limit are predicted 'O'.
        tag = index.get(e["tags"][w], -1) if "tags" in e else -1
        ids += pieces
        tags += [tag] + [tag if self.all_subwords else -1] * (len(pieces) - 1)
        words += [w] * len(pieces)
      rows.append((ids, None))
      labels.append([-1] + tags)
      word_of.append(np.array([-1] + words + [-1] * (T - 1 - len(words)), np.int32))
    arrays = base.encode_rows(self.tokenizer, rows, T)
    arrays["labels"] = base.pad_rows(labels, T, -1)
    return base.Features(arrays, np.arange(len(examples)), word_of)

  def head(self, config) -> nn.Module:
    if self.feature_based:
      features.check(self.cfg, config)
      return features.FeatureTaggingHead(config, len(self.labels), self.cfg.features,
                                         self.cfg.tagger, self.cfg.lstm_size,
                                         self.cfg.lstm_layers)
    return TaggingHead(config, len(self.labels))

  def loss(self, outputs, batch):
    w = (batch["labels"] >= 0) * batch["example_weights"][:, None]
    return base.masked_xent(outputs["logits"], batch["labels"], w)

  def predict_outputs(self, outputs):
    return {"tags": jnp.argmax(outputs["logits"], -1)}

  def decode(self, outputs, features, examples):
    """A tag per word: the prediction at the word's first subword ('O' if cut off)."""
    out = []
    for tags, word_of, e in zip(outputs["tags"], features.meta, examples):
      words = ["O"] * len(e["words"])
      seen = set()
      for pos, w in enumerate(word_of):
        if w >= 0 and w not in seen:
          seen.add(w)
          words[w] = self.labels[tags[pos]]
      out.append(words)
    return out

  def score(self, predictions, examples):
    gold = [e["tags"] for e in examples]
    scores = metrics.entity_prf(predictions, gold)
    flat_p = [t for p in predictions for t in p]
    scores["accuracy"] = metrics.accuracy(flat_p, [t for g in gold for t in g])
    return scores
