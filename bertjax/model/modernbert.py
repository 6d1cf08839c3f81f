"""ModernBERT (Warner et al. 2024), and the encoders built on its architecture (Ettin,
mmBERT), exact to Hugging Face's `transformers.ModernBertForMaskedLM` (v5.24).

- Embeddings: token embedding, LayerNorm, dropout; no positions, no segments.
- Pre-LN blocks: x + Attn(LN(x)), then x + GeGLU(LN(x)); block 0 takes the embedding
  norm's output as is (Hugging Face's `attn_norm` is an Identity there: that block has
  no attention norm). Fused Wqkv [E, 3, N, D] and output Wo [N, D, E].
- Layer types: block i attends globally when i % global_attn_every_n_layers == 0
  (0, 3, 6, ...: rotary theta `global_rope_theta`), the others within a sliding window
  (theta `local_rope_theta`). The window is Hugging Face's: `sliding_window =
  local_attention // 2` and `create_bidirectional_sliding_window_mask` keeps
  |i - j| <= sliding_window, both ends included (2 * 64 + 1 = 129 keys for
  local_attention=128; its flash-attention path passes `sliding_window + 1` because
  flash bounds are exclusive: the same pairs). The authors' code keeps the same pairs.
- Rotary positions, Hugging Face's `ModernBertRotaryEmbedding` + `apply_rotary_pos_emb`:
  inv_freq = theta^(-2k/D), k < D/2, in float32; angles = position * inv_freq in
  float32, duplicated ([f, f], not interleaved); cos/sin cast to the activation dtype;
  q and k rotated in float32 by the rotate-half convention (x * cos + [-x2, x1] * sin,
  x1 / x2 the first / second halves of the head dimension), then cast back.
- GeGLU: Wi [E, 2, M] (Hugging Face's [2M, E] chunked: first half the input, second the
  gate), act(input) * gate, dropout, Wo [M, E]. A final LayerNorm (float32 statistics,
  two-pass variance as torch's).
- MLM head: dense + act + LayerNorm (`transform`, the stack's MLM head around it),
  then the tied token embedding plus a vocabulary bias. Task heads: `task_features`
  (Hugging Face's pooling, `head` and dropout) and `classifier`.
- Packed rows: `segment_ids` [B, T] isolate documents and, without explicit
  `position_ids`, restart the rotary positions at 0 in each document, as the authors'
  unpadded training does (flash-attention varlen with `cu_seqlens`).
- The authors' pretraining, beyond Hugging Face's config: `attention_output_dropout`
  drops Wo's output only (their `attn_out_dropout_prob` 0.1; Hugging Face's
  `attention_dropout` drops the probabilities too, and with them the fast kernels);
  `global_rope_theta_phases` gives the global layers' theta in each pretraining length
  phase (10k at 1,024 tokens, 160k from the 8,192-token context extension on), and
  `local_rope_theta_phases` the local layers' (mmBERT raises both). The
  phase's batches carry it per row as `global_rope_theta` [B] (`phase_inputs`), as they
  carry positions and document ids: the theta is a function of the step through the
  data position, restores with it, and evaluation, fine-tuning, inference and export,
  which pass none, use the config's `global_rope_theta`, the final one.

The family's parts of the shared encoder (`stack.py`). Parameters are Hugging Face's
names (see `bertjax.hf.modernbert`). With `scan_layers`, block 0 (which has no
attention norm) stays `encoder/layer_0` and blocks 1..L-1 are `encoder/layers` with a
leading [L-1] axis (`unscanned_layers=1`; `FAMILY.to_layout` converts). Shapes:
B batch, T length, E hidden, N heads, D head size, M intermediate size, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.errors import ConfigError
from bertjax.model import layers, rotary, stack
from bertjax.model.config import FamilyConfig
from bertjax.model.family import Family
from bertjax.model.layers import ACTIVATIONS, BATCH, EMBED, LENGTH, constrain

POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class ModernBertConfig(FamilyConfig):
  """Hyperparameters of a ModernBERT encoder and its heads; the defaults are
  ModernBERT-base's (Hugging Face's `ModernBertConfig` defaults, their names kept)."""

  family: ClassVar[str] = "modernbert"  # config.model.family (bertjax.model.FAMILIES)
  # What the data and the trainer ask of every family (bertjax.model.family.Family):
  # rotary positions count from 0; no token-type embedding, no NSP, no SBO head, no pooler.
  position_offset: ClassVar[int] = 0
  type_vocab_size: ClassVar[int] = 0
  nsp: ClassVar[bool] = False
  sbo: ClassVar[bool] = False
  pooler: ClassVar[bool] = False

  vocab_size: int = 50368
  num_layers: int = 22
  intermediate_size: int = 1152
  max_position_embeddings: int = 8192  # The context trained for (no position table).
  pad_token_id: int = 50283
  norm_eps: float = 1e-5
  norm_bias: bool = False  # LayerNorms with a bias
  attention_bias: bool = False  # Wqkv, Wo with biases
  mlp_bias: bool = False  # Wi, Wo with biases
  classifier_bias: bool = False  # the heads' dense (MLM `transform`, task `transform`)
  decoder_bias: bool = True  # the MLM vocabulary bias
  global_attn_every_n_layers: int = 3  # block i is global iff i % n == 0
  local_attention: int = 128  # the local window, even: local_attention // 2 each side
  global_rope_theta: float = 160_000.0  # the final one: inference and export use it
  local_rope_theta: float = 10_000.0
  # Training only: the global layers' theta in each pretraining length phase
  # (config.data.length_phases; ModernBERT: 10k at 1,024, then 160k), carried by the
  # phase's batches as `global_rope_theta`; the last must be `global_rope_theta`.
  # (): global_rope_theta throughout.
  global_rope_theta_phases: tuple[float, ...] = ()
  # The same for the local layers' theta, carried as `local_rope_theta` (mmBERT: 10k
  # at 1,024, then 160k like the global ones); the last must be `local_rope_theta`.
  local_rope_theta_phases: tuple[float, ...] = ()
  embedding_dropout: float = 0.0
  attention_dropout: float = 0.0  # attention probabilities and the Wo output
  # Dropout on the Wo output only (the authors' attn_out_dropout_prob, 0.1 in
  # pretraining); Hugging Face has no such field (export drops it with a warning).
  attention_output_dropout: float = 0.0
  mlp_dropout: float = 0.0
  classifier_dropout: float = 0.0
  hidden_activation: str = "gelu"  # a key of ACTIVATIONS (GeGLU's)
  classifier_activation: str = "gelu"  # the heads' `transform` activation
  classifier_pooling: str = "cls"  # 'cls' or 'mean' (sequence-level task heads)

  def __post_init__(self):
    """Every field in range, or a one-line ConfigError naming it."""
    self.check_common(("global_attn_every_n_layers",),
                      ("embedding_dropout", "attention_dropout", "attention_output_dropout",
                       "mlp_dropout", "classifier_dropout"))
    if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
      raise ConfigError(
          f"config.model.hidden_size={self.hidden_size} / config.model.num_heads="
          f"{self.num_heads} must be a whole, even head size (rotary pairs its halves).")
    if self.local_attention < 2 or self.local_attention % 2:
      raise ConfigError(f"config.model.local_attention={self.local_attention} must be even "
                        "and >= 2 (it spans local_attention // 2 tokens each side).")
    if self.attention_dropout and self.attention_output_dropout:
      raise ConfigError(
          f"config.model.attention_dropout={self.attention_dropout} and "
          f"attention_output_dropout={self.attention_output_dropout}: set one (the first "
          "drops probabilities and the Wo output, Hugging Face's; the second the output "
          "only, the authors' pretraining).")
    for kind in ("global", "local"):
      phases, final = (getattr(self, f"{kind}_rope_theta_phases"),
                       getattr(self, f"{kind}_rope_theta"))
      if phases and not (all(isinstance(t, (int, float)) and t > 0 for t in phases)
                         and phases[-1] == final):
        raise ConfigError(
            f"config.model.{kind}_rope_theta_phases={phases}: positive thetas, one per "
            f"length phase, the last equal to config.model.{kind}_rope_theta={final} "
            "(what inference and export use).")
    for name in ("norm_eps", "initializer_range", "global_rope_theta", "local_rope_theta"):
      if not getattr(self, name) > 0:
        raise ConfigError(f"config.model.{name}={getattr(self, name)} must be positive.")
    for name in ("hidden_activation", "classifier_activation"):
      if getattr(self, name) not in ACTIVATIONS:
        raise ConfigError(f"config.model.{name}={getattr(self, name)!r}: use one of "
                          f"{sorted(ACTIVATIONS)}.")
    if self.classifier_pooling not in POOLINGS:
      raise ConfigError(f"config.model.classifier_pooling={self.classifier_pooling!r}: "
                        f"use one of {list(POOLINGS)}.")

  @property
  def attention_dropout_rate(self) -> float:
    """What every family's config answers (`Family`): the attention dropout, which
    picks the attention path (`attention.resolve_impl`)."""
    return self.attention_dropout

  @property
  def window(self) -> int:
    """The local layers' half-width w: query i sees keys j with |i - j| <= w."""
    return self.local_attention // 2

  def is_global(self, layer: int) -> bool:
    return layer % self.global_attn_every_n_layers == 0

  @property
  def windows(self) -> tuple[int | None, ...]:
    """Each block's attention half-width: None (global) or `window`."""
    return tuple(None if self.is_global(i) else self.window for i in range(self.num_layers))

  @property
  def layer_types(self) -> tuple[str, ...]:
    """Hugging Face's `layer_types`: 'full_attention' or 'sliding_attention' per block."""
    return tuple("full_attention" if self.is_global(i) else "sliding_attention"
                 for i in range(self.num_layers))


