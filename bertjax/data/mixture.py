"""Several corpora in one run: a weighted mixture (a general and a domain corpus, to
limit forgetting) or XLM-R's languages, and the one sampler that interleaves them.

Sources are written `NAME[:WEIGHT]=SPEC`, comma-separated, SPEC any corpus spec
(`bertjax.data.sources`: files, globs, directories, gs://, tfds:, or a prepared
directory):
* `config.data.corpus='general:0.3=/data/fineweb/*.parquet,domain:0.7=/data/notes'`
  is a mixture: every source carries a positive weight (normalised to sum to 1);
* `config.data.languages='en=/data/en,sw=/data/sw'`: languages drawn with XLM-R's
  q_i = p_i^alpha / sum_j p_j^alpha (`multilingual.sampling_probabilities`, p_i the
  language's share of `config.data.language_counts`), or with weights given as in a
  mixture (every language or none).

`Interleave` decides which source element k of the mixed stream comes from, as a pure
function of k: source i's count among the first n elements is floor(n * w_i) or within
K - 1 of it (K sources) for every n, so the mixture holds at every scale, with no coin
per document to drift; it is grain's `DatasetSelectionMap`, so a restore, any process
count, and the prepared and in-memory corpora give the same stream.

`config.data.source_phases` changes the sources and their sampling at step boundaries
(mmBERT's languages joining by phase, each phase at its own tau: `phases.source_phases`);
`PhasedInterleave` is then the stream's selection: an `Interleave` per segment, each
source's elements continuing where its previous segment left them, so the counts are
exact within every phase and no row is read twice.
"""

from __future__ import annotations

import dataclasses
import fractions
import itertools
import math
import random
import re
from typing import Iterable, Sequence

import grain
import numpy as np
from absl import logging

from bertjax.data import manifest, multilingual, sources as sources_lib
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import ConfigError, DataError

# NAME:WEIGHT= at the start of a mixture's source (a plain path never starts so).
_WEIGHTED = re.compile(r"^\s*([\w.-]+):([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)=(.*)$",
                       re.S)
_NAMED = re.compile(r"^\s*([\w.-]+)=(.*)$", re.S)
# What a tokenizer trains on (and a vocabulary extension learns words from) where
# config.data.tokenizer does not say: a million sentences per source held (~150 MB of
# Python strings), drawn from all of each source read, streamed.
SAMPLE_SENTENCES = 1_000_000
READ_SENTENCES = 0


@dataclasses.dataclass(frozen=True)
class Source:
  """One corpus of a run: its name ('' for a single corpus, logged as eval/NAME/...),
  its spec, and its weight (None: from its size, the languages' alpha)."""

  name: str
  spec: str
  weight: float | None = None


def is_mixture(spec: str) -> bool:
  """Whether a corpus spec is a weighted mixture (it starts NAME:WEIGHT=)."""
  return bool(_WEIGHTED.match(spec or ""))


def parse(spec: str, field: str, weights_required: bool) -> list[Source]:
  """'NAME[:WEIGHT]=SPEC,...' -> sources (one-line ConfigErrors: a malformed part, a
  repeated name, a weight that is not positive, weights on some sources only)."""
  out = []
  for part in filter(None, (p.strip() for p in spec.split(","))):
    weighted, named = _WEIGHTED.match(part), _NAMED.match(part)
    if weighted:
      name, weight, corpus = weighted.group(1), float(weighted.group(2)), weighted.group(3)
      if not (math.isfinite(weight) and weight > 0):
        raise ConfigError(f"config.data.{field}: source {name!r} has weight {weight:g}; "
                          "weights must be positive (e.g. 'general:0.3=...,domain:0.7=...')")
    elif named and not weights_required:
      name, weight, corpus = named.group(1), None, named.group(2)
    else:
      form = "NAME:WEIGHT=CORPUS" if weights_required else "NAME[:WEIGHT]=CORPUS"
      raise ConfigError(f"config.data.{field}: {part!r} is not {form}: write e.g. "
                        "'general:0.3=/data/general/*.parquet,domain:0.7=/data/domain'")
    if not corpus.strip():
      raise ConfigError(f"config.data.{field}: source {name!r} names no corpus")
    out.append(Source(name, corpus.strip(), weight))
  names = [s.name for s in out]
  if len(set(names)) != len(names):
    raise ConfigError(f"config.data.{field}: sources {names} repeat a name: give each "
                      "source once")
  if len({s.weight is None for s in out}) > 1:
    raise ConfigError(f"config.data.{field}: give a weight to every source or to none")
  return out


