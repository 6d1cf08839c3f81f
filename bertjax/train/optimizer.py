"""Optimizer: AdamW (or LAMB), BERT's learning-rate schedule, decay mask, clipping."""

from __future__ import annotations

from typing import Any, Callable

import flax
import jax
import optax

from bertjax.errors import at_least, one_of, positive, within
from bertjax.train import spikes

# config.train.optimizer -> optax's optimizer.
OPTIMIZERS = {"adamw": optax.adamw, "lamb": optax.lamb}


# config.train.decay_start: where the linear decay to 0 starts.
#   'warmup_end': from the peak at the end of warm-up (Hugging Face's
#     get_linear_schedule_with_warmup, the papers' "linear warm-up then linear decay").
#   'step0': from step 0, the warm-up overriding it (BERT's TF `optimization.py`):
#     the decay resumes below the peak, at peak * (1 - warmup / num_steps).
DECAY_STARTS = ("warmup_end", "step0")


def learning_rate_schedule(train_cfg) -> optax.Schedule:
  """Linear warm-up from 0 to the peak over `warmup_steps`, then linear decay reaching
  0 at `num_steps`, from where `train_cfg.decay_start` says. With 'warmup_end',
  lr(t) = peak * (num_steps - t) / (num_steps - warmup) after warm-up; with 'step0',
  lr(t) = peak * (1 - t / num_steps)."""
  peak, warmup, total = train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.num_steps
  if warmup == 0:
    return optax.linear_schedule(peak, 0.0, total)
  start = peak if train_cfg.decay_start == "warmup_end" else (
      peak * (1 - warmup / total))
  decay = optax.linear_schedule(start, 0.0, total - warmup)
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def check_config(train_cfg) -> None:
  """The optimizer's fields of `config.train` in range (one ConfigError line each)."""
  positive("train.learning_rate", train_cfg.learning_rate)
  one_of("train.optimizer", train_cfg.optimizer, OPTIMIZERS)
  one_of("train.decay_start", train_cfg.decay_start, DECAY_STARTS)
  at_least("train.weight_decay", train_cfg.weight_decay, 0)
  within("train.b1", train_cfg.b1, 0, 1, "[)")
  within("train.b2", train_cfg.b2, 0, 1, "[)")
  positive("train.eps", train_cfg.eps, " (Adam divides by sqrt(v) + eps)")
  at_least("train.max_grad_norm", train_cfg.max_grad_norm, 0)
  at_least("train.spike_window", train_cfg.spike_window, 2)  # a standard deviation needs two
  positive("train.spike_sigma", train_cfg.spike_sigma)


def decay_mask(params):
  """Weight decay on weight matrices and embedding tables only: not on LayerNorm
  parameters (`scale`, `bias`) nor on any bias."""
  flat = flax.traverse_util.flatten_dict(params)
  return flax.traverse_util.unflatten_dict(
      {path: path[-1] in ("kernel", "embedding") for path in flat})


def create_optimizer(train_cfg, frozen: Callable[[Any], Any] | None = None,
                     stateless_frozen: bool = False) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW or LAMB with the schedule and the decay mask, then
  zero updates where `frozen(params)` (a tree of bools) is True; all of it wrapped in
  `spikes.skip_spikes` with `skip_step_on_spikes`. Frozen parameters keep (unused)
  moments, so the state's shapes, shardings and checkpoints stay those of `params`;
  with `stateless_frozen` they have none (`optax.partition`: the optimizer sees only
  the trained parameters; a frozen encoder under a small head)."""
  schedule = learning_rate_schedule(train_cfg)
  kwargs = dict(learning_rate=schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
                weight_decay=train_cfg.weight_decay, mask=decay_mask)
  opt = OPTIMIZERS[train_cfg.optimizer](**kwargs)
  if train_cfg.max_grad_norm > 0:
    opt = optax.chain(optax.clip_by_global_norm(train_cfg.max_grad_norm), opt)
  if frozen is not None and stateless_frozen:
    labels = lambda params: jax.tree.map(lambda f: "frozen" if f else "train", frozen(params))
    opt = optax.partition({"train": opt, "frozen": optax.set_to_zero()}, labels)
  elif frozen is not None:
    opt = optax.chain(opt, optax.masked(optax.set_to_zero(), frozen))
  if train_cfg.skip_step_on_spikes:
    opt = spikes.skip_spikes(opt, train_cfg.spike_window, train_cfg.spike_sigma)
  return opt
