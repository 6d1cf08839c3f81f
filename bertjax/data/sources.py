"""Streaming corpus sources: documents one at a time, memory independent of corpus size.

`iter_documents(spec)` yields documents, each a non-empty list of sentences
(`load_documents(spec)`: all of them, at once, for a small corpus;
`iter_document_texts(spec)`: each as one str, its sentences joined by newlines):

* `'embedded'`: English prose that ships with every Python installation, no download:
  the reference-manual topics of `pydoc_data.topics` (the text behind `help('if')`),
  with code blocks, grammar rules and reST markup removed, wrapped lines re-flowed into
  paragraphs, split into one document per section heading, then into sentences. The
  result depends only on the Python version, so it is identical across machines.
* a file, glob or directory (recursively, hidden files skipped), local or remote
  (`gs://...` through etils.epath; remote globs match within one directory level,
  `*` `?` `[...]`, no `**`: give the directory to read a tree); `.gz` and `.zst` are
  decompressed on the fly. By file name (`bertjax.data.formats` reads the formats):
  - plain text (any other name): one sentence or paragraph a line, a blank line
    between documents;
  - JSON lines (`.jsonl`, `.json`, also `.gz` / `.zst`: Dolma's `.json.zst`): one
    document an object, its text in `text_field`; newlines inside the text separate
    paragraphs;
  - Parquet (`.parquet`: FineWeb, DCLM): one document a row, its text in the column
    `text_field`, read a row group at a time;
  - Arrow IPC (`.arrow`), and a directory Hugging Face `datasets` saved with
    `save_to_disk` (its `state.json` lists its `data-*.arrow` files; a DatasetDict
    directory gives its `train` split): one document a row, column `text_field`.
* `tfds:NAME[/CONFIG][:SPLIT]` (e.g. `tfds:wikipedia/20230601.en`, `tfds:c4/en:train`):
  a prepared TFDS dataset read through `tfds.data_source` from ArrayRecord, no
  TensorFlow needed; the text is in `text_field`. `data_dir` is TFDS's data dir.

A weighted mixture of such specs (`config.data.corpus='general:0.3=...,domain:0.7=...'`)
is `bertjax.data.mixture`'s: each of its sources is one spec here.

Paragraph lines are split into sentences with a punctuation regex (`document_text`),
or with `line_breaks='apart'` (config.data.line_breaks) each line is one unit,
unsplit, to be tokenized apart from the line before it (`tokenizer.unit_texts`). Bad
input raises `DataError` before any document of that file is yielded (binary file, a
Parquet / Arrow file without the text column) or is repaired (invalid UTF-8 bytes and
lone surrogates of JSON escapes become U+FFFD; a text line longer than
`MAX_LINE_CHARS` is cut into pieces, a JSON line is read whole), so a long preparation
never dies midway; a file truncated midway (.gz, .zst) raises where its data ends.
"""

from __future__ import annotations

import glob
import io
import json
import os
import re
from typing import Iterable, Iterator

from etils import epath

from bertjax.data import formats
from bertjax.errors import DataError

TFDS_PREFIX = "tfds:"
EMBEDDED = "embedded"  # the corpus shipped with every Python (`_embedded_documents`)
MAX_LINE_CHARS = 1 << 20
# A text document is cut into documents of about this many characters (a file with no
# blank line is one document; bounded, it never has to fit in memory whole).
MAX_DOCUMENT_CHARS = 1 << 24
_BINARY_SAMPLE = 1 << 16
_MAX_REPLACED_FRACTION = 0.3
# A sentence ends at . ! or ? (optionally closed by a quote or bracket) followed by
# whitespace and an upper-case letter, digit, quote or bracket. The groups are the mark
# and the closing quote, which stay with their sentence: the match begins at the mark,
# so the regex engine skips to the next [.!?] instead of trying every position. A
# newline is not matched: in `document_text` it ends a unit already.
_SENTENCE_END = re.compile(r"([.!?])(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\betc\.)"
                           r"([\"'”’)\]]?)[^\S\n]+(?=[A-Z0-9\"“‘(\[])")
