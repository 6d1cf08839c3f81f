"""Masked-LM corruption, vectorised in numpy: token, whole-word and SpanBERT span masking.

Per example the candidates are the non-special, non-padding tokens (n of them; with
`mask_special_tokens` every non-padding token) and the budget is
`min(max_predictions_per_seq, max(1, round(n * masked_lm_prob)))` tokens (`draw`
'fixed'), or with `draw` 'per_token' the number of candidates that a draw of each
with probability masked_lm_prob picks (Binomial(n, p)), capped the same way.

* 'token' (BERT): the budget's worth of candidates chosen uniformly without replacement.
* 'whole_word' (BERT's --do_whole_word_mask): words (a word-start token and its
  continuations) taken in a random order while the running token count stays within
  the budget, so every piece of a chosen word is chosen.
* 'span' (SpanBERT): repeatedly draw a length l ~ Geometric(p) clipped at
  `max_span_length` words and an anchor token uniformly; unless the anchor is already
  chosen, choose the l whole words from the anchor's word on, token by token until the
  budget is spent. Overlapping or touching spans merge.

Replacement: each chosen token becomes the mask token with `mask_token_prob`, a random
non-special token with `random_token_prob` (uniform over the vocabulary, or from the
corpus unigram frequencies), else stays. 'token' and 'whole_word' decide per token
(as BERT does); 'span' decides once per merged span (SpanBERT's span-level 80/10/10).

Randomness: every draw is `rng.random(shape)` with the rows first, so `rng` is either
a numpy Generator (one stream for the whole batch) or `RowStreams` (one counter-based
stream per row: a row's mask depends only on its key, not on the batch around it).

Shapes: B batch, T length, P = max_predictions_per_seq.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.errors import ConfigError

STRATEGIES = ("token", "whole_word", "span")
DRAWS = ("fixed", "per_token")  # config.data.masked_lm_draw
RANDOM_DISTRIBUTIONS = ("uniform", "unigram")

# SplitMix64 (Steele, Lea & Flood 2014; the seeder of numpy's and Java's generators).
_GAMMA = np.uint64(0x9E3779B97F4A7C15)


def _splitmix(x: np.ndarray) -> np.ndarray:
  """SplitMix64's output function: a bijection of uint64 that mixes every bit."""
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


