"""SpanBERT's span-boundary objective ('sbo', Joshi et al. 2020): each token of a masked
span predicted from the encoder outputs just outside the span and its position in it
(the 'sbo' head, `bertjax.model.sbo`), the mean cross-entropy over the same targets as
the MLM's. It reads the span boundaries only span masking draws
(`config.data.masking='span'`): span_left_positions, span_right_positions,
span_relative_positions [B, P] int32.
"""

from __future__ import annotations

from bertjax.errors import ConfigError
from bertjax.objectives import mlm

FIELDS = mlm.FIELDS + ("span_left_positions", "span_right_positions",
                       "span_relative_positions")


def _check(config) -> None:
  if config.data.masking != "span":
    raise ConfigError(f"the 'sbo' objective (config.objectives) predicts masked spans from "
                      f"their boundaries, which only span masking draws: set "
                      f"config.data.masking='span' (it is {config.data.masking!r}) or "
                      "drop 'sbo'.")


def _flops(cfg, batch: int, seq: int, predictions: int) -> dict[str, float]:
  """6 * B * P * (4 E^2 + E V): the head's two dense layers ([3E] -> [E], [E] -> [E])
  and the tied vocabulary at the P predictions."""
  del seq
  E, V = cfg.hidden_size, cfg.vocab_size
  return {"sbo_head": 6.0 * batch * predictions * (4 * E * E + E * V)}


OBJECTIVE = mlm.predicting("sbo", lambda out: out["sbo_logits"], heads=("sbo",),
                           fields=FIELDS, check=_check, flops=_flops)
