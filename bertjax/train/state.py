"""Building the model, the optimizer and the (sharded) train state from a config."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh, NamedSharding

from bertjax.model import BertForPreTraining, ModelConfig
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import optimizer
from bertjax.train.step import TrainState, make_train_step


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


class Trainer(NamedTuple):
  """Everything one training step needs on one mesh, built in one place."""

  mesh: Mesh
  rules: tuple
  model: BertForPreTraining
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract: TrainState  # unboxed, no memory
  shardings: TrainState  # NamedShardings of every leaf
  batch_sharding: NamedSharding
  train_step: Callable  # jitted `(state, batch) -> (state, metrics)`, state donated

  def init_state(self, config) -> TrainState:
    return create_train_state(config, self.model, self.tx, self.shardings)


def build_trainer(config: ml_collections.ConfigDict, mesh: Mesh | None = None) -> Trainer:
  """Model, optimizer, shardings from the logical-axis rules, and the jitted step
  (explicit in/out shardings, donated state). Call the step under
  `jax.set_mesh(trainer.mesh), nn.logical_axis_rules(trainer.rules)`."""
  rules = tuple(map(tuple, config.logical_axis_rules))
  mesh = mesh if mesh is not None else mesh_lib.create_mesh(config.mesh)
  model, tx = build_model(config), optimizer.create_optimizer(config.train)
  schedule = optimizer.learning_rate_schedule(config.train)
  boxed = jax.eval_shape(_init_fn(config, model, tx))
  shardings = mesh_lib.logical_shardings(boxed, mesh, rules)
  batch_sharding = mesh_lib.batch_sharding(mesh, rules)
  step = jax.jit(
      make_train_step(model, tx, schedule, config.seed, config.train.grad_accum_steps),
      in_shardings=(shardings, batch_sharding), out_shardings=(shardings, None),
      donate_argnums=0)
  return Trainer(mesh, rules, model, tx, schedule, nn.unbox(boxed), shardings,
                 batch_sharding, step)


def create_train_state(config, model, tx, shardings) -> TrainState:
  """Initialises the state directly onto its shardings (no host copy). Traced without
  a context mesh: flax's DenseGeneral constrains its flattened kernel during init, so
  the placement comes from `out_shardings` alone."""
  init = _init_fn(config, model, tx)
  return jax.jit(lambda: nn.unbox(init()), out_shardings=shardings)()


def param_count(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
