"""UltraBERT (dmis-lab: UltraBERT-150M, -380M; English, 32K context), exact to Hugging
Face's `transformers.UltrabertForMaskedLM` (v5.24): EuroBERT's parts (`eurobert.py`)
with

- sliding-window and full-attention layers by `layer_types` (default: block i is
  'full_attention' when (i + 1) % 3 == 0, else 'sliding_attention'); a sliding layer's
  query i sees keys j with |i - j| <= `sliding_window` (an inclusive radius each side:
  2 * 128 + 1 keys at the default);
- a rotary theta per layer kind (`sliding_rope_theta` 10k, `full_rope_theta` 2.56M);
- RMSNorm eps 1e-6;
- a two-layer MLM prediction head: linear1 [E, P] + GELU (tanh) + linear2 [P, E] + GELU
  (tanh), no biases (P = `prediction_head_size`), then an untied decoder [E, V] without
  bias (`tie_word_embeddings`: the token embedding instead);
- ModernBERT's task heads without its transform: sequence classification pools 'cls' or
  'mean', dropout (`classifier_dropout`), classifier; tagging: dropout, classifier; span
  QA (Hugging Face's GenericForQuestionAnswering): `qa_outputs` on each token.

Under `scan_layers` every block is scanned (`unscanned_layers` 0): the kit's attention
picks a layer's kind with `lax.cond` on its traced index, so any `layer_types` pattern
scans. Packed rows restart the rotary positions per document (`segment_ids`).
Initialisation: Hugging Face's (Olmo3PreTrainedModel's, the default one: untruncated
normals of `initializer_range`).

The defaults are Hugging Face's `UltrabertConfig` (a Llama-7B-sized stack: the
published checkpoints' own config.json sizes were not available offline; their model
card gives hidden 768 / 1,024 and a 32K context). Shapes as in `eurobert.py`, P the
prediction head's width.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax

from bertjax.errors import ConfigError
from bertjax.model import eurobert, layers, stack
from bertjax.model.config import FamilyConfig
from bertjax.model.family import Family
from bertjax.model.layers import ACTIVATIONS

POOLINGS = ("cls", "mean")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class UltraBertConfig(FamilyConfig):
  """Hyperparameters of an UltraBERT encoder and its heads (Hugging Face's
  `UltrabertConfig` defaults and names; module docstring)."""

  family: ClassVar[str] = "ultrabert"  # config.model.family (bertjax.model.FAMILIES)
  position_offset: ClassVar[int] = 0
  type_vocab_size: ClassVar[int] = 0
  nsp: ClassVar[bool] = False
  sbo: ClassVar[bool] = False
  pooler: ClassVar[bool] = False
  decoder_bias: ClassVar[bool] = False  # the decoder has no bias

  vocab_size: int = 32000
  hidden_size: int = 4096
  num_layers: int = 32
  num_heads: int = 32
  intermediate_size: int = 11008
  max_position_embeddings: int = 32768  # The context trained for (no position table).
  initializer_cutoff_factor: float = 0.0  # Hugging Face's untruncated normal_
  num_kv_heads: int | None = None  # K; None: num_heads
  head_dim: int | None = None  # D; None: hidden_size // num_heads
  hidden_act: str = "silu"
  rms_norm_eps: float = 1e-6
  # Each block's kind, 'full_attention' or 'sliding_attention'; (): Hugging Face's
  # default, full when (i + 1) % 3 == 0.
  layer_types: tuple[str, ...] = ()
  sliding_window: int = 128  # a sliding layer's inclusive radius each side
  full_rope_theta: float = 2_560_000.0
  sliding_rope_theta: float = 10_000.0
  prediction_head_size: int = 768  # P
  attention_bias: bool = False
  mlp_bias: bool = False
  attention_dropout: float = 0.0  # on the attention probabilities (Hugging Face's)
  tie_word_embeddings: bool = False
  classifier_pooling: str = "cls"  # 'cls' or 'mean'
  classifier_dropout: float = 0.0

  def __post_init__(self):
    """Resolves `num_kv_heads` / `head_dim` None and `layer_types` (); every field in
    range, or a one-line ConfigError naming it."""
    if self.num_kv_heads is None:
      object.__setattr__(self, "num_kv_heads", self.num_heads)
    if self.head_dim is None and self.num_heads >= 1:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    if not self.layer_types:
      object.__setattr__(self, "layer_types", tuple(
          "sliding_attention" if (i + 1) % 3 else "full_attention"
          for i in range(self.num_layers)))
    object.__setattr__(self, "layer_types", tuple(self.layer_types))
    eurobert.check(self, ("attention_dropout", "classifier_dropout"))
    if self.prediction_head_size < 1 or self.sliding_window < 1:
      raise ConfigError(f"config.model.prediction_head_size={self.prediction_head_size} "
                        f"and sliding_window={self.sliding_window} must be >= 1.")
    if (len(self.layer_types) != self.num_layers
        or not set(self.layer_types) <= set(LAYER_TYPES)):
      raise ConfigError(f"config.model.layer_types={list(self.layer_types)}: one of "
                        f"{list(LAYER_TYPES)} per layer (num_layers={self.num_layers}), "
                        "or () for the default.")
    if self.classifier_pooling not in POOLINGS:
      raise ConfigError(f"config.model.classifier_pooling={self.classifier_pooling!r}: "
                        f"use one of {list(POOLINGS)}.")

  @property
  def attention_dropout_rate(self) -> float:
    return self.attention_dropout

  @property
  def rope_thetas(self) -> tuple[float, float]:
    """(global, local) rotary thetas: the full layers', the sliding layers'."""
    return self.full_rope_theta, self.sliding_rope_theta

  @property
  def windows(self) -> tuple[int | None, ...]:
    """Each block's half-width: None (full) or `sliding_window`."""
    return tuple(None if t == "full_attention" else self.sliding_window
                 for t in self.layer_types)


