"""SpanBERT's span-boundary objective (SBO) head (Joshi et al. 2020, section 3.2).

Each token x_i of a masked span (s..e) is predicted from the encoder outputs of the two
boundary tokens just outside the span and a relative-position embedding:

  y_i = f([z_{s-1}; z_{e+1}; p_{i-s+1}]),  f = 2 x (dense + GELU + LayerNorm),

then the tied input embedding plus a vocabulary bias, as in the MLM head. Shapes:
B batch, T length, P predictions per example, E hidden, V vocabulary.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import layers
from bertjax.model.config import ModelConfig
from bertjax.model.layers import BATCH, EMBED


class SpanBoundaryHead(nn.Module):
  """[z_{s-1}; z_{e+1}; p_{i-s+1}] -> two GELU + LayerNorm layers -> tied vocab logits."""

  config: ModelConfig

  @nn.compact
  def __call__(self, hidden: jax.Array, left: jax.Array, right: jax.Array,
               relative: jax.Array, encoder) -> jax.Array:
    """hidden [B, T, E] encoder output; left, right [B, P] boundary positions (s - 1,
    e + 1); relative [B, P] offsets i - s (clipped to `sbo_max_positions - 1`);
    encoder: the module whose `attend` is the tied output embedding.

    Returns [B, P, V] logits.
    """
    cfg = self.config
    take = lambda pos: jnp.take_along_axis(hidden, pos[..., None].astype(jnp.int32), axis=1)
    positions = nn.Embed(cfg.sbo_max_positions, cfg.hidden_size, dtype=cfg.dtype,
                         param_dtype=cfg.param_dtype, name="position_embeddings",
                         embedding_init=layers.param_init(cfg, ("position", "embed")))
    rel = jnp.clip(relative, 0, cfg.sbo_max_positions - 1)
    x = jnp.concatenate([take(left), take(right), positions(rel)], axis=-1)  # [B, P, 3E]
    x = layers.constrain(x, (BATCH, None, None))
    for k in range(2):
      kernel_names = (None, "hidden") if k == 0 else ("embed", "hidden")
      x = layers.dense(cfg, cfg.hidden_size, kernel_names, ("hidden",), f"dense_{k}")(x)
      x = layers.layer_norm(cfg, f"norm_{k}")(nn.gelu(x, approximate=False))
    x = layers.constrain(x, (BATCH, None, EMBED))
    bias = self.param("bias", layers.zeros_init(("vocab",)), (cfg.vocab_size,),
                      cfg.param_dtype)
    logits = encoder.attend(x) + bias.astype(cfg.dtype)
    return layers.constrain(logits, (BATCH, None, "activation_vocab"))
