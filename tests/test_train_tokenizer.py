"""`python -m bertjax.data.train_tokenizer`: WordPiece cased/uncased, SentencePiece
unigram/BPE over sampled languages and RoBERTa's byte-level BPE, with the special ids
the configs expect."""

import subprocess
import sys

import pytest

from bertjax.data import tokenizer as tok_lib
from bertjax.data import train_tokenizer


@pytest.fixture(scope="module")
def languages(tmp_path_factory):
  d = tmp_path_factory.mktemp("langs")
  (d / "en.txt").write_text("\n\n".join(
      f"The Quick brown fox {i} jumps over the lazy dog.\nIt runs home {i}." for i in range(200)))
  (d / "sw.txt").write_text("\n\n".join(
      f"Mbweha mwepesi {i} anaruka juu ya mbwa.\nAnakimbia nyumbani {i}." for i in range(20)))
  return f"en={d / 'en.txt'},sw={d / 'sw.txt'}"


@pytest.mark.parametrize("lowercase", [True, False])
def test_wordpiece(tmp_path, lowercase):
  out = str(tmp_path / "tok")
  summary = train_tokenizer.train("embedded", "", out, kind="wordpiece", vocab_size=1000,
                                  lowercase=lowercase, model_type="unigram",
                                  character_coverage=1.0, alpha=0.3,
                                  language_counts="sentences", seed=0, text_field="text")
  tok = tok_lib.load_tokenizer(out)
  assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 2, 3, 4)
  assert summary["vocab_size"] == tok.vocab_size == 1000
  assert (tok.tokenize("Python") == tok.tokenize("python")) == lowercase


def test_sentencepiece_unigram_and_bpe(tmp_path, languages):
  vocabs = {}
  for model_type in ("unigram", "bpe"):
    out = str(tmp_path / model_type)
    summary = train_tokenizer.train("", languages, out, kind="sentencepiece",
                                    vocab_size=120, lowercase=False, model_type=model_type,
                                    character_coverage=1.0, alpha=0.3,
                                  language_counts="sentences", seed=0, text_field="text")
    tok = tok_lib.load_tokenizer(out)
    assert (tok.cls_id, tok.pad_id, tok.sep_id) == (0, 1, 2)
    assert tok.mask_id == tok.vocab_size - 1 and tok.id_to_token(tok.mask_id) == "<mask>"
    assert summary["sentences"] == 440  # as many as both languages hold, q-weighted
    vocabs[model_type] = {tok.id_to_token(i) for i in range(tok.vocab_size)}
    assert tok.decode(tok.tokenize("Mbweha mwepesi")) == "Mbweha mwepesi"
  assert vocabs["unigram"] != vocabs["bpe"]


def test_cli(tmp_path, languages):
  out = tmp_path / "cli"
  run = subprocess.run([sys.executable, "-m", "bertjax.data.train_tokenizer",
                        f"--languages={languages}", "--kind=sentencepiece",
                        "--model_type=bpe", "--vocab_size=100", f"--output={out}"],
                       capture_output=True, text=True, check=True)
  assert "sentences 440" in run.stdout and "mask_id 99" in run.stdout
  assert tok_lib.load_tokenizer(str(out)).vocab_size == 100


def test_byte_level_bpe(tmp_path):
  out = str(tmp_path / "bpe")
  summary = train_tokenizer.train("embedded", "", out, kind="byte_level_bpe",
                                  vocab_size=600, lowercase=False, model_type="unigram",
                                  character_coverage=1.0, alpha=0.3,
                                  language_counts="sentences", seed=0, text_field="text")
  tok = tok_lib.load_tokenizer(out)
  assert (tok.style, tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id) == ("roberta", 0, 1, 2, 3)
  assert tok.mask_id == tok.vocab_size - 1 == summary["mask_id"] == 599
  from tokenizers import pre_tokenizers  # Then the 256 bytes (GPT-2's alphabet), merges.
  assert {tok.id_to_token(i) for i in range(4, 260)} == set(
      pre_tokenizers.ByteLevel.alphabet())
  text = "Héllo wörld, naïve 中文 🤗 <mask> Python"
  ids = tok.tokenize(text)
  assert tok.mask_id in ids and tok.unk_id not in ids  # Bytes spell anything.
  assert tok.decode(ids) == text.replace(" <mask>", "<mask>")
  assert tok.tokenize("Python") != tok.tokenize("python")  # Cased.


@pytest.mark.parametrize("kind", [  # 7 s each at load 9: byte-level BPE's in the full run.
    "wordpiece", pytest.param("byte_level_bpe", marks=pytest.mark.slow)])
def test_training_gives_the_same_vocabulary_in_every_process(kind):
  """tokenizers numbers WordPiece's '##' pieces in hash-map order, which differs from
  process to process (huggingface/tokenizers#1794): `train_tokenizer` numbers them first,
  so three processes train the same vocabulary on the embedded corpus."""
  code = ("import hashlib; from bertjax.data import sources; "
          "from bertjax.data.tokenizer import train_tokenizer; "
          "docs = sources.load_documents('embedded'); "
          f"tok = train_tokenizer([s for d in docs for s in d], kind={kind!r}, "
          "vocab_size=2048, lowercase=True); "
          "print(hashlib.sha1(' '.join(tok.id_to_token(i) for i in range(tok.vocab_size))"
          ".encode()).hexdigest())")
  digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip() for _ in range(3)}
  assert len(digests) == 1, digests
