"""Corpus sources (text, JSON lines, gzip, globs, directories, TFDS), bad corpora, and
the streaming, parallel, resumable preparation into ArrayRecord."""

import gzip
import json
import os
import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bertjax.data import prepare_tokens as prepare, sources, tfds_builder
from bertjax.data.tokenizer import train_tokenizer
from bertjax.errors import DataError

TEXT = ("The cat sat on the mat. It was warm.\nThe dog barked.\n\n"
        "A second document starts here. It has two sentences.\n\n\n"
        "Third one.\n")


def _docs(spec, **kw):
  return list(sources.iter_documents(spec, **kw))


def test_text_jsonl_gzip_glob_and_directory(tmp_path):
  (tmp_path / "a.txt").write_text(TEXT)
  with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
    f.write(json.dumps({"body": "Line one here. Line two.\nA new paragraph."}) + "\n\n")
    f.write(json.dumps({"body": ""}) + "\n")  # an empty document is skipped
  text_docs = _docs(str(tmp_path / "a.txt"))
  assert text_docs == [["The cat sat on the mat.", "It was warm.", "The dog barked."],
                       ["A second document starts here.", "It has two sentences."],
                       ["Third one."]]
  assert _docs(str(tmp_path / "*.jsonl.gz"), text_field="body") == [
      ["Line one here.", "Line two.", "A new paragraph."]]
  assert len(_docs(str(tmp_path), text_field="body")) == 4
  with pytest.raises(DataError, match="no string field 'text'"):
    _docs(str(tmp_path / "b.jsonl.gz"))


# The sentence split as it was done a line at a time (before `sources.document_text`):
# the reference the whole-document split is held to.
_REFERENCE_END = re.compile(r"(?<=[.!?])(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\betc\.)"
                            r"([\"'”’)\]]?)\s+(?=[A-Z0-9\"“‘(\[])")


def _reference_line_units(line, line_breaks):
  text = " ".join(line.split())
  if not text:
    return []
  if line_breaks == "apart":
    return [text]
  parts = _REFERENCE_END.split(text)
  sentences = [parts[0]]
  for i in range(1, len(parts), 2):
    sentences[-1] += parts[i]
    sentences.append(parts[i + 1])
  return sentences


# Lines of what the split looks at: marks, closing and opening quotes, the
# abbreviations it keeps whole, every kind of whitespace, letters of both cases, digits.
_LINE = st.lists(st.sampled_from(
    [".", "!", "?", "e.g.", "i.e.", "etc.", "xe.g.", '"', "'", "”", "’", ")", "]", "“",
     "‘", "(", "[", " ", "  ", "\t", "\xa0", "\u3000", "\x0b", "\x85", "\u2028", "A",
     "Z", "0", "a", "e", "g", "é", "É", "中"]), max_size=16).map("".join)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.lists(_LINE, max_size=6), st.sampled_from(sources.LINE_BREAKS))
def test_document_text_gives_each_lines_units(lines, line_breaks):
  """`document_text` (a document's lines collapsed and split at once) gives the units
  that splitting each line alone gave, as `line_units` does."""
  expected = [u for line in lines for u in _reference_line_units(line, line_breaks)]
  text = sources.document_text(lines, line_breaks)
  assert (text.split("\n") if text else []) == expected
  assert [u for line in lines for u in sources.line_units(line, line_breaks)] == expected


