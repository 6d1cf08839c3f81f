"""Vocabulary extension: domain words added to a checkpoint's tokenizer, each as one
token of the library's own model, so that the files an export writes (vocab.txt,
vocab.json + merges.txt, the SentencePiece model) tokenize in transformers as bertjax
does; and, for every id of the extended tokenizer, the ids of the old one its
embedding row starts from (`row_sources`).

- WordPiece: the word, normalised as the tokenizer normalises, joins the vocabulary at
  the next free id; longest-match-first then takes it whole at the start of a word.
- Byte-level BPE: the word after a space ('Ġword') becomes a token through merges
  appended after the model's own (the lowest priority), joining left to right the
  pieces the tokenizer splits it into; the intermediate pieces become tokens too.
- SentencePiece (unigram): '▁word' joins the model's pieces with a score one above the
  best segmentation's, so Viterbi takes it whole; `<mask>` (the id past the pieces,
  XLM-R's layout) moves up by the pieces added.

Words come from a file (`read_tokens_file`) or are learned from a corpus
(`learn_words`): a tokenizer of the same kind trained on the domain by
`tokenizer.train_tokenizer` proposes its word-start tokens, ranked by the tokens they
save (occurrences in the domain times the old tokenizer's extra pieces), on a sample
of the domain streamed (`mixture.tokenizer_sentences`: config.data.tokenizer's
`sample_sentences` per source held, `read_sentences` read; logged).

`run_tokenizer(config, given)` is what a continued run's config (`config.init_from`,
`config.vocab_extension`) tokenizes with: the continued run
(`bertjax.train.continued`) and `prepare --config` both make it.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import ml_collections

import numpy as np
import sentencepiece as spm
import tokenizers
from etils import epath

from bertjax.data import mixture, tokenizer as tok_lib
from bertjax.errors import ConfigError, DataError

KINDS = ("wordpiece", "byte_level_bpe", "sentencepiece")
_DOMAIN_VOCAB = 32768  # the ids of the domain tokenizer that proposes words (at most)
_SCORE_MARGIN = 1.0  # a SentencePiece piece's score above its best old segmentation's


def kind_of(tokenizer: tok_lib.Tokenizer) -> str:
  """'wordpiece', 'byte_level_bpe' or 'sentencepiece' (unigram), or a one-line
  DataError for a tokenizer whose model cannot take new words."""
  lib = tokenizer.library
  if isinstance(lib, bytes):
    # Imported here, not at the top: prepare imports this module, and a Beam worker's
    # protobuf (apache-beam pins <7) cannot load these protobuf-7 generated classes.
    from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
    proto = sentencepiece_model_pb2.ModelProto.FromString(lib)
    if proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
      return "sentencepiece"
    raise DataError("vocabulary extension takes SentencePiece unigram models (XLM-R's); "
                    "this one is a SentencePiece BPE model.")
  state = json.loads(lib.to_str())
  model = state["model"]["type"]
  pre = state.get("pre_tokenizer") or {}
  if model == "WordPiece":
    return "wordpiece"
  if model == "BPE" and pre.get("type") == "ByteLevel":
    return "byte_level_bpe"
  raise DataError(f"vocabulary extension takes WordPiece, byte-level BPE and SentencePiece "
                  f"unigram tokenizers; this one is a {model} model with a "
                  f"{pre.get('type')} pre-tokenizer.")


def read_tokens_file(path: str) -> list[str]:
  """The words of a tokens file (one a line; blank lines and '#' comments skipped), or
  a one-line DataError when it is missing or holds none."""
  p = epath.Path(path)
  if not p.is_file():
    raise DataError(f"config.vocab_extension.tokens_file={path} does not exist: give a "
                    "file of words, one a line.")
  words = [w.strip() for w in p.read_text(encoding="utf-8").splitlines()]
  words = [w for w in words if w and not w.startswith("#")]
  if not words:
    raise DataError(f"config.vocab_extension.tokens_file={path} holds no words: write one "
                    "word a line.")
  return words


def _text(kind: str, word: str) -> str:
  """How `word` is written at a word start inside a text (byte-level BPE keeps the
  space before it in the token)."""
  return " " + word if kind == "byte_level_bpe" else word


def surface(tokenizer: tok_lib.Tokenizer, word: str, kind: str | None = None) -> str | None:
  """The vocabulary entry that stands for `word` at the start of a word ('dpkg',
  'Ġdpkg', '▁dpkg'), normalised as the tokenizer normalises; None when the tokenizer
  cannot hold it as one token (it splits at punctuation or whitespace, or holds a
  character the model does not know). `kind`: `kind_of(tokenizer)`, when known."""
  kind, lib = kind or kind_of(tokenizer), tokenizer.library
  if kind == "sentencepiece":
    sp = spm.SentencePieceProcessor(model_proto=lib)
    ids = sp.encode(word)
    if not ids or sp.unk_id() in ids:
      return None
    s = "".join(sp.id_to_piece(i) for i in ids)
    return s if "▁" not in s[1:] else None
  norm = lib.normalizer.normalize_str(word) if lib.normalizer else word
  words = lib.pre_tokenizer.pre_tokenize_str(_text(kind, norm))
  return words[0][0] if len(words) == 1 and words[0][0].strip() else None


def _has(tokenizer: tok_lib.Tokenizer, token: str) -> bool:
  """Whether `token` is in the vocabulary (unk's id means it is not, unless it is unk;
  a tokenizer without unk answers None for one it lacks)."""
  i = tokenizer.token_to_id(token)
  if tokenizer.unk_id is None:
    return i is not None
  return i != tokenizer.unk_id or token == tokenizer.id_to_token(tokenizer.unk_id)


def learn_words(tokenizer: tok_lib.Tokenizer, sentences: Sequence[str], n: int
                ) -> list[str]:
  """The `n` words of `sentences` (the domain corpus) most worth a token of their own:
  the word-start tokens of a tokenizer of the same kind trained on them, not yet in
  `tokenizer`, ranked by occurrences there times the pieces `tokenizer` saves on each
  (ties by the word)."""
  kind = kind_of(tokenizer)
  lowercase = tokenizer.tokenize("Hello World") == tokenizer.tokenize("hello world")
  domain = tok_lib.train_tokenizer(sentences, kind=kind, lowercase=lowercase,
                                   vocab_size=_DOMAIN_VOCAB)
  counts = np.bincount(np.concatenate([np.asarray(ids, np.int64) for ids in
                                       domain.tokenize_batch(sentences)] + [[0]]),
                       minlength=domain.vocab_size)
  starts = domain.word_starts()
  scored = []
  for i in np.flatnonzero(counts * starts):
    if int(i) in domain.special_ids:
      continue
    word = domain.decode([int(i)]).strip()  # '\ufffd': a byte-level token's partial character
    s = surface(tokenizer, word, kind) if word and "\ufffd" not in word else None
    if s is None or _has(tokenizer, s):
      continue
    pieces = len(tokenizer.tokenize(_text(kind, word)))
    if pieces > 1:
      scored.append((-int(counts[i]) * (pieces - 1), word))
  return [w for _, w in sorted(scored)[:n]]


def extend(tokenizer: tok_lib.Tokenizer, words: Sequence[str]
           ) -> tuple[tok_lib.Tokenizer, list[str]]:
  """`tokenizer` with each of `words` it lacks as one token (module docstring): the
  extended tokenizer and the entries added for the words, in id order (a word it has,
  or cannot hold as one token, adds none)."""
  kind = kind_of(tokenizer)
  entries = list(dict.fromkeys(s for s in (surface(tokenizer, w, kind) for w in words)
                               if s is not None and not _has(tokenizer, s)))
  if not entries:
    return tokenizer, []
  if kind == "sentencepiece":
    return _extend_sentencepiece(tokenizer, entries), entries
  state = json.loads(tokenizer.library.to_str())
  vocab = state["model"]["vocab"]

  def add(token: str) -> None:
    if token not in vocab:
      vocab[token] = len(vocab)

  if kind == "wordpiece":
    for e in entries:
      add(e)
  else:
    merges = state["model"]["merges"]
    as_pair = bool(merges) and not isinstance(merges[0], str)
    ranks: dict[tuple[str, str], int] = {}
    texts = [tokenizers.decoders.ByteLevel().decode([e]) for e in entries]  # ' word'
    for e, ids in zip(entries, tokenizer.tokenize_batch(texts)):
      parts = _bpe([tokenizer.id_to_token(i) for i in ids], ranks)
      while len(parts) > 1:  # join left to right, each merge ranked after all others
        ranks[parts[0], parts[1]] = len(ranks)
        merges.append([parts[0], parts[1]] if as_pair else f"{parts[0]} {parts[1]}")
        add(parts[0] + parts[1])
        parts = [parts[0] + parts[1], *parts[2:]]
  outside = [t for t in state.get("added_tokens", []) if t["content"] not in vocab]
  for k, t in enumerate(sorted(outside, key=lambda t: t["id"])):  # after the model's ids
    t["id"] = len(vocab) + k
  return tok_lib.from_library(tokenizers.Tokenizer.from_str(json.dumps(state))), entries


def _bpe(parts: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
  """`parts` after BPE with the merges `ranks` alone (lowest rank first)."""
  while True:
    pairs = [(ranks[p], k) for k, p in enumerate(zip(parts, parts[1:])) if p in ranks]
    if not pairs:
      return parts
    _, k = min(pairs)
    parts = [*parts[:k], parts[k] + parts[k + 1], *parts[k + 2:]]


def _extend_sentencepiece(tokenizer: tok_lib.Tokenizer, entries: list[str]
                          ) -> tok_lib.Tokenizer:
  """The SentencePiece model with `entries` as pieces, each scored one above the best
  segmentation of its word by the model with the others (rounds until each is whole)."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  proto = sentencepiece_model_pb2.ModelProto.FromString(tokenizer.library)
  sp = spm.SentencePieceProcessor(model_proto=tokenizer.library)
  pieces = {}
  for e in entries:
    pieces[e] = proto.pieces.add(piece=e, type=sentencepiece_model_pb2.ModelProto.
                                 SentencePiece.NORMAL)
  best = lambda sp, e: sum(sp.get_score(i) for i in sp.encode(e.replace("▁", " ")))
  for e in entries:
    pieces[e].score = best(sp, e) + _SCORE_MARGIN
  for _ in range(len(entries)):  # a piece can lose to a segmentation using another
    sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
    split = [e for e in entries if sp.encode(e.replace("▁", " "), out_type=str) != [e]]
    if not split:
      break
    for e in split:
      pieces[e].score = best(sp, e) + _SCORE_MARGIN
  return tok_lib.from_library(proto.SerializeToString())


