"""Corpus sources: documents as lists of sentences.

`load_documents(spec)` returns `list[list[str]]`: documents, each a list of sentences.

* `'embedded'`: English prose that ships with every Python installation, no download:
  the reference-manual topics of `pydoc_data.topics` (the text behind `help('if')`),
  with code blocks, grammar rules and reST markup removed, wrapped lines re-flowed into
  paragraphs, split into one document per section heading, then into sentences. The
  result depends only on the Python version, so it is identical across machines.
* Anything else is read by `sources.iter_documents`: text or JSON-lines files, globs,
  directories, `.gz`, TFDS datasets (`tfds:wikipedia/20230601.en`). Paragraph lines
  are split into sentences with the same simple splitter.
"""

from __future__ import annotations

import re

from bertjax.data import sources
from bertjax.errors import DataError

EMBEDDED = sources.EMBEDDED

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


def load_documents(spec: str, text_field: str = "text") -> list[list[str]]:
  """Loads a corpus: `'embedded'`, or any `sources.iter_documents` spec (text or JSON
  lines files, globs, directories, `.gz`, `tfds:NAME`).

  Returns documents (in a deterministic order), each a non-empty list of sentences.
  Raises `DataError` when the spec matches nothing, a file is binary or the corpus
  is empty.
  """
  if not spec:
    raise DataError("config.data.corpus is empty: set it to 'embedded' or to a text "
                    "file, glob or directory (e.g. --config.data.corpus='/data/*.txt')")
  if spec == EMBEDDED:
    documents = _embedded_documents()
  else:
    documents = list(sources.iter_documents(spec, text_field))
  if not documents:
    raise DataError(f"corpus {spec!r} contains no text: give files with one sentence a "
                    "line and a blank line between documents")
  return documents


def _embedded_documents() -> list[list[str]]:
  """The `pydoc_data.topics` reference manual, one document per section or entry.

  A section or definition entry too short to stand alone is appended to the one
  before it in the same topic.
  """
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top

  documents = []
  for name in sorted(topics.topics):
    topic_documents = []
    for section in _split_sections(topics.topics[name]):
      sentences = [s for p in _prose_paragraphs(section)
                   for s in sources.split_sentences(p)]
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
