"""Streaming corpus sources: documents one at a time, memory independent of corpus size.

`iter_documents(spec)` yields documents, each a non-empty list of sentences:

* a file, glob or directory (recursively, hidden files skipped); `.gz` is
  decompressed on the fly.
  - plain text: one sentence or paragraph a line, a blank line between documents;
  - JSON lines (`.jsonl`, `.jsonl.gz`, `.json`): one document an object, its text in
    `text_field`; newlines inside the text separate paragraphs.
* `tfds:NAME[/CONFIG][:SPLIT]` (e.g. `tfds:wikipedia/20230601.en`, `tfds:c4/en:train`):
  a prepared TFDS dataset read through `tfds.data_source` from ArrayRecord, no
  TensorFlow needed; the text is in `text_field`. `data_dir` is TFDS's data dir.

Paragraph lines are split into sentences with `split_sentences`. Bad input
raises `DataError` before any document of that file is yielded (binary file) or is
repaired (invalid UTF-8 bytes and lone surrogates of JSON escapes become U+FFFD; a
text line longer than `MAX_LINE_CHARS` is cut into pieces, a JSON line is read whole),
so a long preparation never dies midway.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import re
from typing import Iterator

from bertjax.errors import DataError

TFDS_PREFIX = "tfds:"
EMBEDDED = "embedded"  # the corpus shipped inside bertjax (`corpus.load_documents`)
MAX_LINE_CHARS = 1 << 20
# A text document is cut into documents of about this many characters (a file with no
# blank line is one document; bounded, it never has to fit in memory whole).
MAX_DOCUMENT_CHARS = 1 << 24
_BINARY_SAMPLE = 1 << 16
_MAX_REPLACED_FRACTION = 0.3
# A sentence ends at . ! or ? (optionally closed by a quote or bracket) followed by
# whitespace and an upper-case letter, digit, quote or bracket.
_SENTENCE_END = re.compile(r"(?<=[.!?])(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\betc\.)"
                           r"([\"'”’)\]]?)\s+(?=[A-Z0-9\"“‘(\[])")
# Lone UTF-16 surrogates: a Python str may hold them (JSON "\ud800" escapes) but they
# are not Unicode text and the tokenizer libraries refuse them.
_SURROGATE = re.compile("[\ud800-\udfff]")


def repair_unicode(text: str) -> str:
  """`text` with each lone surrogate replaced by U+FFFD (as invalid UTF-8 bytes are)."""
  return _SURROGATE.sub("\ufffd", text)


def split_sentences(text: str) -> list[str]:
  """Splits a paragraph into sentences with a simple punctuation regex."""
  text = " ".join(text.split())
  if not text:
    return []
  parts = _SENTENCE_END.split(text)
  # split() keeps the captured closing quote: glue it back onto its sentence.
  sentences = [parts[0]]
  for i in range(1, len(parts), 2):
    sentences[-1] += parts[i]
    sentences.append(parts[i + 1])
  return [s.strip() for s in sentences if s.strip()]


def resolve_paths(spec: str) -> list[str]:
  """Expands a path, directory (recursively, hidden files skipped) or glob."""
  spec = os.path.expanduser(spec)
  if os.path.isdir(spec):
    paths = []
    for root, dirs, files in os.walk(spec):
      dirs[:] = sorted(d for d in dirs if not d.startswith("."))
      paths.extend(os.path.join(root, f) for f in sorted(files) if not f.startswith("."))
    if not paths:
      raise DataError(f"corpus directory {spec!r} holds no files: put text files "
                      "(one sentence a line, blank line between documents) in it")
    return paths
  if os.path.isfile(spec):
    return [spec]
  paths = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
  if not paths:
    raise DataError(f"corpus {spec!r} matches no file: check the path or glob, or use "
                    "--config.data.corpus=embedded")
  return paths


def is_jsonl(path: str) -> bool:
  return path.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz"))


def iter_documents(spec: str, text_field: str = "text", data_dir: str | None = None
                   ) -> Iterator[list[str]]:
  """Yields documents (lists of sentences) of `spec` in a deterministic order."""
  if spec.startswith(TFDS_PREFIX):
    yield from _tfds_documents(spec[len(TFDS_PREFIX):], text_field, data_dir)
    return
  for path in resolve_paths(spec):
    if is_jsonl(path):
      yield from _jsonl_documents(path, text_field)
    else:
      yield from _text_documents(path)


def _open_lines(path: str, max_chars: int | None = None) -> Iterator[str]:
  """Lines of a (gzipped) UTF-8 file, streamed, each cut into pieces of at most
  `max_chars` (None: whole lines); binary files rejected up front."""
  try:
    raw = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    sample = raw.read(_BINARY_SAMPLE)
  except (OSError, EOFError) as e:
    raise DataError(f"cannot read corpus file {path!r} ({e}): give a readable text or "
                    ".gz file") from None
  if b"\x00" in sample:
    raise DataError(f"corpus file {path!r} is binary (contains NUL bytes): give UTF-8 "
                    "text, one sentence a line")
  text = sample.decode("utf-8", errors="replace")
  if text and text.count("\ufffd") > _MAX_REPLACED_FRACTION * len(text):
    raise DataError(f"corpus file {path!r} is binary (mostly not UTF-8): give UTF-8 "
                    "text, one sentence a line")
  raw.seek(0)
  with io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as f:
    try:
      while True:
        line = f.readline(-1 if max_chars is None else max_chars)
        if not line:
          return
        yield line
    except (OSError, EOFError) as e:  # e.g. a truncated .gz
      raise DataError(f"corpus file {path!r} is truncated or corrupt ({e}): fix or "
                      "remove it") from None


def _paragraph_sentences(text: str) -> list[str]:
  text = repair_unicode(text)  # JSON may escape lone surrogates ("\ud800")
  return [s for line in text.splitlines() for s in split_sentences(line)]


def _text_documents(path: str) -> Iterator[list[str]]:
  current: list[str] = []
  characters = 0
  for line in _open_lines(path, MAX_LINE_CHARS):
    if line.strip():
      current.extend(split_sentences(line))
      characters += len(line)
    if current and (not line.strip() or characters >= MAX_DOCUMENT_CHARS):
      yield current
      current, characters = [], 0
  if current:
    yield current


def _jsonl_documents(path: str, text_field: str) -> Iterator[list[str]]:
  for number, line in enumerate(_open_lines(path), 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as e:  # RecursionError: [[[[...
      why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
      raise DataError(f"{path}:{number} is not a JSON object ({why}): give one JSON "
                      "object a line (JSON lines)") from None
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
      raise DataError(f"{path}:{number} has no string field {text_field!r}: set "
                      "--text_field (config.data.text_field) to the text's key")
    sentences = _paragraph_sentences(record[text_field])
    if sentences:
      yield sentences


def _tfds_documents(name: str, text_field: str, data_dir: str | None
                    ) -> Iterator[list[str]]:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  name, _, split = name.partition(":")
  try:
    source = tfds.data_source(name, split=split or "train", data_dir=data_dir,
                              download=False)
  except Exception as e:  # tfds raises many types for a missing or unprepared dataset
    raise DataError(f"TFDS dataset {name!r} ({split or 'train'}) cannot be read "
                    f"({str(e).splitlines()[0][:200]}): prepare it in ArrayRecord format "
                    "first (tfds build --file_format=array_record)") from None
  for i in range(len(source)):
    value = source[i][text_field]
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
    sentences = _paragraph_sentences(text)
    if sentences:
      yield sentences


def text_bytes(spec: str) -> int | None:
  """The size of a corpus's text in bytes (a .gz counts uncompressed, from its
  trailer), or None when it cannot be told cheaply (the embedded corpus, TFDS)."""
  if spec == EMBEDDED or spec.startswith(TFDS_PREFIX):
    return None
  total = 0
  for path in resolve_paths(spec):
    if path.endswith(".gz"):
      with open(path, "rb") as f:  # ISIZE: the uncompressed size modulo 2**32
        f.seek(-4, os.SEEK_END)
        size = int.from_bytes(f.read(4), "little")
      total += max(size, os.path.getsize(path))
    else:
      total += os.path.getsize(path)
  return total