# Lone UTF-16 surrogates: a Python str may hold them (JSON "\ud800" escapes) but they
# are not Unicode text and the tokenizer libraries refuse them.
_SURROGATE = re.compile("[\ud800-\udfff]")


# A section heading: a title line underlined with *, =, - or ~ of the same length.
_UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}$")
# A definition entry: a signature such as `str.split(sep=None, maxsplit=-1)` at column 0.
_SIGNATURE = re.compile(r"^[A-Za-z_][\w.]*\(.*\)$")
_BULLET = re.compile(r"^(\*|-|\d+\.|\(\d+\))\s+")
_FOOTNOTE = re.compile(r"\[\d+\]")
_EMPHASIS = re.compile(r"\*{1,2}([^*\s][^*]*?)\*{1,2}")
# pydoc renders inline code as "name": keep the name, drop the quotes.
_LITERAL = re.compile(r'"([^"\s]{1,40})"')
_MIN_SENTENCE_CHARS = 12
_MIN_DOCUMENT_SENTENCES = 2
# config.data.line_breaks: how a line break inside a document reaches the tokenizer.
# 'space': as a space, the document's lines being one running text (wrapped lines,
# BERT's one sentence a line: a line's first word is tokenized as after a space, as in
# the paragraph the lines come from); the lines are split into sentences (NSP's units).
# 'apart': each line is a unit of its own, tokenized apart from the one before (its
# first word as a text's first word): transformers' run_mlm.py and fairseq's encoders,
# which read a text file a line at a time; for files whose lines are separate texts.
LINE_BREAKS = ("space", "apart")


def repair_unicode(text: str) -> str:
  """`text` with each lone surrogate replaced by U+FFFD (as invalid UTF-8 bytes are)."""
  return _SURROGATE.sub("\ufffd", text)


def line_units(line: str, line_breaks: str = "space") -> list[str]:
  """The units of one line of text: its sentences ('space'), or the line itself with
  its whitespace collapsed ('apart'); none for a blank line."""
  text = document_text([line], line_breaks)
  return text.split("\n") if text else []


def document_text(lines: Iterable[str], line_breaks: str = "space") -> str:
  """The units of `lines` (`line_units` of each, in order) joined by newlines, '' when
  every line is blank: str methods over the whole document instead of a Python step a
  line or a unit. A unit holds no whitespace but single spaces, so splitting the text
  at its newlines gives the units back. The sentences are split in the lines joined
  as in each line alone: the regex matches no newline, and its lookbehinds see the
  newline before a line as they see the start of one (no word character)."""
  text = "\n".join(filter(None, map(" ".join, map(str.split, lines))))
  return text if line_breaks == "apart" else _SENTENCE_END.sub(r"\1\2\n", text)


def resolve_paths(spec: str) -> list[str]:
  """Expands a path, directory (recursively, hidden files skipped) or glob, local or
  remote; a `datasets` save_to_disk directory is one path (`formats.is_hf_dataset`)."""
  paths = (_remote_paths(spec) if formats.is_remote(spec)
           else _local_paths(os.path.expanduser(spec)))
  if paths is None:
    raise DataError(f"corpus {spec!r} matches no file: check the path or glob, or use "
                    "--config.data.corpus=embedded")
  if not paths:
    raise DataError(f"corpus directory {spec!r} holds no files: put text files "
                    "(one sentence a line, blank line between documents) in it")
  return paths


def _local_paths(spec: str) -> list[str] | None:
  """The files of a local spec; None when nothing matches."""
  if os.path.isdir(spec):
    if formats.is_hf_dataset(spec):
      return [spec]
    paths = []
    for root, dirs, files in os.walk(spec):
      dirs[:] = _descend(root, dirs, paths)
      paths.extend(os.path.join(root, f) for f in sorted(files) if not f.startswith("."))
    return paths
  if os.path.isfile(spec):
    return [spec]
  return sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p)) or None


