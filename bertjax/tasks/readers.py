"""Readers of the standard fine-tuning formats, each returning a list of dicts.

  GLUE TSV         one row a line, tab-separated, an optional header (CoLA has none)
  JSON lines       one JSON object a line (any task: the fields are named in the config)
  CoNLL-2003       `word ... tag` columns, a blank line between sentences, -DOCSTART-
  SQuAD JSON       data[].paragraphs[].{context, qas[].{id, question, answers, is_impossible}}
  SWAG CSV         a header with sent1, sent2, ending0..3 and label
  tfds:NAME        a prepared TensorFlow Datasets dataset (`glue/sst2`, `squad`, ...)
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any

from bertjax.errors import DataError

TFDS_PREFIX = "tfds:"


def _open(path: str):
  if not os.path.isfile(path):
    raise DataError(f"data file {path} does not exist; check config.data.train / dev.")
  return open(path, encoding="utf-8", newline="")


def read_tsv(path: str, header: bool = True) -> list[dict[str, str]]:
  """GLUE TSV rows as dicts keyed by the header's column names, or by column index
  ('0', '1', ...) when `header` is False. Quotes are literal (as GLUE writes them)."""
  with _open(path) as f:
    rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  if not rows:
    raise DataError(f"{path} is empty.")
  names = rows[0] if header else [str(i) for i in range(max(len(r) for r in rows))]
  body = rows[1:] if header else rows
  for n, row in enumerate(body):
    if len(row) < len(names):
      raise DataError(f"{path} line {n + 1 + header}: {len(row)} columns, the header has "
                      f"{len(names)}; is it tab-separated?")
  return [dict(zip(names, row)) for row in body if row]


def read_jsonl(path: str) -> list[dict[str, Any]]:
  out = []
  with _open(path) as f:
    for n, line in enumerate(f):
      if line.strip():
        try:
          out.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise DataError(f"{path} line {n + 1} is not JSON ({e.msg}).") from e
  return out


def read_conll(path: str, tag_column: int = -1) -> list[dict[str, list[str]]]:
  """CoNLL column files: the word first, the tag in `tag_column` (-1: last; CoNLL-2003
  NER is -1, its POS tags 1). Returns [{'words': [...], 'tags': [...]}]."""
  sentences, words, tags = [], [], []
  with _open(path) as f:
    for n, line in enumerate(f):
      cols = line.split()
      if not cols or cols[0] == "-DOCSTART-":
        if words:
          sentences.append({"words": words, "tags": tags})
        words, tags = [], []
        continue
      if len(cols) < 2:
        raise DataError(f"{path} line {n + 1}: expected 'word ... tag' columns.")
      words.append(cols[0])
      tags.append(cols[tag_column])
  if words:
    sentences.append({"words": words, "tags": tags})
  return sentences


def read_squad(path: str) -> list[dict[str, Any]]:
  """SQuAD v1.1 / v2.0 JSON -> [{'id', 'question', 'context', 'answers': [{'text',
  'answer_start'}], 'is_impossible'}]."""
  with _open(path) as f:
    try:
      data = json.load(f)["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise DataError(f"{path} is not SQuAD JSON (a top-level 'data' list).") from e
  out = []
  for article in data:
    for para in article["paragraphs"]:
      for qa in para["qas"]:
        out.append({"id": qa["id"], "question": qa["question"], "context": para["context"],
                    "answers": qa.get("answers", []),
                    "is_impossible": bool(qa.get("is_impossible", False))})
  return out


def read_swag(path: str) -> list[dict[str, Any]]:
  """SWAG CSV -> [{'context': sent1, 'start': sent2, 'endings': [4], 'label'}]."""
  with _open(path) as f:
    rows = list(csv.DictReader(f))
  try:
    return [{"context": r["sent1"], "start": r["sent2"],
             "endings": [r[f"ending{i}"] for i in range(4)],
             "label": int(r["label"]) if r.get("label", "") != "" else -1} for r in rows]
  except KeyError as e:
    raise DataError(f"{path} lacks the SWAG column {e}; expected sent1, sent2, "
                    "ending0..3, label.") from e


def read_tfds(spec: str, split: str) -> list[dict[str, Any]]:
  """Records of a prepared TFDS dataset (`tfds:glue/sst2`), bytes decoded to str."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name = spec[len(TFDS_PREFIX):]
  split = {"dev": "validation"}.get(split, split)
  try:
    source = tfds.data_source(name, split=split, download=False)
  except Exception as e:  # tfds raises many types for a missing or unprepared dataset.
    raise DataError(f"TFDS dataset {name!r} split {split!r} is not prepared here "
                    f"({type(e).__name__}); run `tfds build {name}` or give a file.") from e

  def plain(x):
    if isinstance(x, bytes):
      return x.decode("utf-8")
    if isinstance(x, dict):
      return {k: plain(v) for k, v in x.items()}
    if hasattr(x, "tolist"):
      return plain(x.tolist())
    if isinstance(x, list):
      return [plain(v) for v in x]
    return x

  return [plain(source[i]) for i in range(len(source))]


def read(path: str, split: str, native) -> list[dict[str, Any]]:
  """`tfds:NAME`, JSON lines (.jsonl), or the task's native reader `native(path)`."""
  if path.startswith(TFDS_PREFIX):
    return read_tfds(path, split)
  if path.endswith(".jsonl"):
    return read_jsonl(path)
  return native(path)
