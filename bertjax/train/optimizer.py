"""Optimizer: AdamW (or LAMB), BERT's learning-rate schedule, decay mask, clipping."""

from __future__ import annotations

from typing import Any, Callable

import flax
import optax

from bertjax.train import spikes

# config.train.optimizer -> optax's optimizer (the names are checked in config_checks).
OPTIMIZERS = {"adamw": optax.adamw, "lamb": optax.lamb}


def learning_rate_schedule(train_cfg) -> optax.Schedule:
  """BERT's schedule: linear warm-up to the peak over `warmup_steps`, and a linear decay
  that reaches 0 at `num_steps` measured from step 0 (`polynomial_decay` in the original
  `optimization.py`), so lr(t) = peak * (1 - t / num_steps) after warm-up."""
  peak, warmup, total = train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.num_steps
  decay = optax.linear_schedule(peak * (1 - warmup / total), 0.0, total - warmup)
  if warmup == 0:
    return optax.linear_schedule(peak, 0.0, total)
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def decay_mask(params):
  """Weight decay on weight matrices and embedding tables only: not on LayerNorm
  parameters (`scale`, `bias`) nor on any bias."""
  flat = flax.traverse_util.flatten_dict(params)
  return flax.traverse_util.unflatten_dict(
      {path: path[-1] in ("kernel", "embedding") for path in flat})


def create_optimizer(train_cfg, frozen: Callable[[Any], Any] | None = None
                     ) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW or LAMB with the schedule and the decay mask, then
  zero updates where `frozen(params)` (a tree of bools) is True; all of it wrapped in
  `spikes.skip_spikes` with `skip_step_on_spikes`. Frozen parameters keep (unused)
  moments, so the state's shapes, shardings and checkpoints stay those of `params`."""
  schedule = learning_rate_schedule(train_cfg)
  kwargs = dict(learning_rate=schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
                weight_decay=train_cfg.weight_decay, mask=decay_mask)
  opt = OPTIMIZERS[train_cfg.optimizer](**kwargs)
  if train_cfg.max_grad_norm > 0:
    opt = optax.chain(optax.clip_by_global_norm(train_cfg.max_grad_norm), opt)
  if frozen is not None:
    opt = optax.chain(opt, optax.masked(optax.set_to_zero(), frozen))
  if train_cfg.skip_step_on_spikes:
    opt = spikes.skip_spikes(opt, train_cfg.spike_window, train_cfg.spike_sigma)
  return opt