def check_window(cfg: UltraBertConfig, length: int,
                 field: str = "config.data.max_seq_length") -> None:
  """One-line ConfigError when rows of `length` tokens fit inside a sliding window (the
  sliding layers would attend whole rows). Call it where lengths are known."""
  if "sliding_attention" in cfg.layer_types and 2 * cfg.sliding_window + 1 > length:
    raise ConfigError(f"config.model.sliding_window={cfg.sliding_window} spans "
                      f"{2 * cfg.sliding_window + 1} tokens, more than {field}={length}: "
                      "the sliding layers would see whole rows; lower it or use longer "
                      "rows.")


def phase_inputs(cfg: UltraBertConfig, lengths):
  """No per-phase inputs; a window wider than a phase's rows is a one-line error."""
  for k, length in enumerate(lengths):
    check_window(cfg, length, f"config.data.length_phases[{k}]'s length"
                 if len(lengths) > 1 else "config.data.max_seq_length")
  return [{} for _ in lengths]


class PredictionHead(nn.Module):
  """Hugging Face's `UltrabertPredictionHead` without its decoder: linear1 + GELU
  (tanh) + linear2 + GELU (tanh), no biases; [..., E] -> [..., E]."""

  config: UltraBertConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg, act = self.config, ACTIVATIONS["gelu_pytorch_tanh"]
    x = layers.dense(cfg, cfg.prediction_head_size, ("embed", "mlp"), "linear1",
                     init=eurobert.init(cfg), use_bias=False)(x)
    x = layers.dense(cfg, cfg.hidden_size, ("mlp", "embed"), "linear2",
                     init=eurobert.init(cfg), use_bias=False)(act(x))
    return act(x)


def mlm_transform(cfg: UltraBertConfig, x: jax.Array) -> jax.Array:
  """The MLM head's transform: a PredictionHead named 'head'."""
  return PredictionHead(cfg, name="head")(x)


def task_features(cfg: UltraBertConfig, out: dict, deterministic: bool, pooled: bool,
                  dropout: bool = True) -> jax.Array:
  """Pooled: `stack.pool` by `classifier_pooling`; then dropout (`classifier_dropout`)
  where Hugging Face's head has it (`dropout`: sequence classification and tagging,
  not span QA's qa_outputs). [B, T, E] -> [B, E] (pooled) or [B, T, E]."""
  x = out["last_hidden_state"]
  if pooled:
    x = stack.pool(x, out["attention_mask"], cfg.classifier_pooling)
  if dropout:
    x = nn.Dropout(cfg.classifier_dropout)(x, deterministic=deterministic)
  return x


FAMILY = Family(
    name="ultrabert", config=UltraBertConfig, embeddings=eurobert.Embeddings,
    block=eurobert.Block, mlm_transform=mlm_transform,
    block_weights=eurobert.block_weights, task_features=task_features,
    output_layer=eurobert.output_layer,
    mlm_weights=lambda cfg: 2 * cfg.hidden_size * cfg.prediction_head_size,  # linear1, 2
    final_norm=lambda cfg: eurobert.rms_norm(cfg, "final_norm"), phase_inputs=phase_inputs)
