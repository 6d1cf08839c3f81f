"""Parameters between the unscanned layout (encoder/layer_{i}/..., the Hugging Face
conversion's and the default) and the scanned one (encoder/layers/... with a leading
[L] axis, `config.model.scan_layers=True`). Both directions are exact (stack/unstack).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def _layer_keys(encoder: dict) -> list[str]:
  return [f"layer_{i}" for i in range(sum(k.startswith("layer_") for k in encoder))]


def is_scanned(params: dict) -> bool:
  return "layers" in params["encoder"]


def scan_params(params: dict) -> dict:
  """Unscanned -> scanned: encoder/layer_{i}/p [...] -> encoder/layers/p [L, ...].
  Scanned parameters are returned unchanged."""
  if is_scanned(params):
    return params
  encoder = dict(params["encoder"])
  blocks = [encoder.pop(k) for k in _layer_keys(encoder)]
  encoder["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
  return {**params, "encoder": encoder}


def unscan_params(params: dict) -> dict:
  """Scanned -> unscanned: encoder/layers/p [L, ...] -> encoder/layer_{i}/p [...].
  Unscanned parameters are returned unchanged."""
  if not is_scanned(params):
    return params
  encoder = dict(params["encoder"])
  stacked = encoder.pop("layers")
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  for i in range(num_layers):
    encoder[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return {**params, "encoder": encoder}


def to_layout(params: dict, scan_layers: bool) -> Any:
  """The parameters in the layout a model with `scan_layers` expects."""
  return scan_params(params) if scan_layers else unscan_params(params)
