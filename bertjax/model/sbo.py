"""SpanBERT's span-boundary objective (SBO) head (Joshi et al. 2020, section 3.2).

Each token x_i of a masked span (s..e) is predicted from the encoder outputs of the two
boundary tokens just outside the span and a relative-position embedding:

  y_i = f([z_{s-1}; z_{e+1}; p_{i-s+1}]),  f = 2 x (dense + GELU + LayerNorm),

then the tied input embedding plus a vocabulary bias, as in the MLM head
(`stack.tied_logits`). A head of the 'bert' family (`bert.FAMILY.heads`, 'sbo').
Shapes: B batch, T length, P predictions per example, E hidden, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import layers, stack
from bertjax.model.layers import BATCH, EMBED


class SpanBoundaryHead(nn.Module):
  """[z_{s-1}; z_{e+1}; p_{i-s+1}] -> two GELU + LayerNorm layers -> tied vocab logits."""

  config: Any  # the 'bert' family's ModelConfig

  @nn.compact
  def __call__(self, out: dict, encoder: stack.Encoder, span_left_positions: jax.Array,
               span_right_positions: jax.Array, span_relative_positions: jax.Array
               ) -> jax.Array:
    """out: the encoder's output ('last_hidden_state' [B, T, E]); the span left and
    right boundary positions (s - 1, e + 1) and offsets i - s (clipped to
    `sbo_max_positions - 1`) of each prediction, [B, P] each; encoder: the module
    whose `attend` is the tied output embedding.

    Returns [B, P, V] logits.
    """
    cfg = self.config
    hidden = out["last_hidden_state"]
    take = lambda pos: jnp.take_along_axis(hidden, pos[..., None].astype(jnp.int32), axis=1)
    positions = layers.embed(cfg, cfg.sbo_max_positions, ("position", "embed"),
                             name="position_embeddings")
    left, right = span_left_positions, span_right_positions
    rel = jnp.clip(span_relative_positions, 0, cfg.sbo_max_positions - 1)
    x = jnp.concatenate([take(left), take(right), positions(rel)], axis=-1)  # [B, P, 3E]
    x = layers.constrain(x, (BATCH, None, None))
    for k in range(2):
      kernel_names = (None, "hidden") if k == 0 else ("embed", "hidden")
      x = layers.dense(cfg, cfg.hidden_size, kernel_names, f"dense_{k}")(x)
      x = layers.layer_norm(cfg, f"norm_{k}", cfg.layer_norm_eps)(layers.gelu(x))
    x = layers.constrain(x, (BATCH, None, EMBED))
    return stack.tied_logits(self, cfg, x, encoder)
