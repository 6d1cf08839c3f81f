"""Our tokenizers give the same ids as Hugging Face's on the same vocabulary files."""

import os

import numpy as np
import pytest

from bertjax.data import tokenizer as tokenizer_lib
from bertjax.errors import DataError

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Please turn your homework in on Monday, or else!",
    "Héllo wörld: naïve café façade, Ünïcödé and ÀCCÉNTS.",
    "中文字符 mixed with English words and 日本語 text.",
    "Numbers like 3.14159 and 2,718 appear; so do e-mails: a@b.com (maybe).",
    "BERT pretrains bidirectional encoders with masked language modelling.",
    "RoBERTa drops next sentence prediction and trains longer on more data.",
    "XLM-R covers one hundred languages with a SentencePiece vocabulary.",
] * 20

SAMPLES = [
    "The quick brown fox.",
    "Héllo wörld, ÀCCÉNTS and naïve café!",
    "中文字符 and 日本語",
    "please turn [MASK] homework in .",
    "tabs\tand\nnewlines   and   spaces",
    "unseenwordxyz qqqq zzzz",
    "",
    "punctuation!!! ??? ... ---",
]
PAIRS = [("The quick brown fox jumps over the lazy dog again and again.", "short"),
         ("a b", "Please turn your homework in on Monday, or else you will fail."),
         ("one two three four five six", "seven eight nine ten eleven twelve")]


@pytest.fixture(scope="module")
def wordpiece_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("wordpiece")
  tok = tokenizer_lib.train_tokenizer(CORPUS, "wordpiece", vocab_size=300)
  vocab = [tok.id_to_token(i) for i in range(tok.vocab_size)]
  (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
  return str(d)


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory):
  d = tmp_path_factory.mktemp("spm")
  tok = tokenizer_lib.train_tokenizer(CORPUS, "sentencepiece", vocab_size=200,
                                      lowercase=False)
  tok.save(str(d))
  return str(d / tokenizer_lib.SENTENCEPIECE_FILE)


def _hf_batch(hf, texts, pairs=None, max_length=512, **kwargs):
  enc = hf(texts, pairs, truncation=True, max_length=max_length, padding="longest",
           return_tensors="np", **kwargs)
  return {k: np.asarray(v) for k, v in enc.items()}


def _assert_same(ours, hf, keys=("input_ids", "attention_mask", "token_type_ids")):
  for k in keys:
    if k in hf:
      np.testing.assert_array_equal(ours[k], hf[k], err_msg=k)


@pytest.mark.parametrize("lower", [True, False])
def test_wordpiece_matches_hf(wordpiece_dir, lower):
  from transformers import BertTokenizer
  hf = BertTokenizer.from_pretrained(wordpiece_dir, do_lower_case=lower)
  ours = tokenizer_lib._from_vocab_txt(os.path.join(wordpiece_dir, "vocab.txt"),
                                       {"do_lower_case": lower})
  for text in SAMPLES:
    assert ours.tokenize(text) == hf.encode(text, add_special_tokens=False), text
  _assert_same(ours(SAMPLES), _hf_batch(hf, SAMPLES))
  a, b = zip(*PAIRS)
  for max_length in (8, 11, 12, 64):
    _assert_same(ours(list(a), list(b), max_length=max_length),
                 _hf_batch(hf, list(a), list(b), max_length=max_length))
  _assert_same(ours(SAMPLES, max_length=5), _hf_batch(hf, SAMPLES, max_length=5))
  assert ours.tokenize("x [MASK] y")[1] == ours.mask_id == hf.mask_token_id


# Whitespace of every kind (Python's and Rust's sets differ), control and zero-width
# characters, combining marks, CJK, long words, added tokens inside words.
TRICKY = [
    "the\vcat", "the\fcat", "the\x1ccat", "the\x1dcat", "the\x1ecat", "the\x1fcat",
    "the\x85cat", "x\u2028y\u2029z \u3000w\xa0v\u2003u",
    "zero\u200bwidth soft\xadhyphen joiner\u200d \ufffd\x00nul", " \u0301accent e\u0301",
    "中文字符和English混合", "emoji 🤗🙂 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "x" * 150 + " " + "ab" * 60,
    "turn[MASK]homework [SEP][CLS] in", "\t\n\r  ", "", "ÀCCÉNTS naïve café", "İstanbul ß ﬁ",
]