def _remote_paths(spec: str) -> list[str] | None:
  """The files of a remote spec (epath: a file, a directory's tree, or a glob within
  directory levels); None when nothing matches."""
  scheme = spec.split("://", 1)[0] + "://"
  path = epath.Path(spec)
  if not any(c in spec for c in "*?["):
    if path.is_dir():
      if formats.is_hf_dataset(spec):
        return [spec]
      paths = []
      for root, dirs, files in path.walk():
        root = str(root)  # fsspec's walk may drop the scheme
        root = root if "://" in root else scheme + root
        dirs[:] = _descend(root, dirs, paths)
        paths.extend(f"{root}/{f}" for f in sorted(files) if not f.startswith("."))
      return paths
    return [spec] if path.exists() else None
  fixed = spec[:min(spec.index(c) for c in "*?[" if c in spec)].rsplit("/", 1)[0]
  if "**" in spec:
    raise DataError(f"corpus {spec!r}: remote globs match within directory levels (no "
                    f"**): give the directory {fixed} to read its whole tree")
  return sorted(str(p) for p in epath.Path(fixed).glob(spec[len(fixed) + 1:])
                if not p.name.startswith(".") and not p.is_dir()) or None


def _descend(root: str, dirs: list[str], paths: list[str]) -> list[str]:
  """The subdirectories of `root` a walk enters (sorted, hidden ones skipped); a
  `datasets` directory among them is added to `paths` whole instead."""
  out = []
  for d in sorted(d for d in dirs if not d.startswith(".")):
    if formats.is_hf_dataset(f"{root}/{d}"):
      paths.append(f"{root}/{d}")
    else:
      out.append(d)
  return out


def is_jsonl(path: str) -> bool:
  return formats.base_name(path).endswith((".jsonl", ".json"))


def iter_documents(spec: str, text_field: str = "text", data_dir: str | None = None,
                   line_breaks: str = "space") -> Iterator[list[str]]:
  """Yields documents (lists of units: sentences, or lines with `line_breaks='apart'`,
  `line_units`) of `spec` in a deterministic order."""
  for text in iter_document_texts(spec, text_field, data_dir, line_breaks):
    yield text.split("\n")


def iter_document_texts(spec: str, text_field: str = "text", data_dir: str | None = None,
                        line_breaks: str = "space") -> Iterator[str]:
  """`iter_documents`' documents, each as its units joined by newlines
  (`document_text`): one str a document, for stage 1 of prepare."""
  if spec == EMBEDDED:
    yield from map("\n".join, _embedded_documents(line_breaks))
    return
  if spec.startswith(TFDS_PREFIX):
    yield from _tfds_documents(spec[len(TFDS_PREFIX):], text_field, data_dir, line_breaks)
    return
  for path in resolve_paths(spec):
    kind = formats.kind(path)
    if kind == "jsonl":
      yield from _jsonl_documents(path, text_field, line_breaks)
    elif kind == "text":
      yield from _text_documents(path, line_breaks)
    else:
      yield from filter(None, (_paragraph_text(text, line_breaks)
                               for text in formats.texts(path, kind, text_field)))


def load_documents(spec: str, text_field: str = "text", limit_chars: int | None = None,
                   line_breaks: str = "space") -> list[list[str]]:
  """Loads a corpus whole: `'embedded'`, or any `iter_documents` spec (text, JSON
  lines, Parquet, Arrow, `datasets` directories, globs, directories, `.gz`, `.zst`,
  `tfds:NAME`).

  Returns documents (in a deterministic order), each a non-empty list of units
  (sentences, or lines with `line_breaks='apart'`).
  Raises `DataError` when the spec matches nothing, a file is binary or unreadable,
  the corpus is empty, or it holds more than `limit_chars` characters (None: no limit).
  """
  if not spec:
    raise no_text(spec, text_field)
  documents, characters = [], 0
  for document in iter_documents(spec, text_field, line_breaks=line_breaks):
    documents.append(document)
    characters += sum(map(len, document))
    if limit_chars is not None and characters > limit_chars:
      raise too_large(spec, characters, limit_chars, "over")
  if not documents:
    raise no_text(spec, text_field)
  return documents