class RowStreams:
  """Independent random streams, one per row, keyed by (seed, index) and vectorised.

  Row r's stream is SplitMix64 seeded with mix(seed, index[r]): its k-th number is a
  pure function of (seed, index[r], k), so a row gets the same numbers in any batch,
  and distinct indices give distinct keys. `random` has the Generator signature used
  by `mask_tokens`.
  """

  def __init__(self, seed: int, index: np.ndarray):
    """index [B]: non-negative element indices (e.g. positions in the epoch stream)."""
    with np.errstate(over="ignore"):
      base = _splitmix(np.array([seed], np.uint64))
      self._keys = _splitmix(base + _GAMMA * (np.asarray(index, np.uint64) + np.uint64(1)))
    self._drawn = 0

  def random(self, shape) -> np.ndarray:
    """[B, ...] uniform floats in [0, 1); row r from row r's stream."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if shape[0] != len(self._keys):
      raise ValueError(f"RowStreams has {len(self._keys)} rows, asked for {shape}")
    n = int(np.prod(shape[1:], dtype=np.int64))
    counters = np.arange(self._drawn + 1, self._drawn + n + 1, dtype=np.uint64)
    self._drawn += n
    with np.errstate(over="ignore"):
      bits = _splitmix(self._keys[:, None] + _GAMMA * counters[None, :])
    return ((bits >> np.uint64(11)) * 2.0**-53).reshape(shape)


@dataclasses.dataclass(frozen=True, eq=False)
class MaskingConfig:
  """What the masker needs from the data config and the tokenizer.

  `special_ids` [S] are never chosen (padding included), unless `mask_special_tokens`
  (then only `pad_id` is never chosen); `random_ids` [R] is the pool random
  replacements are drawn from (the vocabulary minus the special tokens) and
  `random_cdf` [R] their cumulative probabilities (None: uniform). `word_starts` [V]
  bool marks tokens that begin a word (None: every token is a word). `draw`: 'fixed'
  or 'per_token' (the module docstring).
  """

  mask_id: int
  special_ids: np.ndarray
  random_ids: np.ndarray
  max_predictions_per_seq: int
  masked_lm_prob: float = 0.15
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1
  strategy: str = "token"
  random_cdf: np.ndarray | None = None
  word_starts: np.ndarray | None = None
  span_p: float = 0.2
  max_span_length: int = 10
  draw: str = "fixed"
  mask_special_tokens: bool = False
  pad_id: int = 0

  @classmethod
  def create(cls, data_cfg, tokenizer, token_counts: np.ndarray | None = None
             ) -> MaskingConfig:
    """The masking settings of `config.data` (its fields are range-checked by
    `bertjax.data.pipeline.check_config`) and a tokenizer.

    token_counts [V]: corpus counts per id, needed when
    `config.data.random_token_distribution='unigram'`.
    """
    strategy = data_cfg.masking
    distribution = data_cfg.random_token_distribution
    span_p = float(data_cfg.span_geometric_p)
    max_span = int(data_cfg.max_span_length)
    special = np.array(sorted(set(tokenizer.special_ids) | {tokenizer.pad_id}), np.int32)
    random_ids = np.setdiff1d(np.arange(tokenizer.vocab_size, dtype=np.int32), special)
    cdf = None
    if distribution == "unigram":
      if token_counts is None:
        raise ConfigError("config.data.random_token_distribution='unigram' needs corpus "
                          "token counts; use 'uniform' when none are available")
      freq = np.asarray(token_counts, np.float64)[random_ids] + 1.0  # add-one smoothing
      cdf = np.cumsum(freq / freq.sum())
    return cls(mask_id=tokenizer.mask_id, special_ids=special, random_ids=random_ids,
               max_predictions_per_seq=int(data_cfg.max_predictions_per_seq),
               masked_lm_prob=float(data_cfg.masked_lm_prob),
               mask_token_prob=float(data_cfg.mask_token_prob),
               random_token_prob=float(data_cfg.random_token_prob),
               strategy=strategy, random_cdf=cdf,
               word_starts=None if strategy == "token" else tokenizer.word_starts(),
               span_p=span_p, max_span_length=max_span,
               draw=data_cfg.masked_lm_draw,
               mask_special_tokens=bool(data_cfg.mask_special_tokens),
               pad_id=tokenizer.pad_id)


def span_length_distribution(p: float, max_len: int) -> np.ndarray:
  """[max_len] probabilities of span lengths 1..max_len: Geometric(p) clipped and
  renormalised (SpanBERT's `len_distrib`)."""
  lengths = np.arange(1, max_len + 1)
  probs = p * (1 - p) ** (lengths - 1)
  return probs / probs.sum()


def _budget(candidates: np.ndarray, cfg: MaskingConfig, rng) -> np.ndarray:
  """[B] tokens to choose per row. 'per_token': the candidates a draw of each with
  probability masked_lm_prob picks, counted (chosen afterwards uniformly, as many: the
  law of choosing each with that probability, transformers' collator's)."""
  n = candidates.sum(axis=1)
  if cfg.draw == "per_token":
    want = np.sum(candidates & (rng.random(candidates.shape) < cfg.masked_lm_prob), axis=1)
  else:
    want = np.maximum(1, np.round(n * cfg.masked_lm_prob).astype(np.int64))
  return np.minimum(np.minimum(cfg.max_predictions_per_seq, want), n)


def _word_ids(ids: np.ndarray, candidates: np.ndarray, cfg: MaskingConfig,
              word_starts: np.ndarray | None) -> np.ndarray:
  """[B, T] index of each candidate's word within its row (-1 for non-candidates).

  A word starts at a word-start token or after a non-candidate."""
  if word_starts is None:
    word_starts = (cfg.word_starts[ids] if cfg.word_starts is not None
                   else np.ones(ids.shape, bool))
  prev = np.pad(candidates[:, :-1], ((0, 0), (1, 0)))
  starts = candidates & (word_starts | ~prev)
  return np.where(candidates, np.cumsum(starts, axis=1) - 1, -1)


def _choose_units(unit: np.ndarray, budget: np.ndarray, rng: np.random.Generator
                  ) -> np.ndarray:
  """Units (words or tokens) [B, T] ids (-1: none) in a random order while the token
  count stays within `budget` [B]; returns the chosen tokens [B, T] bool."""
  b, t = unit.shape
  rows = np.arange(b)[:, None]
  lengths = np.zeros((b, t + 1), np.int64)
  np.add.at(lengths, (np.broadcast_to(rows, unit.shape), np.where(unit >= 0, unit, t)), 1)
  lengths = lengths[:, :t]
  keys = np.where(lengths > 0, rng.random((b, t)), 2.0)
  order = np.argsort(keys, axis=1)
  sorted_lengths = lengths[rows, order]
  # BERT's loop over the shuffled words: a word that would overflow the budget is
  # skipped and later (shorter) ones are still tried. One step per word rank, all
  # rows at once.
  taken = np.zeros(b, np.int64)
  within = np.zeros((b, t), bool)
  for k in range(int((lengths > 0).sum(1).max(initial=0))):
    fits = (sorted_lengths[:, k] > 0) & (taken + sorted_lengths[:, k] <= budget)
    within[:, k] = fits
    taken += np.where(fits, sorted_lengths[:, k], 0)
  chosen_unit = np.zeros((b, t), bool)
  chosen_unit[rows, order] = within
  return (unit >= 0) & chosen_unit[rows, np.maximum(unit, 0)]


def _choose_spans(words: np.ndarray, candidates: np.ndarray, budget: np.ndarray,
                  rng: np.random.Generator, cfg: MaskingConfig) -> np.ndarray:
  """SpanBERT's span sampling, one span per row per round, all rows at once."""
  b, t = words.shape
  cdf = np.cumsum(span_length_distribution(cfg.span_p, cfg.max_span_length))
  chosen = np.zeros((b, t), bool)
  remaining = budget.copy()
  rows = np.arange(b)
  while True:
    active = (remaining > 0) & (candidates & ~chosen).any(axis=1)
    if not active.any():
      return chosen
    span_len = 1 + np.minimum(np.searchsorted(cdf, rng.random(b), side="right"),
                              cfg.max_span_length - 1)
    # An anchor uniformly among the row's candidates: the k-th candidate token.
    n = candidates.sum(axis=1)
    k = np.floor(rng.random(b) * np.maximum(n, 1)).astype(np.int64)
    anchor = np.argmax(np.cumsum(candidates, axis=1) > k[:, None], axis=1)
    active &= ~chosen[rows, anchor]
    first = words[rows, anchor]
    in_span = (words >= first[:, None]) & (words < (first + span_len)[:, None])
    new = in_span & ~chosen & active[:, None]
    take = new & (np.cumsum(new, axis=1) <= remaining[:, None])
    chosen |= take
    remaining -= take.sum(axis=1)


def _run_bounds(chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Start and end [B, T] of the run of consecutive chosen tokens each token is in."""
  b, t = chosen.shape
  idx = np.broadcast_to(np.arange(t), (b, t))
  prev = np.pad(chosen[:, :-1], ((0, 0), (1, 0)))
  nxt = np.pad(chosen[:, 1:], ((0, 0), (0, 1)))
  start = np.maximum.accumulate(np.where(chosen & ~prev, idx, 0), axis=1)
  end_rev = np.maximum.accumulate(np.where(chosen & ~nxt, t - 1 - idx, 0)[:, ::-1], axis=1)
  return start, (t - 1 - end_rev)[:, ::-1]


def _random_tokens(u: np.ndarray, cfg: MaskingConfig) -> np.ndarray:
  """[B, P] random replacement ids from uniforms u [B, P] (uniform over the pool, or
  by the unigram `random_cdf`)."""
  if cfg.random_cdf is None:
    k = (u * len(cfg.random_ids)).astype(np.int64)
  else:
    k = np.searchsorted(cfg.random_cdf, u, side="right")
  return cfg.random_ids[np.minimum(k, len(cfg.random_ids) - 1)]


def mask_tokens(input_ids: np.ndarray, rng: np.random.Generator | RowStreams,
                cfg: MaskingConfig,
                word_starts: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Chooses and corrupts tokens of one example [T] or a batch [B, T].

  word_starts: optional [B, T] bool word boundaries (from prepared data); by default
  they come from the tokenizer's vocabulary (`cfg.word_starts`).

  Returns a dict (leading B dimension only when the input had one):
    input_ids [B, T] int32: the corrupted ids.
    masked_lm_positions [B, P] int32: chosen positions, ascending, 0 in unused slots.
    masked_lm_ids [B, P] int32: the original ids at those positions, 0 in unused slots.
    masked_lm_weights [B, P] float32: 1 for real predictions, 0 for unused slots.
  With strategy 'span', also (for the span-boundary objective), per prediction slot:
    span_left_positions, span_right_positions [B, P] int32: the tokens just outside
      the prediction's span (s - 1 and e + 1, clipped to the row).
    span_relative_positions [B, P] int32: its offset inside the span (i - s).
  """
  ids = np.asarray(input_ids, np.int32)
  single = ids.ndim == 1
  ids = np.atleast_2d(ids)
  if word_starts is not None:
    word_starts = np.atleast_2d(np.asarray(word_starts, bool))
  b, t = ids.shape
  p = cfg.max_predictions_per_seq
  candidates = (ids != cfg.pad_id) if cfg.mask_special_tokens else (
      ~np.isin(ids, cfg.special_ids))

  rows = np.arange(b)[:, None]
  # The 80/10/10 draws come first (per slot, or per token for spans, used at each
  # span's start): the span loop's round count depends on the whole batch, and with
  # RowStreams a row's numbers must not.
  u = rng.random((b, t if cfg.strategy == "span" else p))
  random_ids = _random_tokens(rng.random((b, p)), cfg)
  budget = _budget(candidates, cfg, rng)
  if cfg.strategy == "token":
    # A uniform random order of the candidates: the first `budget` are chosen.
    keys = np.where(candidates, rng.random((b, t)), 2.0)
    first = np.argsort(keys, axis=1)[:, :min(p, t)]
    first = np.where(np.arange(first.shape[1])[None, :] < budget[:, None], first, t)
  else:
    if cfg.strategy == "whole_word":
      chosen = _choose_units(_word_ids(ids, candidates, cfg, word_starts), budget, rng)
    else:
      chosen = _choose_spans(_word_ids(ids, candidates, cfg, word_starts), candidates,
                             budget, rng, cfg)
    first = np.where(chosen, np.arange(t)[None, :], t)
  first = np.sort(first, axis=1)[:, :p]
  if first.shape[1] < p:
    first = np.pad(first, ((0, 0), (0, p - first.shape[1])), constant_values=t)
  valid = first < t
  positions = np.where(valid, first, 0).astype(np.int32)
  labels = np.where(valid, ids[rows, positions], 0).astype(np.int32)

  if cfg.strategy == "span":
    start, end = _run_bounds(chosen)
    u = u[rows, start][rows, positions]  # one draw per span, at its start
  replacement = np.where(
      u < cfg.mask_token_prob, cfg.mask_id,
      np.where(u < cfg.mask_token_prob + cfg.random_token_prob, random_ids, labels))
  masked = ids.copy()
  masked[np.broadcast_to(rows, (b, p))[valid], positions[valid]] = replacement[valid]
  out = {
      "input_ids": masked,
      "masked_lm_positions": positions,
      "masked_lm_ids": labels,
      "masked_lm_weights": valid.astype(np.float32),
  }
  if cfg.strategy == "span":
    s, e = start[rows, positions], end[rows, positions]
    out["span_left_positions"] = np.where(valid, np.maximum(s - 1, 0), 0).astype(np.int32)
    out["span_right_positions"] = np.where(valid, np.minimum(e + 1, t - 1), 0).astype(np.int32)
    out["span_relative_positions"] = np.where(valid, positions - s, 0).astype(np.int32)
  if single:
    out = {k: v[0] for k, v in out.items()}
  return out
