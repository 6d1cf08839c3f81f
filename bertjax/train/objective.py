"""Pretraining's objective for the trainer: the run's objectives (`bertjax.objectives`:
MLM, + NSP, + SpanBERT's SBO, ... by `config.objectives`) as the step's `Objective`, and
their held-out evaluation step.

Batch keys (global arrays, leading dim B): input_ids, attention_mask, token_type_ids
[B, T], and the fields the objectives read (`Objectives.fields`: masked_lm_positions,
masked_lm_ids, masked_lm_weights [B, P]; next_sentence_labels [B] for NSP;
span_left_positions, span_right_positions, span_relative_positions [B, P] for SBO);
optionally position_ids, segment_ids [B, T]; global_rope_theta [B] (a length phase's
input, `Family.phase_inputs`); held out, example_weights [B]; in training, row_keys
[B] where an objective draws per row (`Objective.row_keys`: the step adds them). Each
network reads the fields it declares (`stack.PreTraining.inputs`: the encoder's, its
family's, each head's); the rest stay in the batch for the losses.
"""

from __future__ import annotations

from typing import Any, Callable

from bertjax.objectives import Objectives
from bertjax.train.step import Objective


def objective(objectives: Objectives) -> Objective:
  """The sum of the objectives' losses, their parameters' initialisation and metrics."""
  return Objective(init=objectives.networks.init, sums=objectives.sums,
                   counts=objectives.counts, loss=objectives.loss,
                   metrics=objectives.metrics, metric_names=objectives.metric_names,
                   row_keys=objectives.row_keys)


def make_eval_step(objectives: Objectives) -> Callable[[Any, dict], dict]:
  """`(params, batch) -> sums`: summed losses, correct counts and counts
  ('<count>_count'), no dropout; sum over batches on the host, then
  `Objectives.eval_metrics`."""

  def eval_step(params, batch):
    sums = objectives.sums(params, batch, None)
    sums.update({f"{k}_count": v for k, v in objectives.counts(batch).items()})
    return sums

  return eval_step