def check_window(cfg: ModernBertConfig, length: int,
                 field: str = "config.data.max_seq_length") -> None:
  """One-line ConfigError when rows of `length` tokens fit inside the local window
  (local_attention > length): the local layers would attend the whole row, which is
  not what the config describes. Call it where lengths are known."""
  if cfg.num_layers > 1 and cfg.global_attn_every_n_layers > 1 and (
      cfg.local_attention > length):
    raise ConfigError(f"config.model.local_attention={cfg.local_attention} exceeds "
                      f"{field}={length}: the local layers would see whole rows; lower "
                      "config.model.local_attention (even, >= 2) or use longer rows.")


def phase_inputs(cfg: ModernBertConfig, lengths: Sequence[int]) -> list[dict[str, float]]:
  """Pretraining's length phases (their row lengths, in order) -> each phase's constant
  per-row model inputs: {'global_rope_theta': theta} from `global_rope_theta_phases`
  (the authors raise it from 10k to 160k with the 8,192-token context) and
  {'local_rope_theta': theta} from `local_rope_theta_phases` (mmBERT's), else {}.
  One-line ConfigErrors: a local window longer than a phase's rows (`check_window`), a
  theta count that is not the phase count."""
  for k, length in enumerate(lengths):
    check_window(cfg, length, f"config.data.length_phases[{k}]'s length"
                 if len(lengths) > 1 else "config.data.max_seq_length")
  out = [{} for _ in lengths]
  for kind in ("global", "local"):
    thetas = getattr(cfg, f"{kind}_rope_theta_phases")
    if thetas and len(thetas) != len(lengths):
      raise ConfigError(f"config.model.{kind}_rope_theta_phases={thetas} has "
                        f"{len(thetas)} thetas for {len(lengths)} length phases (config."
                        "data.length_phases): give one per phase, or () for one theta.")
    for inputs, t in zip(out, thetas):
      inputs[f"{kind}_rope_theta"] = float(t)
  return out


