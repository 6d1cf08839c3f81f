"""Parameters between the unscanned layout (encoder/layer_{i}/..., the Hugging Face
conversion's and the default) and the scanned one (`config.model.scan_layers=True`:
the first `unscanned` blocks stay encoder/layer_{i}, the rest are encoder/layers/...
with a leading [L - unscanned] axis; `Family.unscanned_layers` gives a family's
count). Both directions are exact (stack/unstack).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def is_scanned(params: dict) -> bool:
  return "layers" in params["encoder"]


def scan_params(params: dict, unscanned: int = 0) -> dict:
  """Unscanned -> scanned: encoder/layer_{i}/p [...] (i >= `unscanned`) ->
  encoder/layers/p [L - unscanned, ...]. Scanned parameters (or a model with no block
  past the unscanned ones) are returned unchanged."""
  encoder = dict(params["encoder"])
  if is_scanned(params) or f"layer_{unscanned}" not in encoder:
    return params
  count = sum(k.startswith("layer_") for k in encoder)
  blocks = [encoder.pop(f"layer_{i}") for i in range(unscanned, count)]
  encoder["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
  return {**params, "encoder": encoder}


def unscan_params(params: dict, unscanned: int = 0) -> dict:
  """Scanned -> unscanned: encoder/layers/p [L - unscanned, ...] ->
  encoder/layer_{unscanned + i}/p [...]. Unscanned parameters are returned unchanged."""
  if not is_scanned(params):
    return params
  encoder = dict(params["encoder"])
  stacked = encoder.pop("layers")
  for i in range(jax.tree.leaves(stacked)[0].shape[0]):
    encoder[f"layer_{unscanned + i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return {**params, "encoder": encoder}


def to_layout(params: dict, scan_layers: bool, unscanned: int = 0) -> Any:
  """The parameters in the layout a model with `scan_layers` expects."""
  return scan_params(params, unscanned) if scan_layers else unscan_params(params, unscanned)
