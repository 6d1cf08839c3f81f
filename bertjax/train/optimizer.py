"""Optimizer: AdamW, LAMB or StableAdamW; BERT's linear or a warm-up-stable-decay
learning-rate schedule, with restarts at new peaks and weight decays (ModernBERT's
runs); decay mask, clipping."""

from __future__ import annotations

from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bertjax.data.phases import boundary
from bertjax.errors import ConfigError, at_least, one_of, positive, within
from bertjax.train import spikes, stable_adamw

# config.train.optimizer -> the optimizer.
OPTIMIZERS = {"adamw": optax.adamw, "lamb": optax.lamb,
              "stable_adamw": stable_adamw.stable_adamw}
# config.train.schedule: 'linear' (BERT's) or 'wsd' (warm-up, stable, decay).
SCHEDULES = ("linear", "wsd")
# config.train.decay_shape of 'wsd': lr falls as 1 - sqrt(x) (Haegele et al. 2024;
# ModernBERT's decay phase) or as 1 - x over the decay's fraction x.
DECAY_SHAPES = ("1-sqrt", "linear")


# config.train.decay_start: where the linear decay to 0 starts.
#   'warmup_end': from the peak at the end of warm-up (Hugging Face's
#     get_linear_schedule_with_warmup, the papers' "linear warm-up then linear decay").
#   'step0': from step 0, the warm-up overriding it (BERT's TF `optimization.py`):
#     the decay resumes below the peak, at peak * (1 - warmup / num_steps).
DECAY_STARTS = ("warmup_end", "step0")


def learning_rate_schedule(train_cfg) -> optax.Schedule:
  """`train_cfg.schedule`: `wsd_schedule` (with the restarts' peaks), or
  `linear_schedule`."""
  if train_cfg.schedule == "wsd":
    return wsd_schedule(train_cfg.learning_rate, train_cfg.warmup_steps,
                        decay_steps(train_cfg), train_cfg.num_steps,
                        train_cfg.final_lr_fraction, train_cfg.decay_shape,
                        [(step, peak) for step, peak, _ in restarts(train_cfg)])
  return linear_schedule(train_cfg)


def restarts(train_cfg) -> list[tuple[int, float, float]]:
  """`config.train.learning_rate_restarts` -> [(first step, peak, weight decay)],
  ascending: from step round(fraction * num_steps) on (`bertjax.data.phases.boundary`,
  as the length phases switch), the schedule holds `peak` and decays with `weight
  decay` (what Composer's `restart_override` resets between the ModernBERT authors'
  runs; decouple_lr's maximum stays `learning_rate`, as optimi's max_lr survives
  them). Pretraining only (a fine-tuning section has no such field): []."""
  spec = (tuple(train_cfg.learning_rate_restarts)
          if "learning_rate_restarts" in train_cfg else ())
  out = []
  for k, r in enumerate(spec):
    ok = (isinstance(r, (tuple, list)) and len(r) == 3
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in r))
    if not (ok and 0 < r[0] < 1 and r[1] > 0 and r[2] >= 0):
      raise ConfigError(f"config.train.learning_rate_restarts[{k}]={r!r}: write (fraction "
                        "of the steps where it starts in (0, 1), peak > 0, weight decay "
                        ">= 0)")
    out.append((boundary(r[0], train_cfg.num_steps), float(r[1]), float(r[2])))
  return out


def linear_schedule(train_cfg) -> optax.Schedule:
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


def decay_steps(train_cfg) -> int:
  """'wsd': the steps of the final decay, round(decay_fraction * num_steps)."""
  return int(round(train_cfg.decay_fraction * train_cfg.num_steps))


def wsd_schedule(peak: float, warmup: int, decay: int, num_steps: int,
                 final_fraction: float = 0.0, shape: str = "1-sqrt",
                 levels: list[tuple[int, float]] = ()) -> optax.Schedule:
  """Warm-up-stable-decay (trapezoidal; Xing et al. 2018, Hu et al. 2024): lr(t) rises
  linearly from 0 to `peak` over `warmup` steps, holds `peak` (from each (step, level)
  of `levels` on, ascending and after the warm-up, holds `level` instead), then over
  the last `decay` steps falls from the level held, L, to end = L * final_fraction, at
  x = (t - (num_steps - decay)) / decay: end + (L - end) * (1 - sqrt(x)) ('1-sqrt') or
  * (1 - x) ('linear'); end from num_steps on. Composer's WarmupStableDecayScheduler
  (linear), ConstantWithWarmupScheduler (a level) and OneMinusSqrtScheduler ('1-sqrt',
  alpha_f = final_fraction) in ModernBERT's src/scheduler.py, counted in steps rather
  than tokens."""
  parts, boundaries = [], []
  if warmup:
    parts.append(optax.linear_schedule(0.0, peak, warmup))
    boundaries.append(warmup)
  parts.append(optax.constant_schedule(peak))
  held = peak
  for step, level in levels:
    parts.append(optax.constant_schedule(level))
    boundaries.append(step)
    held = level
  if decay:
    boundaries.append(num_steps - decay)
    end = held * final_fraction
    if shape == "linear":
      parts.append(optax.linear_schedule(held, end, decay))
    else:
      parts.append(lambda t: end + (held - end) * (
          1 - jnp.sqrt(jnp.clip(t / decay, 0.0, 1.0))))
  return optax.join_schedules(parts, boundaries) if boundaries else parts[0]


