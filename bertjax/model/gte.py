"""The 'gte' family: Alibaba's GTE / mGTE encoders (gte-multilingual-base,
gte-base-en-v1.5, gte-large-en-v1.5), Hugging Face's `GteModel` (transformers
`models/gte`), on the layer kit. NomicBERT (`nomic_bert.py`) is this family's layout
with other constants and reuses its parts.

- Embeddings: word (+ token type when `type_vocab_size` > 0), LayerNorm, dropout; no
  position table: rotary positions (one theta, `rope_theta`; 'linear' scaling by
  `rope_factor`) on q and k in every block, restarting in each document of a packed row.
- Blocks (post-LN, BERT's order): LN(x + drop(Attn(x))), LN(x + drop(MLP(x))). Attn:
  q / k / v / o projections with biases (`qkv_bias`), global. MLP: GLU, act(gate) * up
  without biases, dropout (`mlp_dropout`), down_proj with a bias (`mlp_out_bias`).
- MLM head: dense + GELU + LayerNorm, the tied word embedding and a vocabulary bias
  (Hugging Face's `lm_head.decoder.bias`). No final norm.
- Task heads as Hugging Face's GteFor*: sequence classification reads the pooler (dense
  + tanh on the first token; the encoder's when `pooler`, else the head's own), then
  dropout (`classifier_dropout`) and a linear layer; token classification: dropout and
  a linear layer per token. Multiple choice and span QA use bertjax's generic heads on
  the same features (Hugging Face has no GTE class for them).

Parameters: encoder/embeddings/{word_embeddings, token_type_embeddings, LayerNorm},
encoder/layer_i/{attention/{q,k,v,o}_proj, attention_norm, mlp/{gate,up,down}_proj,
output_norm}, encoder/pooler, mlm/{dense, layer_norm, bias} (`bertjax.hf.gte` maps
them). Shapes: B batch, T length, E hidden, N heads, K key / value heads, D head size,
M intermediate size.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.errors import ConfigError
from bertjax.model import layers, rotary, stack
from bertjax.model.bert import Pooler
from bertjax.model.config import FamilyConfig
from bertjax.model.family import Family
from bertjax.model.layers import ACTIVATIONS, BATCH, EMBED, LENGTH, constrain


@dataclasses.dataclass(frozen=True)
class GteConfig(FamilyConfig):
  """Hyperparameters of a GTE encoder and its heads; the defaults are
  gte-multilingual-base's (Hugging Face's `GteConfig` defaults; its field names where
  bertjax's shared ones do not already name them)."""

  family: ClassVar[str] = "gte"  # config.model.family (bertjax.model.FAMILIES)
  # Rotary positions count from 0; no NSP or SBO head.
  position_offset: ClassVar[int] = 0
  nsp: ClassVar[bool] = False
  sbo: ClassVar[bool] = False
  # What NomicBERT sets otherwise (class constants: Hugging Face has no field for them).
  qkv_bias: ClassVar[bool] = True  # q / k / v / o projections with biases
  mlp_out_bias: ClassVar[bool] = True  # down_proj with a bias
  mlp_dropout: ClassVar[bool] = True  # dropout (dropout_rate) on act(gate) * up
  head_activation: ClassVar[str | None] = "gelu"  # the MLM transform's (None: hidden_act)
  free_head_dim: ClassVar[bool] = False  # a head_dim field (else hidden_size / num_heads)

  vocab_size: int = 250048
  max_position_embeddings: int = 8192  # the context trained for (no position table)
  pad_token_id: int = 1
  initializer_cutoff_factor: float = 0.0  # Hugging Face's untruncated normal_
  type_vocab_size: int = 1  # token types embedded (0: none, gte-base-en-v1.5)
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"  # the GLU's activation (a key of ACTIVATIONS)
  dropout_rate: float = 0.1  # hidden_dropout_prob: embeddings, both residual branches, GLU
  attention_dropout_rate: float = 0.0  # attention_probs_dropout_prob
  classifier_dropout_rate: float | None = None  # classifier_dropout; None: dropout_rate
  rope_theta: float = 160_000.0
  rope_type: str = "default"  # 'default' or 'linear' (positions / rope_factor)
  rope_factor: float = 1.0
  # Training only: the theta of each pretraining length phase (config.data.length_phases;
  # mGTE: 10k at 2,048 tokens, then 160k at 8,192), carried by the phase's batches as
  # `rope_theta`; the last must be `rope_theta`. (): rope_theta throughout.
  rope_theta_phases: tuple[float, ...] = ()
  pooler: bool = False  # the encoder's pooler (Hugging Face's ForSequenceClassification)

  def __post_init__(self):
    """Every field in range, or a one-line ConfigError naming it."""
    self.check_common((), ("dropout_rate", "attention_dropout_rate")
                      + (("classifier_dropout_rate",)
                         if self.classifier_dropout_rate is not None else ()))
    if self.head_dim % 2 or self.head_dim < 2:
      raise ConfigError(f"config.model head size {self.head_dim} (hidden_size / num_heads"
                        " or head_dim) must be whole and even: rotary pairs its halves.")
    if self.hidden_size % self.num_heads and not self.free_head_dim:
      raise ConfigError(f"config.model.hidden_size={self.hidden_size} is not divisible by "
                        f"config.model.num_heads={self.num_heads}.")
    if not 0 <= self.type_vocab_size:
      raise ConfigError(f"config.model.type_vocab_size={self.type_vocab_size} must be >= 0.")
    for name in ("layer_norm_eps", "initializer_range", "rope_theta"):
      if not getattr(self, name) > 0:
        raise ConfigError(f"config.model.{name}={getattr(self, name)} must be positive.")
    if self.hidden_act not in ACTIVATIONS:
      raise ConfigError(f"config.model.hidden_act={self.hidden_act!r}: use one of "
                        f"{sorted(ACTIVATIONS)}.")
    rotary.check_scaling(self.rope_type, self.rope_factor, "config.model.rope_type")
    phases = self.rope_theta_phases
    if phases and not (all(isinstance(t, (int, float)) and t > 0 for t in phases)
                       and phases[-1] == self.rope_theta):
      raise ConfigError(f"config.model.rope_theta_phases={phases}: positive thetas, one per "
                        f"length phase, the last equal to config.model.rope_theta="
                        f"{self.rope_theta} (what inference and export use).")

  @property
  def classifier_dropout(self) -> float:
    """The task heads' own dropout: `classifier_dropout_rate`, else the encoder's."""
    return (self.dropout_rate if self.classifier_dropout_rate is None
            else self.classifier_dropout_rate)


