"""How fine-tuning batches are cut from a task's features (`config.task.batching`).

Features are built once, every row padded to `max_seq_length` T; a batch is cut from
them on the host:

- 'max': every row at T (one shape).
- 'bucket' (default): the batch's token arrays cut to its longest row rounded up to
  the next of `bucket_lengths` (default: powers of two from 16, then T): at most a
  handful of shapes, each compiled once, and short texts cost what they hold, as
  Hugging Face's padding to the longest row of a batch. Evaluation is cut the same way.
- 'pack' (classification and tagging): the batch's examples placed several to a row of
  T tokens (first fit, in batch order), each with its own [CLS], positions restarting
  and `segment_ids` keeping attention inside each example (the encoder's packed-row
  mask, as in pretraining). The row count is rounded up to a power of two (few
  shapes; evaluation pads every batch to the most rows any needs: one shape);
  classification reads each example's pooled [CLS] from `cls_positions`. Maps back to
  the batch's rows come along (`slot_rows`; `token_rows`, `token_cols`), and
  `unpack` puts a packed batch's outputs back in batch order.

A batch depends only on the features and the rows chosen, so a training stream of
such batches stays a pure function of (seed, step) and resumes exactly.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from bertjax.errors import ConfigError

BATCHING = ("max", "bucket", "pack")


def bucket_lengths(configured: Sequence[int], max_seq_length: int) -> tuple[int, ...]:
  """The bucket lengths, ascending, the last `max_seq_length`: `configured` (those up
  to it), else powers of two from 16 below it."""
  if configured:
    bad = [x for x in configured if int(x) < 1]
    if bad:
      raise ConfigError(f"config.task.bucket_lengths has {bad[0]}; use positive lengths.")
    lengths = {int(x) for x in configured if int(x) < max_seq_length}
  else:
    lengths = {2 ** k for k in range(4, max(4, math.ceil(math.log2(max_seq_length))))}
    lengths = {x for x in lengths if x < max_seq_length}
  return tuple(sorted(lengths | {max_seq_length}))


def row_lengths(arrays: dict[str, np.ndarray]) -> np.ndarray:
  """[N] real tokens of each feature (the longest choice of a [N, C, T] feature)."""
  mask = arrays["attention_mask"]
  lengths = mask.sum(-1)
  return lengths.reshape(len(mask), -1).max(-1)


def rows(arrays: dict[str, np.ndarray], idx: np.ndarray, valid: np.ndarray
         ) -> dict[str, np.ndarray]:
  """The feature rows `idx` at full length; rows where `valid` is False weigh 0."""
  batch = {k: v[idx] for k, v in arrays.items()}
  batch["example_weights"] = valid.astype(np.float32)
  return batch


def cut(batch: dict[str, np.ndarray], length: int, token_arrays: Sequence[str]
        ) -> dict[str, np.ndarray]:
  """`batch` with the last axis of its `token_arrays` cut to `length`."""
  return {k: v[..., :length] if k in token_arrays else v for k, v in batch.items()}


def bucketed(batch: dict[str, np.ndarray], lengths: np.ndarray, buckets: Sequence[int],
             token_arrays: Sequence[str]) -> dict[str, np.ndarray]:
  """`batch` cut to the bucket of its longest row (`lengths`: its rows' real lengths;
  every process of a job must pass the lengths of the whole global batch)."""
  longest = int(lengths.max()) if len(lengths) else 1
  return cut(batch, buckets[int(np.searchsorted(buckets, longest))], token_arrays)


def _pow2(n: int) -> int:
  return 1 << max(0, n - 1).bit_length()


def _first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
  """Positions of `lengths` grouped into rows of at most `capacity` tokens, each
  placed in the first row with room (rows in order of opening)."""
  rows, room = [], []
  for i, n in enumerate(lengths):
    for r, free in enumerate(room):
      if n <= free:
        rows[r].append(i)
        room[r] -= n
        break
    else:
      rows.append([i])
      room.append(capacity - n)
  return rows


def packed_row_count(lengths: Sequence[int], T: int) -> int:
  """The rows a packed batch of examples of `lengths` takes on one device: first fit
  into rows of T tokens, rounded up to a power of two (`packed`)."""
  return _pow2(len(_first_fit([int(n) for n in lengths], T)))


def _layouts(valid: np.ndarray, lengths: np.ndarray, groups: int, T: int
             ) -> list[list[list[int]]]:
  """Per data-parallel group of the batch, its rows: the batch positions of the
  examples first-fit into each row of T tokens (`valid` False: left out)."""
  per_group = len(valid) // groups
  layouts = []
  for g in range(groups):
    members = [i for i in range(g * per_group, (g + 1) * per_group) if valid[i]]
    layouts.append([[members[j] for j in row]
                    for row in _first_fit([int(lengths[i]) for i in members], T)])
  return layouts


def packed(arrays: dict[str, np.ndarray], idx: np.ndarray, valid: np.ndarray,
           lengths: np.ndarray, groups: int, mine: slice, mode: str,
           token_arrays: Sequence[str], position_offset: int, pad_id: int,
           row_multiple: int = 1, min_rows: int = 0) -> dict[str, np.ndarray]:
  """The packed batch of the global batch's feature rows `idx` [B] (`valid`: False
  for rows that only fill the last batch, which are left out).

  The batch is split into `groups` equal parts (one per data-parallel device), each
  packed into its own R rows (R the same for all: the most any group needs, rounded
  up to a power of two, then to a multiple of `row_multiple`: the micro-batches of
  gradient accumulation split rows; at least `min_rows`), so that a device's examples
  sit in its own rows. `mine`: this process's groups. Token arrays ([R*groups, T]
  over `mine`'s groups) with `segment_ids` (1 + the example's slot in its row, 0 on
  padding) and `position_ids` (restarting at `position_offset` for each example).
  mode 'tokens' (tagging): every other array is per row; `example_weights` [rows];
  `token_rows` / `token_cols` [rows, T]: each token's example (its position in the
  batch, -1 on padding) and its position in the example's own row. mode 'cls'
  (classification): each row has K slots (K = B / groups, as many as a row could
  hold); `cls_positions` [rows, K] (each example's first token), the feature's other
  arrays [rows, K] per slot, `example_weights` [rows, K] (0 on empty slots) and
  `slot_rows` [rows, K] (each slot's example's position in the batch, -1 if empty).
  """
  T = arrays["input_ids"].shape[-1]
  per_group = len(idx) // groups
  layouts = _layouts(valid, lengths, groups, T)
  R = -(-_pow2(max(min_rows, *(len(rows) for rows in layouts))) // row_multiple
       ) * row_multiple
  K = per_group  # Slots per row: as many as a row could hold, one shape fewer to compile.
  rows = [row for rows in layouts[mine] for row in (rows + [[]] * (R - len(rows)))]
  out = {k: np.full((len(rows), T), pad_id if k == "input_ids" else
                    (-1 if k == "labels" else 0), arrays[k].dtype) for k in token_arrays}
  out["segment_ids"] = np.zeros((len(rows), T), np.int32)
  out["position_ids"] = np.full((len(rows), T), position_offset, np.int32)
  others = [k for k in arrays if k not in token_arrays]
  if mode == "cls":
    out["cls_positions"] = np.zeros((len(rows), K), np.int32)
    out.update({k: np.zeros((len(rows), K, *arrays[k].shape[1:]), arrays[k].dtype)
                for k in others})
    out["example_weights"] = np.zeros((len(rows), K), np.float32)
    out["slot_rows"] = np.full((len(rows), K), -1, np.int32)
  elif others:
    raise ValueError(f"packing mode 'tokens' cannot place per-example arrays {others}")
  else:
    out["example_weights"] = np.array([bool(row) for row in rows], np.float32)
    out["token_rows"] = np.full((len(rows), T), -1, np.int32)
    out["token_cols"] = np.zeros((len(rows), T), np.int32)
  for r, row in enumerate(rows):
    at = 0
    for slot, i in enumerate(row):
      n, f = int(lengths[i]), int(idx[i])
      for k in token_arrays:
        out[k][r, at:at + n] = arrays[k][f, :n]
      out["segment_ids"][r, at:at + n] = slot + 1
      out["position_ids"][r, at:at + n] = np.arange(n) + position_offset
      if mode == "cls":
        out["cls_positions"][r, slot] = at
        out["example_weights"][r, slot] = 1.0
        out["slot_rows"][r, slot] = i
        for k in others:
          out[k][r, slot] = arrays[k][f]
      else:
        out["token_rows"][r, at:at + n] = i
        out["token_cols"][r, at:at + n] = np.arange(n)
      at += n
  return out


@dataclasses.dataclass
class Batcher:
  """Cuts the batches of one set of features (arrays [N, ..., T]) as `mode` says.

  `token_arrays`: the arrays whose last axis is the token axis; `packing`: the task's
  packing mode ('' cannot pack, 'cls', 'tokens'); `groups`: the data-parallel size
  (a packed batch keeps each device's examples in its own rows); `row_multiple`:
  packed rows per device come in multiples of it (gradient accumulation steps)."""

  arrays: dict[str, np.ndarray]
  mode: str
  buckets: tuple[int, ...]
  token_arrays: tuple[str, ...]
  packing: str = ""
  groups: int = 1
  position_offset: int = 0
  pad_id: int = 0
  row_multiple: int = 1

  def __post_init__(self):
    self.lengths = row_lengths(self.arrays)

  def packed_rows(self, idx: np.ndarray, valid: np.ndarray) -> int:
    """The rows per data-parallel group that the packed global batch of feature rows
    `idx` needs before rounding (`batch`'s `min_rows` for the same shape as another's),
    from the lengths alone."""
    T = self.arrays["input_ids"].shape[-1]
    return max(len(rows) for rows in _layouts(valid, self.lengths[idx], self.groups, T))

  def batch(self, idx: np.ndarray, valid: np.ndarray, mine: slice, min_rows: int = 0
            ) -> dict[str, np.ndarray]:
    """This process's part (`mine`: its rows of the global batch, as a slice of
    `idx`) of the global batch of feature rows `idx` [B] (`valid` as in `rows`);
    packed, at least `min_rows` rows per data-parallel group."""
    if self.mode == "pack":
      B, G = len(idx), self.groups
      groups = slice(mine.start * G // B, mine.stop * G // B)
      return packed(self.arrays, idx, valid, self.lengths[idx], self.groups, groups,
                    self.packing, self.token_arrays, self.position_offset, self.pad_id,
                    self.row_multiple, min_rows)
    batch = rows(self.arrays, idx[mine], valid[mine])
    if self.mode == "max":
      return batch
    return bucketed(batch, self.lengths[idx][valid], self.buckets, self.token_arrays)


# The maps of a packed batch back to its rows (`packed`).
PACKING_MAPS = ("slot_rows", "token_rows", "token_cols")


def unpack(outputs: dict[str, np.ndarray], maps: dict[str, np.ndarray], size: int,
           length: int, fill: dict[str, float]) -> dict[str, np.ndarray]:
  """The outputs of a packed batch ([rows, K, ...] per slot, or [rows, T, ...] per
  token for the keys of `fill`) in the order of its `size` batch rows ([size, ...];
  per token [size, length, ...], `fill` where no token is): `maps` holds the batch's
  `slot_rows` or `token_rows` and `token_cols`. Rows of no example stay 0 / `fill`."""
  out = {}
  for k, v in outputs.items():
    if "slot_rows" in maps:
      where = maps["slot_rows"] >= 0
      out[k] = np.zeros((size, *v.shape[2:]), v.dtype)
      out[k][maps["slot_rows"][where]] = v[where]
    elif k in fill:
      where = maps["token_rows"] >= 0
      out[k] = np.full((size, length, *v.shape[2:]), fill[k], v.dtype)
      out[k][maps["token_rows"][where], maps["token_cols"][where]] = v[where]
    else:
      raise ValueError(f"a packed batch's output {k!r} is neither per slot nor per token")
  return out