def missing_tokens(old: tok_lib.Tokenizer, new: tok_lib.Tokenizer) -> list[str]:
  """The tokens of `old` that `new` lacks (none: `new` is `old` or extends it)."""
  out = []
  for i in range(old.vocab_size):
    try:
      token = old.id_to_token(i)
    except DataError:  # a gap in the ids
      continue
    if not _has(new, token):
      out.append(token)
  return out


def row_sources(old: tok_lib.Tokenizer, new: tok_lib.Tokenizer) -> list[tuple[int, ...]]:
  """For each id of `new`: the ids of `old` whose embedding rows its row is the mean of,
  (i,) for a token `old` has (at id i), else the pieces `old` splits the token's text
  into; () for an id without a token."""
  out = []
  for i in range(new.vocab_size):
    try:
      token = new.id_to_token(i)
    except DataError:  # a gap in the ids
      out.append(())
      continue
    if _has(old, token):
      out.append((old.token_to_id(token),))
    else:
      out.append(tuple(old.tokenize(new.decode([i]))))
  return out


def padded_size(size: int, multiple: int) -> int:
  """`size` rounded up to a multiple of `multiple` (<= 1: unchanged)."""
  return -(-size // multiple) * multiple if multiple > 1 else size


def extending(config) -> bool:
  """Whether `config.vocab_extension` adds tokens."""
  v = config.vocab_extension
  return bool(v.tokens_file or v.num_new_tokens)


def checkpoint_tokenizer(path: str) -> tok_lib.Tokenizer:
  """The tokenizer files of checkpoint `path`: a Hugging Face dir's (its config.json
  names a model_type), else a bertjax workdir's tokenizer/; a one-line DataError when
  it holds none."""
  config_file = epath.Path(path) / "config.json"
  hf = config_file.exists() and "model_type" in json.loads(config_file.read_text())
  directory = path if hf else os.path.join(path, "tokenizer")
  if not hf and not epath.Path(directory).is_dir():
    raise DataError(f"{path} has no tokenizer/ directory (a bertjax workdir's) nor a "
                    "Hugging Face config.json: give the tokenizer the checkpoint was "
                    "trained with as config.data.tokenizer.path.")
  return tok_lib.load_tokenizer(directory)


def _sentences(config) -> list[str]:
  """The sentences new tokens are learned from: `vocab_extension.corpus` (a source of
  the run's mixture by name, or a corpus spec), '' the run's corpus."""
  spec = config.vocab_extension.corpus
  named = {s.name: s.spec for s in mixture.sources_of(config.data)}
  data = ml_collections.ConfigDict(config.data.to_dict())
  if spec:
    data.corpus, data.languages = named.get(spec, spec), ""
  return mixture.tokenizer_sentences(data, config.seed)


def run_tokenizer(config, base: tok_lib.Tokenizer
                  ) -> tuple[tok_lib.Tokenizer, list[str], list[str]]:
  """`base` (the checkpoint's tokenizer, or config.data.tokenizer.path's) extended as
  `config.vocab_extension` says: (the tokenizer, the words asked for, the entries
  added). A one-line ConfigError when config.data.tokenizer.path already extends the
  checkpoint's (a prepared corpus's tokenizer: extended when it was prepared)."""
  if not extending(config):
    return base, [], []
  if config.data.tokenizer.path:
    try:
      own = checkpoint_tokenizer(config.init_from)
    except (DataError, OSError):
      own = None
    if own is not None and base.vocab_size > own.vocab_size:
      raise ConfigError(
          f"config.data.tokenizer.path={config.data.tokenizer.path} already extends "
          f"config.init_from's tokenizer ({base.vocab_size - own.vocab_size} more ids; a "
          "prepared corpus's is extended when prepared): drop config.vocab_extension "
          "(--config.vocab_extension.tokens_file='' "
          "--config.vocab_extension.num_new_tokens=0).")
  v = config.vocab_extension
  if v.tokens_file:
    words = read_tokens_file(v.tokens_file)
  else:
    words = learn_words(base, _sentences(config), v.num_new_tokens)
  extended, added = extend(base, words)
  return extended, words, added
