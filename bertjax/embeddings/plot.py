"""Every occurrence of a word projected to 2-D, coloured by sense (the textbook's
Figure 11.7): the contextual vectors are centred and projected on their first two
principal components, a few points are annotated with their sentence."""

from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # Files only; no display needed.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from bertjax.embeddings.analysis import Standardizer  # pylint: disable=wrong-import-position
from bertjax.embeddings.extract import Embedder, Span  # pylint: disable=wrong-import-position
from bertjax.errors import DataError  # pylint: disable=wrong-import-position

_DPI = 100


def pca_2d(vectors: np.ndarray) -> np.ndarray:
  """[N, D] -> [N, 2] coordinates on the first two principal components."""
  centred = vectors - vectors.mean(0)
  _, _, vt = np.linalg.svd(centred, full_matrices=False)
  coords = centred @ vt[:2].T
  return np.pad(coords, [(0, 0), (0, 2 - coords.shape[1])])


def _snippet(sentence: str, span: Span, width: int = 28) -> str:
  """The sentence around the target, the target in capitals, at most ~2*width chars."""
  s, e = span
  left, right = sentence[max(0, s - width):s], sentence[e:e + width]
  return (("…" if s > width else "") + left + sentence[s:e].upper() + right
          + ("…" if e + width < len(sentence) else ""))


def sense_plot(embedder: Embedder, sentences: Sequence[str], spans: Sequence[Span],
               out: str, senses: Sequence[str] | None = None, title: str = "",
               size: tuple[int, int] = (800, 600), annotate: int = 6, pool: str = "mean",
               standardizer: Standardizer | None = None) -> np.ndarray:
  """Writes a PNG of `size` (width, height) pixels to `out` with one point per
  occurrence (sentence i, character span i); returns the 2-D coordinates [N, 2].
  `annotate` points (spread over the senses) are labelled with their sentence."""
  if len(sentences) < 2:
    raise DataError(f"the plot needs at least 2 occurrences; found {len(sentences)}.")
  vectors = embedder.targets(sentences, spans, pool)
  if standardizer is not None:
    vectors = standardizer(vectors)
  coords = pca_2d(vectors)
  labels = list(senses) if senses is not None else [""] * len(sentences)
  kinds = sorted(set(labels))
  fig = plt.figure(figsize=(size[0] / _DPI, size[1] / _DPI), dpi=_DPI)
  ax = fig.add_axes((0.06, 0.08, 0.9, 0.84))
  colours = plt.get_cmap("tab10")
  for k, kind in enumerate(kinds):
    idx = [i for i, label in enumerate(labels) if label == kind]
    ax.scatter(coords[idx, 0], coords[idx, 1], s=36, color=colours(k % 10),
               label=kind or None, alpha=0.85)
  # Round-robin over senses so each gets annotated examples.
  queues = [[i for i, label in enumerate(labels) if label == kind] for kind in kinds]
  chosen = [q[r] for r in range(max(map(len, queues))) for q in queues if r < len(q)]
  middle = coords[:, 0].mean()
  for i in chosen[:annotate]:  # Text grows away from the edge nearest the point.
    right = coords[i, 0] > middle
    ax.annotate(_snippet(sentences[i], spans[i]), coords[i], fontsize=7,
                xytext=(-4 if right else 4, 4), textcoords="offset points",
                ha="right" if right else "left")
  if any(kinds):
    ax.legend(fontsize=8, loc="best")
  ax.set_xlabel("PC 1")
  ax.set_ylabel("PC 2")
  ax.set_title(title, fontsize=10)
  fig.savefig(out, dpi=_DPI, format="png")
  plt.close(fig)
  return coords
