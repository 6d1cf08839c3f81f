"""Held-out evaluation batches: per source of the corpus, at each length phase's shape.

A run holds out documents of every source (`config.data.eval_fraction`); their rows are
built at every length of the length phases. `HeldOut` is one length phase's
evaluation: its length, its constant model inputs (ModernBERT's `global_rope_theta`)
and, per source, the `EvalBatches` of that source's held-out rows. An evaluation during
length phase k runs `held_out[k]` (the shape and theta the model trains on then), and
where asked `held_out[-1]` too (the final ones).

Masks: held-out row r of source i is row first_i + r of all sources' rows one after
the other (first_i: the rows of the sources before it) and is masked from (seed,
first_i + r); so the sources' batches together are masked as the concatenation is
(`HeldOut.all`), and a metric summed over the sources is the whole set's.
"""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any

import numpy as np

from bertjax.data import masking, rows as rows_lib


class EvalBatches(collections.abc.Sequence):
  """This process's share of some held-out rows as fixed masked batches.

  Every process has ceil(N / (b * process_count)) batches: global batch i holds
  rows [i * B, (i + 1) * B) (B = b * process_count) and process p its block
  [i * B + p * b, i * B + (p + 1) * b); past the last row the rows are copies of
  row 0 whose masked_lm_weights and example_weights are 0. Batch i is read and masked
  when asked for; row r's mask depends only on the seed and first_index + r, so the
  global batches are the same whatever the process count. `inputs` (name, value) add
  a [b] float32 column each. Slicing gives the sequence of those batches.
  """

  def __init__(self, source, cfg: masking.MaskingConfig, *, batch_size: int, seed: int,
               nsp: bool, isolate: bool, position_offset: int, process_index: int = 0,
               process_count: int = 1, inputs: tuple[tuple[str, float], ...] = (),
               first_index: int = 0, batches: range | None = None):
    self._source, self._cfg, self._b, self._seed = source, cfg, batch_size, seed
    self._nsp, self._isolate, self._offset = nsp, isolate, position_offset
    self._p, self._count = process_index, process_count
    self._inputs, self._first = inputs, first_index
    self._batches = batches if batches is not None else range(
        -(-len(source) // (batch_size * process_count)))

  def __len__(self) -> int:
    return len(self._batches)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return EvalBatches(self._source, self._cfg, batch_size=self._b, seed=self._seed,
                         nsp=self._nsp, isolate=self._isolate,
                         position_offset=self._offset, process_index=self._p,
                         process_count=self._count, inputs=self._inputs,
                         first_index=self._first, batches=self._batches[i])
    index = (self._batches[i] * self._count + self._p) * self._b + np.arange(self._b)
    real = index < len(self._source)
    index = np.where(real, index, 0)
    out = rows_lib.decode(self._source.read(index), isolate=self._isolate,
                          position_offset=self._offset,
                          word_starts=self._cfg.strategy != "token")
    out.update(masking.mask_tokens(out["input_ids"],
                                   masking.RowStreams(self._seed, self._first + index),
                                   self._cfg, word_starts=out.pop("word_starts", None)))
    out["masked_lm_weights"] = out["masked_lm_weights"] * real[:, None]
    out["example_weights"] = real.astype(np.float32)
    out.update({name: np.full(self._b, value, np.float32) for name, value in self._inputs})
    if not self._nsp:
      del out["next_sentence_labels"]
    return out


@dataclasses.dataclass(frozen=True)
class HeldOut:
  """The held-out evaluation of length phase `phase` (its steps from `first_step` on):
  each source's held-out `rows` of `length` tokens (by name, in the sources' order; ''
  for a single corpus), masked with `cfg`, with the constant model `inputs`;
  `settings` are EvalBatches' batch_size, seed, nsp, isolate, position_offset,
  process_index and process_count."""

  phase: int
  first_step: int
  length: int
  inputs: tuple[tuple[str, float], ...]
  rows: dict[str, Any]
  cfg: masking.MaskingConfig
  settings: dict[str, Any]

  @property
  def sources(self) -> dict[str, EvalBatches]:
    """Each source's batches."""
    out, first = {}, 0
    for name, rows in self.rows.items():
      out[name] = EvalBatches(rows, self.cfg, inputs=self.inputs, first_index=first,
                              **self.settings)
      first += len(rows)
    return out

  def all(self) -> EvalBatches:
    """The batches of every source's rows one after the other (masked as the sources'
    own batches mask them)."""
    return EvalBatches(rows_lib.concatenate(list(self.rows.values())), self.cfg,
                       inputs=self.inputs, **self.settings)

  def __len__(self) -> int:
    """Held-out rows of all sources."""
    return sum(len(r) for r in self.rows.values())

  def describe(self) -> dict[str, float]:
    """{'seq_length': length, **inputs}: the shape and inputs the evaluation runs at."""
    return {"seq_length": float(self.length), **dict(self.inputs)}


def phase_of(held_out: list[HeldOut], step: int) -> HeldOut:
  """The held-out evaluation of the length phase that trained step `step` (1-based: the
  step just taken)."""
  return [h for h in held_out if h.first_step <= max(step - 1, 0)][-1]
