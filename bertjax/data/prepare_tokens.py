"""Stage 1 of `python -m bertjax.data.prepare`: a corpus tokenized once into ArrayRecord
shards (one record a document), and the reading of such a directory
(`TokenizedDocuments`, `read_documents`, `summary`).

Stage 1 streams documents from `sources.iter_document_texts` (one str a document) in
chunks of `--chunk_documents` (or `CHUNK_CHARACTERS` of text); worker processes
tokenize a chunk each and write `part-NNNNN.array_record` (see `encode_document`)
plus `part-NNNNN.json` (its counts) atomically, and a copy of the tokenizer goes to
`tokenizer/`. A rerun skips chunks whose shard exists, so an interrupted preparation
continues where it stopped; memory stays bounded by the chunks in flight. The summary
(documents, sentences, tokens, characters, seconds) is printed and written to
`summary.json`. Stage 2 is `bertjax.data.prepare_examples` (or `prepare_beam`).
"""

from __future__ import annotations

import collections
import gc
import itertools
import json
import multiprocessing
import os
import time
from typing import Iterator

from etils import epath
import numpy as np

from bertjax.console import progress as progress_lib
from bertjax.data import manifest
from bertjax.data import sources
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import DataError

SUMMARY = manifest.SUMMARY
# A chunk (one shard) closes at this much text, whatever its document count.
CHUNK_CHARACTERS = 1 << 25
# Tokenized shards a reader keeps open (each holds its shard's record index).
MAX_OPEN_SHARDS = 4096
_worker_tokenizer: tok_lib.Tokenizer | None = None
_worker_word_starts: np.ndarray | None = None
_worker_line_breaks = "space"


def encode_document(sentences: list[list[int]], word_starts: np.ndarray) -> bytes:
  """One record: int32 [num_sentences, sentence lengths..., ids...] followed by the
  packed bits of the word-start flags [num_tokens] (1 where a token begins a word)."""
  ids = np.concatenate([np.asarray(s, np.int32) for s in sentences])
  header = np.array([len(sentences), *map(len, sentences)], np.int32)
  return (np.concatenate([header, ids]).tobytes()
          + np.packbits(word_starts[ids]).tobytes())


def encode_documents(ids: np.ndarray, lengths: np.ndarray, units: np.ndarray,
                     word_starts: np.ndarray) -> tuple[list[bytes], np.ndarray]:
  """`encode_document`'s records of a chunk's documents at once, from the flat ids of
  their units (ids int32 [N], lengths [U] in order, `units` [D] units a document): a
  document's empty units are left out, a document with none is not written. Returns
  (records, kept [U] bool: the units written)."""
  kept = lengths > 0
  doc_of = np.repeat(np.arange(len(units)), units)
  sentences = np.bincount(doc_of[kept], minlength=len(units))  # written units a doc
  tokens = np.bincount(doc_of, weights=lengths, minlength=len(units)).astype(np.int64)
  ends = np.cumsum(tokens)
  # Every written document's header [n, lengths...], one after the other.
  written = sentences > 0
  header = np.empty(int(written.sum()) + int(kept.sum()), np.int32)
  header_ends = np.cumsum(np.where(written, sentences + 1, 0))
  is_count = np.zeros(len(header), bool)
  is_count[(header_ends - sentences - 1)[written]] = True
  header[is_count] = sentences[written]
  header[~is_count] = lengths[kept]
  starts = word_starts[ids]
  records = []
  for d in np.flatnonzero(written).tolist():
    a, b = int(ends[d] - tokens[d]), int(ends[d])
    h = int(header_ends[d])
    records.append(header[h - int(sentences[d]) - 1:h].tobytes() + ids[a:b].tobytes()
                   + np.packbits(starts[a:b]).tobytes())
  return records, kept


def decode_document(record: bytes) -> tuple[list[np.ndarray], np.ndarray]:
  """Inverse of `encode_document`: (sentences as int32 arrays, word starts [N] bool)."""
  n = int(np.frombuffer(record, np.int32, 1)[0])
  lengths = np.frombuffer(record, np.int32, n, 4)
  total = int(lengths.sum())
  ids = np.frombuffer(record, np.int32, total, 4 * (1 + n))
  bits = np.frombuffer(record, np.uint8, offset=4 * (1 + n + total))
  starts = np.unpackbits(bits, count=total).astype(bool)
  return np.split(ids, np.cumsum(lengths)[:-1]), starts


