"""BERT's masked-LM corruption, vectorised in numpy.

Per example: the candidates are the non-special, non-padding tokens (n of them);
`min(max_predictions_per_seq, max(1, round(n * masked_lm_prob)))` of them are chosen
uniformly without replacement; each chosen token becomes `[MASK]` with probability
`mask_token_prob`, a uniformly random non-special token with `random_token_prob`, and
stays unchanged otherwise (80/10/10 in the paper). Shapes: B batch, T length,
P = max_predictions_per_seq.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.errors import ConfigError


@dataclasses.dataclass(frozen=True, eq=False)
class MaskingConfig:
  """What the masker needs from the data config and the tokenizer.

  `special_ids` [S] are never chosen (padding included); `random_ids` [R] is the pool
  random replacements are drawn from (the vocabulary minus the special tokens).
  """

  mask_id: int
  special_ids: np.ndarray
  random_ids: np.ndarray
  max_predictions_per_seq: int
  masked_lm_prob: float = 0.15
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1

  @classmethod
  def create(cls, data_cfg, tokenizer) -> MaskingConfig:
    """Builds and validates the masking settings from `config.data` and a tokenizer."""
    for field in ("masked_lm_prob", "mask_token_prob", "random_token_prob"):
      if not 0.0 <= data_cfg[field] <= 1.0:
        raise ConfigError(f"config.data.{field}={data_cfg[field]} must lie in [0, 1]")
    if data_cfg.mask_token_prob + data_cfg.random_token_prob > 1.0:
      raise ConfigError("config.data.mask_token_prob + random_token_prob must be <= 1 "
                        f"(got {data_cfg.mask_token_prob} + {data_cfg.random_token_prob})")
    if data_cfg.max_predictions_per_seq < 1:
      raise ConfigError("config.data.max_predictions_per_seq must be >= 1, got "
                        f"{data_cfg.max_predictions_per_seq}")
    special = np.array(sorted(set(tokenizer.special_ids) | {tokenizer.pad_id}), np.int32)
    random_ids = np.setdiff1d(np.arange(tokenizer.vocab_size, dtype=np.int32), special)
    return cls(mask_id=tokenizer.mask_id, special_ids=special, random_ids=random_ids,
               max_predictions_per_seq=int(data_cfg.max_predictions_per_seq),
               masked_lm_prob=float(data_cfg.masked_lm_prob),
               mask_token_prob=float(data_cfg.mask_token_prob),
               random_token_prob=float(data_cfg.random_token_prob))


def mask_tokens(input_ids: np.ndarray, rng: np.random.Generator,
                cfg: MaskingConfig) -> dict[str, np.ndarray]:
  """Chooses and corrupts tokens of one example [T] or a batch [B, T].

  Returns a dict (leading B dimension only when the input had one):
    input_ids [B, T] int32: the corrupted ids.
    masked_lm_positions [B, P] int32: chosen positions, ascending, 0 in unused slots.
    masked_lm_ids [B, P] int32: the original ids at those positions, 0 in unused slots.
    masked_lm_weights [B, P] float32: 1 for real predictions, 0 for unused slots.
  """
  ids = np.asarray(input_ids, np.int32)
  single = ids.ndim == 1
  ids = np.atleast_2d(ids)
  b, t = ids.shape
  p = cfg.max_predictions_per_seq
  candidates = ~np.isin(ids, cfg.special_ids)
  n = candidates.sum(axis=1)
  num_to_predict = np.minimum(
      np.minimum(p, np.maximum(1, np.round(n * cfg.masked_lm_prob).astype(np.int64))), n)

  # A uniform random order of the candidates: the first num_to_predict are chosen.
  keys = np.where(candidates, rng.random((b, t)), 2.0)
  first = np.argsort(keys, axis=1, kind="stable")[:, :min(p, t)]
  if first.shape[1] < p:
    first = np.pad(first, ((0, 0), (0, p - first.shape[1])))
  valid = np.arange(p)[None, :] < num_to_predict[:, None]
  positions = np.sort(np.where(valid, first, t), axis=1)
  valid = positions < t
  positions = np.where(valid, positions, 0).astype(np.int32)

  rows = np.arange(b)[:, None]
  labels = np.where(valid, ids[rows, positions], 0).astype(np.int32)
  u = rng.random((b, p))
  random_tokens = cfg.random_ids[rng.integers(0, len(cfg.random_ids), (b, p))]
  replacement = np.where(
      u < cfg.mask_token_prob, cfg.mask_id,
      np.where(u < cfg.mask_token_prob + cfg.random_token_prob, random_tokens, labels))
  masked = ids.copy()
  masked[np.broadcast_to(rows, (b, p))[valid], positions[valid]] = replacement[valid]
  out = {
      "input_ids": masked,
      "masked_lm_positions": positions,
      "masked_lm_ids": labels,
      "masked_lm_weights": valid.astype(np.float32),
  }
  if single:
    out = {k: v[0] for k, v in out.items()}
  return out
