"""The `tokenizers` library's side of `bertjax.data.tokenizer.Tokenizer`: `HFBackend`
over a `tokenizers.Tokenizer` (WordPiece, BPE, any tokenizer.json), and the fast paths
stage 1 of prepare takes through it, each giving the ids the library gives whole texts
(tests/test_tokenizer.py): a cache of words' ids where a text's ids are its words'
(BERT's pre-tokenizer; GPT-2's byte-level BPE, a word with the space before it), a
document a pre-tokenized input elsewhere, and the ids flat in numpy arrays.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from typing import Sequence

import numpy as np
import tokenizers
from tokenizers import models


# Characters Python's str.split() splits at but BERT's normalizer deletes (control
# characters): a text holding one is tokenized whole, not word by word.
_SPLIT_MISMATCH = re.compile("[\x0b\x0c\x1c-\x1f\x85]")
_WORD_CACHE_SIZE = 1 << 20  # distinct whitespace-separated words kept (~100 MB at most)


def _splits_at_whitespace(tok: tokenizers.Tokenizer) -> bool:
  """True when a text's ids are the concatenation of its whitespace-separated words'
  ids: BERT's pre-tokenizer (or a plain whitespace split) after per-character
  normalizers, and no added token holding a space. Byte-level BPE and Metaspace keep
  the space inside the next token, so they are tokenized whole."""
  state = json.loads(tok.to_str())
  pre, norm = state.get("pre_tokenizer") or {}, state.get("normalizer") or {}
  norms = norm.get("normalizers", [norm]) if norm else []
  return (pre.get("type") in ("BertPreTokenizer", "WhitespaceSplit")
          and all(n.get("type") in ("BertNormalizer", "Lowercase", "NFD", "StripAccents")
                  for n in norms)
          and not any(re.search(r"\s", t["content"]) for t in state.get("added_tokens", [])))


# Whitespace other than the space (as Python's str.isspace counts it, a superset of
# Unicode's White_Space that the libraries' regexes use), and runs of spaces.
_NOT_SINGLE_SPACES = re.compile(r"[^\S ]|  | $")


def _splits_before_spaces(tok: tokenizers.Tokenizer) -> bool:
  """True when a text of words separated by single spaces has the concatenation of its
  pieces' ids, the pieces being the first word and each later word with the space
  before it ('a b c' -> 'a', ' b', ' c'): GPT-2's byte-level pre-tokenizer
  (ByteLevel with its regex, no prefix space), which attaches a space to the token
  after it and never ends a token with one, behind no normalizer or a lower-casing one,
  and no added token holding a space or taking the space after it (rstrip,
  single_word)."""
  state = json.loads(tok.to_str())
  pre, norm = state.get("pre_tokenizer") or {}, state.get("normalizer") or {}
  norms = norm.get("normalizers", [norm]) if norm else []
  return (pre.get("type") == "ByteLevel" and pre.get("use_regex", True)
          and not pre.get("add_prefix_space")
          and all(n.get("type") == "Lowercase" for n in norms)
          and not any(re.search(r"\s", t["content"]) or t.get("rstrip") or t.get("single_word")
                      for t in state.get("added_tokens", [])))


def _spaced_pieces(text: str) -> list[str]:
  """'a b c' -> ['a', ' b', ' c'] (' b c' -> [' b', ' c']), for `_splits_before_spaces`."""
  words = text.split(" ")
  return [w for w in words[:1] if w] + [" " + w for w in words[1:]]


class HFBackend:
  """A `tokenizers.Tokenizer` (WordPiece, BPE or any tokenizer.json).

  For WordPiece behind BERT's pre-tokenizer, `encode_batch` tokenizes each distinct
  whitespace-separated word once and reuses its ids (bounded cache): the same ids as
  tokenizing the whole text (tests/test_tokenizer.py), ~2x faster on natural text where
  words repeat. Byte-level BPE (GPT-2's pre-tokenizer) alike, its words each with the
  space before it (`_splits_before_spaces`), a text with other whitespace than single
  spaces between words tokenized whole.
  """

  def __init__(self, tok: tokenizers.Tokenizer):
    tok.no_truncation()
    tok.no_padding()
    self.tok = tok
    self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
    self.wordpiece = isinstance(tok.model, models.WordPiece)  # '##' continuations
    # The word cache's keys: whitespace-separated words, or space-prefixed ones.
    self._spaced = not _splits_at_whitespace(tok) and _splits_before_spaces(tok)
    self._words: dict[str, tuple[int, ...]] | None = (
        {} if self._spaced or _splits_at_whitespace(tok) else None)

  def _encode(self, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    texts = list(texts)
    if self._words is None:
      return self._encode(texts)
    if self._spaced:
      whole = [i for i, t in enumerate(texts) if _NOT_SINGLE_SPACES.search(t)]
      words = list(map(_spaced_pieces, texts))
    else:
      whole = [i for i, t in enumerate(texts) if _SPLIT_MISMATCH.search(t)]
      words = [t.split() for t in texts]
    cache = self._words
    new = list(set(itertools.chain.from_iterable(words)).difference(cache))
    if len(cache) + len(new) > _WORD_CACHE_SIZE:
      cache.clear()
    cache.update(zip(new, map(tuple, self._encode(new))))  # Tuples: no GC tracking.
    get = cache.__getitem__
    out = [list(itertools.chain.from_iterable(map(get, w))) for w in words]
    for i, ids in zip(whole, self._encode([texts[i] for i in whole])):
      out[i] = ids
    return out

  def encode_units(self, documents: Sequence[Sequence[str]]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The ids of every unit (text) of `documents`, flat: (ids int32 [N], lengths int64
    [units]), the units in order; the same ids as `encode_batch` of the units.

    With the word cache, `encode_batch` of the units. Otherwise each document is one
    pre-tokenized input (`is_pretokenized`: each unit normalised and pre-tokenized on
    its own, as a text of its own is; its tokens' word ids name their unit): one
    Encoding a document instead of one a unit, the library's per-text cost paid per
    document (stage 1 of prepare: ~10% of a byte-level BPE's time)."""
    if self._words is not None:
      return flatten(self.encode_batch([u for d in documents for u in d]))
    documents = [list(d) for d in documents]
    encodings = self.tok.encode_batch(documents, is_pretokenized=True,
                                      add_special_tokens=False)
    counts = np.fromiter(map(len, encodings), np.int64, len(encodings))
    total = int(counts.sum())
    ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), np.int32,
                      total)
    words = [e.word_ids for e in encodings]
    units = np.fromiter(map(len, documents), np.int64, len(documents))
    if any(None in w for w in words):  # a token of no unit: cannot be split by unit
      return flatten(self.encode_batch([u for d in documents for u in d]))
    first = np.repeat(np.cumsum(units) - units, counts)  # each token's document's 1st unit
    unit_of = np.fromiter(itertools.chain.from_iterable(words), np.int64, total) + first
    return ids, np.bincount(unit_of, minlength=int(units.sum())).astype(np.int64)

  def id_to_token(self, i: int) -> str | None:
    return self.tok.id_to_token(i)

  def token_to_id(self, t: str) -> int | None:
    return self.tok.token_to_id(t)

  def decode(self, ids: Sequence[int]) -> str:
    return self.tok.decode(list(ids), skip_special_tokens=False)

  def save(self, directory: str) -> None:
    self.tok.save(os.path.join(directory, "tokenizer.json"))


def flatten(id_lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """Lists of ids as (ids int32 [N], lengths int64 [len(id_lists)])."""
  lengths = np.fromiter(map(len, id_lists), np.int64, len(id_lists))
  return (np.fromiter(itertools.chain.from_iterable(id_lists), np.int32,
                      int(lengths.sum())), lengths)
