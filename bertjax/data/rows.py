"""Training examples as fixed-length binary rows, in memory or in prepared shards.

One layout serves both the examples built in memory from a small raw corpus and the
shards `prepare` writes (`SPLIT/part-SSSSS.rows`, e.g. `train-128/`): a row of length
T holds

  length     uint16       real (non-padding) tokens
  type_start uint16       first token of segment B (token type 1); `length` if none
  label      uint8        next_sentence_label (0 = B follows A, 1 = random B)
  ids        [T] uint16 or int32 (vocabularies over 65,536 ids), padded with pad_id
  words      [ceil(T/8)]  packed bits: the token begins a word (whole-word / span masking)
  documents  [ceil(T/8)]  packed bits: the token begins a document (packed rows), from
                          which segment_ids and position_ids are made at read time

A shard is nothing but its rows one after the other, so row r of a shard is read with
one positioned read at r * itemsize: no index, no decompression, and nothing held in
memory but open file handles. Local files are read with os.pread (the page cache is
not process memory, so a process's RSS does not grow with the data it has read);
other paths (gs://) through etils.epath file objects.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Sequence

from etils import epath
import numpy as np

from bertjax.data import builders

SUFFIX = ".rows"
_MAX_OPEN_FILES = 256


def is_remote(path: str) -> bool:
  """Whether `path` is read through etils.epath (gs://...) rather than os.pread."""
  return "://" in path


def id_dtype(vocab_size: int) -> np.dtype:
  """uint16 ids while the vocabulary fits, else int32 (XLM-R's 250k)."""
  return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<i4")


def row_dtype(length: int, ids: np.dtype) -> np.dtype:
  """The structured dtype of one row of `length` tokens (see the module docstring)."""
  bits = -(-length // 8)
  return np.dtype([("length", "<u2"), ("type_start", "<u2"), ("label", "u1"),
                   ("ids", ids, (length,)), ("words", "u1", (bits,)),
                   ("documents", "u1", (bits,))])


def encode(examples: builders.Examples, word_starts: np.ndarray,
           ids: np.dtype) -> np.ndarray:
  """[N] rows of `examples` ([N, T]; packed rows need their `segment_ids`).

  word_starts [V] bool: the tokenizer's word starts, looked up for every token.
  """
  n, t = examples.input_ids.shape
  out = np.zeros(n, row_dtype(t, ids))
  out["length"] = examples.lengths
  real = np.arange(t)[None, :] < examples.lengths[:, None]
  types = (examples.token_type_ids != 0) & real
  out["type_start"] = np.where(types.any(1), types.argmax(1), examples.lengths)
  out["label"] = examples.next_sentence_labels
  out["ids"] = examples.input_ids
  out["words"] = np.packbits(word_starts[examples.input_ids] & real, axis=1)
  if examples.segment_ids is None:
    starts = np.zeros((n, t), bool)
    starts[:, 0] = examples.lengths > 0
  else:
    seg = examples.segment_ids
    starts = real & (seg != np.pad(seg[:, :-1], ((0, 0), (1, 0))))
  out["documents"] = np.packbits(starts, axis=1)
  return out


def decode(rows: np.ndarray, *, isolate: bool = False, position_offset: int = 0,
           word_starts: bool = False) -> dict[str, np.ndarray]:
  """A batch of model inputs from rows [b] (T their length).

  Returns input_ids, attention_mask, token_type_ids [b, T] int32 and
  next_sentence_labels [b] int32; with `isolate`, segment_ids (1 + the document's
  index in the row, 0 on padding) and position_ids (restarting at `position_offset`
  at each document, `position_offset` on padding) [b, T] int32; with `word_starts`,
  word_starts [b, T] bool.
  """
  t = rows.dtype["ids"].shape[0]
  positions = np.arange(t)[None, :]
  lengths = rows["length"].astype(np.int32)[:, None]
  real = positions < lengths
  out = {
      "input_ids": rows["ids"].astype(np.int32),
      "attention_mask": real.astype(np.int32),
      "token_type_ids": ((positions >= rows["type_start"][:, None]) & real).astype(np.int32),
      "next_sentence_labels": rows["label"].astype(np.int32),
  }
  if isolate:
    starts = np.unpackbits(rows["documents"], axis=1, count=t).astype(bool) & real
    out["segment_ids"] = np.where(real, np.cumsum(starts, axis=1), 0).astype(np.int32)
    first = np.maximum.accumulate(np.where(starts, positions, 0), axis=1)
    out["position_ids"] = (np.where(real, positions - first, 0) + position_offset
                           ).astype(np.int32)
  if word_starts:
    out["word_starts"] = np.unpackbits(rows["words"], axis=1, count=t).astype(bool)
  return out


class MemoryRows:
  """Rows held in memory (a small corpus built at start-up)."""

  def __init__(self, rows: np.ndarray):
    self.rows = rows
    self.dtype = rows.dtype

  def __len__(self) -> int:
    return len(self.rows)

  def read(self, index: np.ndarray) -> np.ndarray:
    """Rows at `index` [b] (int), in that order."""
    return self.rows[np.asarray(index, np.int64)]


class FileRows:
  """The rows of a split's shards, read by random access: row k of the split is row
  k - start of the shard holding it. Only the shards read from are opened (at most
  `_MAX_OPEN_FILES` at a time); pickled (into grain worker processes) without them."""

  def __init__(self, paths: Sequence[str], counts: Sequence[int], dtype: np.dtype):
    self.paths, self.dtype = list(map(str, paths)), dtype
    self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    self._files: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return int(self.starts[-1])

  def __getstate__(self):
    return {"paths": self.paths, "dtype": self.dtype, "starts": self.starts}

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._files, self._lock = collections.OrderedDict(), threading.Lock()

  def _file(self, shard: int):
    """An open handle of shard `shard`: a descriptor (local) or a file object."""
    handle = self._files.pop(shard, None)
    if handle is None:
      path = self.paths[shard]
      handle = (epath.Path(path).open("rb") if is_remote(path)
                else os.open(path, os.O_RDONLY))
      if len(self._files) >= _MAX_OPEN_FILES:
        _close(self._files.popitem(last=False)[1])
    self._files[shard] = handle
    return handle

  def read(self, index: np.ndarray) -> np.ndarray:
    """Rows at `index` [b] (int, each in [0, len)), in that order."""
    index = np.asarray(index, np.int64)
    shards = np.searchsorted(self.starts, index, side="right") - 1
    offsets = (index - self.starts[shards]) * self.dtype.itemsize
    size = self.dtype.itemsize
    chunks = []
    with self._lock:  # The read-ahead threads share the handles.
      for shard, offset in zip(shards.tolist(), offsets.tolist()):
        handle = self._file(shard)
        if isinstance(handle, int):
          chunks.append(os.pread(handle, size, offset))
        else:
          handle.seek(offset)
          chunks.append(handle.read(size))
    data = b"".join(chunks)
    if len(data) != size * len(index):
      raise OSError(f"short read from the shards of {os.path.dirname(self.paths[0])}: "
                    "a shard is shorter than its manifest says; prepare it again")
    return np.frombuffer(data, self.dtype)

  def close(self) -> None:
    with self._lock:
      while self._files:
        _close(self._files.popitem()[1])


def _close(handle) -> None:
  if isinstance(handle, int):
    os.close(handle)
  else:
    handle.close()


def write(path: str, rows: np.ndarray) -> None:
  """Writes rows to `path` atomically (a temporary file renamed into place)."""
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(rows.tobytes())
  os.replace(tmp, path)


class Concatenated:
  """Several row sources (of one row dtype) one after the other."""

  def __init__(self, parts: Sequence):
    self.parts, self.dtype = list(parts), parts[0].dtype
    self.starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])])

  def __len__(self) -> int:
    return int(self.starts[-1])

  def read(self, index: np.ndarray) -> np.ndarray:
    index = np.asarray(index, np.int64)
    part = np.searchsorted(self.starts, index, side="right") - 1
    out = np.empty(len(index), self.dtype)
    for p in np.unique(part):
      at = part == p
      out[at] = self.parts[p].read(index[at] - self.starts[p])
    return out


def concatenate(sources: Sequence):
  """One source of all `sources`' rows, in order."""
  return sources[0] if len(sources) == 1 else Concatenated(sources)