# ---- Initialisers (Hugging Face's `ModernBertPreTrainedModel._init_weights`) ------

def init_std(cfg: ModernBertConfig, kind: str) -> float:
  """'in' (Wqkv, Wi), 'out' (both Wo, the heads' dense), 'embedding', 'final_out' (a
  task classifier): the truncated normal's standard deviation."""
  return {"in": cfg.initializer_range, "embedding": cfg.initializer_range,
          "out": cfg.initializer_range / math.sqrt(2.0 * cfg.num_layers),
          "final_out": cfg.hidden_size ** -0.5}[kind]


def _init(cfg: ModernBertConfig, kind: str):
  """The normal of `init_std(kind)`, cut at +-`initializer_cutoff_factor` of it."""
  return layers.normal(init_std(cfg, kind), cfg.initializer_cutoff_factor)


def layer_norm(cfg: ModernBertConfig, name: str) -> nn.LayerNorm:
  """LayerNorm over E (bias per `norm_bias`); float32 statistics, two-pass variance."""
  return layers.layer_norm(cfg, name, cfg.norm_eps, use_bias=cfg.norm_bias,
                           fast_variance=False)


# ---- Modules ----------------------------------------------------------------------

class Embeddings(nn.Module):
  """Token embedding, LayerNorm, dropout: [B, T] ids -> [B, T, E]; and the blocks'
  context: the padding, the documents and the rotary tables."""

  config: ModernBertConfig

  def setup(self):
    cfg = self.config
    self.tok_embeddings = layers.embed(cfg, cfg.vocab_size, ("vocab", "embed"),
                                       init=_init(cfg, "embedding"))
    self.norm = layer_norm(cfg, "norm")
    self.drop = nn.Dropout(cfg.embedding_dropout)

  def __call__(self, input_ids, attention_mask, token_type_ids, position_ids,
               segment_ids, deterministic: bool, global_rope_theta=None,
               local_rope_theta=None):
    """token_type_ids: ignored (ModernBERT has no segment embeddings); position_ids
    [B, T] rotary positions (default: 0..T-1, or restarting in each document of
    `segment_ids`); global_rope_theta, local_rope_theta [B] float: the global and
    local layers' rotary theta per row (a pretraining length phase's, `phase_inputs`;
    default the config's). -> ([B, T, E], (attention_mask, segment_ids, (global,
    local) rotary tables))."""
    del token_type_ids
    cfg = self.config
    if position_ids is None:
      position_ids = (jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
                      if segment_ids is None else stack.document_positions(segment_ids))
    tables = rotary.tables(position_ids, cfg.head_dim,
                           (cfg.global_rope_theta if global_rope_theta is None
                            else global_rope_theta,
                            cfg.local_rope_theta if local_rope_theta is None
                            else local_rope_theta), cfg.dtype)
    x = self.drop(self.norm(self.tok_embeddings(input_ids)), deterministic=deterministic)
    return constrain(x, (BATCH, LENGTH, EMBED)), (attention_mask, segment_ids, tables)

  def attend(self, x: jax.Array) -> jax.Array:
    """The tied output projection: [..., E] -> [..., V]."""
    return self.tok_embeddings.attend(x)