def layer_norm(cfg: GteConfig, name: str) -> nn.LayerNorm:
  """LayerNorm over E with a bias; float32 statistics, torch's two-pass variance."""
  return layers.layer_norm(cfg, name, cfg.layer_norm_eps, fast_variance=False)


class Embeddings(nn.Module):
  """Word (+ token type) embeddings, LayerNorm, dropout: [B, T] ids -> [B, T, E]; and
  the blocks' context: the padding, the documents, the rotary table."""

  config: GteConfig

  def setup(self):
    cfg = self.config
    self.word_embeddings = layers.embed(cfg, cfg.vocab_size, ("vocab", "embed"))
    if cfg.type_vocab_size > 0:
      self.token_type_embeddings = layers.embed(cfg, cfg.type_vocab_size,
                                                ("segment", "embed"))
    self.LayerNorm = layer_norm(cfg, "LayerNorm")
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def __call__(self, input_ids, attention_mask, token_type_ids, position_ids,
               segment_ids, deterministic: bool, rope_theta=None):
    """position_ids [B, T] rotary positions (default: 0..T-1, or restarting in each
    document of `segment_ids`); rope_theta [B]: the rotary theta per row (a pretraining
    length phase's, `phase_inputs`; default the config's). -> ([B, T, E],
    (attention_mask, segment_ids, (table, table)): one rotary table, every block
    global)."""
    cfg = self.config
    if position_ids is None:
      position_ids = (jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
                      if segment_ids is None else stack.document_positions(segment_ids))
    theta = cfg.rope_theta if rope_theta is None else rope_theta
    tables = rotary.tables(position_ids, cfg.head_dim, (theta, theta), cfg.dtype,
                           cfg.rope_factor)
    x = self.word_embeddings(input_ids)
    if cfg.type_vocab_size > 0:
      x = x + self.token_type_embeddings(token_type_ids)
    x = self.dropout(self.LayerNorm(x), deterministic=deterministic)
    return constrain(x, (BATCH, LENGTH, EMBED)), (attention_mask, segment_ids, tables)

  def attend(self, x: jax.Array) -> jax.Array:
    """The tied output projection: [..., E] -> [..., V]."""
    return self.word_embeddings.attend(x)


