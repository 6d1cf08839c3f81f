"""The file formats corpora are published in, read through their libraries, streamed.

`kind(path)` names a file's format from its name; `texts(path, kind, field)` yields its
documents' text, one string a record, never holding more than one record batch:
* 'parquet' (FineWeb, FineWeb-Edu, DCLM): pyarrow's `ParquetFile.iter_batches` over
  the one column `field`, a row group at a time;
* 'arrow' (Arrow IPC, the stream format Hugging Face `datasets` writes, or the file
  format): pyarrow's IPC reader, a record batch at a time;
* 'hf' (a directory `Dataset.save_to_disk` wrote: `state.json` listing its
  `data-*.arrow` files; a `DatasetDict`'s `dataset_dict.json`: its `train` split): the
  files in the order `state.json` gives, as 'arrow'. `datasets` is not needed.
* 'jsonl' and 'text' are read as lines by `sources`; `open_binary` gives their bytes,
  decompressed on the fly for `.gz` (gzip) and `.zst` (zstandard: Dolma's
  `.json.zst` / `.jsonl.zst`).
Every path may be local or remote (gs://, through etils.epath). Bad input raises a
one-line `DataError`: a file that is not of its format, a missing or non-text column
(naming the columns it has), a corrupt or truncated `.zst`.
"""

from __future__ import annotations

import gzip
import io
import json
from typing import IO, Iterator

from etils import epath

from bertjax.errors import DataError

HF_STATE = "state.json"  # Dataset.save_to_disk: its data files, in order
HF_DICT = "dataset_dict.json"  # DatasetDict.save_to_disk: its splits
HF_SPLIT = "train"  # the split read from a DatasetDict directory
COMPRESSIONS = (".gz", ".zst")
_BATCH_ROWS = 1024  # Parquet rows decoded at once (a row group is read whole)
_CHUNK = 1 << 16


def is_remote(path: str) -> bool:
  """Whether `path` is read through etils.epath (gs://...) rather than the OS."""
  return "://" in path


def base_name(path: str) -> str:
  """The file name without its compression suffix ('a.jsonl.zst' -> 'a.jsonl')."""
  name = path.rstrip("/").rsplit("/", 1)[-1]
  for suffix in COMPRESSIONS:
    if name.endswith(suffix):
      return name[:-len(suffix)]
  return name


def is_hf_dataset(path: str) -> bool:
  """Whether `path` is a directory written by `datasets`' save_to_disk."""
  root = epath.Path(path)
  return root.is_dir() and ((root / HF_STATE).exists() or (root / HF_DICT).exists())


def kind(path: str) -> str:
  """'hf', 'parquet', 'arrow', 'jsonl' or 'text' (anything else)."""
  name = base_name(path)
  if name.endswith(".parquet"):
    return "parquet"
  if name.endswith(".arrow"):
    return "arrow"
  if name.endswith((".jsonl", ".json")):
    return "jsonl"
  return "hf" if is_hf_dataset(path) else "text"


def open_raw(path: str) -> IO[bytes]:
  """The file's bytes as stored (local or remote)."""
  try:
    return epath.Path(path).open("rb") if is_remote(path) else open(path, "rb")
  except OSError as e:
    raise DataError(f"cannot read corpus file {path!r} ({e}): check the path and its "
                    "permissions") from None


def open_binary(path: str) -> IO[bytes]:
  """The file's bytes, decompressed on the fly for .gz and .zst."""
  raw = open_raw(path)
  if path.endswith(".gz"):
    return gzip.GzipFile(fileobj=raw, mode="rb")
  if path.endswith(".zst"):
    return io.BufferedReader(_ZstdFrames(raw, path), _CHUNK)
  return raw


class _ZstdFrames(io.RawIOBase):
  """The decompressed bytes of every frame of a .zst file (zstandard's decompressobj,
  a frame after the other). zstandard's `stream_reader` ends quietly where the input
  ends, inside a frame or not; this raises a DataError for a truncated or corrupt
  frame instead."""

  def __init__(self, raw: IO[bytes], path: str):
    import zstandard  # pylint: disable=g-import-not-at-top
    super().__init__()
    self._raw, self._path, self._zstd = raw, path, zstandard
    self._frame = zstandard.ZstdDecompressor().decompressobj()
    self._pending, self._offset, self._input, self._started = b"", 0, b"", False

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    while self._offset == len(self._pending):
      data = self._input or self._raw.read(_CHUNK)
      self._input = b""
      if not data:
        if self._started and not self._frame.eof:
          raise DataError(f"corpus file {self._path!r} is truncated (its last zstd frame "
                          "ends early): fix or remove it")
        return 0
      if self._frame.eof:  # the next frame of a multi-frame file
        self._frame = self._zstd.ZstdDecompressor().decompressobj()
      self._started = True
      try:
        self._pending, self._offset = self._frame.decompress(data), 0
      except self._zstd.ZstdError as e:
        raise DataError(f"corpus file {self._path!r} is not valid zstd data ({e}): fix "
                        "or remove it") from None
      if self._frame.eof:
        self._input = self._frame.unused_data
    n = min(len(buffer), len(self._pending) - self._offset)
    buffer[:n] = memoryview(self._pending)[self._offset:self._offset + n]
    self._offset += n
    return n

  def close(self) -> None:
    self._raw.close()
    super().close()


