"""Sentence embeddings from an encoder's token states: sentence-transformers' pooling
modes (`sentence_transformer/modules/pooling.py`, v6), computed as it computes them on
right-padded rows, then optional L2 normalisation (its `Normalize` module).

Shapes: B rows, T tokens, E hidden.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.errors import ConfigError

# config.task.pooling: sentence-transformers' `pooling_mode` names.
# 'cls': the first token's state; 'mean': the mean over the row's tokens;
# 'max': their element-wise maximum; 'mean_sqrt_len_tokens': their sum over
# sqrt(count); 'weightedmean': the mean weighted by position 1..n (SGPT's);
# 'lasttoken': the last real token's state.
POOLINGS = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


def check(name: str) -> None:
  if name not in POOLINGS:
    raise ConfigError(f"config.task.pooling={name!r}: use one of {POOLINGS}.")


def pool(hidden: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
  """[B, T, E] token states, [B, T] mask (1 real, 0 padding; right-padded) -> [B, E]
  float32 (accumulated in float32, as sentence-transformers does for half types)."""
  x = hidden.astype(jnp.float32)
  m = mask.astype(jnp.float32)[..., None]  # [B, T, 1]
  if mode == "cls":
    return x[:, 0]
  if mode == "max":
    return jnp.max(jnp.where(m > 0, x, -jnp.inf), axis=1)
  if mode in ("mean", "mean_sqrt_len_tokens"):
    count = jnp.maximum(jnp.sum(m, axis=1), 1e-9)
    return jnp.sum(x * m, axis=1) / (count if mode == "mean" else jnp.sqrt(count))
  if mode == "weightedmean":
    w = m * jnp.arange(1, x.shape[1] + 1, dtype=jnp.float32)[None, :, None]
    return jnp.sum(x * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1e-9)
  if mode == "lasttoken":
    last = jnp.maximum(jnp.sum(mask, axis=1).astype(jnp.int32) - 1, 0)  # [B]
    return jnp.take_along_axis(x * m, last[:, None, None], axis=1)[:, 0]
  raise ConfigError(f"pooling {mode!r}: use one of {POOLINGS}.")


def normalize(x: jax.Array) -> jax.Array:
  """Rows of [..., E] scaled to unit L2 norm (torch's F.normalize: norms below 1e-12
  divide by 1e-12)."""
  norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True))
  return x / jnp.maximum(norm, 1e-12)
