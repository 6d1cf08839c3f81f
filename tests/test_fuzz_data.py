"""Fuzz tests (hypothesis) of the data path: corpus readers, tokenizers, example
builders and maskers on random Unicode, control characters, lone surrogates, invalid
UTF-8, binary bytes, empty and enormous documents.

Properties: nothing crashes (rejected input is a one-line DataError), no output is
longer than its maximum length, every id lies in the vocabulary, masks are consistent.
Deterministic (derandomize, no example database) and bounded (a fixed number of
examples per test); a failure hypothesis once found stays as an `@example`.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from bertjax.data import masking, builders, sources
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import ConfigError, DataError

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Pieces that mean something to some layer: special tokens of both styles, WordPiece
# and SentencePiece markers, every kind of line break and whitespace, BOM, NUL,
# replacement character, combining mark, lone surrogates, sentence punctuation.
FRAGMENTS = ["[MASK]", "[SEP]", "[CLS]", "[PAD]", "[UNK]", "<mask>", " <mask>", "<s>",
             "</s>", "<pad>", "<unk>", "##", "▁", "Ġ", "\n", "\r", "\r\n", "\n\n", "\t",
             "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\u3000", "\xa0",
             "\u200b", "\ufeff", "\x00", "\ufffd", "\u0301", "\ud800", "\udfff", ". ",
             "? ", "! A", "e.g. ", '"', "中文", "🤗", "x" * 120]
CHARS = st.one_of(st.characters(exclude_categories=()), st.characters(categories=["Cs"]))
TEXT = st.lists(st.one_of(st.text(CHARS, max_size=12), st.sampled_from(FRAGMENTS)),
                max_size=12).map("".join)
LONG_WORD = "supercalifragilistic" * 40


def _tokenizer_corpus() -> list[str]:
  docs = sources.load_documents("embedded")
  return [s for d in docs[:100] for s in d] + [
      "Héllo wörld: naïve café façade, Ünïcödé and ÀCCÉNTS.",
      "中文字符 mixed with English words and 日本語 text.", "Привет мир, это тест.",
      "مرحبا بالعالم", "emoji 🤗🙂 and ß ﬁ"] * 10


@pytest.fixture(scope="module")
def tokenizers():
  """The three backends and styles: WordPiece from tokenizer.json and from vocab.txt
  (BERT), byte-level BPE from vocab.json + merges.txt (RoBERTa), SentencePiece with
  fairseq ids (XLM-R)."""
  wordpiece = tok_lib.load_tokenizer(os.path.join(FIXTURES, "tokenizer"))
  with tempfile.TemporaryDirectory() as d:
    vocab = os.path.join(d, "vocab.txt")
    with open(vocab, "w", encoding="utf-8") as f:
      f.write("".join(wordpiece.id_to_token(i) + "\n" for i in range(wordpiece.vocab_size)))
    vocab_txt = tok_lib.load_tokenizer(vocab)
  spm = tok_lib.train_tokenizer(_tokenizer_corpus(), "sentencepiece", vocab_size=300,
                                lowercase=False)
  bpe = tok_lib.load_tokenizer(os.path.join(FIXTURES, "bpe"))
  return {"wordpiece": wordpiece, "vocab_txt": vocab_txt, "bpe": bpe, "sentencepiece": spm}


TOKENIZER_NAMES = ("wordpiece", "vocab_txt", "bpe", "sentencepiece")


def _one_line_data_error(fn):
  """fn() or None when it raised a one-line DataError (acceptable for rejected input)."""
  try:
    return fn()
  except DataError as e:
    assert "\n" not in str(e), str(e)
    return None


# --- tokenizers ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", TOKENIZER_NAMES)
def test_tokenize_any_text(tokenizers, name):
  tok = tokenizers[name]

  @FUZZ
  @given(st.lists(TEXT, min_size=1, max_size=4))
  @example(["a\ud800b", "\udfff"])  # lone surrogates (a JSON "\ud800" escape)
  @example(["", "\x00\x01\x02", "\u2028\u2029", LONG_WORD])
  def check(texts):
    ids = tok.tokenize_batch(texts)
    assert len(ids) == len(texts)
    for row in ids:
      assert all(0 <= i < tok.vocab_size for i in row)
      tok.decode(row)  # any ids of the vocabulary decode
    assert ids == [tok.tokenize(t) for t in texts]  # batching changes nothing

  check()


@pytest.mark.slow
def test_wordpiece_word_cache_matches_the_library(tokenizers):
  """The WordPiece backend's per-word fast path gives the library's ids for the whole
  text, whatever whitespace and control characters it holds."""
  tok = tokenizers["wordpiece"]
  library = tok._backend.tok  # pylint: disable=protected-access

  @FUZZ
  @given(st.lists(TEXT.map(lambda t: t.encode("utf-8", "replace").decode()),
                  min_size=1, max_size=4))
  def check(texts):
    want = [e.ids for e in library.encode_batch(texts, add_special_tokens=False)]
    assert tok.tokenize_batch(texts) == want

  check()


@pytest.mark.parametrize("name", (  # 11 s each at load 9: SentencePiece's in the full run.
    "wordpiece", pytest.param("sentencepiece", marks=pytest.mark.slow)))
def test_model_inputs_fit_max_length(tokenizers, name):
  tok = tokenizers[name]
  pair_special = tok.num_special(pair=True)

  @FUZZ
  @given(st.lists(TEXT, min_size=1, max_size=3), st.booleans(),
         st.integers(pair_special + 1, 40))
  @example(["x " * 100], True, pair_special + 1)
  def check(texts, pairs, max_length):
    batch = tok(texts, texts[::-1] if pairs else None, max_length=max_length)
    ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    assert ids.shape == types.shape == mask.shape and ids.shape[0] == len(texts)
    assert ids.shape[1] <= max_length
    assert ((ids >= 0) & (ids < tok.vocab_size)).all()
    lengths = mask.sum(1)
    assert (mask == (np.arange(ids.shape[1]) < lengths[:, None])).all()  # right padding
    assert (ids[mask == 0] == tok.pad_id).all() and (types[mask == 0] == 0).all()
    assert (ids[:, 0] == tok.cls_id).all()
    assert (ids[np.arange(len(ids)), lengths - 1] == tok.sep_id).all()
    assert set(np.unique(types)) <= ({0, 1} if tok.style == "bert" else {0})

  check()


@pytest.mark.parametrize("max_length,pairs", [(0, False), (2, False), (3, True)])
def test_max_length_without_room_for_text_is_one_line(tokenizers, max_length, pairs):
  tok = tokenizers["wordpiece"]
  with pytest.raises(ConfigError, match=f"max_length={max_length}") as e:
    tok(["some text"], ["a pair"] if pairs else None, max_length=max_length)
  assert "\n" not in str(e.value)


def test_non_text_input_is_one_line(tokenizers):
  for tok in tokenizers.values():
    with pytest.raises(DataError, match="takes text") as e:
      tok.tokenize_batch(["fine", None])
    assert "\n" not in str(e.value)


# --- corpus readers ------------------------------------------------------------------

BYTES = st.one_of(
    st.binary(max_size=300),
    TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.lists(st.sampled_from([b"\xff", b"\xc3", b"\x80", b"\xed\xa0\x80", b"\n", b"\r",
                              b"\n\n", b"A. B", b"\x00", b"word ", b"\xef\xbb\xbf",
                              b'{"text": "', b'"}', b"\\ud800", b"[[[[", b"\x1f\x8b"]),
             max_size=40).map(b"".join))
JSON_LINES = st.lists(st.one_of(
    st.builds(lambda t: '{"text": %s}' % json.dumps(t), TEXT),
    st.builds(lambda t: '{"text": "%s"}' % t, TEXT),  # unescaped: often invalid JSON
    st.sampled_from(['{"text": "a\\ud800b. C d."}', '{"text": 5}', '"text"', "[" * 5000,
                     '{"text": NaN}', "1e999999", "", "{}", '{"text": ""}'])),
    max_size=6).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass"))


def _check_documents(path: str, max_line_chars: int) -> None:
  documents = _one_line_data_error(lambda: list(sources.iter_documents(path)))
  for doc in documents or []:
    assert doc and all(isinstance(s, str) and s.strip() for s in doc)
    for s in doc:
      s.encode("utf-8")  # valid Unicode: no lone surrogates reach the tokenizer
      if not sources.is_jsonl(path):
        assert len(s) <= max_line_chars


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".txt", ".txt.gz", ".jsonl"])
def test_corpus_readers_any_bytes(tmp_path, monkeypatch, suffix):
  """Any file content gives documents of valid, non-blank sentences or a one-line
  DataError. Lines are cut at a small MAX_LINE_CHARS so long lines are exercised."""
  monkeypatch.setattr(sources, "MAX_LINE_CHARS", 64)
  path = str(tmp_path / f"corpus{suffix}")

  @FUZZ
  @given(st.one_of(BYTES, JSON_LINES))
  @example(b"[" * 100_000)  # deeply nested JSON
  @example(b'{"text": "a\\ud800b. Next one."}')  # a lone surrogate escaped in JSON
  @example(b"")
  def check(data):
    if suffix.endswith(".gz"):
      data = gzip.compress(data)
    with open(path, "wb") as f:
      f.write(data)
    _check_documents(path, sources.MAX_LINE_CHARS)

  check()


def test_truncated_gzip_is_one_line(tmp_path):
  path = tmp_path / "c.txt.gz"
  data = gzip.compress(b"A sentence. Another one.\n" * 50_000)
  path.write_bytes(data[:len(data) // 2])
  with pytest.raises(DataError, match="truncated or corrupt") as e:
    list(sources.iter_documents(str(path)))
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_enormous_documents(tmp_path, tokenizers):
  """A 3 MB line of text and a 2M-character JSON document (more than MAX_LINE_CHARS)
  are read whole or in pieces, tokenized, and packed, in bounded time."""
  text = tmp_path / "big.txt"
  text.write_bytes(b"Word " * 600_000 + b"\n\nSecond document.\n")
  docs = list(sources.iter_documents(str(text)))
  assert len(docs) == 2 and sum(len(s) for s in docs[0]) >= 2_999_000
  assert all(len(s) <= sources.MAX_LINE_CHARS for s in docs[0])
  jsonl = tmp_path / "big.jsonl"
  jsonl.write_text('{"text": "%s"}\n{"text": "Small one."}\n' % ("Longword. " * 200_000))
  docs = list(sources.iter_documents(str(jsonl)))
  assert len(docs) == 2 and len(docs[0]) == 200_000
  tok = tokenizers["wordpiece"]
  tokenized = builders.tokenize_documents(docs, tok)
  examples = builders.create_packed_examples(tokenized, tok, max_seq_length=128)
  assert examples.input_ids.shape[1] == 128 and len(examples) > 1000


# --- example builders ----------------------------------------------------------------

VOCAB = 60  # ids 0..4 are the special tokens: pad, unk, cls (<s>), sep (</s>), mask


@pytest.fixture(scope="module")
def id_tokenizers(tmp_path_factory):
  """BERT- and RoBERTa-style tokenizers of VOCAB ids, specials 0..4 in both."""
  d = tmp_path_factory.mktemp("ids")
  words = [f"w{i}" for i in range(5, VOCAB)]
  (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                          *words]) + "\n")
  (d / "bpe").mkdir()
  names = ["<pad>", "<unk>", "<s>", "</s>", "<mask>", *words]
  (d / "bpe" / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(names)}))
  (d / "bpe" / "merges.txt").write_text("#version: 0.2\n")
  return {"bert": tok_lib.load_tokenizer(str(d / "vocab.txt")),
          "roberta": tok_lib.load_tokenizer(str(d / "bpe"))}


SENTENCE = st.lists(st.integers(5, VOCAB - 1), min_size=1, max_size=40)
DOCUMENTS = st.lists(st.lists(SENTENCE, min_size=1, max_size=6), max_size=8)


@FUZZ
@given(DOCUMENTS, st.sampled_from(["bert", "roberta"]), st.integers(8, 48),
       st.floats(0, 1), st.integers(1, 3), st.integers(0, 2**32 - 1))
@example([[[5] * 300]], "bert", 8, 0.0, 1, 0)  # one sentence far longer than a row
@example([[[5]]], "roberta", 8, 1.0, 2, 1)  # a single one-token document
def test_nsp_pairs(id_tokenizers, documents, style, max_seq_length, short_seq_prob,
                   dupe_factor, seed):
  tok = id_tokenizers[style]
  ex = builders.create_nsp_examples(
      documents, tok, max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
      dupe_factor=dupe_factor, rng=np.random.default_rng(seed))
  n = len(ex)
  assert ex.input_ids.shape == (n, max_seq_length)
  assert ((ex.input_ids >= 0) & (ex.input_ids < VOCAB)).all()
  assert ((ex.lengths >= 2 + tok.num_special(True)) & (ex.lengths <= max_seq_length)).all()
  assert set(np.unique(ex.next_sentence_labels)) <= {0, 1}
  assert ((ex.source_documents >= 0) & (ex.source_documents < len(documents))).all()
  # A label 0 pair comes from one document.
  same = ex.source_documents[:, 0] == ex.source_documents[:, 1]
  assert same[ex.next_sentence_labels == 0].all()
  for ids, types, length in zip(ex.input_ids, ex.token_type_ids, ex.lengths):
    row = ids[:length]
    seps = np.flatnonzero(row == tok.sep_id)
    assert row[0] == tok.cls_id and (ids[length:] == tok.pad_id).all()
    assert (types[length:] == 0).all()
    if style == "bert":  # [CLS] A [SEP] B [SEP], A and B non-empty
      assert len(seps) == 2 and 1 < seps[0] < length - 2 and seps[1] == length - 1
      assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:length] == 1).all()
    else:  # <s> A </s></s> B </s>
      assert len(seps) == 3 and seps[1] == seps[0] + 1 and seps[2] == length - 1
      assert seps[0] > 1 and seps[2] > seps[1] + 1 and (types == 0).all()


@FUZZ
@given(DOCUMENTS, st.sampled_from(["bert", "roberta"]), st.integers(8, 48),
       st.sampled_from(builders.PACKINGS), st.booleans(), st.integers(0, 2))
@example([[[5] * 300], [[6]]], "bert", 8, "full_sentences", True, 2)
@example([], "bert", 8, "doc_sentences", True, 0)
def test_packing(id_tokenizers, documents, style, max_seq_length, packing, isolate,
                 position_offset):
  """Rows hold the documents' tokens in order (FULL-SENTENCES: a separator between
  documents; a stream: none), each row [CLS] ... [SEP] within max_seq_length;
  FULL-SENTENCES and stream rows are full but the last; DOC-SENTENCES rows never cross
  a document; isolation segments and positions restart at each document."""
  tok = id_tokenizers[style]
  assert tok.style == style and tok.vocab_size == VOCAB and tok.sep_id == 3
  ex = builders.create_packed_examples(
      documents, tok, max_seq_length=max_seq_length, packing=packing,
      isolate_documents=isolate, position_offset=position_offset)
  n, T = len(ex), max_seq_length
  assert ex.input_ids.shape == (n, T) and (ex.lengths <= T).all() and (ex.lengths >= 3).all()
  assert ((ex.input_ids >= 0) & (ex.input_ids < VOCAB)).all()
  inner = []
  for ids, length in zip(ex.input_ids, ex.lengths):
    assert ids[0] == tok.cls_id and ids[length - 1] == tok.sep_id
    assert (ids[length:] == tok.pad_id).all()
    inner.extend(ids[1:length - 1].tolist())
  flat = [list(itertools.chain.from_iterable(d)) for d in documents]
  if packing == "full_sentences":
    want = list(itertools.chain.from_iterable(
        d + [tok.sep_id] if k < len(flat) - 1 else d for k, d in enumerate(flat)))
    # A separator that would open a row is the previous row's last token instead.
    assert [t for t in inner if t != tok.sep_id] == [t for t in want if t != tok.sep_id]
    assert (ex.lengths[:-1] == T).all()
  else:
    assert inner == list(itertools.chain.from_iterable(flat))
  if packing == "stream":  # No separators, every row full.
    assert (ex.lengths[:-1] == T).all()
  if packing == "doc_sentences":
    assert (ex.source_documents[:, 0] == ex.source_documents[:, 1]).all()
  if isolate:
    for seg, pos, length in zip(ex.segment_ids, ex.position_ids, ex.lengths):
      assert (seg[length:] == 0).all() and (seg[:length] >= 1).all()
      assert (np.diff(seg[:length]) >= 0).all() and seg[0] == 1
      starts = np.flatnonzero(np.diff(seg[:length], prepend=0))
      assert (pos[starts] == position_offset).all()
      assert (pos[:length] < position_offset + T).all()


@pytest.mark.slow
@FUZZ
@given(st.lists(st.lists(TEXT, min_size=1, max_size=4), min_size=1, max_size=5),
       st.sampled_from(TOKENIZER_NAMES), st.integers(8, 32), st.booleans())
def test_text_to_examples(tokenizers, texts, name, max_seq_length, nsp):
  """Random text through a real tokenizer and a builder: rows fit, ids in vocabulary."""
  tok = tokenizers[name]
  documents = builders.tokenize_documents(texts, tok)
  assert all(doc and all(doc) for doc in documents)
  if nsp:
    ex = builders.create_nsp_examples(documents, tok, max_seq_length=max_seq_length,
                                         short_seq_prob=0.1, dupe_factor=1,
                                         rng=np.random.default_rng(0))
  else:
    ex = builders.create_packed_examples(documents, tok, max_seq_length=max_seq_length,
                                            isolate_documents=True)
  assert ex.input_ids.shape[1] == max_seq_length and (ex.lengths <= max_seq_length).all()
  assert ((ex.input_ids >= 0) & (ex.input_ids < tok.vocab_size)).all()


# --- masking -------------------------------------------------------------------------


@st.composite
def masking_cases(draw):
  """A batch of ids [B, T] (specials and padding included), word starts and settings."""
  b, t = draw(st.integers(1, 4)), draw(st.integers(1, 40))
  lengths = draw(st.lists(st.integers(0, t), min_size=b, max_size=b))
  ids = np.array([draw(st.lists(st.integers(0, VOCAB - 1), min_size=t, max_size=t))
                  for _ in range(b)], np.int32)
  ids[np.arange(t)[None, :] >= np.array(lengths)[:, None]] = 0
  starts = np.array(draw(st.lists(st.booleans(), min_size=VOCAB, max_size=VOCAB)))
  mask_p = draw(st.floats(0, 1))
  cfg = masking.MaskingConfig(
      mask_id=4, special_ids=np.arange(4, dtype=np.int32),  # [MASK] itself may be chosen
      random_ids=np.arange(5, VOCAB, dtype=np.int32),
      max_predictions_per_seq=draw(st.integers(1, 50)),
      masked_lm_prob=draw(st.floats(0, 1)), mask_token_prob=mask_p,
      random_token_prob=draw(st.floats(0, 1 - mask_p)),
      strategy=draw(st.sampled_from(masking.STRATEGIES)),
      random_cdf=draw(st.sampled_from([None, np.linspace(0, 1, VOCAB - 4)[1:]])),
      word_starts=starts, span_p=draw(st.floats(0.01, 1)),
      max_span_length=draw(st.integers(1, 12)))
  return ids, cfg, draw(st.integers(0, 2**32 - 1)), draw(st.booleans())


@pytest.mark.slow
@FUZZ
@given(masking_cases())
def test_masking_is_consistent(case):
  ids, cfg, seed, row_streams = case
  b, t = ids.shape
  p = cfg.max_predictions_per_seq
  rng = (masking.RowStreams(seed, np.arange(b)) if row_streams
         else np.random.default_rng(seed))
  out = masking.mask_tokens(ids, rng, cfg)
  pos, labels, weights = (out["masked_lm_positions"], out["masked_lm_ids"],
                          out["masked_lm_weights"])
  assert pos.shape == labels.shape == weights.shape == (b, p)
  assert out["input_ids"].shape == (b, t)
  assert set(np.unique(weights)) <= {0.0, 1.0}
  candidates = ~np.isin(ids, cfg.special_ids)
  n = candidates.sum(1)
  budget = np.minimum(np.minimum(p, np.maximum(1, np.round(n * cfg.masked_lm_prob))), n)
  real = weights.astype(bool)
  assert (real.sum(1) <= budget).all()
  if cfg.strategy == "token":
    assert (real.sum(1) == budget).all()
  # Real slots first, positions strictly increasing; unused slots all zero.
  assert (np.diff(weights, axis=1) <= 0).all()
  assert ((pos >= 0) & (pos < t)).all() and (pos[~real] == 0).all() and (labels[~real] == 0).all()
  is_chosen = np.zeros((b, t), bool)
  is_chosen[np.nonzero(real)[0], pos[real]] = True
  for r in range(b):
    chosen = pos[r][real[r]]
    assert (np.diff(chosen) > 0).all() and candidates[r, chosen].all()
    assert (labels[r][real[r]] == ids[r, chosen]).all()
    unchanged = np.setdiff1d(np.arange(t), chosen)
    assert (out["input_ids"][r, unchanged] == ids[r, unchanged]).all()
    new = out["input_ids"][r, chosen]
    assert ((new == cfg.mask_id) | np.isin(new, cfg.random_ids) | (new == ids[r, chosen])).all()
    if cfg.strategy == "whole_word":  # a word is chosen whole or not at all
      words = _word_ids(ids[r], candidates[r], cfg.word_starts)
      for w in np.unique(words[is_chosen[r]]):
        assert is_chosen[r][words == w].all()
    if cfg.strategy == "span":
      for k in np.flatnonzero(real[r]):
        s, e = pos[r, k], pos[r, k]
        while s > 0 and is_chosen[r, s - 1]:
          s -= 1
        while e < t - 1 and is_chosen[r, e + 1]:
          e += 1
        assert out["span_relative_positions"][r, k] == pos[r, k] - s
        assert out["span_left_positions"][r, k] == max(s - 1, 0)
        assert out["span_right_positions"][r, k] == min(e + 1, t - 1)


def _word_ids(ids: np.ndarray, candidates: np.ndarray, word_starts: np.ndarray
              ) -> np.ndarray:
  """[T] word index of each candidate token (-1 elsewhere): a word starts at a
  word-start token or after a non-candidate."""
  words, w = np.full(len(ids), -1), -1
  for i, (token, candidate) in enumerate(zip(ids, candidates)):
    if candidate:
      w += word_starts[token] or i == 0 or not candidates[i - 1]
      words[i] = w
  return words