class Block(layers.PostLNBlock):
  """Post-LN block: LN(x + drop(Attn(x))), LN(x + drop(GLU(x))). Attn: q [E, N, D],
  k / v [E, K, D], rotary q and k, o [N, D, E] (biases per `qkv_bias`), dropout on the
  probabilities only. GLU: act(gate_proj x) * up_proj x [B, T, M], dropout (per
  `mlp_dropout`), down_proj [M, E] (bias per `mlp_out_bias`)."""

  norm = staticmethod(layer_norm)
  attention = staticmethod(lambda cfg, name: layers.SelfAttention(
      cfg, bias=cfg.qkv_bias, out_bias=cfg.qkv_bias, dropout=cfg.attention_dropout_rate,
      out_dropout=0.0, name=name))
  feed_forward = staticmethod(lambda cfg, name: layers.GatedMLP(
      cfg, cfg.hidden_act, out_bias=cfg.mlp_out_bias,
      dropout=cfg.dropout_rate if cfg.mlp_dropout else 0.0, name=name))


def mlm_transform(cfg: GteConfig, x: jax.Array) -> jax.Array:
  """The MLM head's dense (E -> E, bias), activation and 'layer_norm': [B, P, E]."""
  x = layers.dense(cfg, cfg.hidden_size, ("embed", "hidden"), "dense")(x)
  act = ACTIVATIONS[cfg.head_activation or cfg.hidden_act]
  return layer_norm(cfg, "layer_norm")(act(x))


def task_features(cfg: GteConfig, out: dict, deterministic: bool, pooled: bool,
                  dropout: bool = True) -> jax.Array:
  """Pooled [B, E]: the encoder's pooler output when it has one (`pooler`), else the
  head's own 'pooler' (dense + tanh) on the first token, then dropout
  (`classifier_dropout`), as GteForSequenceClassification. Per token [B, T, E]: the
  last hidden states, with dropout when `dropout` (tagging: GteForTokenClassification;
  span QA reads them as they are)."""
  x = out["last_hidden_state"]
  drop = nn.Dropout(cfg.classifier_dropout)
  if not pooled:
    return drop(x, deterministic=deterministic) if dropout else x
  x = out["pooled"] if cfg.pooler else Pooler(cfg, name="pooler")(x[:, 0])
  return drop(x, deterministic=deterministic)


def output_layer(cfg: GteConfig, features: int, name: str) -> nn.Dense:
  """A task's linear layer [E] -> [features] with a bias (Hugging Face's `classifier`)."""
  return layers.dense(cfg, features, ("embed", "classes"), name)


def block_weights(cfg: GteConfig) -> int:
  """q and o E N D each, k and v E K D each, the GLU's gate, up and down E M each."""
  E, N, K, D, M = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                   cfg.intermediate_size)
  return 2 * E * N * D + 2 * E * K * D + 3 * E * M


def phase_inputs(cfg: GteConfig, lengths: Sequence[int]) -> list[dict[str, float]]:
  """Pretraining's length phases (their row lengths) -> each phase's constant per-row
  input {'rope_theta': theta} from `rope_theta_phases` ({} without), or a one-line
  ConfigError when the counts differ."""
  thetas = cfg.rope_theta_phases
  if not thetas:
    return [{} for _ in lengths]
  if len(thetas) != len(lengths):
    raise ConfigError(f"config.model.rope_theta_phases={thetas} has {len(thetas)} thetas "
                      f"for {len(lengths)} length phases (config.data.length_phases): give "
                      "one per phase, or () for one theta.")
  return [{"rope_theta": float(t)} for t in thetas]


def head_flops(cfg: GteConfig, batch: int) -> dict[str, float]:
  """6 * B * E^2: the encoder's pooler on the first token, when it has one."""
  return {"pooler": 6.0 * batch * cfg.hidden_size ** 2 if cfg.pooler else 0.0}


FAMILY = Family(
    name="gte", config=GteConfig, embeddings=Embeddings, block=Block,
    mlm_transform=mlm_transform, block_weights=block_weights,
    task_features=task_features, output_layer=output_layer, pooler=Pooler,
    head_flops=head_flops, inputs=("rope_theta",), phase_inputs=phase_inputs)