class Block(layers.PreNormBlock):
  """Pre-LN block: x + Attn(LN(x)) (block 0: x + Attn(x), `first_norm=False`), then
  x + GeGLU(LN(x)). Attn: the fused Wqkv [E, 3, N, D], rotary q and k, global or
  windowed attention by layer, Wo [N, D, E], dropout (probabilities and output:
  `attention_dropout`; the output only: `attention_output_dropout`). GeGLU: Wi [E, 2, M]
  (the input half, then the gate), act(input) * gate, dropout, Wo [M, E]."""

  first_norm = False
  norm = staticmethod(lambda cfg, name: layer_norm(cfg, name))
  attention = staticmethod(lambda cfg, name: layers.SelfAttention(
      cfg, names=("Wqkv", "Wo"), fused=True, bias=cfg.attention_bias,
      out_bias=cfg.attention_bias, kernel_init=_init(cfg, "in"),
      out_kernel_init=_init(cfg, "out"),
      dropout=cfg.attention_dropout,
      out_dropout=cfg.attention_output_dropout or cfg.attention_dropout, name=name))
  mlp = staticmethod(lambda cfg, name: layers.GatedMLP(
      cfg, cfg.hidden_activation, names=("Wi", "Wo"), fused=True, bias=cfg.mlp_bias,
      out_bias=cfg.mlp_bias, kernel_init=_init(cfg, "in"),
      out_kernel_init=_init(cfg, "out"),
      dropout=cfg.mlp_dropout, name=name))


class PredictionHead(nn.Module):
  """Hugging Face's `ModernBertPredictionHead`: dense (E -> E) + act + LayerNorm."""

  config: ModernBertConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., E] -> [..., E]."""
    cfg = self.config
    x = layers.dense(cfg, cfg.hidden_size, ("embed", "hidden"), "dense",
                     init=_init(cfg, "out"), use_bias=cfg.classifier_bias)(x)
    return layer_norm(cfg, "norm")(ACTIVATIONS[cfg.classifier_activation](x))


def mlm_transform(cfg: ModernBertConfig, x: jax.Array) -> jax.Array:
  """The MLM head's `transform`: a PredictionHead."""
  return PredictionHead(cfg, name="transform")(x)


# ---- Task heads (Hugging Face's ModernBertFor* trunks) -----------------------------

def task_features(cfg: ModernBertConfig, out: dict, deterministic: bool, pooled: bool,
                  dropout: bool = True) -> jax.Array:
  """Call inside a task head's compact `__call__`: `stack.pool` of the last hidden
  states by `classifier_pooling` (when `pooled`: sequence classification, multiple
  choice), then the head's own PredictionHead named 'transform' and dropout
  (`classifier_dropout`), as ModernBertFor* do (every one drops out: `dropout` changes
  nothing). [B, T, E] -> [B, E] (pooled) or [B, T, E] (per token: tagging, QA)."""
  del dropout
  x = out["last_hidden_state"]
  if pooled:
    x = stack.pool(x, out["attention_mask"], cfg.classifier_pooling)
  x = PredictionHead(cfg, name="transform")(x)
  return nn.Dropout(cfg.classifier_dropout)(x, deterministic=deterministic)


def classifier(cfg: ModernBertConfig, features: int, name: str) -> nn.Dense:
  """A task's output layer [E] -> [features], with bias (Hugging Face's `classifier`,
  initialised with std hidden_size^-0.5)."""
  return layers.dense(cfg, features, ("embed", "classes"), name, init=_init(cfg, "final_out"))


FAMILY = Family(
    name="modernbert", config=ModernBertConfig, embeddings=Embeddings, block=Block,
    mlm_transform=mlm_transform,
    # Wqkv 3E^2, Wo E^2, GeGLU's Wi 2EM and Wo EM.
    block_weights=lambda c: 4 * c.hidden_size ** 2 + 3 * c.hidden_size * c.intermediate_size,
    task_features=task_features, output_layer=classifier,
    unscanned_layers=1, inputs=("global_rope_theta", "local_rope_theta"),
    final_norm=lambda cfg: layer_norm(cfg, "final_norm"), phase_inputs=phase_inputs)