def test_bad_corpora(tmp_path):
  (tmp_path / "bin.txt").write_bytes(b"\x00\x01\x02" * 100)
  with pytest.raises(DataError, match="binary"):
    _docs(str(tmp_path / "bin.txt"))
  # Invalid UTF-8 bytes inside text are replaced, not fatal.
  (tmp_path / "mixed.txt").write_bytes("Caf\u00e9 is open. ".encode() * 20 + b"\xff\xfe ok.\n")
  (doc,) = _docs(str(tmp_path / "mixed.txt"))
  assert "\ufffd" in doc[-1] and doc[0] == "Café is open."
  # One giant line is cut into bounded pieces instead of exhausting memory.
  (tmp_path / "giant.txt").write_text("word " * (sources.MAX_LINE_CHARS // 2))
  (giant,) = _docs(str(tmp_path / "giant.txt"))
  assert sum(map(len, giant)) >= sources.MAX_LINE_CHARS // 2 - 2
  (tmp_path / "empty.txt").write_text("\n\n   \n\n")
  assert not _docs(str(tmp_path / "empty.txt"))
  with gzip.open(tmp_path / "cut.txt.gz", "wb") as f:
    f.write(b"Some text here.\n" * 5000)
  data = (tmp_path / "cut.txt.gz").read_bytes()
  (tmp_path / "cut.txt.gz").write_bytes(data[:len(data) // 2])
  with pytest.raises(DataError, match="cut.txt.gz.*(truncated|ended before)"):
    _docs(str(tmp_path / "cut.txt.gz"))
  with pytest.raises(DataError, match="matches no file"):
    _docs(str(tmp_path / "nothing*.txt"))


def test_tfds_builder_and_data_source(tmp_path):
  (tmp_path / "a.txt").write_text(TEXT)
  spec = tfds_builder.build(str(tmp_path / "a.txt"), str(tmp_path / "tfds"), "tiny_corpus")
  assert spec == "tfds:tiny_corpus/default"
  assert _docs(spec, data_dir=str(tmp_path / "tfds")) == _docs(str(tmp_path / "a.txt"))
  with pytest.raises(DataError, match="cannot be read"):
    _docs("tfds:not_prepared_here", data_dir=str(tmp_path / "tfds"))


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("corpus")
  rng = np.random.default_rng(0)
  words = "alpha beta gamma delta epsilon unbelievable tokenization cat dog".split()
  for f in range(3):
    with open(d / f"part{f}.txt", "w") as out:
      for _ in range(40):
        for _ in range(int(rng.integers(1, 5))):
          out.write(" ".join(rng.choice(words, 8)).capitalize() + ".\n")
        out.write("\n")
  tok = train_tokenizer([" ".join(words)] * 10, kind="wordpiece", vocab_size=80)
  tok.save(str(d / "tok"))
  return d


def test_prepare_parallel_resumable_and_exact(corpus_dir, tmp_path):
  spec, tok_path = str(corpus_dir / "*.txt"), str(corpus_dir / "tok")
  out = str(tmp_path / "prepared")
  summary = prepare.prepare(spec, tok_path, out, workers=2, chunk_documents=25,
                            progress=False)
  assert summary["documents"] == 120 and summary["shards"] == 5
  assert summary["resumed_shards"] == 0
  docs = list(prepare.read_documents(out))
  from bertjax.data.tokenizer import load_tokenizer
  tok = load_tokenizer(tok_path)
  expected = [[tok.tokenize(s) for s in d] for d in sources.iter_documents(spec)]
  assert docs == expected
  assert summary["tokens"] == sum(len(s) for d in expected for s in d)
  # Word boundaries travel with the ids.
  from array_record.python import array_record_data_source
  src = array_record_data_source.ArrayRecordDataSource(
      [os.path.join(out, "part-00000.array_record")])
  sentences, starts = prepare.decode_document(src[0])
  np.testing.assert_array_equal(starts, tok.word_starts()[np.concatenate(sentences)])
  # An interrupted run: two shards lost (and one half-written tmp file) -> resumed.
  for k in (3, 4):
    os.remove(os.path.join(out, f"part-{k:05d}.array_record"))
  open(os.path.join(out, "part-00004.array_record.tmp"), "w").write("partial")
  again = prepare.prepare(spec, tok_path, out, workers=2, chunk_documents=25,
                          progress=False)
  assert again["resumed_shards"] == 3 and again["documents"] == 120
  assert list(prepare.read_documents(out)) == docs
  # The training pipeline reads the prepared directory without tokenizing again.
  from bertjax.data import pipeline
  from configs import bert_tiny
  cfg = bert_tiny.get_config().data
  cfg.corpus, cfg.max_seq_length, cfg.dupe_factor = out, 32, 1
  data = pipeline.build_pretraining_data(cfg, tok, batch_size=4, seed=0, nsp=True)
  assert data.stats["documents"] == 120
  assert next(iter(data.train))["input_ids"].shape == (4, 32)


def test_a_document_without_blank_lines_is_cut_to_bounded_pieces(tmp_path, monkeypatch):
  monkeypatch.setattr(sources, "MAX_DOCUMENT_CHARS", 100)
  (tmp_path / "one.txt").write_text("".join(f"Sentence number {i} is here.\n"
                                            for i in range(40)))
  documents = _docs(str(tmp_path / "one.txt"))
  assert len(documents) > 5 and all(sum(map(len, d)) < 130 for d in documents)
  assert [s for d in documents for s in d] == [f"Sentence number {i} is here."
                                               for i in range(40)]


def test_prepare_keeps_its_tokenizer_and_counts_characters(corpus_dir, tmp_path):
  spec, out = str(corpus_dir / "part0.txt"), str(tmp_path / "tokens")
  (tmp_path / "sentences.txt").write_text(TEXT * 3)  # lines of several sentences
  for corpus, line_breaks in [(spec, "space"), (str(tmp_path / "sentences.txt"), "space"),
                              (str(tmp_path / "sentences.txt"), "apart")]:
    summary = prepare.prepare(corpus, str(corpus_dir / "tok"), out, workers=1,
                              progress=False, line_breaks=line_breaks)
    documents = sources.iter_documents(corpus, line_breaks=line_breaks)
    assert summary["characters"] == sum(len(s) for d in documents for s in d)
    shutil.rmtree(out)
  prepare.prepare(spec, str(corpus_dir / "tok"), out, workers=1, progress=False)
  assert os.path.isdir(os.path.join(out, "tokenizer"))
  other = train_tokenizer(["completely different words here"] * 10, kind="wordpiece",
                          vocab_size=40)
  other.save(str(tmp_path / "other"))
  with pytest.raises(DataError, match="another tokenizer"):
    prepare.prepare(spec, str(tmp_path / "other"), out, workers=1, progress=False)
