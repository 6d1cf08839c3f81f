"""Geometry of contextual vectors: standardisation, anisotropy, rogue dimensions.

Contextual spaces are anisotropic: random tokens have a large expected cosine
(Ethayarajh 2019) because a few "rogue" dimensions with huge means and variances
dominate the dot product (Timkey & van Schijndel 2021). z-scoring each dimension with
a mean and standard deviation taken over a corpus removes most of it.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from bertjax.errors import DataError

_EPS = 1e-8


@dataclasses.dataclass(frozen=True)
class Standardizer:
  """Per-dimension z-scoring: (x - mean) / std, with mean and std [D] from a corpus."""

  mean: np.ndarray
  std: np.ndarray

  @classmethod
  def fit(cls, vectors: np.ndarray) -> "Standardizer":
    """From corpus vectors [N, D] (N >= 2; NaN rows are ignored)."""
    vectors = _finite_rows(vectors)
    if len(vectors) < 2:
      raise DataError(f"standardisation needs at least 2 vectors; got {len(vectors)}.")
    return cls(vectors.mean(0), vectors.std(0))

  def __call__(self, vectors: np.ndarray) -> np.ndarray:
    """[..., D] -> [..., D] standardised (float32)."""
    if vectors.shape[-1] != self.mean.shape[0]:
      raise DataError(f"vectors of size {vectors.shape[-1]} cannot use statistics of size "
                      f"{self.mean.shape[0]}; extract them with the same model and layers.")
    return ((vectors - self.mean) / np.maximum(self.std, _EPS)).astype(np.float32)

  def save(self, path: str) -> None:
    np.savez(path, mean=self.mean, std=self.std)

  @classmethod
  def load(cls, path: str) -> "Standardizer":
    if not os.path.isfile(path):
      raise DataError(f"statistics file {path} does not exist; write it with "
                      "`python -m bertjax.embed stats`.")
    with np.load(path) as f:
      if "mean" not in f or "std" not in f:
        raise DataError(f"{path} holds no mean/std; write it with `bertjax.embed stats`.")
      return cls(f["mean"], f["std"])


def _finite_rows(vectors: np.ndarray) -> np.ndarray:
  vectors = np.asarray(vectors, np.float64)
  if vectors.ndim != 2:
    raise DataError(f"expected vectors [N, D]; got shape {vectors.shape}.")
  return vectors[np.isfinite(vectors).all(1)]


def unit(vectors: np.ndarray) -> np.ndarray:
  """[..., D] rows scaled to unit length."""
  return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), _EPS)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Cosine of matching rows of a and b ([..., D] -> [...])."""
  return (unit(a) * unit(b)).sum(-1)


def _pair_products(vectors: np.ndarray, num_pairs: int, seed: int) -> np.ndarray:
  """[P, D]: per-dimension products u_d v_d of unit vectors for random pairs i != j."""
  vectors = unit(_finite_rows(vectors))
  n = len(vectors)
  if n < 2:
    raise DataError(f"anisotropy needs at least 2 vectors; got {n}.")
  rng = np.random.default_rng(seed)
  i = rng.integers(0, n, num_pairs)
  j = (i + rng.integers(1, n, num_pairs)) % n  # uniform over j != i
  return vectors[i] * vectors[j]


def anisotropy(vectors: np.ndarray, num_pairs: int = 20000, seed: int = 0) -> float:
  """Expected cosine of two random distinct rows of `vectors` [N, D] (Ethayarajh)."""
  return float(_pair_products(vectors, num_pairs, seed).sum(1).mean())


def rogue_dimensions(vectors: np.ndarray, top: int = 5, num_pairs: int = 20000,
                     seed: int = 0) -> list[tuple[int, float, float]]:
  """The `top` dimensions contributing most to the expected cosine (Timkey & van
  Schijndel): (dimension, its contribution E[u_d v_d / |u||v|], its share of the
  anisotropy), largest contribution first. Contributions sum to `anisotropy`."""
  contributions = _pair_products(vectors, num_pairs, seed).mean(0)  # [D]
  total = contributions.sum()
  best = np.argsort(-contributions)[:top]
  return [(int(d), float(contributions[d]), float(contributions[d] / total))
          for d in best]


def report(vectors: np.ndarray, standardizer: Standardizer, top: int = 5,
           num_pairs: int = 20000, seed: int = 0) -> dict:
  """Anisotropy and rogue dimensions before and after standardising `vectors` [N, D]."""
  after = standardizer(_finite_rows(vectors))
  return {"num_vectors": int(len(after)), "dimensions": int(after.shape[1]),
          "anisotropy_raw": anisotropy(vectors, num_pairs, seed),
          "anisotropy_standardized": anisotropy(after, num_pairs, seed),
          "rogue_dimensions_raw": rogue_dimensions(vectors, top, num_pairs, seed),
          "rogue_dimensions_standardized": rogue_dimensions(after, top, num_pairs, seed)}