@pytest.mark.parametrize("lower", [True, False])
def test_word_cache_gives_the_same_ids_as_whole_texts(wordpiece_dir, lower):
  """`encode_batch` tokenizes each distinct word once; the ids equal the library's on
  whole texts, for the tricky strings and the embedded corpus, twice (warm cache)."""
  from bertjax.data import sources
  tok = tokenizer_lib.load_tokenizer(os.path.join(wordpiece_dir, "vocab.txt"))
  backend = tok._backend  # pylint: disable=protected-access
  backend.tok.normalizer = tokenizer_lib.normalizers.BertNormalizer(lowercase=lower)
  texts = TRICKY + [s for d in sources.load_documents("embedded")[:40] for s in d]
  whole = [e.ids for e in backend.tok.encode_batch(texts, add_special_tokens=False)]
  assert backend._words is not None  # pylint: disable=protected-access
  assert tok.tokenize_batch(texts) == whole
  assert tok.tokenize_batch(texts[::-1]) == whole[::-1]


# Texts as stage 1 of prepare hands them over: sentences, each after a document's first
# with the space before it (`tokenizer.running_text`), and runs, ends and kinds of
# spaces that send a text down the whole-text path.
SPACED = [" " + t for t in TRICKY] + ["a  b", "a b ", " a", "a\xa0b c", "x \u3000y",
                                      " [MASK] y", "it's  <mask> ok", "don't stop 's"]


def _texts():
  from bertjax.data import sources
  docs = sources.load_documents("embedded")[:40]
  return (TRICKY + SAMPLES + SPACED
          + [s for d in docs for s in tokenizer_lib.running_text(d)])


@pytest.mark.parametrize("lower", [False, True])
def test_byte_level_bpe_word_cache_gives_the_same_ids_as_whole_texts(lower):
  """Byte-level BPE (GPT-2's pre-tokenizer) caches each word with the space before it;
  the ids equal the library's on whole texts (cold and warm cache), with a lower-casing
  normalizer too; with a prefix space or another pre-tokenizer there is no cache."""
  tok = tokenizer_lib.train_tokenizer(CORPUS, "byte_level_bpe", vocab_size=400)
  backend = tok._backend  # pylint: disable=protected-access
  if lower:
    backend = type(backend)(_with(backend.tok, normalizer=tokenizer_lib.normalizers.Lowercase()))
  assert backend._spaced  # pylint: disable=protected-access
  texts = _texts()
  whole = [e.ids for e in backend.tok.encode_batch(texts, add_special_tokens=False)]
  assert backend.encode_batch(texts) == whole
  assert backend.encode_batch(texts[::-1]) == whole[::-1]
  prefixed = _with(backend.tok, pre_tokenizer=tokenizer_lib.pre_tokenizers.ByteLevel(
      add_prefix_space=True))
  assert type(backend)(prefixed)._words is None  # pylint: disable=protected-access


