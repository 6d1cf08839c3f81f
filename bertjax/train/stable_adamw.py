"""StableAdamW: AdamW with per-tensor update clipping (Wortsman et al. 2023, "Stable and
low-precision training for large-scale vision-language models", Algorithm 2), computed
as optimi's `StableAdamW` does (github:warner-benjamin/optimi, optimi/stableadamw.py;
torch-optimi 0.2.1 is what ModernBERT trained with).

Per parameter tensor, at step t, with the gradient g and Adam's bias-corrected moments
m_hat and v_hat (v_hat already holding g):

    rms = sqrt(mean(g**2 / max(v_hat, eps**2)))
    lr' = lr_t / max(1, rms)
    p  <- p - lr' * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)

The decay term only on the tensors `mask` selects, and scaled by the clipped lr' too.
Adafactor's update clipping as a learning-rate scale: a tensor whose gradient jumps
above its running second moment moves less, where AdamW would take a full step sized
by a stale v. It stands in for gradient clipping (ModernBERT trains with none).

Composed from optax's `scale_by_adam`, `add_decayed_weights` and
`scale_by_learning_rate`, the per-tensor factor applied between the last two. A leaf
under a 'layers' key (`nn.scan`ned blocks stacked on a leading [L] axis, see
`bertjax.model.layout`) gets one factor per layer, as the unstacked model's tensors do.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

# The key under which `nn.scan` keeps stacked blocks (leading [L] axis).
STACKED = "layers"


def _stacked(path) -> bool:
  return any(getattr(k, "key", None) == STACKED for k in path)


def update_scales(grads, nu_hat, eps: float):
  """Per tensor 1 / max(1, sqrt(mean(g**2 / max(v_hat, eps**2)))), float32, shaped to
  broadcast against the tensor ([L, 1, ...] for a stacked leaf, one value per layer)."""

  def scale(path, g, v):
    axes = tuple(range(1 if _stacked(path) and g.ndim else 0, g.ndim))
    ratio = jnp.square(g.astype(jnp.float32)) / jnp.maximum(v.astype(jnp.float32), eps**2)
    return 1.0 / jnp.maximum(1.0, jnp.sqrt(jnp.mean(ratio, axis=axes, keepdims=True)))

  return jax.tree_util.tree_map_with_path(scale, grads, nu_hat)


class ScaleByStableAdamState(NamedTuple):
  adam: optax.ScaleByAdamState
  decay: optax.OptState


def scale_by_stable_adam(b1: float, b2: float, eps: float, weight_decay: float = 0.0,
                         mask: Any | Callable[[Any], Any] | None = None
                         ) -> optax.GradientTransformation:
  """Adam's direction plus decoupled weight decay (on `mask`), each tensor's sum scaled
  by its `update_scales` factor; the learning rate is applied after."""
  adam = optax.scale_by_adam(b1, b2, eps)
  decay = optax.add_decayed_weights(weight_decay, mask)

  def init_fn(params):
    return ScaleByStableAdamState(adam.init(params), decay.init(params))

  def update_fn(grads, state, params=None):
    updates, adam_state = adam.update(grads, state.adam, params)
    updates, decay_state = decay.update(updates, state.decay, params)
    nu_hat = optax.tree.bias_correction(adam_state.nu, b2, adam_state.count)
    updates = jax.tree.map(lambda u, s: (u * s).astype(u.dtype), updates,
                           update_scales(grads, nu_hat, eps))
    return updates, ScaleByStableAdamState(adam_state, decay_state)

  return optax.GradientTransformation(init_fn, update_fn)


def stable_adamw(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99,
                 eps: float = 1e-6, weight_decay: float = 1e-2,
                 mask: Any | Callable[[Any], Any] | None = None
                 ) -> optax.GradientTransformation:
  """StableAdamW with optax.adamw's signature (defaults: optimi's). `weight_decay` is
  multiplied by the (clipped) learning rate, optimi's `decouple_lr=False`; its
  `decouple_lr=True` (decay scaled by lr / peak) is weight_decay / peak here."""
  return optax.chain(scale_by_stable_adam(b1, b2, eps, weight_decay, mask),
                     optax.scale_by_learning_rate(learning_rate))
