"""Building blocks of the encoder: embeddings, self-attention, the post-LN block.

Every parameter carries logical axis names (`nn.with_logical_partitioning`) and every
large activation a logical constraint; the rules table in the config maps the names
onto the mesh axes ('data', 'fsdp', 'tensor'). Shapes: B batch, T length, E hidden,
N heads, D head size, M intermediate (MLP) size.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import attention as attention_lib
from bertjax.model.attention import BATCH, HEADS
from bertjax.model.config import REMAT_POLICIES, ModelConfig

LENGTH, EMBED = "activation_length", "activation_embed"
KV, MLP = "activation_kv", "activation_mlp"


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  return nn.with_logical_constraint(x, tuple(names))


def param_init(cfg: ModelConfig, names: Sequence[str | None]):
  """BERT's initialiser (truncated normal, stddev `initializer_range`) with axis names."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(cfg.initializer_range), tuple(names))


def zeros_init(names: Sequence[str | None]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(names))


def dense(cfg: ModelConfig, features: int, kernel_names, bias_names, name) -> nn.Dense:
  return nn.Dense(
      features, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
      kernel_init=param_init(cfg, kernel_names), bias_init=zeros_init(bias_names),
      name=name)


def einsum(cfg: ModelConfig, shape, kernel_names, bias_names, name) -> nn.Einsum:
  """A multi-axis projection whose kernel is created at its true shape (so its logical
  names fit it), e.g. [E, N, D] for the query."""
  return nn.Einsum(
      shape, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
      kernel_init=param_init(cfg, kernel_names), bias_init=zeros_init(bias_names),
      name=name)


def layer_norm(cfg: ModelConfig, name: str, axis_name: str = "embed") -> nn.LayerNorm:
  """LayerNorm; its mean/variance are computed in float32 even for bf16 inputs."""
  return nn.LayerNorm(
      epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (axis_name,)),
      bias_init=zeros_init((axis_name,)), name=name)


def position_ids_for(cfg: ModelConfig, input_ids: jax.Array) -> jax.Array:
  """[B, T] positions. BERT: 0..T-1. RoBERTa/XLM-R: counted from `position_offset`
  over non-padding tokens; padding gets `pad_token_id` (fairseq's convention)."""
  if cfg.position_offset == 0:
    return jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
  real = (input_ids != cfg.pad_token_id).astype(jnp.int32)
  return jnp.where(real > 0, jnp.cumsum(real, axis=1) - 1 + cfg.position_offset,
                   cfg.pad_token_id)