def _with(tok, **parts):
  """A copy of the `tokenizers.Tokenizer` `tok` with `parts` (normalizer=...) set."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  copy = tokenizers.Tokenizer.from_str(tok.to_str())
  for k, v in parts.items():
    setattr(copy, k, v)
  return copy


def test_tokenize_units_gives_tokenize_batch_ids(wordpiece_dir, spm_path):
  """`tokenize_units` (stage 1 of prepare: a chunk's documents at once, the ids flat)
  gives `tokenize_batch`'s ids of the units in order, empty units and special tokens
  included: WordPiece and byte-level BPE (the word cache), a byte-level BPE with a prefix
  space (each document one pre-tokenized input), SentencePiece in XLM-R's and DeBERTa's
  layouts, lower-cased too (one library call, the special tokens' units apart)."""
  bpe = tokenizer_lib.train_tokenizer(CORPUS, "byte_level_bpe", vocab_size=400)
  kinds = {
      "wordpiece": tokenizer_lib.load_tokenizer(os.path.join(wordpiece_dir, "vocab.txt")),
      "byte_level_bpe": bpe,
      "pretokenized": tokenizer_lib.from_library(_with(
          bpe.library, pre_tokenizer=tokenizer_lib.pre_tokenizers.ByteLevel(
              add_prefix_space=True))),
      "sentencepiece": tokenizer_lib.load_tokenizer(spm_path),
      "sentencepiece_lower": tokenizer_lib.lowercasing(
          tokenizer_lib.load_tokenizer(spm_path)),
      "sentencepiece_bert": tokenizer_lib.train_tokenizer(CORPUS, "sentencepiece_bert",
                                                          vocab_size=200),
  }
  texts = _texts()
  documents = [texts[i:i + n] for i, n in zip(range(0, len(texts), 7), [3, 0, 7, 1, 5] * 99)]
  documents.append(["", "a", ""])
  documents.append(["a <b> c", "x<", "<mask", "[MASK", "<S>x</s>", "[CLS][MASK]", "<"])
  units = [u for d in documents for u in d]
  for name, tok in kinds.items():
    if name == "pretokenized":
      assert tok._backend._words is None, name  # pylint: disable=protected-access
    ids, lengths = tok.tokenize_units(documents)
    expected = tok.tokenize_batch(units)
    assert ids.dtype == np.int32 and lengths.dtype == np.int64, name
    assert lengths.tolist() == [len(e) for e in expected], name
    assert ids.tolist() == [i for e in expected for i in e], name


@pytest.mark.parametrize("line_breaks", ["space", "apart"])
def test_document_unit_texts_are_unit_texts(line_breaks):
  """A document given as its units joined by newlines has `unit_texts`' texts."""
  for units in [["One."], ["One.", "Two too.", "x"], ["a b", "c d e"]]:
    assert (tokenizer_lib.document_unit_texts("\n".join(units), line_breaks)
            == tokenizer_lib.unit_texts(units, line_breaks))


def test_wordpiece_dir_reads_do_lower_case(wordpiece_dir, tmp_path):
  import shutil
  shutil.copy(os.path.join(wordpiece_dir, "vocab.txt"), tmp_path / "vocab.txt")
  (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
  cased = tokenizer_lib.load_tokenizer(str(tmp_path))
  lower = tokenizer_lib.load_tokenizer(os.path.join(wordpiece_dir, "vocab.txt"))
  assert cased.tokenize("The Fox") != lower.tokenize("The Fox")
  assert lower.tokenize("The Fox") == lower.tokenize("the fox")


def _lower_cased(hf):
  """`hf` (a transformers tokenizer) as sentence-transformers 6.2's Transformer module
  with do_lower_case makes it: a Lowercase normaliser ahead of its own."""
  from tokenizers import normalizers
  norm = hf.backend_tokenizer.normalizer
  own = (list(norm) if isinstance(norm, normalizers.Sequence) else [norm]
         if norm is not None else [])
  if not any(isinstance(n, normalizers.Lowercase) for n in own):
    hf.backend_tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), *own])
  return hf


def test_lowercasing_is_sentence_transformers_do_lower_case(wordpiece_dir, spm_path):
  """`lowercasing` a cased WordPiece and an XLM-R SentencePiece: the ids of transformers'
  tokenizer lower-cased as sentence-transformers does, special tokens in a text kept
  whole (lower-casing the text in Python would split '[MASK]'); the tokenizer given is
  left as it was."""
  from transformers import BertTokenizer, XLMRobertaTokenizer
  cased = tokenizer_lib._from_vocab_txt(os.path.join(wordpiece_dir, "vocab.txt"),
                                        {"do_lower_case": False})
  hf = _lower_cased(BertTokenizer.from_pretrained(wordpiece_dir, do_lower_case=False))
  ours = tokenizer_lib.lowercasing(cased)
  for text in SAMPLES + TRICKY + ["The FOX, [MASK] And [SEP]"]:
    assert ours.tokenize(text) == hf.encode(text, add_special_tokens=False), text
  assert ours.tokenize("The FOX") == cased.tokenize("the fox") != cased.tokenize("The FOX")
  hf = _lower_cased(XLMRobertaTokenizer.from_pretrained(os.path.dirname(spm_path)))
  sp = tokenizer_lib.load_tokenizer(spm_path)
  ours = tokenizer_lib.lowercasing(sp)
  for text in SAMPLES + ["Hello <mask> World", "X<mask>Y</s>", "The FOX jumps"]:
    assert ours.tokenize(text) == hf.encode(text, add_special_tokens=False), text
  assert ours.tokenize("The FOX") == sp.tokenize("the fox") != sp.tokenize("The FOX")


def test_sentencepiece_matches_xlmr(spm_path):
  from transformers import XLMRobertaTokenizer
  hf = XLMRobertaTokenizer.from_pretrained(os.path.dirname(spm_path))
  ours = tokenizer_lib.load_tokenizer(spm_path)
  assert (ours.cls_id, ours.pad_id, ours.sep_id, ours.unk_id) == (0, 1, 2, 3)
  assert ours.mask_id == ours.vocab_size - 1 == hf.mask_token_id
  assert ours.vocab_size == len(hf)
  texts = SAMPLES + ["hello <mask> world", "x<mask>y"]
  for text in texts:
    assert ours.tokenize(text) == hf.encode(text, add_special_tokens=False), text
  _assert_same(ours(texts), _hf_batch(hf, texts), keys=("input_ids", "attention_mask"))
  a, b = zip(*PAIRS)
  for max_length in (9, 12, 64):
    _assert_same(ours(list(a), list(b), max_length=max_length),
                 _hf_batch(hf, list(a), list(b), max_length=max_length),
                 keys=("input_ids", "attention_mask"))
  for i in (0, 1, 2, 3, 10, ours.mask_id):
    assert ours.id_to_token(i) == hf.convert_ids_to_tokens(i)