def weight_decay_schedule(train_cfg) -> float | optax.Schedule:
  """The decay rate the optimizers multiply by lr_t: `weight_decay` (divided by the
  peak `learning_rate` with `decouple_lr`), or with restarts a step function of the
  optimizer's step count taking each restart's weight decay from its first step."""
  scale = 1.0 / train_cfg.learning_rate if train_cfg.decouple_lr else 1.0
  later = restarts(train_cfg)
  if not later:
    return train_cfg.weight_decay * scale
  starts = jnp.asarray([step for step, _, _ in later], jnp.int32)
  rates = jnp.asarray([train_cfg.weight_decay] + [wd for _, _, wd in later],
                      jnp.float32) * scale
  return lambda count: rates[jnp.searchsorted(starts, count, side="right")]


def check_config(train_cfg) -> None:
  """The optimizer's and the schedule's fields of `config.train` in range (one
  ConfigError line each)."""
  t = train_cfg
  positive("train.learning_rate", t.learning_rate)
  one_of("train.optimizer", t.optimizer, OPTIMIZERS)
  one_of("train.schedule", t.schedule, SCHEDULES)
  one_of("train.decay_start", t.decay_start, DECAY_STARTS)
  at_least("train.weight_decay", t.weight_decay, 0)
  within("train.b1", t.b1, 0, 1, "[)")
  within("train.b2", t.b2, 0, 1, "[)")
  positive("train.eps", t.eps, " (Adam divides by sqrt(v) + eps)")
  at_least("train.max_grad_norm", t.max_grad_norm, 0)
  at_least("train.spike_window", t.spike_window, 2)  # a standard deviation needs two
  positive("train.spike_sigma", t.spike_sigma)
  if t.schedule != "wsd":
    if restarts(t):
      raise ConfigError("config.train.learning_rate_restarts needs "
                        "config.train.schedule='wsd' (restarts hold levels; 'linear' "
                        "decays from one peak).")
    return
  one_of("train.decay_shape", t.decay_shape, DECAY_SHAPES)
  within("train.final_lr_fraction", t.final_lr_fraction, 0, 1)
  within("train.decay_fraction", t.decay_fraction, 0, 1)
  later = restarts(t)
  # Pretraining counts the warm-up in steps, fine-tuning as a fraction of its steps.
  if "num_steps" in t:
    warmup, named = t.warmup_steps / t.num_steps, (
        f"config.train.warmup_steps={t.warmup_steps} of num_steps={t.num_steps}")
  else:
    warmup, named = t.warmup_fraction, f"config.train.warmup_fraction={t.warmup_fraction}"
  if warmup + t.decay_fraction > 1:
    raise ConfigError(f"config.train.decay_fraction={t.decay_fraction!r} overlaps the "
                      f"warm-up ({named}): the decay cannot start before the warm-up ends.")
  steps = [step for step, _, _ in later]
  if later and not (t.warmup_steps <= steps[0] and steps == sorted(set(steps)) and
                    steps[-1] <= t.num_steps - decay_steps(t)):
    raise ConfigError(
        f"config.train.learning_rate_restarts start at steps {steps}: they must ascend, "
        f"start after the warm-up ({t.warmup_steps} steps) and before the final decay "
        f"(step {t.num_steps - decay_steps(t)}).")


def decay_mask(params):
  """Weight decay on weight matrices and embedding tables only: not on LayerNorm
  parameters (`scale`, `bias`) nor on any bias."""
  flat = flax.traverse_util.flatten_dict(params)
  return flax.traverse_util.unflatten_dict(
      {path: path[-1] in ("kernel", "embedding") for path in flat})


def create_optimizer(train_cfg, frozen: Callable[[Any], Any] | None = None,
                     stateless_frozen: bool = False,
                     own_rates: dict[str, float] | None = None
                     ) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW, LAMB or StableAdamW with the schedule and the
  decay mask, then zero updates where `frozen(params)` (a tree of bools) is True; all
  of it wrapped in `spikes.skip_spikes` with `skip_step_on_spikes`. Frozen parameters
  keep (unused) moments, so the state's shapes, shardings and checkpoints stay those of
  `params`; with `stateless_frozen` they have none (`optax.partition`: the optimizer
  sees only the trained parameters; a frozen encoder under a small head). With
  `decouple_lr` the decay rate is weight_decay / peak learning rate, so lr_t * rate =
  (lr_t / peak) * weight_decay: optimi's and Composer's "fully decoupled" decay; with
  `learning_rate_restarts` the weight decay changes at each (`weight_decay_schedule`:
  its step count is the optimizer's, as the learning rate's is). `own_rates` {top-level
  parameter name: peak learning rate} gives those parameters the same optimizer and
  schedule at their own peak (sentence-transformers' learning_rate_mapping: a parameter
  group of its own), the clipping's norm still over every gradient."""
  def adam(cfg):
    return OPTIMIZERS[cfg.optimizer](
        learning_rate=learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
        weight_decay=weight_decay_schedule(cfg), mask=decay_mask)

  opt = adam(train_cfg)
  if own_rates:
    groups = {"run": opt}
    for name, rate in own_rates.items():
      cfg = train_cfg.copy_and_resolve_references()
      cfg.learning_rate = rate
      groups[name] = adam(cfg)
    # A label per (possibly boxed) parameter: a box's own leaves would hold its state.
    opt = optax.partition(groups, lambda params: {
        k: jax.tree.map(lambda _, k=k: k if k in own_rates else "run", v,
                        is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
        for k, v in params.items()})
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
