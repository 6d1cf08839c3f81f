"""The model seam: what a family of encoders (`config.model.family`) supplies, and what
the rest of bertjax builds from it. Every module that builds a model, restores or
converts parameters, counts FLOPs or plans memory goes through a `Family`
(`bertjax.model.family_of` picks it); the shared stack (`stack.py`) owns the encoder
around a family's parts: the embedding dispatch, the blocks' list / scan / remat, the
final-norm and pooler slots, the tied MLM head and its gather, `encode`,
`init_params`, the parameter layouts, the FLOPs every family shares, the packed
examples' rows and what fine-tuning freezes.

A new family is one file, bertjax/model/<family>.py, its Hugging Face table
bertjax/hf/<family>.py, its recipes in configs/, and its name in
`bertjax.model.MODULES` (which `FAMILIES` and `bertjax.hf.convert.TABLES` are read
from); tests/test_family_conformance.py then tests it. The file supplies exactly:

1. `config`: its frozen hyperparameter dataclass (mixing in `config.FamilyConfig`),
   whose instances answer what the data, the trainer and the stack ask of any model:
   `family`, `vocab_size`, `hidden_size`, `embedding_size` (the token embedding's
   width: `hidden_size` unless the family projects), `num_layers`, `num_heads`, `head_dim`,
   `intermediate_size`, `max_position_embeddings`, `pad_token_id`,
   `position_offset` (0 unless positions start past the padding id), `max_length`
   (the tokens a row may hold: `FamilyConfig`'s, from the two),
   `type_vocab_size` (token types it embeds, 0 for none), `nsp`, `sbo`, `pooler`
   (booleans: the heads and slot it has; class constants where it has none),
   `decoder_bias` (the MLM head's vocabulary bias), `tie_word_embeddings` (the MLM
   decoder is the token embedding, else its own [D, V]), `num_kv_heads` (key / value
   heads: `num_heads` unless grouped), `classifier_pooling` ('cls' or
   'mean': the packed examples' rows), `classifier_dropout` (the task heads' own
   dropout), `windows` (each block's attention half-width, None global),
   `scan_layers`, `remat_policy`, `attention_impl`, `attention_dropout_rate` (it
   picks the attention path), `dtype`, `param_dtype`, `initializer_range`.
2. `embeddings`: an `nn.Module` class, `embeddings(config)`, called `(input_ids,
   attention_mask, token_type_ids, position_ids or None, segment_ids or None,
   deterministic, **its `inputs`)` -> ([B, T, E], the context every block reads:
   masks, rotary tables, relative positions...), with `attend(x)` [..., E] ->
   [..., V], the tied output projection.
3. `block`: an `nn.Module` class, `block(config, scanned=False)`, called `(x, context,
   layer, deterministic, keep)` -> x [B, T, E] (with `scanned`: (x, x if keep else
   None)); `layer` its index (a Python int unless scanned).
4. `mlm_transform(config, x)`: the MLM head's dense + activation + norm, [B, P, E] ->
   [B, P, E], built in the head's compact scope (its parameters' names are the
   family's, e.g. the Hugging Face table's).
5. `block_weights(config)`: the weights one block multiplies each token by (its
   matmul FLOPs per token / 2).
6. `task_features(config, out, deterministic, pooled, dropout)`: what a task head
   reads, called in the head's compact `__call__`: `pooled` [B, E] (sequence
   classification, multiple choice) or per token [B, T, E] (tagging, span QA).
   `dropout`: whether the family's classic head drops out there (per token: tagging
   True, span QA False); pooled, sequence classification passes True and multiple
   choice False, for a family whose two heads differ (ELECTRA's classification head
   drops out [CLS] before its dense, its multiple-choice summary does not; BERT and
   ModernBERT ignore it there). `out` is the encoder's output with the batch's
   'attention_mask' [B, T].
7. `output_layer(config, features, name)`: a task head's `nn.Dense` [E] -> [features].
And, where it has them: `unscanned_layers` (the leading blocks kept out of the scan:
ModernBERT's block 0 has no attention norm), `inputs` (its embedding's own inputs,
e.g. ModernBERT's `global_rope_theta`), `final_norm(config)` (the module named
'final_norm' after the blocks), `pooler(config)` (the module on the first position,
named 'pooler', when `config.pooler`), `heads` (its own pretraining heads),
`head_flops`, `token_weights`, `pretraining_heads` and `phase_inputs` (below).

Shapes: B batch, T length, E hidden, V vocabulary, P predictions per row.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax

from bertjax.errors import ConfigError
from bertjax.model import layout, stack


@dataclasses.dataclass(frozen=True)
class Head:
  """A pretraining head: `module(config)` (an `nn.Module`; its parameters live under
  `name`), called `(encoder output, encoder, **inputs)` -> logits, the model's
  '<name>_logits' (float32). `inputs`: the batch fields it reads besides the
  encoder's; `required`: it runs only when they are given (else they are optional)."""

  name: str
  module: Callable[[Any], nn.Module]
  inputs: tuple[str, ...] = ()
  required: bool = True


