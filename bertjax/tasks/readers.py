"""Readers of the standard fine-tuning formats, each returning a list of dicts.

  GLUE TSV         one row a line, tab-separated, an optional header (CoLA has none)
  JSON lines       one JSON object a line (any task: the fields are named in the config)
  CoNLL-2003       `word ... tag` columns, a blank line between sentences, -DOCSTART-
  SQuAD JSON       data[].paragraphs[].{context, qas[].{id, question, answers, is_impossible}}
  SWAG CSV         a header with sent1, sent2, ending0..3 and label
  tfds:NAME        a prepared TensorFlow Datasets dataset (`glue/sst2`, `squad`,
                   `conll2003`, ...): its ClassLabel ints become label names
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


def first_row(path: str) -> list[str]:
  """The tab-separated cells of a TSV file's first line."""
  with _open(path) as f:
    return f.readline().rstrip("\r\n").split("\t")


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


def words_and_tags(records: list[dict], fields, source: str) -> list[dict[str, list]]:
  """CoNLL-style TFDS records (e.g. `tfds:conll2003`: tokens, pos, chunks, ner) as
  [{'words', 'tags'}], `fields` = (words feature, tags feature)."""
  words, tags = fields
  if records and not {words, tags} <= set(records[0]):
    raise DataError(f"{source} has the features {sorted(records[0])}, not "
                    f"config.task.tfds_fields={tuple(fields)}.")
  return [{"words": r[words], "tags": r[tags]} for r in records]


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


def _class_label_texts(names: list[str], labels) -> list[str]:
  """What a ClassLabel's ints become: its class names, or the ints as text ('0', '1',
  ...) when the config's `labels` list those and not the names (GLUE's CoLA, SST-2,
  MRPC, QQP and WNLI files write 0/1 where TFDS names the classes, in the same order)."""
  labels = {str(x) for x in labels}
  ints = [str(i) for i in range(len(names))]
  if labels and not set(names) <= labels and set(ints) <= labels:
    return ints
  return list(names)


def _label_decoders(features, labels) -> dict:
  """{feature name: int -> label text} for the ClassLabel features (and sequences of
  them, e.g. CoNLL's tags) of a TFDS dataset; -1 (TFDS's 'no label': GLUE's test sets)
  becomes ''."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  out = {}
  for key in features.keys():
    f = features[key]
    inner = f.feature if isinstance(f, tfds.features.Sequence) else f
    if isinstance(inner, tfds.features.ClassLabel):
      texts = _class_label_texts(inner.names, labels)
      out[key] = lambda i, texts=texts: "" if i < 0 else texts[i]
  return out


# Our split -> the TFDS names tried: GLUE calls dev 'validation' (MNLI:
# 'validation_matched' and 'validation_mismatched'), CoNLL-2003 'dev'.
SPLITS = {"dev": ["dev", "validation", "validation_matched"],
          "dev_mismatched": ["validation_mismatched"]}


def read_tfds(spec: str, split: str, labels=()) -> list[dict[str, Any]]:
  """Records of a prepared TFDS dataset, `tfds:NAME` (e.g. `tfds:glue/rte`; the split
  'dev' reads the first of `SPLITS['dev']` it has) or `tfds:NAME:SPLIT`
  (`tfds:glue/mnli:validation_mismatched`),
  from $TFDS_DATA_DIR (else TFDS's default); bytes decoded to str and ClassLabel ints
  to label text (`_class_label_texts`, given the config's `labels`)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  name, _, named_split = spec[len(TFDS_PREFIX):].partition(":")
  splits = [named_split] if named_split else SPLITS.get(split, [split])
  for split in splits:
    try:
      source = tfds.data_source(name, split=split, download=False,
                                data_dir=os.environ.get("TFDS_DATA_DIR") or None)
      break
    except Exception as e:  # tfds raises many types for a missing or unprepared dataset.
      error = e
  else:
    raise DataError(f"TFDS dataset {name!r} split {' / '.join(map(repr, splits))} is not "
                    f"prepared here ({type(error).__name__}); run `tfds build {name}` or "
                    "give a file.") from error
  decoders = _label_decoders(source.dataset_info.features, labels)

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

  def decoded(record):
    for key, decode in decoders.items():
      v = record[key]
      record[key] = [decode(i) for i in v] if isinstance(v, list) else decode(v)
    return record

  return [decoded(plain(source[i])) for i in range(len(source))]


def squad_records(records: list[dict]) -> list[dict[str, Any]]:
  """TFDS `squad` records (answers as {'text': [...], 'answer_start': [...]}) in
  `read_squad`'s form."""
  return [{"id": r["id"], "question": r["question"], "context": r["context"],
           "answers": [{"text": t, "answer_start": a} for t, a in zip(
               r["answers"]["text"], r["answers"]["answer_start"])],
           "is_impossible": bool(r.get("is_impossible", False))} for r in records]


def read(path: str, split: str, native, labels=()) -> list[dict[str, Any]]:
  """`tfds:NAME` (ClassLabels as text given the config's `labels`), JSON lines
  (.jsonl), or the task's native reader `native(path)`."""
  if path.startswith(TFDS_PREFIX):
    return read_tfds(path, split, labels)
  if path.endswith(".jsonl"):
    return read_jsonl(path)
  return native(path)
