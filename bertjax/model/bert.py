"""The 'bert' family (BERT, RoBERTa, XLM-R, SpanBERT): its parts of the shared encoder
(`stack.py`): the config, the absolute-position embedding, the post-LN block, the
pooler, the MLM transform, its own heads (NSP; SpanBERT's SBO in `sbo.py`) and the
task heads' trunk (Hugging Face's Bert/RobertaFor*).

Shapes: B batch, T length, E hidden, N heads, D head size, M intermediate size.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.errors import ConfigError
from bertjax.model import attention as attention_lib, layers
from bertjax.model.config import FamilyConfig
from bertjax.model.family import Family, Head
from bertjax.model.layers import BATCH, EMBED, HEADS, KV, LENGTH, constrain
from bertjax.model.sbo import SpanBoundaryHead


@dataclasses.dataclass(frozen=True)
class ModelConfig(FamilyConfig):
  """Hyperparameters of an encoder of the 'bert' family (BERT, RoBERTa, XLM-R,
  SpanBERT) and its pretraining heads.

  BERT: `type_vocab_size=2`, `position_offset=0`. RoBERTa / XLM-R: `type_vocab_size=1`
  and `position_offset=pad_token_id + 1` (positions count from past the padding index,
  padding tokens get position `pad_token_id`, exactly as fairseq and Hugging Face do).
  """

  family: ClassVar[str] = "bert"  # config.model.family (bertjax.model.FAMILIES)

  type_vocab_size: int = 2
  position_offset: int = 0
  layer_norm_eps: float = 1e-12
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  pooler: bool = True
  nsp: bool = True
  sbo: bool = False  # SpanBERT's span-boundary objective head (with span masking)
  sbo_max_positions: int = 32  # relative positions inside a span the SBO head embeds

  def __post_init__(self):
    """Every field in range, or a one-line ConfigError naming it."""
    self.check_common(("type_vocab_size", "sbo_max_positions"),
                      ("dropout_rate", "attention_dropout_rate"))
    if self.hidden_size % self.num_heads:
      raise ConfigError(
          f"config.model.hidden_size={self.hidden_size} is not divisible by "
          f"config.model.num_heads={self.num_heads}; pick sizes that divide.")
    if not self.position_offset >= 0:
      raise ConfigError(f"config.model.position_offset={self.position_offset} must be >= 0.")
    for name in ("layer_norm_eps", "initializer_range"):
      if not getattr(self, name) > 0:
        raise ConfigError(f"config.model.{name}={getattr(self, name)} must be positive.")
    if self.nsp and not self.pooler:
      raise ConfigError("config.model.nsp=True needs config.model.pooler=True.")

  @property
  def classifier_dropout(self) -> float:
    """The task heads' own dropout: the encoder's."""
    return self.dropout_rate


def _layer_norm(cfg: ModelConfig, name: str) -> nn.LayerNorm:
  return layers.layer_norm(cfg, name, cfg.layer_norm_eps)


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
    self.word_embeddings = layers.embed(cfg, cfg.vocab_size, ("vocab", "embed"))
    self.position_embeddings = layers.embed(
        cfg, cfg.max_position_embeddings, ("position", "embed"),
        one_hot_rows=layers.POSITION_ONE_HOT_ROWS)
    if cfg.type_vocab_size > 0:
      self.token_type_embeddings = layers.embed(cfg, cfg.type_vocab_size,
                                                ("segment", "embed"))
    self.LayerNorm = _layer_norm(cfg, "LayerNorm")
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def __call__(self, input_ids, attention_mask, token_type_ids, position_ids,
               segment_ids, deterministic: bool):
    """[B, T] ids -> ([B, T, E], the blocks' context: (attention_mask, segment_ids));
    position_ids default to `position_ids_for`."""
    if position_ids is None:
      position_ids = position_ids_for(self.config, input_ids)
    x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
    if self.config.type_vocab_size > 0:
      x = x + self.token_type_embeddings(token_type_ids)
    x = self.dropout(self.LayerNorm(x), deterministic=deterministic)
    return constrain(x, (BATCH, LENGTH, EMBED)), (attention_mask, segment_ids)

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
  def __call__(self, x: jax.Array, context, deterministic: bool) -> jax.Array:
    """x: [B, T, E]; context: (padding [B, T] (1 real, 0 pad), segment ids [B, T] or
    None)."""
    cfg = self.config
    padding, segment_ids = context
    shape, names = (cfg.hidden_size, cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv")
    q, k, v = (layers.einsum(cfg, shape, names, n)(x, "BTE,END->BTND")
               for n in ("query", "key", "value"))  # [B, T, N, D]
    q, k, v = (constrain(t, (BATCH, LENGTH, HEADS, KV)) for t in (q, k, v))
    dropout = not deterministic and cfg.attention_dropout_rate > 0
    impl = layers.attention_impl(self, cfg, dropout, x.shape[1])
    out = attention_lib.attention(
        q, k, v, padding, segment_ids, impl=impl,
        dropout_rate=cfg.attention_dropout_rate if dropout else 0.0,
        dropout_rng=self.make_rng("dropout") if dropout else None)
    out = constrain(out, (BATCH, LENGTH, HEADS, KV))
    shape = (cfg.num_heads, cfg.head_dim, cfg.hidden_size)
    return layers.einsum(cfg, shape, ("heads", "kv", "embed"), "output",
                         bias_names=("embed",))(out, "BTND,NDE->BTE")


class TransformerBlock(layers.PostLNBlock):
  """Post-LN block: LN(x + Attn(x)), then LN(x + FFN(x)) with exact GELU, dropout 0.1."""

  attention = SelfAttention
  activation = staticmethod(lambda cfg, h: layers.gelu(h))
  norm = staticmethod(_layer_norm)


class Pooler(nn.Module):
  """dense + tanh of [CLS] vectors [..., E] -> [..., E] (its kernel and bias directly
  under its own name)."""

  config: ModelConfig

  def setup(self):
    self.dense = layers.dense(self.config, self.config.hidden_size, ("embed", "hidden"),
                              "dense")
    nn.share_scope(self, self.dense)

  def __call__(self, cls: jax.Array) -> jax.Array:
    return jnp.tanh(self.dense(cls))


class NSPHead(nn.Module):
  """Next-sentence prediction: a 2-way linear layer on the pooled [CLS] -> [B, 2]."""

  config: ModelConfig

  def setup(self):
    self.dense = layers.dense(self.config, 2, ("embed", "classes"), "dense")
    nn.share_scope(self, self.dense)

  def __call__(self, out: dict, encoder) -> jax.Array:
    del encoder
    return self.dense(out["pooled"])


def mlm_transform(cfg: ModelConfig, x: jax.Array) -> jax.Array:
  """The MLM head's 'transform' (dense), GELU and 'transform_norm'."""
  x = layers.dense(cfg, cfg.hidden_size, ("embed", "hidden"), "transform")(x)
  return _layer_norm(cfg, "transform_norm")(layers.gelu(x))


# ---- The task heads' trunk (Hugging Face's Bert/RobertaFor* heads) ----------------

def task_features(config: ModelConfig, out: dict, deterministic: bool, pooled: bool,
                  dropout: bool = True) -> jax.Array:
  """Pooled, [B, E]: the pooler's output (dense + tanh on [CLS]) when the encoder has
  one, else RoBERTa's classification head's first half (a dense + tanh, the head's own
  'pooler', over the dropped-out [CLS] vector), then dropout. Per token, [B, T, E]: the
  last hidden states, with dropout when `dropout` (tagging; BERT's span-QA head reads
  them as they are)."""
  x = out["last_hidden_state"]
  if not pooled:
    return nn.Dropout(config.dropout_rate)(x, deterministic=deterministic) if dropout else x
  drop = nn.Dropout(config.dropout_rate)  # Dropout_0, before the [CLS] one (its rngs)
  if config.pooler:
    x = out["pooled"]
  else:
    cls = nn.Dropout(config.dropout_rate)(x[:, 0], deterministic=deterministic)
    x = Pooler(config, name="pooler")(cls)
  return drop(x, deterministic=deterministic)


def output_layer(config: ModelConfig, features: int, name: str) -> nn.Dense:
  """A head projection [E] -> [features] with BERT's initialiser and logical axes."""
  return layers.dense(config, features, ("embed", "classes"), name)


def head_flops(cfg: ModelConfig, batch: int) -> dict[str, float]:
  """6 * B * (E^2 + 2 E): the pooler and the NSP classifier on [CLS] (each when
  present; SBO's head is not counted)."""
  E = cfg.hidden_size
  return {"pooler_nsp": 6.0 * batch * ((E * E if cfg.pooler else 0) + (2 * E if cfg.nsp else 0))}


FAMILY = Family(
    name="bert", config=ModelConfig, embeddings=Embeddings, block=TransformerBlock,
    mlm_transform=mlm_transform,
    # query, key, value, output E^2 each; intermediate and output E M each.
    block_weights=lambda c: 4 * c.hidden_size ** 2 + 2 * c.hidden_size * c.intermediate_size,
    task_features=task_features, output_layer=output_layer, pooler=Pooler,
    heads=(Head("nsp", NSPHead),
           Head("sbo", SpanBoundaryHead, ("span_left_positions", "span_right_positions",
                                          "span_relative_positions"))),
    head_flops=head_flops,
    # BERT's recipe trains the pooler and NSP; RoBERTa's (positions past the padding
    # id) neither, but a pooler serves its classifiers.
    pretraining_heads=lambda c: dataclasses.replace(c, pooler=True,
                                                    nsp=c.position_offset == 0))
