"""Building the model, the optimizer and the (sharded) train state from a config."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertjax.model import BertForPreTraining, ModelConfig
from bertjax.train import optimizer
from bertjax.train.step import TrainState


def build_model(config: ml_collections.ConfigDict) -> BertForPreTraining:
  return BertForPreTraining(ModelConfig.from_config(config.model))


def _init_fn(config, model, tx):
  """() -> TrainState with boxed (nn.Partitioned) params and optimizer state."""
  T, P = 8, 2  # Shapes do not matter for the parameters.

  def init():
    ids = jnp.zeros((1, T), jnp.int32)
    params = model.init({"params": jax.random.key(config.seed)}, ids,
                        masked_lm_positions=jnp.zeros((1, P), jnp.int32))["params"]
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))

  return init


def abstract_state(config: ml_collections.ConfigDict) -> tuple[TrainState, Any]:
  """(unboxed abstract TrainState, boxed abstract TrainState) — no memory used."""
  model, tx = build_model(config), optimizer.create_optimizer(config.train)
  boxed = jax.eval_shape(_init_fn(config, model, tx))
  return nn.unbox(boxed), boxed


def create_train_state(config, model, tx, shardings) -> TrainState:
  """Initialises the state directly onto its shardings (no host copy). Traced without
  a context mesh: flax's DenseGeneral constrains its flattened kernel during init, so
  the placement comes from `out_shardings` alone."""
  init = _init_fn(config, model, tx)
  return jax.jit(lambda: nn.unbox(init()), out_shardings=shardings)()


def param_count(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
