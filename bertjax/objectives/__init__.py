"""Pretraining objectives by name (big_vision's `config.loss`; levanter computes the loss
outside the model): `config.objectives`, e.g. ('mlm', 'nsp') for BERT, ('mlm',) for
RoBERTa and ModernBERT, ('mlm', 'sbo') for SpanBERT, picks them from `REGISTRY`.
`from_config(config)` gives the run's `Objectives`: the objectives, the parameters they
train (`base.Networks`: by default one pretraining network of `config.model`'s family
carrying the heads they read) and what the trainer, the data and the tools ask of
them: the loss and metrics as sums (`bertjax.train.step.Objective`), the batch fields
(`fields`: the data pipeline and `prepare` build sentence pairs or packed rows from
them), the held-out metrics, the FLOPs of a step, and which network export, fine-tuning
and `load_pretrained` take (`model`, `networks.member()`).

A new objective is a module here whose `OBJECTIVE` (`base.Objective`: its fields, heads,
sums / counts / loss / metrics, checks, FLOPs, held-out metrics, and the networks it
trains when it owns them) is listed in `REGISTRY`.

An objective that trains several networks (replaced-token detection: a generator and
a discriminator) sets `Objective.networks(config, model)` -> `base.Networks` whose
`init(rng)` returns one boxed tree keyed by network name ({'generator': {'encoder',
'mlm'}, 'discriminator': {'encoder', 'rtd'}}; shared embeddings live in one of them
and the other reads them in `forward`), `forward(params, batch, rng)` runs both
(sampling keys folded from `rng`; `rng` None in evaluation: a fixed key) and returns
what its `sums` read, `flops` counts both, `members` names each as a `base.Network`
(its `path` in the tree, its family config, its pretraining module) and `exported`
names the one export, fine-tuning, embed and `load_pretrained` take ('discriminator';
`load_pretrained(..., network='generator')` for fill_mask). Everything downstream
already works on that one tree: the train state, the optimizer and its weight-decay
mask (by leaf name: kernels and embeddings), the shardings (from the boxed logical
axes), the checkpoint and resume
(`bertjax.train.state`), the parameter count logged per member (`pretrain.run`), and
restore by member (`bertjax.checkpoint.workdir.saved_network`). Its module and its
`REGISTRY` entry are the only files of this package it touches; its model parts
(ELECTRA's embedding projection, the discriminator head) are its family's.

Configs written before `config.objectives` existed, and the config.json of their
workdirs, name the objectives by booleans of the model section (`config.model.nsp`,
`.sbo`): without `config.objectives` they map onto ('mlm', then 'sbo', then 'nsp': the
order their losses were added in); beside `config.objectives` one that contradicts it is
a one-line ConfigError.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import jax

from bertjax import model as model_lib
from bertjax.errors import ConfigError
from bertjax.objectives import base, mlm, nsp, rtd, sbo
from bertjax.objectives.base import Network, Networks, Objective

# config.objectives names -> the objective.
REGISTRY = {o.name: o for o in (mlm.OBJECTIVE, nsp.OBJECTIVE, sbo.OBJECTIVE, rtd.OBJECTIVE)}
# The config.model booleans that named objectives before config.objectives, in the
# order their losses were added to the MLM's.
LEGACY = ("sbo", "nsp")


@dataclasses.dataclass(frozen=True)
class Objectives:
  """The objectives of a run (`names`, in the config's order) and the `networks` they
  train. Its `sums`, `counts`, `loss`, `metrics` are the trainer's
  (`bertjax.train.step.Objective`): every objective's, the loss their sum."""

  names: tuple[str, ...]
  objectives: tuple[Objective, ...]
  networks: Networks

  @property
  def model(self) -> Any:
    """The model config of the exported network (the data's positions, export, the
    FLOPs of its heads)."""
    return self.networks.member().config

  @property
  def module(self) -> Any:
    """The exported network's pretraining module."""
    return self.networks.member().module

  @property
  def fields(self) -> tuple[str, ...]:
    """Every batch field the objectives read."""
    return tuple(dict.fromkeys(f for o in self.objectives for f in o.fields))

  @property
  def metric_names(self) -> tuple[str, ...]:
    return tuple(n for o in self.objectives for n in o.metric_names)

  @property
  def row_keys(self) -> bool:
    """Whether the train step gives each row its key (`Objective.row_keys`)."""
    return any(o.row_keys for o in self.objectives)

  def sums(self, params: Any, batch: dict, rng: jax.Array | None) -> dict:
    """The networks on `batch` (dropout from `rng`; None: deterministic), then every
    objective's sums."""
    out = self.networks.forward(params, batch, rng)
    return {k: v for o in self.objectives for k, v in o.sums(out, batch).items()}

  def counts(self, batch: dict) -> dict:
    return {k: v for o in self.objectives for k, v in o.counts(batch).items()}

  def loss(self, sums: dict, counts: dict) -> jax.Array:
    """The sum of the objectives' losses, in the config's order."""
    return functools.reduce(operator.add, [o.loss(sums, counts) for o in self.objectives])

  def metrics(self, sums: dict, counts: dict) -> dict:
    return {k: v for o in self.objectives for k, v in o.metrics(sums, counts).items()}

  def eval_sums(self, batch: dict, facts: dict) -> dict[str, float]:
    """The objectives' host sums of a held-out batch (`Objective.eval_sums`)."""
    return {k: v for o in self.objectives if o.eval_sums
            for k, v in o.eval_sums(batch, facts).items()}

  def eval_metrics(self, totals: dict[str, float]) -> dict[str, float]:
    """Held-out metrics of the totals of every batch's sums, host sums and counts
    ('<count>_count'): each objective's `metrics`, then its `eval_metrics`."""
    counts = {k[:-len("_count")]: v for k, v in totals.items() if k.endswith("_count")}
    out = {k: float(v) for k, v in self.metrics(totals, counts).items()}
    for o in self.objectives:
      if o.eval_metrics:
        out.update(o.eval_metrics(totals))
    return out

  def train_flops(self, batch: int, seq: int, predictions: int) -> dict[str, float]:
    """{term: FLOPs of one training step, 'total'}: the networks' (`Networks.flops`)
    and the objectives' own terms (`Objective.flops`), for B rows of T tokens with P
    predictions each."""
    terms = dict(self.networks.flops(batch, seq, predictions))
    extra = {k: v for o in self.objectives if o.flops
             for k, v in o.flops(self.model, batch, seq, predictions).items()}
    if extra:
      del terms["total"]
      terms.update(extra)
      terms["total"] = sum(terms.values())
    return terms


def names_of(config) -> tuple[str, ...]:
  """The objectives `config` (a run's config, or a workdir's config.json) names:
  `config.objectives`, or the model section's booleans where it has none (module
  docstring); a one-line ConfigError for names that are not objectives, or booleans
  that contradict them or that the family cannot have."""
  model = config["model"]
  legacy = {k: model[k] for k in LEGACY if k in model}
  # The family's defaults where a boolean is absent; a family without the head refuses it.
  fixed = model_lib.config_from({"family": model_lib.family_of(model).name, **legacy})
  if "objectives" not in config:
    return ("mlm",) + tuple(k for k in LEGACY if getattr(fixed, k, False))
  names = config["objectives"]
  if (not isinstance(names, (tuple, list)) or not names
      or not all(isinstance(n, str) for n in names)):
    raise ConfigError(f"config.objectives={names!r}: give a tuple of objective names, e.g. "
                      f"('mlm', 'nsp'), of {sorted(REGISTRY)}.")
  names = tuple(names)
  unknown = [n for n in names if n not in REGISTRY]
  if unknown:
    raise ConfigError(f"config.objectives={names!r}: no objective {unknown[0]!r}; use "
                      f"names of {sorted(REGISTRY)}.")
  if len(set(names)) < len(names):
    raise ConfigError(f"config.objectives={names!r} names an objective twice.")
  for k, v in legacy.items():
    if bool(v) != (k in names):
      raise ConfigError(
          f"config.model.{k}={v!r} but config.objectives={names!r} "
          f"{'names' if k in names else 'does not name'} {k!r}: the objectives choose the "
          f"heads; drop config.model.{k}.")
  return names


def from_config(config) -> Objectives:
  """The `Objectives` of `config` (a run's config or a workdir's config.json): the
  heads they read exist in `config.model`'s family (else one ConfigError line), the
  model config carries exactly those heads (its `nsp`, `sbo`), and the networks are the
  one objective's that owns them or the family's pretraining network."""
  names = names_of(config)
  objectives = tuple(REGISTRY[n] for n in names)
  family = model_lib.family_of(config["model"])
  has = ("mlm",) + tuple(h.name for h in family.heads)
  wanted = {h: o for o in objectives for h in o.heads}
  for head, o in wanted.items():
    if head not in has:
      raise ConfigError(f"the {o.name!r} objective (config.objectives={names!r}) reads the "
                        f"{head!r} head, which the {family.name!r} family does not have "
                        f"(it has {list(has)}): drop {o.name!r}.")
  fields = dict(config["model"])
  # The booleans of the heads an objective reads: what the run's objectives read; a
  # head no registered objective reads keeps the model section's, and so does every
  # head but the LEGACY ones where the config names no objectives (a converted
  # checkpoint's, e.g. an ELECTRA discriminator's 'rtd').
  read = {h for o in REGISTRY.values() for h in o.heads}
  for head in family.heads:
    if head.name in read and ("objectives" in config or head.name in LEGACY):
      fields[head.name] = head.name in wanted
  model = model_lib.config_from(fields)
  owners = [o for o in objectives if o.networks]
  if len(owners) > 1:
    raise ConfigError(f"config.objectives={names!r}: {owners[0].name!r} and "
                      f"{owners[1].name!r} each train networks of their own; keep one.")
  networks = (owners[0].networks(config, model) if owners else
              base.pretraining(model, family.config_heads(model)))
  return Objectives(names, objectives, networks)


def check(config) -> Objectives:
  """`from_config`, after each objective's check of the run's config (`Objective.check`:
  its data and its heads' needs), one ConfigError line each."""
  for name in names_of(config):
    if REGISTRY[name].check:
      REGISTRY[name].check(config)
  return from_config(config)


__all__ = ["LEGACY", "REGISTRY", "Network", "Networks", "Objective", "Objectives",
           "check", "from_config", "names_of"]
