"""Corpora in the formats the field publishes (`bertjax.data.formats`): Parquet (a row
group at a time), zstandard JSON lines and text (Dolma), Arrow IPC and Hugging Face
`datasets` save_to_disk directories, local and on gs:// (an in-memory fake GCS behind
etils.epath's fsspec backend, as gcsfs would serve it), their one-line errors, and
`prepare` stage 1 reading them.

tests/fixtures/hf_dataset was written by `datasets` 5.2.0 itself (not a dependency):
  datasets.DatasetDict({"train": Dataset.from_dict({"id": [...], "text": TEXTS}),
                        "validation": ...}).save_to_disk(DIR, num_shards={"train": 2, ...})
"""

import io
import json
import os
import shutil
import sys

import fsspec
from fsspec.implementations.memory import MemoryFileSystem
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bertjax.data import formats, prepare_tokens, sources
from bertjax.errors import DataError

HF_DATASET = os.path.join(os.path.dirname(__file__), "fixtures", "hf_dataset")
# The fixture's train split: its texts (two shards), in order, "" and None skipped.
HF_TRAIN = [["The heart pumps blood.", "It has four chambers."],
            ["Aspirin thins the blood.", "It is taken daily by some patients."],
            ["A fracture heals in weeks.", "Rest helps."],
            ["Insulin lowers blood sugar.", "It is made in the pancreas."]]
TEXTS = [f"Note number {i} is here. It has a second sentence." for i in range(40)]
DOCS = [[f"Note number {i} is here.", "It has a second sentence."] for i in range(40)]


def _docs(spec, **kw):
  return list(sources.iter_documents(spec, **kw))


def _parquet(path, texts, column="text", row_group_size=7):
  table = pa.table({"id": list(range(len(texts))), column: texts})
  pq.write_table(table, path, row_group_size=row_group_size)
  return str(path)


def _zst(path, data: bytes, frames=1):
  """`data` as a .zst of `frames` frames (zstd's CLI writes one; pzstd many)."""
  cut = np.linspace(0, len(data), frames + 1).astype(int)
  path.write_bytes(b"".join(zstandard.ZstdCompressor().compress(data[a:b])
                            for a, b in zip(cut[:-1], cut[1:])))
  return str(path)


def _jsonl(texts, field="text") -> bytes:
  return "".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)).encode()


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
  """One corpus of TEXTS in each format, in its own directory."""
  root = tmp_path_factory.mktemp("formats")
  out = {"parquet": _parquet(root / "a.parquet", TEXTS[:20] + [None, ""] + TEXTS[20:]),
         "jsonl_zst": _zst(root / "a.jsonl.zst", _jsonl(TEXTS), frames=3),
         "text_zst": _zst(root / "a.txt.zst", "\n\n".join(TEXTS).encode())}
  with pa.OSFile(str(root / "a.arrow"), "wb") as f:  # the IPC file format (Feather v2)
    with pa.ipc.new_file(f, pa.schema([("text", pa.large_string())])) as writer:
      for k in range(0, 40, 16):
        writer.write_batch(pa.record_batch([pa.array(TEXTS[k:k + 16], pa.large_string())],
                                           names=["text"]))
  out["arrow"] = str(root / "a.arrow")
  return out


@pytest.mark.parametrize("name", ["parquet", "jsonl_zst", "text_zst", "arrow"])
def test_every_format_reads_its_documents_in_order(corpus_files, name):
  assert _docs(corpus_files[name]) == DOCS


def test_parquet_named_column_row_groups_and_size(tmp_path):
  path = _parquet(tmp_path / "b.parquet", TEXTS, column="body", row_group_size=5)
  assert pq.ParquetFile(path).metadata.num_row_groups == 8
  assert _docs(path, text_field="body") == DOCS
  # The text's size from the footer alone (the column's uncompressed bytes).
  size = sources.text_bytes(path, "body")
  assert sum(map(len, TEXTS)) <= size < 2 * sum(map(len, TEXTS)) + 8 * 200