class Embeddings(nn.Module):
  """Token + segment + position embeddings, then LayerNorm and dropout."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.word_embeddings = nn.Embed(
        cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        embedding_init=param_init(cfg, ("vocab", "embed")))
    self.position_embeddings = nn.Embed(
        cfg.max_position_embeddings, cfg.hidden_size, dtype=cfg.dtype,
        param_dtype=cfg.param_dtype, embedding_init=param_init(cfg, ("position", "embed")))
    if cfg.type_vocab_size > 0:
      self.token_type_embeddings = nn.Embed(
          cfg.type_vocab_size, cfg.hidden_size, dtype=cfg.dtype,
          param_dtype=cfg.param_dtype, embedding_init=param_init(cfg, ("segment", "embed")))
    self.LayerNorm = layer_norm(cfg, "LayerNorm")
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
    """[B, T] ids -> [B, T, E]."""
    x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
    if self.config.type_vocab_size > 0:
      x = x + self.token_type_embeddings(token_type_ids)
    x = self.dropout(self.LayerNorm(x), deterministic=deterministic)
    return constrain(x, (BATCH, LENGTH, EMBED))

  def attend(self, x: jax.Array) -> jax.Array:
    """The tied output projection: [..., E] -> [..., vocab]."""
    return self.word_embeddings.attend(x)


class SelfAttention(nn.Module):
  """Bidirectional multi-head self-attention through `bertjax.model.attention`: the
  path is `config.attention_impl` as `attention.resolve_impl` checks or (for '')
  chooses it for this platform, dtype, length and whether attention dropout applies
  (training with `attention_dropout_rate > 0`: the XLA path, the only one with it)."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask, deterministic: bool) -> jax.Array:
    """x: [B, T, E]; mask: `encoder_mask`'s (padding [B, T], segment ids [B, T] or
    None)."""
    cfg = self.config
    padding, segment_ids = mask
    shape, names = (cfg.hidden_size, cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv")
    q, k, v = (einsum(cfg, shape, names, names[1:], n)(x, "BTE,END->BTND")
               for n in ("query", "key", "value"))  # [B, T, N, D]
    q, k, v = (constrain(t, (BATCH, LENGTH, HEADS, KV)) for t in (q, k, v))
    dropout = not deterministic and cfg.attention_dropout_rate > 0
    impl = "xla" if self.is_initializing() else attention_lib.resolve_impl(
        cfg.attention_impl, platform=jax.default_backend(), dtype=cfg.dtype,
        dropout=dropout, seq_len=x.shape[1])  # Init: shapes only (T may be 8).
    out = attention_lib.attention(
        q, k, v, padding, segment_ids, impl=impl,
        dropout_rate=cfg.attention_dropout_rate if dropout else 0.0,
        dropout_rng=self.make_rng("dropout") if dropout else None)
    out = constrain(out, (BATCH, LENGTH, HEADS, KV))
    shape = (cfg.num_heads, cfg.head_dim, cfg.hidden_size)
    return einsum(cfg, shape, ("heads", "kv", "embed"), ("embed",), "output")(
        out, "BTND,NDE->BTE")


class TransformerBlock(nn.Module):
  """Post-LN block: LN(x + Attn(x)), then LN(x + FFN(x)) with GELU, dropout 0.1.

  `scanned=True` gives the `nn.scan` signature: it returns (x, x if `keep` else None),
  the carry and the per-layer output (stacked by the scan into [L, B, T, E]).
  """

  config: ModelConfig
  scanned: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool,
               keep: bool = False):
    """[B, T, E] -> [B, T, E]."""
    cfg = self.config
    drop = nn.Dropout(cfg.dropout_rate)
    h = SelfAttention(cfg, name="attention")(x, mask, deterministic)
    x = layer_norm(cfg, "attention_norm")(x + drop(h, deterministic=deterministic))
    x = constrain(x, (BATCH, LENGTH, EMBED))
    h = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), ("mlp",), "intermediate")(x)
    h = constrain(nn.gelu(h, approximate=False), (BATCH, LENGTH, MLP))  # [B, T, M]
    h = dense(cfg, cfg.hidden_size, ("mlp", "embed"), ("embed",), "output")(h)
    x = layer_norm(cfg, "output_norm")(x + drop(h, deterministic=deterministic))
    x = constrain(x, (BATCH, LENGTH, EMBED))
    if self.scanned:
      return x, (x if keep else None)
    return x


def block_stack(cfg: ModelConfig):
  """The encoder's blocks: a list of `num_layers` modules named layer_{i}, or with
  `scan_layers` one `nn.scan`ned module named 'layers' whose parameters have a leading
  [L] axis (logical name 'layers'); either way rematerialised per `remat_policy`."""
  block = TransformerBlock
  if cfg.remat_policy != "none":
    # static_argnums count `self`: 3 = deterministic, 4 = keep (always passed).
    block = nn.remat(block, policy=REMAT_POLICIES[cfg.remat_policy],
                     prevent_cse=not cfg.scan_layers, static_argnums=(3, 4))
  if not cfg.scan_layers:
    return [block(cfg, name=f"layer_{i}") for i in range(cfg.num_layers)]
  scanned = nn.scan(
      block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
      in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers,
      metadata_params={nn.PARTITION_NAME: "layers"})
  return scanned(cfg, scanned=True, name="layers")


def encoder_mask(attention_mask: jax.Array, segment_ids: jax.Array | None = None):
  """What the blocks' attention takes: (padding [B, T] (1 real, 0 pad), document ids
  [B, T] of packed rows or None); each attention path builds its own mask from them."""
  return attention_mask, segment_ids
