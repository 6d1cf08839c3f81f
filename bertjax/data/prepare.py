"""Tokenize a corpus once into ArrayRecord shards: streaming, parallel, resumable.

  python -m bertjax.data.prepare --input='/data/*.txt' --tokenizer=vocab.txt \
      --output=/data/prepared --workers=8

Documents are streamed from `sources.iter_documents` in chunks of `--chunk_documents`;
worker processes tokenize a chunk each and write `part-NNNNN.array_record` (one record
per document, see `encode_document`) plus `part-NNNNN.json` (its counts) atomically.
A rerun skips chunks whose shard exists, so an interrupted preparation continues
where it stopped; memory stays bounded by the chunks in flight. The summary
(documents, sentences, tokens, seconds) is printed and written to `summary.json`.
"""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import time
from typing import Iterator

from absl import flags
import numpy as np

from bertjax import cli
from bertjax import progress as progress_lib
from bertjax.data import corpus
from bertjax.data import sources
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import DataError

SUMMARY = "summary.json"
_worker_tokenizer: tok_lib.Tokenizer | None = None
_worker_word_starts: np.ndarray | None = None


def encode_document(sentences: list[list[int]], word_starts: np.ndarray) -> bytes:
  """One record: int32 [num_sentences, sentence lengths..., ids...] followed by the
  packed bits of the word-start flags [num_tokens] (1 where a token begins a word)."""
  ids = np.concatenate([np.asarray(s, np.int32) for s in sentences])
  header = np.array([len(sentences), *map(len, sentences)], np.int32)
  return (np.concatenate([header, ids]).tobytes()
          + np.packbits(word_starts[ids]).tobytes())


def decode_document(record: bytes) -> tuple[list[np.ndarray], np.ndarray]:
  """Inverse of `encode_document`: (sentences as int32 arrays, word starts [N] bool)."""
  n = int(np.frombuffer(record, np.int32, 1)[0])
  lengths = np.frombuffer(record, np.int32, n, 4)
  total = int(lengths.sum())
  ids = np.frombuffer(record, np.int32, total, 4 * (1 + n))
  bits = np.frombuffer(record, np.uint8, offset=4 * (1 + n + total))
  starts = np.unpackbits(bits, count=total).astype(bool)
  return np.split(ids, np.cumsum(lengths)[:-1]), starts


def read_documents(directory: str) -> Iterator[list[list[int]]]:
  """Tokenized documents of a prepared directory, in order (each a list of sentences)."""
  from array_record.python import array_record_data_source  # pylint: disable=g-import-not-at-top
  paths = sorted(glob.glob(os.path.join(directory, "part-*.array_record")))
  if not paths:
    raise DataError(f"{directory!r} holds no prepared shards: run python -m "
                    "bertjax.data.prepare --output there first")
  source = array_record_data_source.ArrayRecordDataSource(paths)
  for i in range(len(source)):
    yield [s.tolist() for s in decode_document(source[i])[0]]


def _init_worker(tokenizer_path: str) -> None:
  global _worker_tokenizer, _worker_word_starts
  _worker_tokenizer = tok_lib.load_tokenizer(tokenizer_path)
  _worker_word_starts = _worker_tokenizer.word_starts()


def _write_shard(args: tuple[str, list[list[str]]]) -> dict[str, int]:
  """Tokenizes one chunk of documents into `path` (atomically); returns its counts."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  path, documents = args
  flat = [s for d in documents for s in d]
  ids = _worker_tokenizer.tokenize_batch(flat)
  counts = {"documents": 0, "sentences": 0, "tokens": 0}
  tmp = path + ".tmp"
  writer = array_record_module.ArrayRecordWriter(tmp, "group_size:1")
  k = 0
  for doc in documents:
    sentences = [s for s in ids[k:k + len(doc)] if s]
    k += len(doc)
    if sentences:
      writer.write(encode_document(sentences, _worker_word_starts))
      counts["documents"] += 1
      counts["sentences"] += len(sentences)
      counts["tokens"] += sum(map(len, sentences))
  writer.close()
  with open(path.replace(".array_record", ".json"), "w") as f:
    json.dump(counts, f)
  os.replace(tmp, path)
  return counts


def _chunks(spec: str, size: int, text_field: str) -> Iterator[list[list[str]]]:
  chunk = []
  documents = (corpus.load_documents(spec) if spec == corpus.EMBEDDED
               else sources.iter_documents(spec, text_field))
  for doc in documents:
    chunk.append(doc)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


def prepare(input_spec: str, tokenizer_path: str, output: str, workers: int = 1,
            chunk_documents: int = 1000, text_field: str = "text",
            progress: bool = True) -> dict[str, float]:
  """Tokenizes `input_spec` into ArrayRecord shards under `output`; returns the summary
  (documents, sentences, tokens, seconds, shards, resumed_shards)."""
  start = time.perf_counter()
  os.makedirs(output, exist_ok=True)
  tok_lib.load_tokenizer(tokenizer_path)  # fail fast, in this process, on a bad path
  totals = {"documents": 0, "sentences": 0, "tokens": 0, "shards": 0, "resumed_shards": 0}

  def add(counts):
    for key, value in counts.items():
      totals[key] += value
    totals["shards"] += 1
    bar.update(counts["documents"])

  ctx = multiprocessing.get_context("spawn")
  with ctx.Pool(max(1, workers), _init_worker, (tokenizer_path,)) as pool, \
      progress_lib.Progress("prepare", unit="docs", enable=progress) as bar:
    pending = []
    for k, chunk in enumerate(_chunks(input_spec, chunk_documents, text_field)):
      path = os.path.join(output, f"part-{k:05d}.array_record")
      if os.path.exists(path):  # done by an earlier, interrupted run
        with open(path.replace(".array_record", ".json")) as f:
          add(json.load(f))
        totals["resumed_shards"] += 1
        continue
      pending.append(pool.apply_async(_write_shard, ((path, chunk),)))
      while len(pending) >= 2 * max(1, workers):  # bounded memory: wait for the oldest
        add(pending.pop(0).get())
    for result in pending:
      add(result.get())
  totals["seconds"] = round(time.perf_counter() - start, 3)
  with open(os.path.join(output, SUMMARY), "w") as f:
    json.dump(totals, f, indent=1)
  return totals


def main(argv):
  del argv
  f = flags.FLAGS
  summary = prepare(f.input, f.tokenizer, f.output, f.workers, f.chunk_documents,
                    f.text_field)
  print(" | ".join(f"{k} {v:,}" for k, v in summary.items()))


if __name__ == "__main__":
  # Defined only when run as a program, so importing the module defines no flags.
  flags.DEFINE_string("input", None, "Corpus: file, glob, directory, tfds:NAME, embedded.")
  flags.DEFINE_string("tokenizer", None, "vocab.txt, .model, tokenizer.json or dir.")
  flags.DEFINE_string("output", None, "Directory for the ArrayRecord shards.")
  flags.DEFINE_integer("workers", os.cpu_count() or 1, "Tokenizer processes.")
  flags.DEFINE_integer("chunk_documents", 1000, "Documents per shard.")
  flags.DEFINE_string("text_field", "text", "JSON-lines / TFDS text key.")
  flags.mark_flags_as_required(["input", "tokenizer", "output"])
  cli.run(main)
