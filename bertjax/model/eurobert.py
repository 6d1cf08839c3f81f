"""EuroBERT (Boizard et al. 2025, arXiv 2503.05500: EuroBERT-210m, -610m, -2.1B), exact to
Hugging Face's `transformers.EuroBertForMaskedLM` (v5.24), on the layer kit.

- Embeddings: the token embedding alone (no norm, no dropout, no positions, no segments).
- Llama's pre-norm blocks: x + Attn(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)); q / k / v /
  o projections (biases iff `attention_bias`), grouped-query attention (`num_kv_heads`
  key / value heads, each shared by num_heads / num_kv_heads query heads: EuroBERT-2.1B
  has 18 over 6), every layer global; SwiGLU gate_proj / up_proj / down_proj (biases iff
  `mlp_bias`), act(gate) * up. RMSNorm statistics in float32 (eps `rms_norm_eps`).
- Rotary positions on q and k (`rotary`: theta `rope_theta`, 250,000 in EuroBERT's
  checkpoints; 'linear' scaling by `rope_factor`), a final RMSNorm.
- MLM head: Hugging Face's `lm_head`, a Linear [E, V] on the final norm's output, untied
  from the token embedding (`tie_word_embeddings=False`), with a bias iff `mlp_bias`
  (Hugging Face builds it with bias=config.mlp_bias): no transform.
- Task heads (EuroBertForSequenceClassification / ForTokenClassification):
  `classifier_pooling` 'cls' (Hugging Face's 'bos': the first token), 'mean' (over the
  real tokens), each then dense + GELU + classifier; 'late' (Hugging Face's default):
  dense + GELU + classifier at every token, the logits averaged over the real tokens,
  computed here as the classifier of the averaged GELU features (the classifier is
  affine: the same up to float rounding). Tagging: the classifier on each token. No
  dropout in either (`classifier_dropout`, 0, is bertjax's). Multiple choice and span
  QA run on the same features (Hugging Face has no such EuroBERT classes).
- Packed rows: `segment_ids` [B, T] isolate documents and, without explicit
  `position_ids`, restart the rotary positions at 0 in each (`stack.document_positions`).
  'late' pooling is computed over a row's tokens, so packed classification rows
  (several examples a row) need 'cls' or 'mean': `stack.Encoder.slots` says so.
- Initialisation: Hugging Face's (PreTrainedModel._init_weights): every Linear and the
  embedding from an untruncated normal of `initializer_range`, biases 0, norms 1.

Parameters carry Hugging Face's names (`bertjax.hf.eurobert`). UltraBERT
(`ultrabert.py`) reuses these parts. Shapes: B batch, T length, E hidden, N heads,
K key / value heads, D head size, M intermediate size, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.errors import ConfigError
from bertjax.model import layers, rotary, stack
from bertjax.model.config import FamilyConfig
from bertjax.model.family import Family
from bertjax.model.layers import ACTIVATIONS, BATCH, EMBED, LENGTH, constrain

POOLINGS = ("cls", "mean", "late")


@dataclasses.dataclass(frozen=True)
class EuroBertConfig(FamilyConfig):
  """Hyperparameters of a EuroBERT encoder and its heads; the defaults are
  EuroBERT-210m's (its config.json: Hugging Face's `EuroBertConfig` defaults but the
  rotary theta, 250,000; the head size and key / value heads default as there)."""

  family: ClassVar[str] = "eurobert"  # config.model.family (bertjax.model.FAMILIES)
  position_offset: ClassVar[int] = 0  # rotary positions count from 0
  type_vocab_size: ClassVar[int] = 0
  nsp: ClassVar[bool] = False
  sbo: ClassVar[bool] = False
  pooler: ClassVar[bool] = False

  vocab_size: int = 128256  # Llama-3's vocabulary (<|mask|> = 128002)
  max_position_embeddings: int = 8192  # The context trained for (no position table).
  pad_token_id: int = 128001  # <|end_of_text|>
  initializer_cutoff_factor: float = 0.0  # Hugging Face's untruncated normal_
  # K key / value heads (grouped-query attention when < num_heads); None: num_heads.
  num_kv_heads: int | None = None
  head_dim: int | None = None  # D; None: hidden_size // num_heads
  hidden_act: str = "silu"  # SwiGLU's activation (a key of ACTIVATIONS)
  rms_norm_eps: float = 1e-5
  rope_theta: float = 250_000.0
  rope_type: str = "default"  # or 'linear' (positions / rope_factor)
  rope_factor: float = 1.0
  attention_bias: bool = False  # q, k, v, o with biases
  mlp_bias: bool = False  # gate, up, down with biases (and the MLM decoder's)
  attention_dropout: float = 0.0  # on the attention probabilities (Hugging Face's)
  tie_word_embeddings: bool = False  # the MLM decoder is the token embedding
  classifier_pooling: str = "late"  # 'cls' (Hugging Face's 'bos'), 'mean' or 'late'
  classifier_dropout: float = 0.0  # bertjax's: after the task features (HF has none)

  def __post_init__(self):
    """Resolves `num_kv_heads` / `head_dim` None; every field in range, or a one-line
    ConfigError naming it."""
    if self.num_kv_heads is None:
      object.__setattr__(self, "num_kv_heads", self.num_heads)
    if self.head_dim is None and self.num_heads >= 1:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    check(self, ("attention_dropout", "classifier_dropout"))
    rotary.check_scaling(self.rope_type, self.rope_factor, "config.model.rope_type")
    if self.classifier_pooling not in POOLINGS:
      raise ConfigError(f"config.model.classifier_pooling={self.classifier_pooling!r}: "
                        f"use one of {list(POOLINGS)}.")

  @property
  def decoder_bias(self) -> bool:
    """The MLM decoder's bias: Hugging Face's lm_head has one iff `mlp_bias`."""
    return self.mlp_bias

  @property
  def attention_dropout_rate(self) -> float:
    return self.attention_dropout

  @property
  def rope_thetas(self) -> tuple[float, float]:
    """(global, local) rotary thetas: EuroBERT's one."""
    return self.rope_theta, self.rope_theta