def sources_of(data_cfg) -> list[Source]:
  """The run's sources: `data.languages`, a mixture in `data.corpus`, or the one corpus
  (name '')."""
  languages = parse(data_cfg.languages, "languages", weights_required=False)
  if languages and data_cfg.corpus:
    raise ConfigError("config.data.languages and config.data.corpus both name corpora: "
                      "set config.data.corpus='' for languages, or write the mixture in "
                      "config.data.corpus alone")
  if languages:
    return languages
  if is_mixture(data_cfg.corpus):
    return parse(data_cfg.corpus, "corpus", weights_required=True)
  return [Source("", data_cfg.corpus)]


def weights(sources: Sequence[Source], sizes: Sequence[float], alpha: float
            ) -> np.ndarray:
  """[K] sampling probabilities: the given weights normalised, else q_i ~ p_i^alpha of
  the sizes (eq. 11.7)."""
  if sources[0].weight is not None:
    w = np.array([s.weight for s in sources], np.float64)
    return w / w.sum()
  return multilingual.sampling_probabilities(sizes, alpha)


def sample(texts: Iterable[str], size: int, limit: int, seed: int
           ) -> tuple[list[str], int]:
  """(up to `size` of `texts` drawn uniformly at random, all of them in order when they
  are fewer (0: all), how many were read): streamed, reading at most `limit` (0: all),
  holding at most `size` (a reservoir, Vitter's algorithm R)."""
  rng = random.Random(seed)
  out: list[str] = []
  read = 0
  for text in itertools.islice(texts, limit or None):
    read += 1
    if not size or len(out) < size:
      out.append(text)
    elif (j := rng.randrange(read)) < size:
      out[j] = text
  return out, read


def tokenizer_sentences(data_cfg, seed: int) -> list[str]:
  """The sentences to train a tokenizer on (and to learn a vocabulary extension's words
  from): each source streamed, at most `tokenizer.read_sentences` of its units read
  (0: all) and `tokenizer.sample_sentences` of them kept, drawn uniformly (0: all; the
  defaults `READ_SENTENCES`, `SAMPLE_SENTENCES` where the section lacks them); with
  several sources as many as they hold together up to that sample, drawn with their
  sampling probabilities (the languages' q of their `language_counts`, a mixture's
  weights). Logs how many it sampled of how many it read."""
  field = data_cfg.text_field
  sources = sources_of(data_cfg)
  for source in sources:
    if manifest.kind_of(source.spec):
      raise DataError(f"corpus {source.spec!r} is prepared (tokenized): give the "
                      "tokenizer it was prepared with, "
                      f"--config.data.tokenizer.path={source.spec}/tokenizer")
  settings = data_cfg.get("tokenizer") or {}
  size = settings.get("sample_sentences", SAMPLE_SENTENCES)
  limit = settings.get("read_sentences", READ_SENTENCES)
  per_source, read = [], []
  for i, source in enumerate(sources):
    if not source.spec:
      raise sources_lib.no_text(source.spec, field)
    texts = (t for d in sources_lib.iter_documents(source.spec, field,
                                                   line_breaks=data_cfg.line_breaks)
             for t in tok_lib.unit_texts(d, data_cfg.line_breaks))
    kept, n = sample(texts, size, limit, seed + i)
    if not n:
      raise sources_lib.no_text(source.spec, field)
    per_source.append(kept)
    read.append(n)
  if len(per_source) == 1:
    out = per_source[0]
  else:
    counts = multilingual.language_counts(data_cfg)
    # Each source's size is its sample's scaled to what was read of it.
    sizes = [multilingual.text_size(s, counts) * n / len(s) for s, n in zip(per_source, read)]
    q = weights(sources, sizes, data_cfg.language_alpha)
    total = min(sum(read), size or sum(read))
    out = multilingual.sample_sentences(per_source, q, total, np.random.default_rng(seed))
  logging.info("Tokenizer sentences: %s sampled of %s read%s (at most "
               "config.data.tokenizer.sample_sentences=%d kept, read_sentences=%d read "
               "per source; 0: all).", f"{len(out):,}", f"{sum(read):,}",
               "" if len(read) == 1 else " (" + ", ".join(
                   f"{s.name} {n:,}" for s, n in zip(sources, read)) + ")", size, limit)
  return out


