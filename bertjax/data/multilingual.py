"""Multilingual sampling (XLM / XLM-R, textbook eq. 11.7): language i with a share
p_i = n_i / sum_j n_j of the corpus is drawn with probability
q_i = p_i^alpha / sum_j p_j^alpha, which up-samples low-resource languages (alpha=1
keeps the corpus shares, alpha=0 makes all languages equally likely). n_i counts the
language's sentences, as the equation does (`config.data.language_counts`: or its
tokens or characters). Used for the tokenizer's training text and for pretraining
batches (`pipeline.py` mixes per-language example streams with these weights).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertjax.data import manifest, sources
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import ConfigError, DataError

# What n_i of eq. 11.7 counts (config.data.language_counts).
COUNTS = ("sentences", "tokens", "characters")


def parse_languages(spec: str) -> list[tuple[str, str]]:
  """'en=/data/en/*.txt,de=tfds:wikipedia/20230601.de' -> [(language, corpus spec)]."""
  out = []
  for part in filter(None, (p.strip() for p in spec.split(","))):
    name, sep, corpus = part.partition("=")
    if not sep or not name.strip() or not corpus.strip():
      raise ConfigError(f"language source {part!r} is not LANG=CORPUS: write e.g. "
                        "'en=/data/en/*.txt,sw=/data/sw/*.txt'")
    out.append((name.strip(), corpus.strip()))
  names = [n for n, _ in out]
  if len(set(names)) != len(names):
    raise ConfigError(f"languages {names} repeat a name: give each language once")
  return out


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


def sample_sentences(per_language: Sequence[Sequence[str]], alpha: float, total: int,
                     rng: np.random.Generator, counts: str = "sentences") -> list[str]:
  """About `total` sentences drawn from the languages with probabilities q (n_i by
  `counts`): each language contributes round(q_i * total) sentences, sampled without
  replacement while it has enough and cycling over a shuffle when it must repeat.
  Returned shuffled."""
  q = sampling_probabilities([text_size(s, counts) for s in per_language], alpha)
  out: list[str] = []
  for sentences, share in zip(per_language, q):
    n = int(round(share * total))
    order = np.concatenate([rng.permutation(len(sentences))
                            for _ in range(-(-n // len(sentences)))] or [[]])
    out.extend(sentences[k] for k in order[:n].astype(np.int64))
  return [out[k] for k in rng.permutation(len(out))]


def tokenizer_sentences(data_cfg, seed: int) -> list[str]:
  """The sentences to train a tokenizer on: the corpus's, or with
  `config.data.languages` as many sentences as all languages hold, drawn with q."""
  field = data_cfg.text_field
  languages = parse_languages(data_cfg.languages)
  for spec in [s for _, s in languages] or [data_cfg.corpus]:
    if manifest.kind_of(spec):
      raise DataError(f"corpus {spec!r} is prepared (tokenized): give the tokenizer it "
                      f"was prepared with, --config.data.tokenizer.path={spec}/tokenizer")
  if not languages:
    return [s for d in sources.load_documents(data_cfg.corpus, field)
            for s in tok_lib.running_text(d)]
  per_language = [[s for d in sources.load_documents(spec, field)
                   for s in tok_lib.running_text(d)] for _, spec in languages]
  return sample_sentences(per_language, data_cfg.language_alpha,
                          sum(map(len, per_language)), np.random.default_rng(seed),
                          language_counts(data_cfg))