def check(cfg, dropouts: tuple[str, ...]) -> None:
  """The checks EuroBERT and UltraBERT share: the common ones, the head size (whole,
  even), the key / value heads dividing the query heads, positive eps and theta(s),
  a known activation."""
  cfg.check_common(("num_kv_heads", "head_dim"), dropouts)
  if cfg.head_dim % 2:
    raise ConfigError(f"config.model.head_dim={cfg.head_dim} must be even (rotary pairs "
                      "its halves).")
  if cfg.num_heads % cfg.num_kv_heads:
    raise ConfigError(f"config.model.num_kv_heads={cfg.num_kv_heads} must divide "
                      f"config.model.num_heads={cfg.num_heads}.")
  for name in ("rms_norm_eps", "initializer_range") + tuple(
      f.name for f in dataclasses.fields(cfg) if f.name.endswith("rope_theta")):
    if not getattr(cfg, name) > 0:
      raise ConfigError(f"config.model.{name}={getattr(cfg, name)} must be positive.")
  if cfg.hidden_act not in ACTIVATIONS:
    raise ConfigError(f"config.model.hidden_act={cfg.hidden_act!r}: use one of "
                      f"{sorted(ACTIVATIONS)}.")


def init(cfg):
  """Hugging Face's initialiser of every weight: a normal of `initializer_range`
  (untruncated at `initializer_cutoff_factor` 0)."""
  return layers.normal(cfg.initializer_range, cfg.initializer_cutoff_factor)


def rms_norm(cfg, name: str) -> nn.RMSNorm:
  return layers.rms_norm(cfg, name, cfg.rms_norm_eps)


# ---- Modules ----------------------------------------------------------------------

