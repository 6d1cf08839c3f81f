"""The 'electra' family (Clark et al. 2020): BERT's network with the token embedding
at its own width and a projection to the hidden size, exact to Hugging Face's
`transformers.ElectraForPreTraining` (the discriminator) and `ElectraForMaskedLM`
(the generator), v5.24.

Why a family of its own and not a field of the 'bert' family: ELECTRA adds to BERT
only the embedding width and its projection, but everything around the encoder
differs: no pooler and no NSP, two pretraining heads of its own (the generator's MLM
head maps to the embedding width, the discriminator's detector gives one logit per
token), task heads of its own (ElectraClassificationHead's dense + GELU on [CLS],
the multiple-choice SequenceSummary) and a Hugging Face model type of its own
('electra', `bertjax.hf.electra`) whose checkpoints name their parameters otherwise.
As a field of bert.py each of those would be a branch inside BERT's file; as a family
it is this file of parts, and bert.py is untouched: it reuses BERT's post-LN block,
its embeddings (word, absolute position, token type; positions from
`bert.position_ids_for`, so packed rows restart them as BERT's pipeline gives them),
its initialiser (`initializer_range`, `initializer_cutoff_factor`) and its output layers.

- Embeddings: word, position and token-type tables of [*, D] (D = `embedding_size`),
  summed, LayerNorm over D, dropout; then, when D differs from the hidden size E,
  `embeddings_project`, a dense D -> E.
- Blocks: BERT's (`bert.TransformerBlock`): post-LN, GELU, dropout.
- Heads by name: 'mlm' (the generator's: `generator_predictions`, a dense E -> D,
  GELU, LayerNorm over D; then the tied word embedding [V, D] and a vocabulary bias,
  `generator_lm_head`) and 'rtd' (the discriminator's replaced-token detector:
  `discriminator_predictions`, a dense E -> E, GELU, a dense E -> 1: one logit per
  token, [B, T]), which the replaced-token-detection objective reads.
- Task heads (`task_features` + BERT's `output_layer`): sequence classification as
  ElectraClassificationHead (dropout, dense, GELU, dropout on [CLS], then out_proj),
  multiple choice as ElectraSequenceSummary (dense, GELU, dropout on [CLS]; no
  dropout before it), tagging dropout + classifier, span QA the hidden states as they
  are; no pooler anywhere.

Tied embeddings across the two networks: every embedding table's shape (and the
embedding LayerNorm's) depends only on `vocab_size`, `embedding_size`,
`max_position_embeddings` and `type_vocab_size`, never on the hidden size; a
generator made by `generator_config` keeps those four, so its
encoder/embeddings/{word,position,token_type}_embeddings and LayerNorm have the
discriminator's shapes and can be one array (ELECTRA's code shares exactly these,
its "electra/embeddings" scope); each network keeps its own `embeddings_project`.

Shapes: B batch, T length, E hidden, D embedding size, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping

import flax.linen as nn
import jax

from bertjax.errors import ConfigError
from bertjax.model import bert, config as config_lib, layers
from bertjax.model.config import FamilyConfig
from bertjax.model.family import Family, Head


@dataclasses.dataclass(frozen=True)
class ElectraConfig(FamilyConfig):
  """Hyperparameters of an ELECTRA network (a discriminator or a generator) and its
  heads; the defaults are Hugging Face's `ElectraConfig`'s (ELECTRA-Small's
  discriminator), their names BERT's in bertjax."""

  family: ClassVar[str] = "electra"  # config.model.family (bertjax.model.FAMILIES)
  # What the data and the trainer ask of every family: positions count from 0; no
  # pooler, no NSP, no SBO head.
  position_offset: ClassVar[int] = 0
  nsp: ClassVar[bool] = False
  sbo: ClassVar[bool] = False
  pooler: ClassVar[bool] = False

  embedding_size: int = 128  # D: the embedding tables' width (projected to hidden_size)
  hidden_size: int = 256
  num_heads: int = 4
  intermediate_size: int = 1024
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  rtd: bool = False  # the discriminator's replaced-token-detection head ('rtd')
  # The task heads' dropout (Hugging Face's classifier_dropout); None: dropout_rate.
  classifier_dropout_rate: float | None = None
  summary_dropout: float = 0.1  # multiple choice's, after its summary (summary_last_dropout)

  def __post_init__(self):
    """Every field in range, or a one-line ConfigError naming it."""
    self.check_common(("embedding_size", "type_vocab_size"),
                      ("dropout_rate", "attention_dropout_rate", "summary_dropout")
                      + (("classifier_dropout_rate",)
                         if self.classifier_dropout_rate is not None else ()))
    if self.hidden_size % self.num_heads:
      raise ConfigError(
          f"config.model.hidden_size={self.hidden_size} is not divisible by "
          f"config.model.num_heads={self.num_heads}; pick sizes that divide.")
    for name in ("layer_norm_eps", "initializer_range"):
      if not getattr(self, name) > 0:
        raise ConfigError(f"config.model.{name}={getattr(self, name)} must be positive.")

  @property
  def classifier_dropout(self) -> float:
    """The task heads' own dropout: `classifier_dropout_rate`, else the encoder's."""
    return (self.dropout_rate if self.classifier_dropout_rate is None
            else self.classifier_dropout_rate)