def test_parquet_holds_one_row_group_at_a_time(tmp_path):
  """Reading a Parquet file keeps about a row group of Arrow memory, whatever its
  length: 40 row groups of 100 KB of text, at most 3 held at any document (a single
  `iter_batches` over the file held every one it had read until the end)."""
  text = "x" * 1000
  path = tmp_path / "long.parquet"
  pq.write_table(pa.table({"text": [text] * 4000}), path, row_group_size=100,
                 compression="none")
  base, peak, n = pa.total_allocated_bytes(), 0, 0  # Arrow memory this read adds.
  for t in formats.parquet_texts(str(path), "text"):
    n += t == text
    peak = max(peak, pa.total_allocated_bytes() - base)
  assert n == 4000 and peak < 3 * 100 * len(text), peak


def test_datasets_directory_reads_its_train_split_in_order():
  assert _docs(HF_DATASET) == HF_TRAIN
  assert _docs(os.path.join(HF_DATASET, "train")) == HF_TRAIN
  assert _docs(os.path.join(HF_DATASET, "validation")) == [
      ["A held out note.", "Two sentences."]]
  assert sources.text_bytes(HF_DATASET) == sum(
      os.path.getsize(os.path.join(HF_DATASET, "train", f"data-0000{k}-of-00002.arrow"))
      for k in (0, 1))


def test_a_directory_and_globs_mix_formats(corpus_files, tmp_path):
  root = os.path.dirname(corpus_files["parquet"])
  assert _docs(root) == DOCS * 4  # a.arrow, a.jsonl.zst, a.parquet, a.txt.zst
  assert _docs(os.path.join(root, "*.parquet")) == DOCS
  # A datasets directory inside a tree is read as one (its JSON files are no corpus).
  shutil.copytree(HF_DATASET, tmp_path / "tree" / "hf")
  shutil.copy(corpus_files["parquet"], tmp_path / "tree" / "b.parquet")
  assert _docs(str(tmp_path / "tree")) == HF_TRAIN + DOCS


def _one_line(call, match):
  with pytest.raises(DataError, match=match) as e:
    call()
  assert "\n" not in str(e.value)
  return str(e.value)


def test_bad_files_are_one_line_data_errors(tmp_path):
  no_text = _parquet(tmp_path / "c.parquet", TEXTS, column="content")
  message = _one_line(lambda: _docs(no_text), "has no column 'text' .its columns: id, "
                      "content.: set config.data.text_field")
  assert "c.parquet" in message
  _one_line(lambda: sources.text_bytes(no_text), "has no column 'text'")
  pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
  _one_line(lambda: _docs(str(tmp_path / "ints.parquet")), "holds int64, not text")
  (tmp_path / "junk.parquet").write_bytes(b"\x00\x01 not parquet" * 50)
  _one_line(lambda: _docs(str(tmp_path / "junk.parquet")), "not a readable Parquet file")
  (tmp_path / "junk.arrow").write_bytes(b"not arrow at all" * 50)
  _one_line(lambda: _docs(str(tmp_path / "junk.arrow")), "not a readable Arrow IPC file")
  data = _jsonl(TEXTS * 50)
  whole = _zst(tmp_path / "whole.jsonl.zst", data)
  cut = tmp_path / "cut.jsonl.zst"
  cut.write_bytes(open(whole, "rb").read()[:-20])  # zstandard's stream_reader: no error
  _one_line(lambda: _docs(str(cut)), "cut.jsonl.zst.* is truncated")
  (tmp_path / "junk.jsonl.zst").write_bytes(b"plain bytes, no zstd frame" * 10)
  _one_line(lambda: _docs(str(tmp_path / "junk.jsonl.zst")), "not valid zstd data")
  _zst(tmp_path / "bin.txt.zst", bytes(range(256)) * 100)
  _one_line(lambda: _docs(str(tmp_path / "bin.txt.zst")), "is binary")
  empty = _parquet(tmp_path / "empty.parquet", ["", None])
  _one_line(lambda: sources.load_documents(empty), "contains no text")
  (tmp_path / "dict").mkdir()
  (tmp_path / "dict" / formats.HF_DICT).write_text(json.dumps({"splits": ["test"]}))
  _one_line(lambda: _docs(str(tmp_path / "dict")), "without a 'train' split .it has "
            "test.: give one split's directory, e.g. .*/dict/test")


