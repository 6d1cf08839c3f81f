"""Word-sense disambiguation by 1-nearest-neighbour sense embeddings.

A sense's embedding is the mean of the contextual vectors of its labelled training
occurrences (Melamud et al. 2016, Peters et al. 2018); a test occurrence takes, among
the senses seen for its lemma, the one with the highest cosine. The baseline picks the
lemma's most frequent training sense. Lemmas never seen in training count as errors
for both, so the two accuracies are comparable (`coverage` says how many were seen).

Input, JSON lines — one labelled occurrence a line:

    {"sentence": "He sat on the bank of the river .", "word": "bank", "sense": "bank%river"}

with the target given by exactly one of `"word"` (its first whole-word occurrence; add
`"occurrence": k` for the k-th, from 0), `"index"` (its position among the
whitespace-separated words, from 0) or `"span"` ([start, end) character offsets);
`"lemma"` is optional (default: the target's text, lowercased). `read_semcor_xml` reads
the unified SemCor / Senseval XML of Raganato et al. (2017) with its `.gold.key.txt`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import xml.etree.ElementTree as ET
from typing import Sequence

import numpy as np

from bertjax.embeddings.analysis import Standardizer, unit
from bertjax.embeddings.extract import Embedder, Span, find_word
from bertjax.errors import DataError


@dataclasses.dataclass(frozen=True)
class Example:
  """One sense-labelled occurrence: the target is sentence[span[0]:span[1]]."""

  sentence: str
  span: Span
  lemma: str
  sense: str


def _target_span(row: dict, where: str) -> Span:
  keys = [k for k in ("word", "index", "span") if k in row]
  if len(keys) != 1:
    raise DataError(f"{where}: give exactly one of 'word', 'index' or 'span'; got {keys}.")
  sentence = row["sentence"]
  if keys[0] == "word":
    return find_word(sentence, row["word"], int(row.get("occurrence", 0)))
  if keys[0] == "index":
    words = list(re.finditer(r"\S+", sentence))
    if not 0 <= int(row["index"]) < len(words):
      raise DataError(f"{where}: index {row['index']} but the sentence has {len(words)} "
                      "words.")
    return words[int(row["index"])].span()
  start, end = (int(x) for x in row["span"])
  if not 0 <= start < end <= len(sentence):
    raise DataError(f"{where}: span {row['span']} is outside the sentence "
                    f"({len(sentence)} characters).")
  return start, end


def read_jsonl(path: str) -> list[Example]:
  """Examples from a JSON-lines file in the format of the module docstring."""
  if not os.path.isfile(path):
    raise DataError(f"sense-labelled file {path} does not exist.")
  examples = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{n}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{where} is not JSON ({e.msg}).") from e
      missing = [k for k in ("sentence", "sense") if k not in row]
      if missing:
        raise DataError(f"{where} lacks the field(s) {missing}.")
      s, e = _target_span(row, where)
      lemma = row.get("lemma") or row["sentence"][s:e].lower()
      examples.append(Example(row["sentence"], (s, e), lemma, str(row["sense"])))
  if not examples:
    raise DataError(f"{path} holds no examples.")
  return examples


def read_semcor_xml(path: str, keys_path: str | None = None) -> list[Example]:
  """Examples from the unified SemCor / Senseval XML (`<sentence>` of `<wf>` and
  `<instance id lemma>` tokens) and its key file (`ID SENSE [SENSE...]` a line; by
  default PATH with `.xml` replaced by `.gold.key.txt`). The first key is the sense."""
  keys_path = keys_path or re.sub(r"\.xml$", "", path) + ".gold.key.txt"
  for p in (path, keys_path):
    if not os.path.isfile(p):
      raise DataError(f"SemCor-style file {p} does not exist.")
  with open(keys_path, encoding="utf-8") as f:
    keys = {parts[0]: parts[1] for parts in map(str.split, f) if len(parts) >= 2}
  try:
    root = ET.parse(path).getroot()
  except ET.ParseError as e:
    raise DataError(f"{path} is not well-formed XML ({e}).") from e
  examples = []
  for sentence in root.iter("sentence"):
    text, targets = "", []
    for token in sentence:
      if token.tag not in ("wf", "instance"):
        continue
      start = len(text) + (1 if text else 0)
      text = f"{text} {token.text or ''}" if text else (token.text or "")
      if token.tag == "instance" and token.get("id") in keys:
        lemma = token.get("lemma") or (token.text or "").lower()
        targets.append(((start, len(text)), lemma, keys[token.get("id")]))
    examples += [Example(text, span, lemma, sense) for span, lemma, sense in targets]
  if not examples:
    raise DataError(f"{path} has no <instance> with a key in {keys_path}.")
  return examples


def read_examples(path: str) -> list[Example]:
  """`.xml` -> `read_semcor_xml`, anything else -> `read_jsonl`."""
  return read_semcor_xml(path) if path.endswith(".xml") else read_jsonl(path)


def target_vectors(embedder: Embedder, examples: Sequence[Example], pool: str = "mean",
                   standardizer: Standardizer | None = None) -> np.ndarray:
  """[N, D] the (optionally standardised) vector of each example's target word."""
  vectors = embedder.targets([x.sentence for x in examples], [x.span for x in examples],
                             pool)
  return standardizer(vectors) if standardizer is not None else vectors


