"""Multilingual sampling (XLM / XLM-R, textbook eq. 11.7): language i with a share
p_i = n_i / sum_j n_j of the corpus is drawn with probability
q_i = p_i^alpha / sum_j p_j^alpha, which up-samples low-resource languages (alpha=1
keeps the corpus shares, alpha=0 makes all languages equally likely). n_i counts the
language's sentences, as the equation does (`config.data.language_counts`: or its
tokens or characters). Used for the tokenizer's training text and for pretraining
batches (`bertjax.data.mixture` parses the languages and interleaves their streams with
these weights, as it does a weighted mixture's).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertjax.errors import ConfigError

# What n_i of eq. 11.7 counts (config.data.language_counts).
COUNTS = ("sentences", "tokens", "characters")


def sampling_probabilities(sizes: Sequence[float], alpha: float) -> np.ndarray:
  """[K] q_i = p_i^alpha / sum_j p_j^alpha with p_i = sizes_i / sum(sizes)."""
  sizes = np.asarray(sizes, np.float64)
  if not 0.0 <= alpha <= 1.0:
    raise ConfigError(f"multilingual sampling alpha={alpha} must lie in [0, 1] "
                      "(XLM-R uses 0.3)")
  if len(sizes) == 0 or (sizes <= 0).any():
    raise ConfigError(f"every language needs some text; sizes {sizes.tolist()}")
  q = (sizes / sizes.sum()) ** alpha
  return q / q.sum()


def language_counts(data_cfg) -> str:
  """`config.data.language_counts`, checked: what n_i counts."""
  counts = data_cfg.language_counts
  if counts not in COUNTS:
    raise ConfigError(f"config.data.language_counts={counts!r}: use one of {COUNTS}")
  return counts


def text_size(sentences: Sequence[str], counts: str) -> int:
  """n_i of raw sentences: how many, their characters, or (before a tokenizer
  exists) their whitespace-separated words for 'tokens'."""
  if counts == "sentences":
    return len(sentences)
  if counts == "characters":
    return sum(map(len, sentences))
  return sum(len(s.split()) for s in sentences)


def sample_sentences(per_source: Sequence[Sequence[str]], q: Sequence[float], total: int,
                     rng: np.random.Generator) -> list[str]:
  """About `total` sentences drawn from the sources with probabilities q: each
  contributes round(q_i * total) sentences, sampled without replacement while it has
  enough and cycling over a shuffle when it must repeat. Returned shuffled."""
  out: list[str] = []
  for sentences, share in zip(per_source, q):
    n = int(round(share * total))
    order = np.concatenate([rng.permutation(len(sentences))
                            for _ in range(-(-n // len(sentences)))] or [[]])
    out.extend(sentences[k] for k in order[:n].astype(np.int64))
  return [out[k] for k in rng.permutation(len(out))]