def summary(directory: str) -> dict:
  """The `summary.json` of a tokenized directory (local or gs://)."""
  path = epath.Path(directory) / SUMMARY
  if not path.exists():
    raise DataError(f"{directory!r} holds no prepared shards: run python -m "
                    "bertjax.data.prepare --output there first")
  return json.loads(path.read_text())


def text_bytes(directory: str) -> int:
  """About how much text a tokenized directory came from (its characters)."""
  info = summary(directory)
  return int(info.get("characters") or 4 * info["tokens"])


class TokenizedDocuments:
  """Random access to the documents of a tokenized directory: document i (in corpus
  order) as its sentences, each a list of ids. One array_record read per access
  (local paths or gs://); shards are opened when first read, at most
  `MAX_OPEN_SHARDS` at a time with small buffers, so memory stays bounded however
  many shards the corpus has. Not thread-safe (one per process)."""

  def __init__(self, directory: str):
    info = summary(directory)
    root = epath.Path(directory)
    counts = info.get("shard_documents") or [
        json.loads((root / f"part-{k:05d}.json").read_text())["documents"]
        for k in range(info["shards"])]
    if not counts:
      raise DataError(f"{directory!r} holds no documents: prepare a corpus with text")
    self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    self._paths = [str(root / f"part-{k:05d}.array_record") for k in range(len(counts))]
    self._readers: collections.OrderedDict = collections.OrderedDict()

  def __len__(self) -> int:
    return int(self.starts[-1])

  def _reader(self, shard: int):
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
    reader = self._readers.pop(shard, None)
    if reader is None:
      if len(self._readers) >= MAX_OPEN_SHARDS:
        self._readers.popitem(last=False)[1].close()
      reader = array_record_module.ArrayRecordReader(
          self._paths[shard], options="readahead_buffer_size:0", file_reader_buffer_size=4096)
    self._readers[shard] = reader
    return reader

  def __getitem__(self, i: int) -> list[list[int]]:
    shard = int(np.searchsorted(self.starts, i, side="right")) - 1
    record = self._reader(shard).read([int(i - self.starts[shard])])[0]
    n = int(np.frombuffer(record, np.int32, 1)[0])
    header = np.frombuffer(record, np.int32, n + 1).tolist()
    ids = np.frombuffer(record, np.int32, sum(header[1:]), 4 * (1 + n)).tolist()
    ends = np.cumsum(header[1:]).tolist()
    return [ids[end - length:end] for end, length in zip(ends, header[1:])]


def read_documents(directory: str) -> Iterator[list[list[int]]]:
  """Tokenized documents of a prepared directory, in order (each a list of sentences)."""
  documents = TokenizedDocuments(directory)
  for i in range(len(documents)):
    yield documents[i]


def _init_worker(tokenizer_path: str, line_breaks: str) -> None:
  global _worker_tokenizer, _worker_word_starts, _worker_line_breaks
  _worker_tokenizer = tok_lib.load_tokenizer(tokenizer_path)
  _worker_word_starts = _worker_tokenizer.word_starts()
  _worker_line_breaks = line_breaks


def _write_shard(args: tuple[str, list[str]]) -> dict[str, int]:
  """Tokenizes one chunk of documents (each its units joined by newlines) into `path`
  (atomically); returns its counts.

  The cyclic garbage collector waits while the chunk is tokenized: the hundreds of
  thousands of lists that makes (a unit's ids, its words) hold no cycles, yet every
  few hundred of them would start a collection, some walking the whole heap with the
  word cache's million entries (~15% of a WordPiece or byte-level BPE worker's time).
  It collects between chunks as usual."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  path, texts = args
  gc.disable()
  try:
    records, counts = _encode_chunk(texts)
  finally:
    gc.enable()
  tmp = path + ".tmp"
  writer = array_record_module.ArrayRecordWriter(tmp, "group_size:1")
  for record in records:
    writer.write(record)
  writer.close()
  with open(path.replace(".array_record", ".json"), "w") as f:
    json.dump(counts, f)
  os.replace(tmp, path)
  return counts


def _encode_chunk(texts: list[str]) -> tuple[list[bytes], dict[str, int]]:
  """The records of a chunk's documents (`encode_documents`) and its counts."""
  units = [tok_lib.document_unit_texts(t, _worker_line_breaks) for t in texts]
  per_document = np.fromiter(map(len, units), np.int64, len(units))
  ids, lengths = _worker_tokenizer.tokenize_units(units)
  records, kept = encode_documents(ids, lengths, per_document, _worker_word_starts)
  characters = np.fromiter(map(len, itertools.chain.from_iterable(units)), np.int64,
                           len(kept))
  if _worker_line_breaks == "space":  # less the space before each but a document's first
    characters -= 1
    characters[np.cumsum(per_document) - per_document] += 1
  return records, {"documents": len(records), "sentences": int(kept.sum()),
                   "tokens": int(lengths.sum()),
                   "characters": int(characters[kept].sum())}


