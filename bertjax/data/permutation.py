"""Pseudo-random permutations of [0, n) evaluated index by index, holding no table.

A training epoch over billions of examples cannot afford a stored permutation (4-8
bytes an example on every host, seconds to draw at every epoch), and a held-out split
of millions of documents should not need one either. `permute(i, n, seed, epoch)` is a
bijection of [0, n) computed for any batch of indices at once: a 4-round Feistel
network keyed by (seed, epoch) on the bits covering n (halves of unequal width when
their count is odd), with cycle walking (an output >= n goes through the network again
until it lands in range; the domain is under 2n, so that is rare). The round keys come
from SplitMix64 (as `masking.RowStreams`), the round function is a multiply-xorshift.
"""

from __future__ import annotations

import numpy as np

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xD6E8FEB86659FD93), np.uint64(0xBF58476D1CE4E5B9)
_ROUNDS = 4


def _mix(x: np.ndarray) -> np.ndarray:
  """SplitMix64's output function (a bijection of uint64 that mixes every bit)."""
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def permute(index: np.ndarray, n: int, seed: int, epoch: int = 0) -> np.ndarray:
  """[m] int64: the images of `index` [m] (each in [0, n)) under the permutation of
  [0, n) drawn from (seed, epoch). Distinct epochs give unrelated orders."""
  if n < 1:
    raise ValueError(f"cannot permute an empty range (n={n})")
  bits = max(2, int(n - 1).bit_length())
  halves = (bits - bits // 2, bits // 2)  # widths of the left and right halves
  with np.errstate(over="ignore"):
    base = _mix(np.array([seed], np.uint64) * _GAMMA + np.uint64(epoch))
    keys = _mix(base + _GAMMA * np.arange(1, _ROUNDS + 1, dtype=np.uint64))

    def network(v: np.ndarray) -> np.ndarray:
      left_bits, right_bits = halves
      left, right = v >> np.uint64(right_bits), v & np.uint64((1 << right_bits) - 1)
      for k in keys:  # an unbalanced Feistel round: the halves swap widths
        f = (right ^ k) * _M1
        f = ((f ^ (f >> np.uint64(32))) * _M2) >> np.uint64(64 - left_bits)
        left, right = right, left ^ f
        left_bits, right_bits = right_bits, left_bits
      return (left << np.uint64(right_bits)) | right

    x = network(np.asarray(index, np.uint64))
    outside = x >= np.uint64(n)
    while outside.any():  # cycle walking
      x = np.where(outside, network(x), x)
      outside = x >= np.uint64(n)
  return x.astype(np.int64)


def num_held_out(n: int, fraction: float) -> int:
  """How many of n documents are held out: round(fraction * n), at least 2."""
  return max(2, int(round(fraction * n)))


def held_out(index: np.ndarray, n: int, fraction: float, seed: int) -> np.ndarray:
  """[m] bool: which documents `index` [m] of a corpus of n are held out for
  evaluation. Exactly `num_held_out(n, fraction)` of the n are, chosen by the
  permutation of (seed): any shard can tell its own documents' split alone."""
  return permute(index, n, seed) < num_held_out(n, fraction)