GENERATOR_SIZES = config_lib.GENERATOR_SIZES  # what config.generator sets


def generator_config(config: ElectraConfig, sizes: Mapping[str, int]) -> ElectraConfig:
  """The generator of the discriminator `config` (`FamilyConfig.generator`): `config`
  with the `sizes` of `config.generator`, without the 'rtd' head. Vocabulary,
  embedding size, positions and token types, which fix the embedding tables ELECTRA
  ties between the two networks, stay the discriminator's."""
  return config.generator(dict(sizes))


class Embeddings(bert.Embeddings):
  """BERT's embeddings at the width `embedding_size` (word + position + token type,
  LayerNorm, dropout), then `embeddings_project` to the hidden size when it differs:
  [B, T] ids -> ([B, T, E], the blocks' context)."""

  config: ElectraConfig

  def setup(self):
    cfg = self.config
    D = cfg.embedding_size
    self.word_embeddings = layers.embed(cfg, cfg.vocab_size, ("vocab", "embed"), features=D)
    self.position_embeddings = layers.embed(
        cfg, cfg.max_position_embeddings, ("position", "embed"), features=D,
        one_hot_rows=layers.POSITION_ONE_HOT_ROWS)
    self.token_type_embeddings = layers.embed(cfg, cfg.type_vocab_size,
                                              ("segment", "embed"), features=D)
    self.LayerNorm = layers.layer_norm(cfg, "LayerNorm", cfg.layer_norm_eps)
    self.dropout = nn.Dropout(cfg.dropout_rate)
    if D != cfg.hidden_size:
      self.embeddings_project = layers.dense(cfg, cfg.hidden_size, ("hidden", "embed"),
                                             "embeddings_project")

  def __call__(self, input_ids, attention_mask, token_type_ids, position_ids,
               segment_ids, deterministic: bool):
    x, context = super().__call__(input_ids, attention_mask, token_type_ids,
                                  position_ids, segment_ids, deterministic)  # [B, T, D]
    if self.config.embedding_size != self.config.hidden_size:
      x = layers.constrain(self.embeddings_project(x),
                           (layers.BATCH, layers.LENGTH, layers.EMBED))
    return x, context


def mlm_transform(cfg: ElectraConfig, x: jax.Array) -> jax.Array:
  """The generator's `generator_predictions`: 'transform' (dense E -> D), GELU and
  'transform_norm' (LayerNorm over D): [B, P, E] -> [B, P, D]."""
  x = layers.dense(cfg, cfg.embedding_size, ("embed", "hidden"), "transform")(x)
  return layers.layer_norm(cfg, "transform_norm", cfg.layer_norm_eps)(
      layers.gelu(x))


class DiscriminatorHead(nn.Module):
  """The replaced-token detector (`discriminator_predictions`): 'dense' (E -> E),
  GELU, 'dense_prediction' (E -> 1) at every position: [B, T, E] -> [B, T] logits."""

  config: ElectraConfig

  @nn.compact
  def __call__(self, out: dict, encoder) -> jax.Array:
    del encoder
    cfg = self.config
    x = layers.dense(cfg, cfg.hidden_size, ("embed", "hidden"), "dense")(
        out["last_hidden_state"])
    x = layers.gelu(x)
    return layers.dense(cfg, 1, ("hidden", "classes"), "dense_prediction")(x)[..., 0]


# ---- The task heads' trunk (Hugging Face's ElectraFor* heads) ----------------------

def task_features(config: ElectraConfig, out: dict, deterministic: bool, pooled: bool,
                  dropout: bool = True) -> jax.Array:
  """Pooled, [B, E], from [CLS]: with `dropout` (sequence classification) the first
  half of ElectraClassificationHead (dropout, 'dense', GELU, dropout); without
  (multiple choice) ElectraSequenceSummary ('summary', GELU, `summary_dropout`). Per
  token, [B, T, E]: the last hidden states, dropped out when `dropout` (tagging; span
  QA reads them as they are)."""
  x = out["last_hidden_state"]
  drop = nn.Dropout(config.classifier_dropout)
  if not pooled:
    return drop(x, deterministic=deterministic) if dropout else x
  x = x[:, 0]
  dense = lambda name: layers.dense(config, config.hidden_size, ("embed", "hidden"), name)
  if dropout:
    x = layers.gelu(dense("dense")(drop(x, deterministic=deterministic)))
    return drop(x, deterministic=deterministic)
  x = layers.gelu(dense("summary")(x))
  return nn.Dropout(config.summary_dropout)(x, deterministic=deterministic)


def token_weights(cfg: ElectraConfig) -> int:
  """Per token outside the blocks: the embedding projection D E (when D differs from
  E) and, with the 'rtd' head, its E^2 + E at every position."""
  D, E = cfg.embedding_size, cfg.hidden_size
  return (D * E if D != E else 0) + (E * E + E if cfg.rtd else 0)


FAMILY = Family(
    name="electra", config=ElectraConfig, embeddings=Embeddings,
    block=bert.TransformerBlock, mlm_transform=mlm_transform,
    block_weights=bert.FAMILY.block_weights, task_features=task_features,
    output_layer=bert.output_layer, heads=(Head("rtd", DiscriminatorHead),),
    token_weights=token_weights)
