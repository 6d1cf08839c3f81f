"""The builders every family composes its parts from: logical-axis constraints,
initialisers, dense / einsum projections, LayerNorm and embedding tables.

Every parameter carries logical axis names (`nn.with_logical_partitioning`) and every
large activation a logical constraint; the rules table in the config maps the names
onto the mesh axes ('data', 'fsdp', 'tensor'). A builder takes the family's config for
its `dtype` / `param_dtype` (and `initializer_range` / `initializer_cutoff_factor`, the
default initialiser's).
Shapes: B batch, T length, E hidden, N heads, D head size, M intermediate size.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax

from bertjax.model import attention
from bertjax.model.attention import BATCH, HEADS

LENGTH, EMBED = "activation_length", "activation_embed"
KV, MLP = "activation_kv", "activation_mlp"
__all__ = ["ACTIVATIONS", "BATCH", "EMBED", "Embed", "HEADS", "KV", "LENGTH", "MLP",
           "ONE_HOT_ROWS", "PostLNBlock", "attention_impl", "constrain", "dense", "einsum",
           "embed", "layer_norm", "normal", "zeros_init"]

# Hugging Face's ACT2FN names -> the function ('gelu' is the exact, erf GELU).
ACTIVATIONS = {
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_new": functools.partial(nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(nn.gelu, approximate=True),
    "silu": nn.silu,
    "relu": nn.relu,
    "tanh": jax.numpy.tanh,
}


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  return nn.with_logical_constraint(x, tuple(names))


def attention_impl(module: nn.Module, cfg: Any, dropout: bool, seq_len: int,
                   bias: bool = False) -> str:
  """The path a block's attention runs: `cfg.attention_impl` as
  `attention.resolve_impl` checks or chooses it for this platform, `cfg.dtype`,
  attention `dropout`, the length and a score `bias`; 'xla' while `module`
  initialises (shapes only: T may be 8)."""
  if module.is_initializing():
    return "xla"
  return attention.resolve_impl(cfg.attention_impl, platform=jax.default_backend(),
                                dtype=cfg.dtype, dropout=dropout, seq_len=seq_len,
                                bias=bias)


def normal(std: float, cutoff: float = 2.0):
  """A normal of scale `std` truncated at +-`cutoff` times it (its standard deviation
  is then 0.88 `std` at a cutoff of 2: flax's `truncated_normal`, google-research/bert's
  `tf.truncated_normal_initializer`, torch's `trunc_normal_(std=std, a=-2 std, b=2
  std)`); `cutoff=0`: untruncated (torch's `normal_`, what transformers' BERT, ELECTRA
  and DeBERTa classes initialise with)."""
  if cutoff == 0:
    return nn.initializers.normal(std)
  return nn.initializers.truncated_normal(std, lower=-cutoff, upper=cutoff)


def zeros_init(names: Sequence[str | None]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(names))


def _kernel_init(cfg: Any, init, names):
  return nn.with_logical_partitioning(
      normal(cfg.initializer_range, cfg.initializer_cutoff_factor) if init is None else init,
      tuple(names))


def dense(cfg: Any, features: int, names: Sequence[str | None], name: str, *,
          init=None, use_bias: bool = True) -> nn.Dense:
  """[..., names[0]] -> [..., features (names[1])]; `init` the kernel's initialiser
  (default: `normal(cfg.initializer_range, cfg.initializer_cutoff_factor)`), the bias
  zeros."""
  return nn.Dense(features, use_bias=use_bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                  kernel_init=_kernel_init(cfg, init, names), bias_init=zeros_init(names[1:]),
                  name=name)


def einsum(cfg: Any, shape, names: Sequence[str | None], name: str, *, init=None,
           use_bias: bool = True, bias_names: Sequence[str | None] | None = None
           ) -> nn.Einsum:
  """A multi-axis projection whose kernel has its true shape (its logical names fit
  it), e.g. [E, N, D] for a query; its bias (`bias_names`, default names[1:]: one
  contracted axis) covers the kernel's output axes."""
  return nn.Einsum(shape, use_bias=use_bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                   kernel_init=_kernel_init(cfg, init, names),
                   bias_init=zeros_init(names[1:] if bias_names is None else bias_names),
                   name=name)


def layer_norm(cfg: Any, name: str, eps: float, *, use_bias: bool = True,
               fast_variance: bool = True, axis_name: str = "embed") -> nn.LayerNorm:
  """LayerNorm over the last axis; its statistics are float32 even for bf16 inputs
  (`fast_variance=False`: the two-pass variance, torch's)."""
  return nn.LayerNorm(
      epsilon=eps, use_bias=use_bias, use_fast_variance=fast_variance, dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), (axis_name,)),
      bias_init=zeros_init((axis_name,)), name=name)


# A table of at most this many rows is read by a one-hot matmul (`Embed`).
ONE_HOT_ROWS = 64


class Embed(nn.Embed):
  """`nn.Embed` (the same parameter) whose lookup in a table of at most `ONE_HOT_ROWS`
  rows (token types, SpanBERT's span positions) multiplies by the ids' one-hot instead
  of gathering, as google-research/bert does for token types: a gather's gradient is a
  scatter-add, and into a few rows every token of the batch adds into the same
  addresses, which a GPU serializes (BERT-base at 128 tokens, batch 256, on an H200:
  that one scatter took 59-87 ms of a 117 ms step); a matmul's gradient is a matmul,
  summed in float32. Exact: one term of each sum is nonzero."""

  def __call__(self, inputs: jax.Array) -> jax.Array:
    if not 1 < self.num_embeddings <= ONE_HOT_ROWS:
      return super().__call__(inputs)
    (table,) = self.promote_dtype(self.embedding, dtype=self.dtype, inexact=False)
    one_hot = jax.nn.one_hot(inputs, self.num_embeddings, dtype=table.dtype)
    return jax.numpy.einsum("...v,ve->...e", one_hot, table,
                            precision=jax.lax.Precision.HIGHEST)


def embed(cfg: Any, num: int, names: Sequence[str | None], *, init=None,
          name: str | None = None, features: int | None = None) -> Embed:
  """A [num, features] table (default `cfg.hidden_size`; `init` as `dense`'s)."""
  return Embed(num, features or cfg.hidden_size, dtype=cfg.dtype,
               param_dtype=cfg.param_dtype,
               embedding_init=_kernel_init(cfg, init, names), name=name)


class PostLNBlock(nn.Module):
  """The post-LN transformer block of BERT, ELECTRA and DeBERTa: LN(x + Attn(x)), then
  LN(x + FFN(x)) ('intermediate', the activation, 'output'), dropout on each branch.
  A family's block is a subclass naming its self-attention module (`attention`:
  `attention(config, name='attention')(x, context, deterministic)` -> [B, T, E]), its
  `activation(config, h)` and its `norm(config, name)`."""

  config: Any
  scanned: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, context, layer, deterministic: bool,
               keep: bool = False):
    """[B, T, E] -> [B, T, E] (`layer`: unused, every block is alike)."""
    del layer
    cfg = self.config
    drop = nn.Dropout(cfg.dropout_rate)
    h = self.attention(cfg, name="attention")(x, context, deterministic)
    x = self.norm(cfg, "attention_norm")(x + drop(h, deterministic=deterministic))
    x = constrain(x, (BATCH, LENGTH, EMBED))
    h = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x)
    h = constrain(self.activation(cfg, h), (BATCH, LENGTH, MLP))  # [B, T, M]
    h = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h)
    x = self.norm(cfg, "output_norm")(x + drop(h, deterministic=deterministic))
    x = constrain(x, (BATCH, LENGTH, EMBED))
    return (x, x if keep else None) if self.scanned else x
