"""The model seam: what a family of encoders (`config.model.family`) gives the rest of
bertjax. Every module that builds a model, restores or converts parameters, counts
FLOPs or plans memory goes through a `Family` (`bertjax.model.family_of` picks it);
a new family is one file in bertjax/model/ that defines its `FAMILY`, listed in
`bertjax.model.FAMILIES`, plus its Hugging Face table in bertjax/hf/.

Shapes: B batch, T length, E hidden, K slots of a packed row.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax


@dataclasses.dataclass(frozen=True)
class Family:
  """One family of encoders.

  config: its frozen hyperparameter dataclass (`from_config(config.model)`,
    `to_dict()`), whose instances also answer what the data and the trainer ask of any
    model: `family`, `vocab_size`, `hidden_size`, `num_layers`, `num_heads`,
    `intermediate_size`, `max_position_embeddings`, `pad_token_id`, `position_offset`
    (0 unless positions start past the padding id), `type_vocab_size` (token types
    the model embeds: 0 for none), `nsp`, `sbo`, `pooler`,
    `scan_layers`, `remat_policy`, `attention_impl`, `attention_dropout_rate` (on the
    attention probabilities: it picks the attention path), `dtype`, `param_dtype`,
    `initializer_range`.
  pretraining: the encoder with its pretraining heads, an `nn.Module` class built from
    the config: `__call__(input_ids, attention_mask, token_type_ids,
    masked_lm_positions, position_ids, segment_ids, span_left_positions,
    span_right_positions, span_relative_positions, deterministic, **phase inputs)` ->
    {'mlm_logits' [B, P, V], 'nsp_logits' [B, 2] with NSP, 'sbo_logits' with SBO};
    `encode(...)`; `init_params(rng)`; its encoder's parameters under 'encoder'.
  encoder: the encoder alone (the fine-tuning trunk): `__call__(input_ids,
    attention_mask, token_type_ids, position_ids, segment_ids, deterministic,
    output_hidden_states)` -> {'last_hidden_state' [B, T, E], 'hidden_states'
    [L+1, B, T, E] when asked, 'pooled' [B, E] when the config has a pooler}.
  to_layout: (params, scan_layers) -> the parameters in that layout (exact both ways).
  pretraining_heads: config -> the config with every pretraining head the family's
    recipe trains (what an imported encoder gets fresh heads for).
  train_flops: (config, batch, seq, predictions) -> {term: FLOPs of one training step
    (forward + backward), 'total': their sum} — the model FLOPs of MFU.
  sequence_features: (config, out, deterministic) -> [B, E], called inside a task
    head's compact `__call__`: what a sequence classifier (or a multiple-choice scorer)
    reads, dropout included. `out` is the encoder's output with the batch's
    'attention_mask' [B, T].
  token_features: (config, out, deterministic, dropout) -> [B, T, E] what a tagger or a
    span-QA head reads (`dropout`: whether the family's classic head drops out here).
  output_layer: (config, features, name) -> the `nn.Dense` [E] -> [features] of a head.
  head_dropout: config -> the dropout rate of the task heads' own layers.
  slot_features: (config, encoder module, out, batch) -> the `out` of the K examples
    packed in each row, one row each: {'last_hidden_state' [B*K, 1, E],
    'attention_mask' [B*K, 1], ...} (`batch['cls_positions']` [B, K], 'segment_ids'),
    for heads that predict one thing per example.
  phase_inputs: (config, lengths) -> for each pretraining length phase (its row
    length, in order) the constant per-row inputs its batches carry to the model
    ({name: value}, e.g. ModernBERT's `global_rope_theta`; {} none), after a one-line
    ConfigError if the model cannot train at a length.
  """

  name: str
  config: type
  pretraining: type
  encoder: type
  to_layout: Callable[[dict, bool], dict]
  pretraining_heads: Callable[[Any], Any]
  train_flops: Callable[[Any, int, int, int], dict[str, float]]
  sequence_features: Callable[[Any, dict, bool], jax.Array]
  token_features: Callable[[Any, dict, bool, bool], jax.Array]
  output_layer: Callable[[Any, int, str], nn.Dense]
  head_dropout: Callable[[Any], float]
  slot_features: Callable[[Any, nn.Module, dict, dict], dict]
  phase_inputs: Callable[[Any, Sequence[int]], list[dict[str, float]]]