def spec_of(sources: Sequence[Source]) -> str:
  """The sources written back as a spec ('NAME:WEIGHT=SPEC,...' or 'NAME=SPEC,...')."""
  return ",".join(f"{s.name}{'' if s.weight is None else f':{s.weight:g}'}={s.spec}"
                  for s in sources)


class Interleave(grain.transforms.DatasetSelectionMap):
  """Element k of the mixed stream -> (source i, its element j), with weights `w`.

  Source 0 takes the elements where floor(k * w_0) steps up (floor((k + 1) W_0 / W) >
  floor(k W_0 / W), W_i integers in the ratio of the weights as written: 0.3 : 0.7 is
  3 : 7); the others share the rest the same way, one after the other (grain's `mix`
  does this with weights scaled to 100 times the smallest and truncated: 0.3 : 0.7
  becomes 100 : 233, a 0.1% drift). Stateless, exact in integer arithmetic."""

  def __init__(self, w: Sequence[float]):
    if len(w) < 2 or not all(x > 0 for x in w):
      raise ConfigError(f"an interleaving needs two or more positive weights, got {w}")
    exact = [fractions.Fraction(repr(float(x))) for x in w]  # the decimals written
    shares = [x / sum(exact) for x in exact]
    denominator = math.lcm(*(x.denominator for x in shares))
    self._proportions = tuple(int(x * denominator) for x in shares)

  def __len__(self) -> int:
    return 2**62

  def __getitem__(self, k: int) -> tuple[int, int]:
    remaining = sum(self._proportions)
    k = int(k)
    for i, p in enumerate(self._proportions[:-1]):
      before, after = (k * p) // remaining, ((k + 1) * p) // remaining
      if after > before:
        return i, before
      k -= after  # the index among the elements the later sources share
      remaining -= p
    return len(self._proportions) - 1, k


def interleave_counts(proportions: Sequence[int], n: int) -> list[int]:
  """How many of the first `n` elements of an interleaving of integer `proportions`
  each source takes (`Interleave`'s rule: source 0 floor(n p_0 / P), the others the
  same over the rest, one after the other)."""
  out, remaining = [], sum(proportions)
  for p in proportions[:-1]:
    c = (n * p) // remaining
    out.append(c)
    n -= c
    remaining -= p
  return out + [n]


class PhasedInterleave(grain.transforms.DatasetSelectionMap):
  """Element k of a stream whose mixture changes: `segments` [(first element, [K]
  weights, 0 for a source absent from that segment)], the first at element 0,
  ascending. Within a segment, its present sources interleave as `Interleave` does
  (one present source takes every element); source i's j-th element of a segment is
  its element offset + j, offset its elements in the segments before. Stateless,
  exact in integer arithmetic."""

  def __init__(self, segments: Sequence[tuple[int, Sequence[float]]]):
    starts = [int(e) for e, _ in segments]
    if not starts or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
      raise ConfigError(f"segments must start at element 0 and ascend, got {starts}")
    self._starts = starts
    self._parts = []  # (present source indices, their Interleave or None)
    for _, w in segments:
      present = [i for i, x in enumerate(w) if x > 0]
      if not present:
        raise ConfigError(f"a segment of the mixture has no source with weight > 0: {w}")
      self._parts.append((present, Interleave([w[i] for i in present])
                          if len(present) > 1 else None))
    K = len(segments[0][1])
    self._offsets = [[0] * K]
    for s in range(len(segments) - 1):
      present, mix = self._parts[s]
      n = starts[s + 1] - starts[s]
      taken = interleave_counts(mix._proportions, n) if mix else [n]  # pylint: disable=protected-access
      row = list(self._offsets[-1])
      for i, c in zip(present, taken):
        row[i] += c
      self._offsets.append(row)

  def __len__(self) -> int:
    return 2**62

  def __getitem__(self, k: int) -> tuple[int, int]:
    k = int(k)
    s = next(s for s in range(len(self._starts) - 1, -1, -1) if self._starts[s] <= k)
    present, mix = self._parts[s]
    i, j = mix[k - self._starts[s]] if mix else (0, k - self._starts[s])
    source = present[i]
    return source, self._offsets[s][source] + j