class Embeddings(nn.Module):
  """The token embedding: [B, T] ids -> [B, T, E]; and the blocks' context: the
  padding, the documents and the rotary tables (`config.rope_thetas`)."""

  config: EuroBertConfig

  def setup(self):
    cfg = self.config
    self.embed_tokens = layers.embed(cfg, cfg.vocab_size, ("vocab", "embed"), init=init(cfg))

  def __call__(self, input_ids, attention_mask, token_type_ids, position_ids,
               segment_ids, deterministic: bool):
    """token_type_ids: ignored; position_ids [B, T] (default: 0..T-1, or restarting in
    each document of `segment_ids`). -> ([B, T, E], (attention_mask, segment_ids,
    (global, local) rotary tables))."""
    del token_type_ids, deterministic
    cfg = self.config
    if position_ids is None:
      position_ids = (jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
                      if segment_ids is None else stack.document_positions(segment_ids))
    tables = rotary.tables(position_ids, cfg.head_dim, cfg.rope_thetas, cfg.dtype,
                           getattr(cfg, "rope_factor", 1.0))
    x = self.embed_tokens(input_ids)
    return constrain(x, (BATCH, LENGTH, EMBED)), (attention_mask, segment_ids, tables)

  def attend(self, x: jax.Array) -> jax.Array:
    """The tied output projection (`tie_word_embeddings`): [..., E] -> [..., V]."""
    return self.embed_tokens.attend(x)


class Block(layers.PreNormBlock):
  """Llama's block: x + Attn(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)). Attn: q [E, N, D],
  k and v [E, K, D], rotary q and k, global or windowed by layer (`config.windows`),
  o [N, D, E]; dropout on the probabilities only (Hugging Face's). SwiGLU: act(gate) *
  up, down."""

  names = ("self_attn", "input_layernorm", "mlp", "post_attention_layernorm")
  norm = staticmethod(rms_norm)
  attention = staticmethod(lambda cfg, name: layers.SelfAttention(
      cfg, bias=cfg.attention_bias, out_bias=cfg.attention_bias, kernel_init=init(cfg),
      dropout=cfg.attention_dropout, out_dropout=0.0, name=name))
  mlp = staticmethod(lambda cfg, name: layers.GatedMLP(
      cfg, cfg.hidden_act, bias=cfg.mlp_bias, out_bias=cfg.mlp_bias, kernel_init=init(cfg),
      name=name))


def block_weights(cfg) -> int:
  """q and o E N D each, k and v E K D each, SwiGLU's gate, up and down E M each."""
  E, N, K, D, M = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                   cfg.intermediate_size)
  return 2 * E * N * D + 2 * E * K * D + 3 * E * M


def mlm_transform(cfg: EuroBertConfig, x: jax.Array) -> jax.Array:
  """EuroBERT's lm_head reads the final norm's output as is."""
  del cfg
  return x


# ---- Task heads (Hugging Face's EuroBertFor*) --------------------------------------

def task_features(cfg: EuroBertConfig, out: dict, deterministic: bool, pooled: bool,
                  dropout: bool = True) -> jax.Array:
  """Call inside a task head's compact `__call__`. Pooled (sequence classification,
  multiple choice): 'cls' / 'mean' pool the last hidden states, then dense (named
  'dense') + GELU; 'late': dense + GELU at every token, then the mean over the real
  tokens (module docstring). Per token (tagging, span QA): the hidden states as they
  are. Then `classifier_dropout` (0: Hugging Face's heads have none). [B, T, E] ->
  [B, E] (pooled) or [B, T, E]."""
  del dropout
  x = out["last_hidden_state"]
  if pooled:
    mask = out["attention_mask"]
    if cfg.classifier_pooling != "late":
      x = stack.pool(x, mask, cfg.classifier_pooling)
    x = ACTIVATIONS["gelu"](layers.dense(cfg, cfg.hidden_size, ("embed", "hidden"), "dense",
                                         init=init(cfg))(x))
    if cfg.classifier_pooling == "late":
      x = stack.pool(x, mask, "mean")
  return nn.Dropout(cfg.classifier_dropout)(x, deterministic=deterministic)


def output_layer(cfg, features: int, name: str) -> nn.Dense:
  """A task's output layer [E] -> [features] with bias (Hugging Face's `classifier`)."""
  return layers.dense(cfg, features, ("embed", "classes"), name, init=init(cfg))


FAMILY = Family(
    name="eurobert", config=EuroBertConfig, embeddings=Embeddings, block=Block,
    mlm_transform=mlm_transform, block_weights=block_weights,
    task_features=task_features, output_layer=output_layer,
    mlm_weights=lambda cfg: 0,  # the decoder alone
    final_norm=lambda cfg: rms_norm(cfg, "final_norm"))