def no_text(spec: str, text_field: str = "text") -> DataError:
  """The one line of a corpus spec that is empty or whose files hold no text."""
  if not spec:
    return DataError("config.data.corpus is empty: set it to 'embedded' or to a text "
                     "file, glob or directory (e.g. --config.data.corpus='/data/*.txt')")
  return DataError(f"corpus {spec!r} contains no text: give text files with one "
                   "sentence a line and a blank line between documents, or records "
                   f"whose {text_field!r} field / column holds text "
                   "(config.data.text_field)")


def too_large(spec: str, size: int, limit: int, how: str = "") -> DataError:
  """The one line refusing to build `spec` (`size` bytes of text) in memory."""
  return DataError(
      f"corpus {spec!r} holds {how + ' ' if how else ''}{size / 2**20:,.0f} MB of text, "
      f"more than config.data.raw_text_limit_mb={limit / 2**20:g} that training builds "
      f"in memory: prepare it once (python -m bertjax.data.prepare --config=YOUR_CONFIG "
      f"--input={spec} --tokenizer=TOKENIZER --output=DIR) and train with "
      "--config.data.corpus=DIR")


def _open_lines(path: str, max_chars: int | None = None) -> Iterator[str]:
  """Lines of a (.gz / .zst compressed) UTF-8 file, streamed, each cut into pieces of
  at most `max_chars` (None: whole lines); binary files rejected up front."""
  try:
    with formats.open_binary(path) as raw:
      sample = raw.read(_BINARY_SAMPLE)
  except (OSError, EOFError) as e:
    raise DataError(f"cannot read corpus file {path!r} ({e}): give a readable text, "
                    ".gz or .zst file") from None
  if b"\x00" in sample:
    raise DataError(f"corpus file {path!r} is binary (contains NUL bytes): give UTF-8 "
                    "text, one sentence a line")
  text = sample.decode("utf-8", errors="replace")
  if text and text.count("\ufffd") > _MAX_REPLACED_FRACTION * len(text):
    raise DataError(f"corpus file {path!r} is binary (mostly not UTF-8): give UTF-8 "
                    "text, one sentence a line")
  with io.TextIOWrapper(formats.open_binary(path), encoding="utf-8",
                        errors="replace") as f:
    try:
      while True:
        line = f.readline(-1 if max_chars is None else max_chars)
        if not line:
          return
        yield line
    except (OSError, EOFError) as e:  # e.g. a truncated .gz
      raise DataError(f"corpus file {path!r} is truncated or corrupt ({e}): fix or "
                      "remove it") from None


def _paragraph_text(text: str, line_breaks: str) -> str:
  """`document_text` of a record's text, its lines as `str.splitlines` has them."""
  text = repair_unicode(text)  # JSON may escape lone surrogates ("\ud800")
  return document_text(text.splitlines(), line_breaks)


def _text_documents(path: str, line_breaks: str) -> Iterator[str]:
  """The `document_text` of each run of non-blank lines of a text file (a document
  closing, too, once its lines hold MAX_DOCUMENT_CHARS)."""
  lines: list[str] = []
  characters = 0
  for line in _open_lines(path, MAX_LINE_CHARS):
    blank = line.isspace()
    if not blank:
      lines.append(line)
      characters += len(line)
    if lines and (blank or characters >= MAX_DOCUMENT_CHARS):
      yield document_text(lines, line_breaks)
      lines, characters = [], 0
  if lines:
    yield document_text(lines, line_breaks)


def _jsonl_documents(path: str, text_field: str, line_breaks: str) -> Iterator[str]:
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
    text = _paragraph_text(record[text_field], line_breaks)
    if text:
      yield text


