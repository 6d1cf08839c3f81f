"""What one pretraining objective supplies (`Objective`), and what the parameters it
trains are (`Networks`: by default one pretraining network of `config.model`'s family
with the heads the objectives read, `pretraining`).

Shapes: B batch, T length, P predictions per row.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import model as model_lib
from bertjax.errors import CheckpointError


@dataclasses.dataclass(frozen=True)
class Objective:
  """One pretraining objective, chosen by name in `config.objectives`
  (`bertjax.objectives.REGISTRY`). Several objectives train together: the run's loss
  is the sum of their losses (in the config's order), its metrics the union of theirs.

  name: its name in `config.objectives`.
  fields: the batch fields it reads (the data must carry them: 'next_sentence_labels'
    makes the rows BERT's sentence pairs, `bertjax.data.pipeline.sentence_pairs`).
  sums: (the networks' outputs, batch) -> {name: []} its losses and correct counts
    summed over the batch's targets (rows and targets weighing 0 add nothing), so that
    micro-batches add up exactly (`bertjax.train.step.Objective`).
  counts: batch -> {name: []} its denominators, from the batch alone.
  loss: (sums, counts) -> [] its term of the run's loss; linear in `sums`.
  metrics: (sums, counts) -> {name: []}, named `metric_names`, logged each step and
    in the held-out evaluation.
  heads: the pretraining heads it reads on the shared network (`Family.head`, by
    name); their logits are its outputs ('<head>_logits').
  check: the run's config -> None, or a one-line ConfigError where the config
    contradicts it (its data, its heads' needs); None: nothing to check.
  flops: (model config, B, T, P) -> {term: FLOPs of one training step} of its own
    compute beyond the networks' (`Networks.flops`), e.g. SBO's head.
  eval_sums: (a held-out batch (numpy), data facts {'most_frequent_token': id}) ->
    {name: float} summed on the host beside `sums` (MLM's most-frequent-token hits).
  eval_metrics: held-out totals (every `sums`, `eval_sums` and '<count>_count') ->
    {name: float}: its held-out metrics beyond `metrics` (MLM's baseline accuracy).
  networks: (the run's config, the model config of `config.model` with the heads of
    the objectives) -> the `Networks` it trains, for an objective that owns its
    networks (e.g. a generator and a discriminator); None: the shared network.
  row_keys: its networks draw per row from batch['row_keys'] in training (the train
    step's `row_keys`: one key a row, the same in any micro-batch, on any device).
  """

  name: str
  fields: tuple[str, ...]
  sums: Callable[[dict, dict], dict[str, jax.Array]]
  counts: Callable[[dict], dict[str, jax.Array]]
  loss: Callable[[dict, dict], jax.Array]
  metrics: Callable[[dict, dict], dict[str, jax.Array]]
  metric_names: tuple[str, ...]
  heads: tuple[str, ...] = ()
  check: Callable[[Any], None] | None = None
  flops: Callable[[Any, int, int, int], dict[str, float]] | None = None
  eval_sums: Callable[[dict, dict], dict[str, float]] | None = None
  eval_metrics: Callable[[dict], dict[str, float]] | None = None
  networks: Callable[[Any, Any], "Networks"] | None = None
  row_keys: bool = False


@dataclasses.dataclass(frozen=True)
class Network:
  """One pretrained model among the trained parameters: where its parameters lie in the
  tree (`path`, () the root), its family config dataclass and its pretraining module
  (encoder and heads, `Family.pretraining`), whose parameters the sub-tree holds;
  `assemble` (the whole tree -> its parameters) where some of them lie elsewhere
  (an ELECTRA generator reads the discriminator's embeddings)."""

  path: tuple[str, ...]
  config: Any
  module: nn.Module
  assemble: Callable[[Any], Any] | None = None

  def params(self, params: Any) -> Any:
    """Its parameters: its sub-tree of the whole parameter tree (or `assemble`'s)."""
    if self.assemble is not None:
      return self.assemble(params)
    for key in self.path:
      params = params[key]
    return params


@dataclasses.dataclass(frozen=True)
class Networks:
  """The parameters a run trains, as one tree under one optimizer state and one
  checkpoint, and how they run.

  init: rng -> the whole tree, boxed in `nn.Partitioned` (logical axes: the shardings
    and the weight-decay mask follow from it).
  forward: (params, batch, dropout rng or None: deterministic) -> the outputs the
    objectives' `sums` read.
  flops: (B, T, P) -> {term: FLOPs of one training step, 'total'} of every network.
  members: {name: `Network`}: each pretrained model in the tree.
  exported: the name of the member that export (`convert --to=hf`), fine-tuning's
    `init_from`, `load_pretrained`, embed and fill_mask take by default.
  place: where members' checkpoints go in the tree (continued pretraining:
    `bertjax.train.continued`): {member name: its parameters from a checkpoint, flat
    {path in its own pretraining tree: array}} -> {path in the whole tree: array}.
    None: each member's at its `path`; networks that share parameters say where the
    shared ones come from (`placed`).
  """

  init: Callable[[jax.Array], Any]
  forward: Callable[[Any, dict, jax.Array | None], dict]
  flops: Callable[[int, int, int], dict[str, float]]
  members: dict[str, Network]
  exported: str
  place: Callable[[dict[str, dict]], dict] | None = None

  def member(self, name: str | None = None) -> Network:
    """The member `name` (default: the exported one)."""
    name = name or self.exported
    if name not in self.members:
      raise CheckpointError(f"no network {name!r} among the trained ones "
                            f"({', '.join(self.members)}).")
    return self.members[name]

  def placed(self, loaded: dict[str, dict]) -> dict:
    """The whole tree's parameters that `loaded` gives ({member name: {path in its
    pretraining tree: array}}, the members that have a checkpoint), flat by path in
    the tree (`place`)."""
    if self.place is not None:
      return self.place(loaded)
    return {self.members[name].path + p: v for name, params in loaded.items()
            for p, v in params.items()}


def example_weights(batch: dict) -> jax.Array:
  """[B] each row's weight: `example_weights` where given (a held-out batch, whose
  filler rows have 0), else 1."""
  return batch.get("example_weights", jnp.ones(batch["input_ids"].shape[:1], jnp.float32))


def apply(module: nn.Module, params: Any, batch: dict, rng: jax.Array | None) -> dict:
  """`module` (a pretraining module) on the batch fields it reads (`module.inputs`),
  dropout from `rng` (None: deterministic) -> {'<head>_logits': float32}."""
  inputs = {k: batch[k] for k in module.inputs if k in batch}
  return module.apply({"params": params}, **inputs, deterministic=rng is None,
                      rngs=None if rng is None else {"dropout": rng})


def pretraining(config: Any, heads: tuple[str, ...]) -> Networks:
  """One pretraining network of `config`'s family (`Family.pretraining`) with `heads`,
  its parameters the whole tree ({'encoder', 'mlm', 'nsp', ...}); its FLOPs the
  family's (`Family.train_flops`)."""
  family = model_lib.family_of(config)
  module = family.pretraining(config, heads)
  return Networks(init=module.init_params, forward=functools.partial(apply, module),
                  flops=functools.partial(family.train_flops, config),
                  members={"model": Network((), config, module)}, exported="model")


# Folded into the step's key for the root of its rows' keys (`row_keys`): not a
# micro-batch's index (those are folded in for dropout: 0 .. grad_accum_steps - 1).
ROW_KEYS = 0x524F5753  # "ROWS"


def row_keys(key: jax.Array, rows: jax.Array) -> jax.Array:
  """[R] threefry keys, one a row: each of `rows` (int [R], the rows' indices in the
  step's batch) folded into a root drawn from `key` (the step's: `fold_in(key,
  ROW_KEYS)`, as a threefry key). A row's key depends on `key` and its index alone,
  not on the rows drawn beside it: the same in one batch, in any micro-batch, on any
  device. Threefry whatever `key`'s implementation: RBG's bits under `jax.vmap` over
  keys come from the first key alone (jax's batching rule of `rng_bit_generator`), so
  a row's draw would depend on which row is first in its micro-batch. A threefry draw
  vmapped over rows costs what one draw of the same size does (the rows' keys are R
  hashes more); rows sharded over the data axis draw on their own devices, nothing
  gathered."""
  root = jax.random.fold_in(key, ROW_KEYS)
  if str(jax.random.key_impl(root)) != "threefry2x32":
    root = jax.random.wrap_key_data(jax.random.bits(root, (2,), jnp.uint32),
                                    impl="threefry2x32")
  return jax.vmap(jax.random.fold_in, (None, 0))(root, rows)