def _check_column(schema, field: str, path: str, what: str) -> None:
  """DataError unless `schema` has a string column `field`."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  if field not in schema.names:
    raise DataError(f"{what} {path!r} has no column {field!r} (its columns: "
                    f"{', '.join(schema.names) or 'none'}): set config.data.text_field "
                    "(prepare: --text_field) to the text's column")
  kind_ = schema.field(field).type
  if not (pa.types.is_string(kind_) or pa.types.is_large_string(kind_)
          or pa.types.is_string_view(kind_)):
    raise DataError(f"{what} {path!r} column {field!r} holds {kind_}, not text: set "
                    "config.data.text_field to a string column")


def _strings(batch) -> Iterator[str]:
  """The non-empty strings of a one-column record batch."""
  for text in batch.column(0).to_pylist():
    if text:
      yield text


def parquet_texts(path: str, field: str) -> Iterator[str]:
  """The strings of column `field`, a row group at a time: one `iter_batches` call per
  row group, since a single call over the file keeps every row group it pre-buffered
  until it ends (pyarrow 26: 169 MiB held at the end of a 173 MB file, 6 MiB this
  way)."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  with (open_raw(path) if is_remote(path) else pa.OSFile(path)) as f:
    try:
      parquet = pq.ParquetFile(f)
      _check_column(parquet.schema_arrow, field, path, "Parquet file")
      for group in range(parquet.num_row_groups):
        for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, row_groups=[group],
                                          columns=[field]):
          yield from _strings(batch)
    except (pa.ArrowException, OSError) as e:
      raise _unreadable(path, "Parquet", e) from None


def arrow_texts(path: str, field: str) -> Iterator[str]:
  """The strings of column `field` of an Arrow IPC file (stream or file format), a
  record batch at a time."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  with (open_raw(path) if is_remote(path) else pa.OSFile(path)) as f:
    try:
      file_format = f.read(6) == b"ARROW1"
      f.seek(0)
      reader = pa.ipc.open_file(f) if file_format else pa.ipc.open_stream(f)
      _check_column(reader.schema, field, path, "Arrow file")
      batches = ((reader.get_batch(i) for i in range(reader.num_record_batches))
                 if file_format else reader)
      for batch in batches:
        yield from _strings(batch.select([field]))
    except (pa.ArrowException, OSError) as e:
      raise _unreadable(path, "Arrow IPC", e) from None


def hf_files(directory: str) -> list[str]:
  """The Arrow files of a `save_to_disk` directory, in order (a DatasetDict's train
  split)."""
  root = epath.Path(directory)
  if (root / HF_DICT).exists():
    splits = json.loads((root / HF_DICT).read_text()).get("splits", [])
    if HF_SPLIT not in splits:
      raise DataError(f"{directory!r} is a datasets DatasetDict without a "
                      f"{HF_SPLIT!r} split (it has {', '.join(splits)}): give one split's "
                      f"directory, e.g. {directory.rstrip('/')}/{splits[0] if splits else 'SPLIT'}")
    root = root / HF_SPLIT
  try:
    state = json.loads((root / HF_STATE).read_text())
    names = [f["filename"] for f in state["_data_files"]]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DataError(f"{str(root)!r} has no readable datasets {HF_STATE} ({_first_line(e)}): "
                    "save the dataset again with Dataset.save_to_disk") from None
  return [str(root / name) for name in names]


def texts(path: str, kind_: str, field: str) -> Iterator[str]:
  """The documents' text of a 'parquet', 'arrow' or 'hf' path, in order."""
  if kind_ == "parquet":
    yield from parquet_texts(path, field)
  elif kind_ == "arrow":
    yield from arrow_texts(path, field)
  else:
    for file in hf_files(path):
      yield from arrow_texts(file, field)


def text_bytes(path: str, kind_: str, field: str) -> int | None:
  """About how many bytes of text a file holds, told from its metadata: a Parquet
  column's uncompressed size, an Arrow file's size (a `datasets` directory's files),
  a .gz's trailer, a .zst frame header's content size; None where the file does not
  record it (a .zst written as a stream)."""
  if kind_ == "parquet":
    import pyarrow as pa  # pylint: disable=g-import-not-at-top
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    with open_raw(path) as f:
      try:
        parquet = pq.ParquetFile(f)
      except (pa.ArrowException, OSError) as e:
        raise _unreadable(path, "Parquet", e) from None
      _check_column(parquet.schema_arrow, field, path, "Parquet file")
      meta = parquet.metadata
      j = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == field)
      return sum(meta.row_group(g).column(j).total_uncompressed_size
                 for g in range(meta.num_row_groups))
  if kind_ == "hf":
    return sum(_size(f) for f in hf_files(path))
  size = _size(path)
  if path.endswith(".gz"):
    with open_raw(path) as f:  # ISIZE: the uncompressed size modulo 2**32
      f.seek(-4, io.SEEK_END)
      return max(int.from_bytes(f.read(4), "little"), size)
  if path.endswith(".zst"):
    import zstandard  # pylint: disable=g-import-not-at-top
    with open_raw(path) as f:
      header = f.read(18)  # a frame header is at most 18 bytes
    try:
      content = zstandard.get_frame_parameters(header).content_size
    except zstandard.ZstdError:
      return size  # not zstd: reading it says so
    return None if content == zstandard.CONTENTSIZE_UNKNOWN else max(content, size)
  return size


def _size(path: str) -> int:
  return epath.Path(path).stat().length


def _unreadable(path: str, what: str, e: BaseException) -> DataError:
  return DataError(f"{path!r} is not a readable {what} file ({_first_line(e)}): fix or "
                   "remove it")


def _first_line(e: BaseException) -> str:
  return (str(e).splitlines() or [type(e).__name__])[0][:200]