@dataclasses.dataclass
class SenseInventory:
  """For each lemma: its senses, their unit-length mean vectors [S, D] and counts."""

  senses: dict[str, list[str]]
  embeddings: dict[str, np.ndarray]
  counts: dict[str, np.ndarray]

  @classmethod
  def build(cls, examples: Sequence[Example], vectors: np.ndarray) -> "SenseInventory":
    grouped = collections.defaultdict(lambda: collections.defaultdict(list))
    for x, v in zip(examples, vectors):
      grouped[x.lemma][x.sense].append(v)
    senses, embeddings, counts = {}, {}, {}
    for lemma, by_sense in grouped.items():
      senses[lemma] = sorted(by_sense)
      embeddings[lemma] = unit(np.stack([np.mean(by_sense[s], 0) for s in senses[lemma]]))
      counts[lemma] = np.array([len(by_sense[s]) for s in senses[lemma]])
    return cls(senses, embeddings, counts)

  def nearest(self, lemma: str, vector: np.ndarray) -> str | None:
    """The sense of `lemma` whose embedding has the highest cosine with `vector`."""
    if lemma not in self.senses:
      return None
    return self.senses[lemma][int(np.argmax(self.embeddings[lemma] @ unit(vector)))]

  def most_frequent(self, lemma: str) -> str | None:
    if lemma not in self.senses:
      return None
    return self.senses[lemma][int(np.argmax(self.counts[lemma]))]


def evaluate(embedder: Embedder, train: Sequence[Example], test: Sequence[Example],
             pool: str = "mean", standardizer: Standardizer | None = None) -> dict:
  """1-NN accuracy, most-frequent-sense accuracy, coverage and the predictions."""
  inventory = SenseInventory.build(train, target_vectors(embedder, train, pool,
                                                         standardizer))
  vectors = target_vectors(embedder, test, pool, standardizer)
  predicted = [inventory.nearest(x.lemma, v) for x, v in zip(test, vectors)]
  mfs = [inventory.most_frequent(x.lemma) for x in test]
  gold = [x.sense for x in test]
  return {"num_train": len(train), "num_test": len(test),
          "accuracy": float(np.mean([p == g for p, g in zip(predicted, gold)])),
          "mfs_accuracy": float(np.mean([p == g for p, g in zip(mfs, gold)])),
          "coverage": float(np.mean([x.lemma in inventory.senses for x in test])),
          "predictions": predicted}
