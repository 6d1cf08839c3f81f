"""An objective, an optimizer and a mesh -> the sharded state and the jitted step
(`setup`); pretraining's model and optimizer from a config (`build_trainer`)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bertjax.errors import ConfigError, one_of
from bertjax import objectives as objectives_lib
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import compilation, optimizer, objective
from bertjax.train import step as step_lib
from bertjax.train.step import Objective, TrainState, make_train_step, new_window


class Inference(NamedTuple):
  """What running a model (no training) needs on one mesh: the model, the shardings of
  its parameters and of a batch (`inference`, or a training `Setup.inference`)."""

  mesh: Mesh
  rules: tuple
  model: nn.Module
  params: Any  # NamedShardings of the parameters
  batch_sharding: NamedSharding


def inference(config: ml_collections.ConfigDict, model: nn.Module,
              init: Callable[[jax.Array], Any]) -> Inference:
  """The `Inference` of `model` on `config.mesh` with `config.logical_axis_rules`;
  `init(rng)` gives its boxed parameters (traced for their shapes only)."""
  rules = tuple(map(tuple, config.logical_axis_rules))
  mesh = mesh_lib.create_mesh(config.mesh)
  params = mesh_lib.logical_shardings(jax.eval_shape(init, jax.random.key(0)), mesh, rules)
  return Inference(mesh, rules, model, params, mesh_lib.batch_sharding(mesh, rules))


class SeededStep(NamedTuple):
  """The jitted train step with the run's seed bound: `(state, batch) -> (state,
  metrics)` and `.lower(state, batch)`; `jitted` takes the seed as its third argument
  (one program for every seed)."""

  jitted: Callable
  seed: np.int32  # a host scalar: lowers for abstract devices (a TPU topology) too

  def __call__(self, state, batch):
    return self.jitted(state, batch, self.seed)

  def lower(self, state, batch):
    return self.jitted.lower(state, batch, self.seed)


def seed_scalar(seed: int) -> np.int32:
  """`seed` as the int32 scalar the step and the initialisation take (replicated); a
  one-line error when it is not a 32-bit integer."""
  if not -2**31 <= seed < 2**31:
    raise ConfigError(f"config.seed={seed} is not a 32-bit integer; use one below 2**31.")
  return np.int32(seed)


class Setup(NamedTuple):
  """Everything one training step needs on one mesh, built in one place (`setup`)."""

  mesh: Mesh
  rules: tuple
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract: TrainState  # unboxed, no memory
  shardings: TrainState  # NamedShardings of every leaf
  batch_sharding: NamedSharding
  train_step: SeededStep  # jitted `(state, batch) -> (state, metrics)`, state donated
  objective: Objective

  @property
  def inference(self) -> Inference:
    return Inference(self.mesh, self.rules, self.model, self.shardings.params,
                     self.batch_sharding)

  def init_params(self, config, part: str | None = None) -> Any:
    """Parameters drawn from `config.seed`, directly onto their shardings (the seed an
    argument: one program for every seed); with `part`, only that top-level entry
    ('head': a fine-tuning run from a pretrained encoder): the same values, the rest of
    the draw left out of the program (for a tiny BERT 0.17 s of compiling against
    1.04 s). On a GPU its Threefry bits come from JAX's kernel (the same bits:
    `compilation.threefry_kernel`)."""
    with compilation.threefry_kernel():
      return self.init_program(part)(seed_scalar(config.seed))

  def init_program(self, part: str | None = None) -> Callable:
    """`init_params`' jitted draw: int32 seed -> parameters on their shardings. Traced
    without a context mesh: flax's DenseGeneral constrains its flattened kernel during
    init, so the placement comes from `out_shardings` alone."""
    def draw(seed):
      params = nn.unbox(self.objective.init(jax.random.key(seed)))
      return params if part is None else params[part]

    shardings = self.shardings.params if part is None else self.shardings.params[part]
    return jax.jit(draw, out_shardings=shardings)

  def init_state(self, config, params: Any = None) -> TrainState:
    """A fresh state on the shardings: `params` (default: `init_params(config)`),
    the optimizer's initial state, step 0 and an empty log window."""
    params = self.init_params(config) if params is None else params
    # Made by jit, placed like the step's output (an unplaced state would retrace the
    # step once), each leaf its own buffer (the step donates them all).
    step, opt_state, window = jax.jit(
        lambda p: (jnp.zeros((), jnp.int32), self.tx.init(p), new_window(self.objective)),
        out_shardings=(self.shardings.step, self.shardings.opt_state,
                       self.shardings.window))(params)
    return TrainState(step, params, opt_state, window)


def setup(config: ml_collections.ConfigDict, model: nn.Module, objective: Objective,
          tx: optax.GradientTransformation, schedule: optax.Schedule,
          mesh: Mesh | None = None) -> Setup:
  """Shardings of the state from the logical-axis rules (`config.logical_axis_rules`)
  on `mesh` (default: `config.mesh`'s), and the jitted step (explicit in/out
  shardings, donated state; `config.train.grad_accum_steps`, `log_every`). Call the
  step under `jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules)`."""
  rules = tuple(map(tuple, config.logical_axis_rules))
  mesh = mesh if mesh is not None else mesh_lib.create_mesh(config.mesh)
  accum = config.train.grad_accum_steps
  dp = mesh_lib.data_parallel_size(mesh, rules)
  if config.train.batch_size % (dp * accum):
    raise ConfigError(
        f"config.train.batch_size={config.train.batch_size} is not divisible by the "
        f"{dp} data-parallel devices x {accum} grad_accum_steps; use a multiple of "
        f"{dp * accum}.")

  prng_impl = config.train.get("prng_impl", "")
  one_of("train.prng_impl", prng_impl, step_lib.PRNG_IMPLS)
  boxed = jax.eval_shape(_initial_state(objective, tx, config.seed))
  shardings = mesh_lib.logical_shardings(boxed, mesh, rules)
  batch_sharding = mesh_lib.batch_sharding(mesh, rules)
  step = SeededStep(jax.jit(
      make_train_step(objective, tx, schedule, accum, config.train.log_every,
                      prng_impl),
      in_shardings=(shardings, batch_sharding, NamedSharding(mesh, P())),
      out_shardings=(shardings, None), donate_argnums=0), seed_scalar(config.seed))
  return Setup(mesh, rules, model, tx, schedule, nn.unbox(boxed), shardings,
               batch_sharding, step, objective)


def build_model(config: ml_collections.ConfigDict) -> nn.Module:
  """The pretraining model (encoder and heads) of the network the run exports: with
  the heads its objectives read (`bertjax.objectives.from_config`)."""
  return objectives_lib.from_config(config).module


def build_trainer(config: ml_collections.ConfigDict, mesh: Mesh | None = None) -> Setup:
  """Pretraining's `Setup`: the objectives of `config.objectives` and the networks they
  train (`Setup.model`: the exported one), the optimizer and schedule of
  `config.train`, the sharded state and the jitted step. No data, no workdir."""
  objectives = objectives_lib.from_config(config)
  return setup(config, objectives.module, objective.objective(objectives),
               optimizer.create_optimizer(config.train),
               optimizer.learning_rate_schedule(config.train), mesh)


def abstract_state(config: ml_collections.ConfigDict) -> tuple[TrainState, Any]:
  """Pretraining's (unboxed abstract TrainState, boxed abstract TrainState) — no
  memory, no mesh."""
  tx = optimizer.create_optimizer(config.train)
  boxed = jax.eval_shape(_initial_state(
      objective.objective(objectives_lib.from_config(config)), tx, config.seed))
  return nn.unbox(boxed), boxed


def _initial_state(objective: Objective, tx: optax.GradientTransformation, seed: int):
  """() -> the initial TrainState, parameters boxed with their logical axes."""

  def init():
    params = objective.init(jax.random.key(seed))
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params),
                      new_window(objective))

  return init


def param_count(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