def test_save_load_round_trip(wordpiece_dir, spm_path, tmp_path):
  for name, tok in [("wp", tokenizer_lib.load_tokenizer(wordpiece_dir)),
                    ("spm", tokenizer_lib.load_tokenizer(spm_path))]:
    tok.save(str(tmp_path / name))
    back = tokenizer_lib.load_tokenizer(str(tmp_path / name))
    assert (back.style, back.vocab_size, back.special_ids) == (
        tok.style, tok.vocab_size, tok.special_ids)
    assert back.tokenize_batch(SAMPLES) == tok.tokenize_batch(SAMPLES)
    ids = tok.tokenize("the quick brown fox")
    assert back.decode(ids) == tok.decode(ids) == "the quick brown fox"


def test_train_special_ids():
  wp = tokenizer_lib.train_tokenizer(CORPUS, "wordpiece", vocab_size=200)
  assert (wp.style, wp.pad_id, wp.unk_id, wp.cls_id, wp.sep_id, wp.mask_id) == (
      "bert", 0, 1, 2, 3, 4)
  assert wp.mask_token == "[MASK]" and wp.vocab_size <= 200
  sp = tokenizer_lib.train_tokenizer(CORPUS, "sentencepiece", vocab_size=150)
  assert (sp.style, sp.cls_id, sp.pad_id, sp.sep_id, sp.unk_id) == ("roberta", 0, 1, 2, 3)
  assert sp.mask_id == sp.vocab_size - 1 and sp.mask_token == "<mask>"
  assert sp.tokenize("The Fox") == sp.tokenize("the fox")
  ids, types = sp.build_inputs([5, 6], [7])
  assert ids == [0, 5, 6, 2, 2, 7, 2] and types == [0] * 7
  ids, types = wp.build_inputs([5, 6], [7])
  assert ids == [2, 5, 6, 3, 7, 3] and types == [0, 0, 0, 0, 1, 1]


def test_errors_are_one_line(tmp_path):
  for path in (tmp_path / "missing", tmp_path):
    with pytest.raises(DataError) as e:
      tokenizer_lib.load_tokenizer(str(path))
    assert "\n" not in str(e.value)
  bad = tmp_path / "bad.model"
  bad.write_bytes(b"not a model")
  with pytest.raises(DataError) as e:
    tokenizer_lib.load_tokenizer(str(bad))
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["xlmr", "wordpiece"])
def test_transformers_saved_folders_load_with_pairs(wordpiece_dir, spm_path, tmp_path, kind):
  """GTE's and NomicBERT's kinds of tokenizer folder as transformers saves them
  (mGTE: XLM-R's SentencePiece pieces, <s> / </s>, the 'roberta' layout; gte-*-en-v1.5
  and NomicBERT: BERT's WordPiece, the 'bert' layout; each with its tokenizer.json,
  which bertjax reads first): bertjax's ids, token types and masks are AutoTokenizer's
  for single texts and pairs, cut or not."""
  from transformers import AutoTokenizer, BertTokenizer, XLMRobertaTokenizer
  source = (XLMRobertaTokenizer.from_pretrained(os.path.dirname(spm_path)) if kind == "xlmr"
            else BertTokenizer.from_pretrained(wordpiece_dir))
  source.save_pretrained(str(tmp_path))
  assert os.path.isfile(tmp_path / "tokenizer.json")
  hf = AutoTokenizer.from_pretrained(str(tmp_path))
  ours = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert ours.style == ("roberta" if kind == "xlmr" else "bert")
  assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id, ours.unk_id) == (
      hf.cls_token_id, hf.sep_token_id, hf.pad_token_id, hf.mask_token_id, hf.unk_token_id)
  keys = ("input_ids", "attention_mask", "token_type_ids")
  _assert_same(ours(SAMPLES), _hf_batch(hf, SAMPLES, return_token_type_ids=True), keys)
  a, b = (list(x) for x in zip(*PAIRS))
  for max_length in (9, 12, 64):
    _assert_same(ours(a, b, max_length=max_length),
                 _hf_batch(hf, a, b, max_length=max_length, return_token_type_ids=True), keys)
