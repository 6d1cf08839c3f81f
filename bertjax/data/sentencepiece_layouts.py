"""SentencePiece models behind `bertjax.data.tokenizer.Tokenizer`: XLM-R's layout
(`sentencepiece.bpe.model`, fairseq's id mapping) and DeBERTa's (`spm.model`, the
pieces' own ids with BERT's special tokens)."""

from __future__ import annotations

import itertools
import os
import re
from typing import Sequence

import numpy as np
import sentencepiece as spm
from tokenizers import normalizers

from bertjax.data.hf_backend import flatten

SENTENCEPIECE_FILE = "sentencepiece.bpe.model"  # the name Hugging Face's XLM-R dirs use
SPM_FILE = "spm.model"  # DeBERTa's layout: the name its Hugging Face dirs use


class SentencePieceBackend:
  """A SentencePiece model, in XLM-R's layout (fairseq's id mapping) or DeBERTa's (the
  pieces' own ids, BERT's special tokens; `bert` True).

  Special tokens written inside the text (`<mask>`, `<s>`, ..., or `[MASK]`, `[CLS]`,
  ...) are recognised as Hugging Face does; XLM-R's `<mask>` also swallows the
  whitespace on its left (lstrip); DeBERTa's text between them is encoded stripped
  (SentencePiece's normalisation; transformers' Strip normaliser). With `lowercase`,
  the text between them is lower-cased first (tokenizers' Lowercase normaliser ahead
  of the model's own: `bertjax.data.tokenizer.lowercasing`).
  """

  FAIRSEQ = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
  BERT = ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")
  wordpiece = False  # words start at '▁'

  def __init__(self, proto: bytes, lowercase: bool = False):
    self.proto = proto
    self.lowercase = lowercase
    self.sp = spm.SentencePieceProcessor(model_proto=proto)
    n, unk = self.sp.get_piece_size(), self.sp.unk_id()
    self.bert = self.sp.piece_to_id("[CLS]") != unk
    if self.bert:  # DeBERTa's spm.model: ids are the pieces', [MASK] after them
      self.specials = {t: self.sp.piece_to_id(t) for t in self.BERT
                       if self.sp.piece_to_id(t) != unk or t == self.sp.id_to_piece(unk)}
      self.specials.setdefault("[MASK]", n)
      self.vocab_size = max(n, self.specials["[MASK]"] + 1)
      self.split_re = re.compile("(" + "|".join(map(re.escape, self.specials)) + ")")
    else:
      self.mask_id = n + 1
      self.vocab_size = self.mask_id + 1
      self.specials = dict(self.FAIRSEQ, **{"<mask>": self.mask_id})
      self.split_re = re.compile(r"(\s*<mask>|<s>|</s>|<pad>|<unk>)")
    self.special_tokens = {v: k for k, v in self.specials.items()}
    # The special tokens' names: a text holds one exactly where `split_re` matches in
    # it (XLM-R's taking the whitespace before <mask> too).
    self._special_re = re.compile("|".join(map(re.escape, self.specials)))

  def _to_ids(self, spm_ids: list[int]) -> list[int]:
    if self.bert:
      return list(spm_ids)
    unk = self.sp.unk_id()
    return [self.FAIRSEQ["<unk>"] if i == unk else i + 1 for i in spm_ids]

  def _piece_of(self, i: int) -> int:
    """The SentencePiece id of our id `i` (not a special token's)."""
    return i if self.bert else i - 1

  def encode_units(self, documents: Sequence[Sequence[str]]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """`encode_batch` of every unit of `documents`, flat: (ids int32 [N], lengths int64
    [units]). The units holding a special token are found by one regex search over
    their text joined by newlines (a special token holds none) and encoded as
    `encode_batch` encodes them; the others, all of them as a rule, in one library
    call, their ids mapped in numpy."""
    texts = list(itertools.chain.from_iterable(documents))
    ends = np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)) + 1)
    found = [m.start() for m in self._special_re.finditer("\n".join(texts))]
    special = np.zeros(len(texts), bool)
    special[np.searchsorted(ends, found, side="right")] = True
    plain = list(itertools.compress(texts, ~special)) if found else texts
    if self.lowercase:
      plain = list(map(normalizers.Lowercase().normalize_str, plain))
    ids, lengths = flatten(self.sp.encode(plain) if plain else [])
    if not self.bert:  # fairseq's mapping, as `_to_ids`
      unk = ids == self.sp.unk_id()
      ids += 1
      ids[unk] = self.FAIRSEQ["<unk>"]
    if not found:
      return ids, lengths
    special_ids, special_lengths = flatten(
        self.encode_batch(list(itertools.compress(texts, special))))
    all_lengths = np.empty(len(texts), np.int64)
    all_lengths[~special] = lengths
    all_lengths[special] = special_lengths
    of_special = np.repeat(special, all_lengths)
    all_ids = np.empty(len(of_special), np.int32)
    all_ids[~of_special] = ids
    all_ids[of_special] = special_ids
    return all_ids, all_lengths

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    parts = [self.split_re.split(t) for t in texts]
    plain = [p for ps in parts for p in ps[0::2] if p]
    if self.lowercase:
      plain = list(map(normalizers.Lowercase().normalize_str, plain))
    encoded = iter(self.sp.encode(plain) if plain else [])
    out = []
    for ps in parts:
      ids = []
      for k, p in enumerate(ps):
        if k % 2:
          ids.append(self.specials[p.strip()])
        elif p:
          ids.extend(self._to_ids(next(encoded)))
      out.append(ids)
    return out

  def id_to_token(self, i: int) -> str | None:
    if i in self.special_tokens:
      return self.special_tokens[i]
    piece = self._piece_of(i)
    return self.sp.id_to_piece(piece) if 0 < piece < self.sp.get_piece_size() else None

  def token_to_id(self, t: str) -> int | None:
    if t in self.specials:
      return self.specials[t]
    i = self.sp.piece_to_id(t)
    return None if i == self.sp.unk_id() else self._to_ids([i])[0]

  def decode(self, ids: Sequence[int]) -> str:
    pieces, out = [], []
    for i in ids:
      if i in self.special_tokens:
        if pieces:
          out.append(self.sp.decode(pieces))
          pieces = []
        out.append(self.special_tokens[i])
      else:
        pieces.append(self._piece_of(int(i)))
    if pieces:
      out.append(self.sp.decode(pieces))
    return " ".join(out)

  def save(self, directory: str) -> None:
    with open(os.path.join(directory, SPM_FILE if self.bert else SENTENCEPIECE_FILE),
              "wb") as f:
      f.write(self.proto)
