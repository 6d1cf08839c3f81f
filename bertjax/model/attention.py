"""Bidirectional attention over padded and packed rows, globally or in a sliding window.

One function, `attention`, for every encoder family. This is its XLA path: the
[B, 1, T, T] boolean mask of the pairs a query may attend (its key is real, in the same
document of a packed row, and within the window) is built and handed to
`jax.nn.dot_product_attention` (or, with attention-probability dropout, to
`flax.linen.dot_product_attention`). Softmax statistics are float32 on both.
Shapes: B batch, T length, N heads, D head size.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.errors import ConfigError


def allowed_pairs(padding: jax.Array, segment_ids: jax.Array | None = None,
                  window: int | None = None) -> jax.Array:
  """[B, 1, T, T] bool, True where query i may attend key j: padding[j] (1 real, 0 pad),
  segment_ids[i] == segment_ids[j] when given, and |i - j| <= window when given (the
  window is the half-width: 2 * window + 1 keys around each query, both ends included).
  """
  mask = padding.astype(bool)[:, None, None, :]
  if segment_ids is not None:
    mask = mask & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
  if window is not None:
    pos = jnp.arange(padding.shape[1])
    mask = mask & (jnp.abs(pos[:, None] - pos[None, :]) <= window)[None, None]
  return mask


def attention(q: jax.Array, k: jax.Array, v: jax.Array, padding: jax.Array,
              segment_ids: jax.Array | None = None, *, window: int | None = None,
              impl: str | None = "xla", dropout_rate: float = 0.0,
              dropout_rng: jax.Array | None = None) -> jax.Array:
  """Softmax(q k^T / sqrt(D)) v over the pairs `allowed_pairs` allows.

  q, k, v: [B, T, N, D]; padding: [B, T] (1 real, 0 pad); segment_ids: [B, T] document
  ids of a packed row, or None; window: None (global) or the half-width w (query i sees
  key j iff |i - j| <= w); impl: None or 'xla'; dropout on the attention probabilities
  when `dropout_rate > 0` and `dropout_rng` is given (a mask of its own for every
  example, head and pair, as torch's dropout draws). A query with nothing to attend
  (padding in a window of padding) gets a uniform average, never NaN.

  Returns [B, T, N, D] in q's dtype.
  """
  if impl not in (None, "xla"):
    raise ConfigError(f"config.model.attention_impl={impl!r} is not available in this "
                      "build of bertjax.model.attention; use 'xla'.")
  mask = allowed_pairs(padding, segment_ids, window)
  if dropout_rate > 0 and dropout_rng is not None:
    return nn.dot_product_attention(
        q, k, v, mask=mask, dropout_rng=dropout_rng, dropout_rate=dropout_rate,
        broadcast_dropout=False, deterministic=False, dtype=q.dtype,
        force_fp32_for_softmax=True)
  return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
