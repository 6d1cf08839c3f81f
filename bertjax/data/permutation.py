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

import functools

import numpy as np

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xD6E8FEB86659FD93), np.uint64(0xBF58476D1CE4E5B9)
_ROUNDS = 4


def _mix(x: np.ndarray) -> np.ndarray:
  """SplitMix64's output function (a bijection of uint64 that mixes every bit)."""
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


_MASK64 = (1 << 64) - 1


@functools.lru_cache(maxsize=256)
def _keys(seed: int, epoch: int) -> tuple[int, ...]:
  """The round keys of the permutation of (seed, epoch)."""
  with np.errstate(over="ignore"):
    base = _mix(np.array([seed], np.uint64) * _GAMMA + np.uint64(epoch))
    return tuple(int(k) for k in _mix(base + _GAMMA * np.arange(1, _ROUNDS + 1,
                                                                dtype=np.uint64)))


def _halves(n: int) -> tuple[int, int]:
  """Widths of the left and right halves of the bits covering [0, n)."""
  if n < 1:
    raise ValueError(f"cannot permute an empty range (n={n})")
  bits = max(2, int(n - 1).bit_length())
  return bits - bits // 2, bits // 2


def _round(right, key, bits: int):
  """The Feistel round function: `bits` bits mixed from `right` and the round key
  (numpy uint64 arrays, or Python ints: the same numbers)."""
  if isinstance(right, int):
    f = ((right ^ key) * int(_M1)) & _MASK64
    return (((f ^ (f >> 32)) * int(_M2)) & _MASK64) >> (64 - bits)
  f = (right ^ key) * _M1
  return ((f ^ (f >> np.uint64(32))) * _M2) >> np.uint64(64 - bits)


def _network(v, halves: tuple[int, int], keys, inverse: bool):
  """One pass of the unbalanced Feistel network over [0, 2**bits) (or its inverse),
  on a uint64 array or a Python int."""
  typed = int if isinstance(v, int) else np.uint64
  left_bits, right_bits = halves  # (an even number of rounds restores the widths)
  left, right = v >> typed(right_bits), v & typed((1 << right_bits) - 1)
  if not inverse:
    for k in keys:  # a round: (L, R) -> (R, L ^ F(R)), the widths swap
      left, right = right, left ^ _round(right, k, left_bits)
      left_bits, right_bits = right_bits, left_bits
  else:
    for k in keys[::-1]:  # (R, L ^ F(R)) -> (L, R)
      left, right = right ^ _round(left, k, right_bits), left
      left_bits, right_bits = right_bits, left_bits
  return (left << typed(right_bits)) | right


def _walk(index: np.ndarray, n: int, seed: int, epoch: int, inverse: bool) -> np.ndarray:
  """The permutation of [0, n) of (seed, epoch), or its inverse, at `index`."""
  halves = _halves(n)
  keys = np.array(_keys(seed, epoch), np.uint64)
  with np.errstate(over="ignore"):
    x = _network(np.asarray(index, np.uint64), halves, keys, inverse)
    outside = x >= np.uint64(n)
    while outside.any():  # cycle walking (backwards for the inverse)
      x = np.where(outside, _network(x, halves, keys, inverse), x)
      outside = x >= np.uint64(n)
  return x.astype(np.int64)


def permute(index: np.ndarray, n: int, seed: int, epoch: int = 0) -> np.ndarray:
  """[m] int64: the images of `index` [m] (each in [0, n)) under the permutation of
  [0, n) drawn from (seed, epoch). Distinct epochs give unrelated orders."""
  return _walk(index, n, seed, epoch, inverse=False)


def unpermute(value: np.ndarray, n: int, seed: int, epoch: int = 0) -> np.ndarray:
  """[m] int64: the inverse of `permute`: unpermute(permute(i)) == i."""
  return _walk(value, n, seed, epoch, inverse=True)


def unpermute_one(value: int, n: int, seed: int, epoch: int = 0) -> int:
  """`unpermute` of one value, in plain Python (a few microseconds, where numpy's
  per-call cost would dominate)."""
  halves, keys = _halves(n), _keys(seed, epoch)
  x = _network(int(value), halves, keys, inverse=True)
  while x >= n:
    x = _network(x, halves, keys, inverse=True)
  return x


def num_held_out(n: int, fraction: float) -> int:
  """How many of n documents are held out: round(fraction * n), at least 2."""
  return max(2, int(round(fraction * n)))


def held_out(index: np.ndarray, n: int, fraction: float, seed: int) -> np.ndarray:
  """[m] bool: which documents `index` [m] of a corpus of n are held out for
  evaluation: those whose image under the permutation of (seed) is below
  `num_held_out(n, fraction)`. Any shard can tell its own documents' split alone, and
  the k-th held-out (training) document is unpermute(k) (unpermute(E + k))."""
  return permute(index, n, seed) < num_held_out(n, fraction)