def _chunks(spec: str, size: int, text_field: str, line_breaks: str
            ) -> Iterator[list[str]]:
  """Lists of `size` documents, each its units joined by newlines
  (`sources.iter_document_texts`), fewer once their units hold CHUNK_CHARACTERS."""
  chunk, characters = [], 0
  for text in sources.iter_document_texts(spec, text_field, line_breaks=line_breaks):
    chunk.append(text)
    characters += len(text) - text.count("\n")
    if len(chunk) == size or characters >= CHUNK_CHARACTERS:
      yield chunk
      chunk, characters = [], 0
  if chunk:
    yield chunk


def _save_tokenizer(tokenizer_path: str, output: str) -> str:
  """Copies the tokenizer into OUTPUT/tokenizer (refusing to mix two tokenizers in one
  directory); returns its fingerprint."""
  tok = tok_lib.load_tokenizer(tokenizer_path)  # fail fast, in this process
  fingerprint = manifest.fingerprint(tok)
  saved = os.path.join(output, manifest.TOKENIZER_DIR)
  if os.path.isdir(saved):
    if manifest.fingerprint(tok_lib.load_tokenizer(saved)) != fingerprint:
      raise DataError(f"{output} was prepared with another tokenizer than "
                      f"{tokenizer_path}: use a new --output")
  else:
    tok.save(saved)
  return fingerprint


def prepare(input_spec: str, tokenizer_path: str, output: str, workers: int = 1,
            chunk_documents: int = 1000, text_field: str = "text",
            progress: bool = True, line_breaks: str = "space") -> dict[str, float]:
  """Tokenizes `input_spec` into ArrayRecord shards under `output`, a line break
  inside a document as `line_breaks` says (config.data.line_breaks: recorded in the
  summary, checked by training); returns the summary (documents, sentences, tokens,
  characters, shards, resumed_shards, seconds)."""
  start = time.perf_counter()
  os.makedirs(output, exist_ok=True)
  fingerprint = _save_tokenizer(tokenizer_path, output)
  totals = {"documents": 0, "sentences": 0, "tokens": 0, "characters": 0, "shards": 0,
            "resumed_shards": 0}
  shard_documents: dict[int, int] = {}

  def add(k, counts):
    for key, value in counts.items():
      totals[key] += value
    totals["shards"] += 1
    shard_documents[k] = counts["documents"]
    bar.update(counts["documents"])

  ctx = multiprocessing.get_context("spawn")
  with ctx.Pool(max(1, workers), _init_worker, (tokenizer_path, line_breaks)) as pool, \
      progress_lib.Progress("prepare", unit="docs", enable=progress) as bar:
    pending = []
    for k, chunk in enumerate(_chunks(input_spec, chunk_documents, text_field,
                                      line_breaks)):
      path = os.path.join(output, f"part-{k:05d}.array_record")
      if os.path.exists(path):  # done by an earlier, interrupted run
        with open(path.replace(".array_record", ".json")) as f:
          add(k, {"characters": 0, **json.load(f)})
        totals["resumed_shards"] += 1
        continue
      pending.append((k, pool.apply_async(_write_shard, ((path, chunk),))))
      while len(pending) >= 2 * max(1, workers):  # bounded memory: wait for the oldest
        k, result = pending.pop(0)
        add(k, result.get())
    for k, result in pending:
      add(k, result.get())
  totals["seconds"] = round(time.perf_counter() - start, 3)
  tmp = os.path.join(output, SUMMARY + ".tmp")
  with open(tmp, "w") as f:
    json.dump({**totals, "tokenizer_fingerprint": fingerprint, "line_breaks": line_breaks,
               "shard_documents": [shard_documents[k] for k in sorted(shard_documents)]},
              f, indent=1)
  os.replace(tmp, os.path.join(output, SUMMARY))
  return totals
