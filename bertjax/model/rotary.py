"""Rotary positions (Su et al. 2021) as every rotary family computes them: Hugging
Face's `LlamaRotaryEmbedding` / `ModernBertRotaryEmbedding` + `apply_rotary_pos_emb`.

- inv_freq = theta^(-2k/D), k < D/2, in float32; with linear scaling (`rope_type`
  'linear', factor f) inv_freq / f, i.e. positions divided by f.
- angles = position * inv_freq in float32, duplicated ([f, f], not interleaved);
  cos / sin cast to the activation dtype.
- q and k rotated in float32 by the rotate-half convention (x * cos + [-x2, x1] * sin,
  x1 / x2 the first / second halves of the head dimension), then cast back.

A family keeps one table per layer kind (`tables`: a global and a local theta, as
ModernBERT and UltraBERT; one theta gives one table for both) in the context its blocks
read. Shapes: B batch, T length, N heads, D head size.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.errors import ConfigError

# Hugging Face's rope_type names bertjax computes (config.json `rope_parameters`).
ROPE_TYPES = ("default", "linear")


def check_scaling(rope_type: str, factor: float, field: str) -> None:
  """One-line ConfigError for a scaling bertjax does not compute."""
  if rope_type not in ROPE_TYPES:
    raise ConfigError(f"{field}={rope_type!r}: bertjax computes rotary types "
                      f"{list(ROPE_TYPES)}.")
  if not factor > 0 or (rope_type == "default" and factor != 1.0):
    raise ConfigError(f"{field}={rope_type!r} with factor {factor}: the factor must be "
                      "positive, and 1 for 'default'.")


def table(position_ids: jax.Array, head_dim: int, theta, dtype, factor: float = 1.0
          ) -> tuple[jax.Array, jax.Array]:
  """[B, T] positions -> (cos, sin), each [B, T, D] in `dtype` (angles in float32).
  `theta`: a float (the config's: Hugging Face's numerics), or [B] per row (a length
  phase's theta in pretraining); `factor`: linear scaling (positions / factor)."""
  exponents = np.arange(0, head_dim, 2, dtype=np.float32) / head_dim
  if isinstance(theta, (int, float)):
    inv_freq = jnp.asarray(1.0 / (theta ** exponents), jnp.float32)  # [D/2]
  else:
    inv_freq = 1.0 / jnp.power(jnp.asarray(theta, jnp.float32)[:, None, None],
                               exponents)  # [B, 1, D/2]
  if factor != 1.0:
    inv_freq = inv_freq / factor
  angles = position_ids.astype(jnp.float32)[..., None] * inv_freq
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def tables(position_ids: jax.Array, head_dim: int, thetas: tuple[Any, Any], dtype,
           factor: float = 1.0) -> tuple[tuple[jax.Array, jax.Array], ...]:
  """The (global, local) tables of `thetas` (one computed when both are the same)."""
  first = table(position_ids, head_dim, thetas[0], dtype, factor)
  if thetas[1] is thetas[0] or (isinstance(thetas[0], float) and isinstance(thetas[1], float)
                                and thetas[1] == thetas[0]):
    return first, first
  return first, table(position_ids, head_dim, thetas[1], dtype, factor)


def apply(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x [B, T, N, D] rotated by (cos, sin) [B, T, D] (rotate-half), in float32."""
  f = x.astype(jnp.float32)
  x1, x2 = jnp.split(f, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  return (f * cos + rotated * sin).astype(x.dtype)
