"""Real text nobody here wrote, on every machine: the docstrings of the installed Python
(the standard library and site-packages), read the same way by the benchmarks that need
a corpus (`pretrain_fidelity`, `electra_claim`: documents) or retrieval pairs
(`retrieval_example`: a docstring's summary and the rest of it)."""

from __future__ import annotations

import ast
import os
import sysconfig
from typing import Iterator

# Packages of site-packages whose docstrings join the standard library's by default
# (1.7 + 1.6 + 4.7 MB of text with Python 3.11, numpy 2 and scipy).
PACKAGES = ("numpy", "scipy")
MIN_WORDS = 8  # A docstring shorter than this is not a document ('one_line').
MIN_LINES = 2  # Nor one of fewer non-empty lines ('lines').
LAYOUTS = ("one_line", "lines")
_SKIPPED = ("test", "tests", "idle_test", "__pycache__", "site-packages")


def roots(packages: list[str]) -> list[str]:
  """The standard library and the installed `packages` (those found; ['all']: every
  package of site-packages)."""
  site = sysconfig.get_paths()["purelib"]
  if list(packages) == ["all"]:
    return [sysconfig.get_paths()["stdlib"], site]
  found = [os.path.join(site, p) for p in packages if os.path.isdir(os.path.join(site, p))]
  return [sysconfig.get_paths()["stdlib"], *found]


def file_docstrings(paths: list[str]) -> Iterator[list[str]]:
  """Each readable Python file's docstrings (module, class, function; in `ast.walk`
  order) under `paths` (files or directories, walked in sorted order, tests skipped)."""
  files = []
  for root in paths:
    files += [root] if os.path.isfile(root) else []
    for dirpath, dirnames, filenames in os.walk(root):
      dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED)
      files += [os.path.join(dirpath, n) for n in sorted(filenames) if n.endswith(".py")]
  for name in files:
    try:
      with open(name, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
      continue
    yield [ast.get_docstring(node) or "" for node in ast.walk(tree) if isinstance(
        node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]


def documents(paths: list[str], layout: str = "one_line", max_bytes: int = 0) -> list[str]:
  """The docstrings under `paths` as documents, in order, repeated ones once.

  layout='one_line': those of MIN_WORDS words or more, each one line of single spaces;
  'lines': those of MIN_LINES non-empty lines or more, each line's whitespace collapsed,
  one line each (a document of several lines, as BERT's corpus layout is). With
  `max_bytes`, the documents of the files read until their text first holds that many
  bytes.
  """
  out, seen, size = [], set(), 0
  for docstrings in file_docstrings(paths):
    if max_bytes and size >= max_bytes:
      break
    for docstring in docstrings:
      if layout == "lines":
        lines = [" ".join(x.split()) for x in docstring.splitlines()]
        text = "\n".join(x for x in lines if x)
        keep = text.count("\n") + 1 >= MIN_LINES
      else:
        text = " ".join(docstring.split())
        keep = len(text.split()) >= MIN_WORDS
      if keep and text not in seen:
        seen.add(text)
        out.append(text)
        size += len(text.encode())
  return out


def pairs(paths: list[str], min_words: int = 4) -> list[tuple[str, str]]:
  """(summary, rest) of every docstring of two paragraphs or more under `paths`, each
  whitespace-collapsed and of at least `min_words` words; a pair whose summary or rest
  was seen before is dropped with the earlier one (an ambiguous query, or a document
  that would be two queries' positive)."""
  found, count = [], {}
  for docstrings in file_docstrings(paths):
    for docstring in docstrings:
      head, _, rest = docstring.strip().partition("\n\n")
      head, rest = " ".join(head.split()), " ".join(rest.split())
      if len(head.split()) >= min_words and len(rest.split()) >= min_words:
        found.append((head, rest))
        for text in (head, rest):
          count[text] = count.get(text, 0) + 1
  return [(q, d) for q, d in found if count[q] == 1 and count[d] == 1]