def test_in_memory_limit_holds_where_a_file_does_not_tell_its_size(tmp_path):
  """A .zst written as a stream records no size: the limit stops the read as it
  passes, in one line."""
  out = io.BytesIO()
  with zstandard.ZstdCompressor().stream_writer(out, closefd=False) as w:
    w.write(_jsonl(TEXTS * 1000))
  (tmp_path / "s.jsonl.zst").write_bytes(out.getvalue())
  spec = str(tmp_path / "s.jsonl.zst")
  assert sources.text_bytes(spec) is None
  _one_line(lambda: sources.load_documents(spec, limit_chars=2**20),
            "holds over 1 MB of text, more than config.data.raw_text_limit_mb=1 .*prepare")
  assert len(sources.load_documents(spec, limit_chars=2**22)) == 40_000


class _FakeGCS(MemoryFileSystem):
  """gs:// in memory, paths without the scheme as gcsfs gives them."""
  protocol = ("gs", "gcs")
  root_marker = ""
  store: dict = {}
  pseudo_dirs = [""]

  @classmethod
  def _strip_protocol(cls, path):
    path = str(path)
    for scheme in ("gs://", "gcs://"):
      path = path[len(scheme):] if path.startswith(scheme) else path
    return path.rstrip("/")


@pytest.fixture
def gcs(monkeypatch):
  """A fake GCS that etils.epath reaches through fsspec; upload(local, remote)."""
  from etils.epath import backend
  registry = sys.modules["fsspec.registry"]._registry  # pylint: disable=protected-access
  monkeypatch.setitem(registry, "gcs", _FakeGCS)  # (undone after the test)
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  _FakeGCS.store.clear()
  fs = fsspec.filesystem("gcs")

  def upload(local, remote):
    if os.path.isdir(local):
      for root, _, names in os.walk(local):
        for name in names:
          rel = os.path.relpath(os.path.join(root, name), local)
          fs.pipe(f"{remote}/{rel}", open(os.path.join(root, name), "rb").read())
    else:
      fs.pipe(remote, open(local, "rb").read())

  yield upload
  backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access


def test_every_format_reads_from_gcs(gcs, corpus_files):
  for name, local in corpus_files.items():
    gcs(local, f"gs://bucket/corpus/{os.path.basename(local)}")
  gcs(HF_DATASET, "gs://bucket/hf")
  gcs(HF_DATASET, "gs://bucket/tree/hf")
  gcs(corpus_files["parquet"], "gs://bucket/tree/b.parquet")
  for name, local in corpus_files.items():
    assert _docs(f"gs://bucket/corpus/{os.path.basename(local)}") == DOCS, name
  assert _docs("gs://bucket/corpus") == DOCS * 4
  assert _docs("gs://bucket/*/*.parquet") == DOCS * 2  # corpus/a, tree/b
  assert _docs("gs://bucket/hf") == HF_TRAIN
  assert _docs("gs://bucket/tree") == HF_TRAIN + DOCS  # as a local tree reads
  assert sources.text_bytes("gs://bucket/corpus/a.parquet") == sources.text_bytes(
      corpus_files["parquet"])
  _one_line(lambda: _docs("gs://bucket/**/*.parquet"), "no \\*\\*.: give the directory "
            "gs://bucket to read its whole tree")
  _one_line(lambda: _docs("gs://bucket/nothing/*.parquet"), "matches no file")


def test_prepare_tokenizes_every_format(corpus_files, tokenizer, tmp_path):
  """Stage 1 on a directory of all four formats and on the datasets directory: the
  shards hold their documents, tokenized."""
  tokenizer.save(str(tmp_path / "tok"))
  root = os.path.dirname(corpus_files["parquet"])
  for name, spec in (("all", root), ("hf", HF_DATASET)):
    out = str(tmp_path / name)
    totals = prepare_tokens.prepare(spec, str(tmp_path / "tok"), out, workers=1,
                                    chunk_documents=30, progress=False)
    expected = [[tokenizer.tokenize(s) for s in d] for d in _docs(spec)]
    assert totals["documents"] == len(expected)
    assert list(prepare_tokens.read_documents(out)) == expected
