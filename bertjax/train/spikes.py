"""Skipping loss spikes inside the jitted step (`config.train.skip_step_on_spikes`).

An optax wrapper around the whole optimizer: a step whose loss or raw gradient norm is
non-finite, or above the mean + k * std of the last `window` accepted steps, gets zero
updates and keeps the inner optimizer state (Adam moments, its step count and so the
learning-rate schedule) unchanged. The statistics live in the optimizer state, so they
are checkpointed and a resumed run skips exactly the same steps; no host sync is added.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class SpikeState(NamedTuple):
  inner: Any  # The wrapped optimizer's state.
  losses: jax.Array  # [window] f32 ring buffer: losses of the last accepted steps.
  grad_norms: jax.Array  # [window] f32 ring buffer: their gradient norms.
  accepted: jax.Array  # [] i32 steps accepted so far (the buffers are full at >= window).
  skipped: jax.Array  # [] i32 steps skipped so far.
  last_skipped: jax.Array  # [] bool whether the latest step was skipped.


def is_spike(value: jax.Array, history: jax.Array, full: jax.Array, sigma: float
             ) -> jax.Array:
  """value [] vs history [window]: non-finite, or (once `full`) > mean + sigma * std."""
  bound = jnp.mean(history) + sigma * jnp.std(history)
  return ~jnp.isfinite(value) | (full & (value > bound))


def skip_spikes(inner: optax.GradientTransformation, window: int, sigma: float
                ) -> optax.GradientTransformationExtraArgs:
  """`inner`, with updates dropped on spikes; `update(..., loss=loss)` needs the step's
  loss []. Until `window` steps were accepted only non-finite steps are skipped."""
  inner = optax.with_extra_args_support(inner)

  def init(params):
    zeros = jnp.zeros((window,), jnp.float32)
    zero = jnp.zeros((), jnp.int32)
    return SpikeState(inner.init(params), zeros, zeros, zero, zero, jnp.zeros((), bool))

  def update(grads, state: SpikeState, params=None, *, loss, **extra):
    loss = jnp.asarray(loss, jnp.float32)
    grad_norm = optax.tree.norm(grads).astype(jnp.float32)
    full = state.accepted >= window
    skip = (is_spike(loss, state.losses, full, sigma)
            | is_spike(grad_norm, state.grad_norms, full, sigma))
    updates, inner_state = inner.update(grads, state.inner, params, **extra)
    updates = jax.tree.map(lambda u: jnp.where(skip, jnp.zeros_like(u), u), updates)
    inner_state = jax.tree.map(lambda new, old: jnp.where(skip, old, new), inner_state,
                               state.inner)
    slot = state.accepted % window
    keep = lambda buf, x: jnp.where(skip, buf, buf.at[slot].set(x))
    return updates, SpikeState(
        inner_state, keep(state.losses, loss), keep(state.grad_norms, grad_norm),
        state.accepted + (~skip).astype(jnp.int32), state.skipped + skip.astype(jnp.int32),
        skip)

  return optax.GradientTransformationExtraArgs(init, update)