def _tfds_documents(name: str, text_field: str, data_dir: str | None, line_breaks: str
                    ) -> Iterator[str]:
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
    text = _paragraph_text(text, line_breaks)
    if text:
      yield text


def text_bytes(spec: str, text_field: str = "text") -> int | None:
  """About how many bytes of text a corpus holds, from its files' sizes and metadata
  (`formats.text_bytes`: a .gz counts uncompressed, a Parquet file its text column),
  or None when that cannot be told cheaply (the embedded corpus, TFDS, a .zst written
  as a stream)."""
  if spec == EMBEDDED or spec.startswith(TFDS_PREFIX):
    return None
  total = 0
  for path in resolve_paths(spec):
    size = formats.text_bytes(path, formats.kind(path), text_field)
    if size is None:
      return None
    total += size
  return total


def _embedded_documents(line_breaks: str = "space") -> list[list[str]]:
  """The `pydoc_data.topics` reference manual, one document per section or entry, its
  re-flowed paragraphs its lines (with `line_breaks='apart'`, a paragraph a unit).

  A section or definition entry too short to stand alone is appended to the one
  before it in the same topic.
  """
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top

  documents = []
  for name in sorted(topics.topics):
    topic_documents = []
    for section in _split_sections(topics.topics[name]):
      sentences = [s for p in _prose_paragraphs(section)
                   for s in line_units(p, line_breaks)]
      sentences = [s for s in sentences if len(s) >= _MIN_SENTENCE_CHARS]
      if len(sentences) < _MIN_DOCUMENT_SENTENCES and topic_documents:
        topic_documents[-1].extend(sentences)
      elif sentences:
        topic_documents.append(sentences)
    documents.extend(d for d in topic_documents if len(d) >= _MIN_DOCUMENT_SENTENCES)
  return documents


def _split_sections(text: str) -> list[list[str]]:
  """Splits a topic's lines at underlined headings and signature lines (both dropped)."""
  lines = text.splitlines()
  sections, current = [], []
  i = 0
  while i < len(lines):
    if (i + 1 < len(lines) and lines[i].strip() and _UNDERLINE.match(lines[i + 1])
        and len(lines[i + 1]) >= len(lines[i].rstrip())):
      sections.append(current)
      current = []
      i += 2
      continue
    if _SIGNATURE.match(lines[i]):
      sections.append(current)
      current = []
      i += 1
      continue
    current.append(lines[i])
    i += 1
  sections.append(current)
  return [s for s in sections if any(line.strip() for line in s)]


def _prose_paragraphs(lines: list[str]) -> list[str]:
  """Blank-line separated blocks that read as prose, re-flowed into one line each.

  Bullet items start their own paragraph; code, grammar rules, tables, interactive
  sessions and signature lines are dropped; reST emphasis, literal quotes and footnote
  marks removed.
  """
  blocks, current = [], []
  for line in lines:
    stripped = line.strip()
    if not stripped:
      if current:
        blocks.append(current)
      current = []
    elif _BULLET.match(stripped) and current:
      blocks.append(current)
      current = [stripped]
    else:
      current.append(stripped)
  if current:
    blocks.append(current)
  paragraphs = []
  for block in blocks:
    text = _BULLET.sub("", " ".join(block))
    text = _FOOTNOTE.sub("", _LITERAL.sub(r"\1", _EMPHASIS.sub(r"\1", text)))
    text = " ".join(text.split())
    if _is_prose(text):
      paragraphs.append(text)
  return paragraphs


def _is_prose(text: str) -> bool:
  """Heuristic: several words, mostly letters and spaces, sentence punctuation."""
  if len(text.split()) < 5 or text[-1] not in ".!?:;)\"”":
    return False
  if any(marker in text for marker in ("::=", ">>>", "+---", "+===", "===", "def ",
                                       "    ")):
    return False
  letters = sum(c.isalpha() or c.isspace() for c in text)
  return letters >= 0.85 * len(text)
