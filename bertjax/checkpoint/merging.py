"""Merging the parameters of checkpoints of one architecture, as mergekit merges them
(arcee-ai/mergekit: `linear`, and `ties` = Yadav et al. 2023, "TIES-Merging: Resolving
Interference When Merging Models", its defaults normalize=True, lambda 1): how mmBERT's
authors made their final model from several decay-phase variants. Every leaf is merged
on its own, in float64, and cast back to its dtype.

- `average(trees, weights)`: sum_i w_i theta_i / sum_i w_i.
- `ties(base, trees, weights, density, scale)`: each model's task vector
  tau_i = theta_i - theta_base trimmed to its `density` share of largest magnitudes
  (per leaf: the int(density * size) largest |tau_i|, at least one; density 1 keeps
  all), weighted (w_i tau_i); the elected sign of each entry is that of the sum of the
  weighted vectors (0 counts as +); the merged vector the sum of the weighted entries
  whose sign is the elected one, over the sum of those entries' weights (1 where none
  agrees); theta = theta_base + scale * merged.
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from bertjax.errors import ConfigError

METHODS = ("average", "ties")


def _weights(weights: Sequence[float] | None, n: int) -> np.ndarray:
  w = np.ones(n) if not weights else np.asarray(weights, np.float64)
  if w.shape != (n,):
    raise ConfigError(f"--weights: {len(w)} weights for {n} checkpoints; give one each.")
  if (w < 0).any() or w.sum() <= 0:
    raise ConfigError(f"--weights={list(w)}: give weights of 0 or more, not all 0.")
  return w


def average(trees: Sequence[dict], weights: Sequence[float] | None = None) -> dict:
  """The weighted mean of `trees` (one structure), leaf by leaf (mergekit's linear)."""
  w = _weights(weights, len(trees))

  def leaf(*xs):
    stacked = np.stack([np.asarray(x, np.float64) for x in xs])
    return (np.tensordot(w, stacked, 1) / w.sum()).astype(np.asarray(xs[0]).dtype)

  return jax.tree.map(leaf, *trees)


def trim(delta: np.ndarray, density: float) -> np.ndarray:
  """`delta` with all but its int(density * size) largest magnitudes (at least one;
  ties in magnitude: the first in flat order) set to 0; density 1: `delta`."""
  if density >= 1:
    return delta
  flat = delta.reshape(-1)
  k = max(1, int(density * flat.size))
  keep = np.argsort(-np.abs(flat), kind="stable")[:k]
  out = np.zeros_like(flat)
  out[keep] = flat[keep]
  return out.reshape(delta.shape)


def ties(base: dict, trees: Sequence[dict], weights: Sequence[float] | None = None,
         density: float = 1.0, scale: float = 1.0) -> dict:
  """TIES-merging of `trees` onto `base` (module docstring)."""
  if not 0 < density <= 1:
    raise ConfigError(f"--density={density}: the share of each task vector kept, in (0, 1].")
  w = _weights(weights, len(trees))

  def leaf(b, *xs):
    b64 = np.asarray(b, np.float64)
    deltas = np.stack([trim(np.asarray(x, np.float64) - b64, density) for x in xs])
    weighted = deltas * w.reshape(-1, *[1] * b64.ndim)
    elected = np.where(weighted.sum(0) >= 0, 1.0, -1.0)
    agree = np.sign(weighted) == elected
    divisor = (w.reshape(-1, *[1] * b64.ndim) * agree).sum(0)
    merged = (weighted * agree).sum(0) / np.where(divisor == 0, 1.0, divisor)
    return (b64 + scale * merged).astype(np.asarray(b).dtype)

  return jax.tree.map(leaf, base, *trees)