def _no_phase_inputs(config, lengths: Sequence[int]) -> list[dict[str, float]]:
  del config
  return [{} for _ in lengths]


@dataclasses.dataclass(frozen=True)
class Family:
  """One family of encoders: its parts (the module docstring lists them).

  heads: its own pretraining heads (`Head`); every family has the stack's 'mlm'.
  head_flops: (config, batch) -> {term: FLOPs of one training step} of its own heads
    and pooler (`stack.train_flops` adds them).
  mlm_weights: config -> the weights the MLM head multiplies each prediction by before
    its decoder (its transform; default E D, one dense: `stack.train_flops`), e.g. 0
    for EuroBERT's decoder alone, UltraBERT's two-layer head.
  token_weights: config -> the weights every token is multiplied by outside the blocks
    and the MLM head (ELECTRA's embedding projection, its replaced-token detector at
    every position; `stack.train_flops` counts 6 B T of them). None: none.
  pretraining_heads: config -> the config with every pretraining head the family's
    recipe trains (what an imported encoder gets fresh heads for).
  phase_inputs: (config, lengths) -> for each pretraining length phase (its row
    length, in order) the constant per-row inputs its batches carry to the model
    ({name: value}, e.g. ModernBERT's `global_rope_theta`; {} none), after a one-line
    ConfigError if the model cannot train at a length.
  """

  name: str
  config: type
  embeddings: type
  block: type
  mlm_transform: Callable[[Any, jax.Array], jax.Array]
  block_weights: Callable[[Any], int]
  task_features: Callable[..., jax.Array]
  output_layer: Callable[[Any, int, str], nn.Dense]
  unscanned_layers: int = 0
  inputs: tuple[str, ...] = ()
  final_norm: Callable[[Any], nn.Module] | None = None
  pooler: Callable[[Any], nn.Module] | None = None
  heads: tuple[Head, ...] = ()
  head_flops: Callable[[Any, int], dict[str, float]] | None = None
  mlm_weights: Callable[[Any], int] | None = None
  token_weights: Callable[[Any], int] | None = None
  pretraining_heads: Callable[[Any], Any] = lambda config: config
  phase_inputs: Callable[[Any, Sequence[int]], list[dict[str, float]]] = _no_phase_inputs

  def head(self, name: str) -> Head:
    """The pretraining head `name` ('mlm', or one of the family's own)."""
    if name == "mlm":
      return Head("mlm", lambda config: stack.MLMHead(config, self.mlm_transform),
                  ("masked_lm_positions",), required=False)
    for head in self.heads:
      if head.name == name:
        return head
    raise ConfigError(f"the {self.name!r} family has no {name!r} pretraining head: it "
                      f"has {['mlm'] + [h.name for h in self.heads]}.")

  def config_heads(self, config) -> tuple[str, ...]:
    """The heads `config`'s booleans name: 'mlm', and each own head whose field
    (`config.nsp`, `config.sbo`) is set."""
    return ("mlm",) + tuple(h.name for h in self.heads if getattr(config, h.name))

  def encoder(self, config) -> stack.Encoder:
    """The encoder alone (the fine-tuning trunk; `stack.Encoder`)."""
    return stack.Encoder(config, self)

  def pretraining(self, config, heads: Sequence[str] | None = None) -> stack.PreTraining:
    """The encoder with the pretraining `heads` (default: `config_heads(config)`); its
    encoder's parameters under 'encoder', each head's under its name."""
    return stack.PreTraining(config, self, tuple(heads or self.config_heads(config)))

  def to_layout(self, params: dict, scan_layers: bool) -> dict:
    """The parameters in the layout a model with `scan_layers` expects (exact both
    ways; `layout.to_layout` with the family's `unscanned_layers`)."""
    return layout.to_layout(params, scan_layers, self.unscanned_layers)

  def train_flops(self, config, batch: int, seq: int, predictions: int
                  ) -> dict[str, float]:
    """{term: FLOPs of one training step, 'total'} (`stack.train_flops`): the model
    FLOPs of MFU."""
    return stack.train_flops(self, config, batch, seq, predictions)
