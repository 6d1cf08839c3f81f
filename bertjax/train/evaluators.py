"""Pretraining's evaluations by name, as big_vision's `config.evals`
(`evaluators/common.py: from_config`): `config.evals` maps a name (the split its
metrics are logged under) to an entry {'type': a kind of `EVALUATORS`, its settings};
`from_config` builds the trainer's `Evaluator`s from it. Every evaluation runs every
`config.train.eval_every` steps and after the last, over `config.train.eval_batches`
batches of each source (0: all); with its setting `at_start` (`COMMON`, every type has
it) also on the weights a new run starts from, logged at step 0 (the baseline of
continued pretraining: `config.init_from`).

'held_out': the held-out documents of every source of the corpus, scored by every
objective of the run (`Objectives.eval_metrics`: MLM's loss and accuracy beside the
accuracy of always predicting the most frequent token, NSP's, SBO's), all sources
together as NAME/metric and, with several, each as NAME/SOURCE/metric; at the length
phase of the step just taken (its length and inputs, e.g. ModernBERT's global rope
theta: the model the run trains then), and with `final_length` at the final phase's
too, as NAME_final (its figures are NAME's once the final phase runs). Both log
seq_length (and the inputs) beside the metrics.

Configs written before `config.evals` had `config.train.eval_final_length`: without
`config.evals` they get {'eval': held_out with final_length = that field}.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils

from bertjax.console import progress
from bertjax.data import held_out as held_out_lib, pipeline
from bertjax.errors import ConfigError
from bertjax.objectives import Objectives
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import objective
from bertjax.train.state import Setup
from bertjax.train.trainer import Evaluator


def held_out(name: str, settings: dict, config, setup: Setup,
             data: pipeline.PretrainingData, objectives: Objectives) -> list[Evaluator]:
  """The 'held_out' evaluation `name` (module docstring)."""
  eval_step = jax.jit(objective.make_eval_step(objectives),
                      in_shardings=(setup.shardings.params, setup.batch_sharding))
  facts = {"most_frequent_token": data.most_frequent_token}
  batches, every = config.train.eval_batches, config.train.eval_every
  last: dict[tuple[int, int], dict[str, float]] = {}  # (step, phase) -> its metrics

  def sums(params, chosen) -> dict[str, float]:
    """Device sums and counts, then host sums (every process's rows), of `chosen`."""
    totals: dict[str, float] = {}
    host: dict[str, float] = {}
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
      for batch in progress.Progress(name, len(chosen), "batches", leave=False).wrap(
          chosen):
        out = jax.device_get(eval_step(params, mesh_lib.put_batch(batch,
                                                                  setup.batch_sharding)))
        for k, v in out.items():
          totals[k] = totals.get(k, 0.0) + float(v)
        for k, v in objectives.eval_sums(batch, facts).items():
          host[k] = host.get(k, 0.0) + v
    if jax.process_count() > 1:  # Each process counted its own eval rows.
      host = {k: float(np.sum(multihost_utils.process_allgather(np.float32(v))))
              for k, v in host.items()}
    return {**totals, **host}

  def evaluate(params, step: int, held: held_out_lib.HeldOut) -> dict[str, float]:
    if (step, held.phase) in last:
      return last[step, held.phase]
    every_source = {source: sums(params, b[:batches or None])
                    for source, b in held.sources.items()}
    totals = {k: sum(t.get(k, 0.0) for t in every_source.values())
              for k in next(iter(every_source.values()))}
    out = {**objectives.eval_metrics(totals), **held.describe()}
    if len(every_source) > 1:
      for source, t in every_source.items():
        out.update({f"{source}/{k}": v for k, v in objectives.eval_metrics(t).items()})
    last.clear()
    last[step, held.phase] = out
    return out

  out = [Evaluator(name, lambda params, step: evaluate(
      params, step, held_out_lib.phase_of(data.held_out, step)), every)]
  if settings["final_length"] and len(data.held_out) > 1:
    out.append(Evaluator(f"{name}_final", lambda params, step: evaluate(
        params, step, data.held_out[-1]), every))
  return out


# config.evals types -> (builder: (name, settings, config, setup, data, objectives) ->
# its Evaluators, its settings with their defaults).
EVALUATORS: dict[str, tuple[Callable[..., list[Evaluator]], dict[str, Any]]] = {
    "held_out": (held_out, {"final_length": False}),
}


# Settings every type of evaluation has, with their defaults (the trainer reads them).
COMMON: dict[str, Any] = {"at_start": False}


def evals_of(config) -> dict[str, dict[str, Any]]:
  """{name: {'type', settings (defaults filled in)}} of `config.evals` (or, in a
  config written before it, the held-out evaluation its train section asked for); a
  one-line ConfigError for an unknown type or setting."""
  if "evals" not in config:
    return {"eval": {"type": "held_out", **COMMON,
                     "final_length": bool(config.train.get("eval_final_length", False))}}
  if "eval_final_length" in config.train:
    raise ConfigError("config.train.eval_final_length is now a setting of the held-out "
                      "evaluation: set config.evals.eval.final_length and drop it.")
  out = {}
  for name, entry in config.evals.items():
    entry = dict(entry)
    kind = entry.pop("type", None)
    if kind not in EVALUATORS:
      raise ConfigError(f"config.evals.{name}.type={kind!r}: use one of "
                        f"{sorted(EVALUATORS)}.")
    defaults = {**COMMON, **EVALUATORS[kind][1]}
    unknown = sorted(set(entry) - set(defaults))
    if unknown:
      raise ConfigError(f"config.evals.{name} has no setting {unknown[0]!r}: a {kind!r} "
                        f"evaluation has {sorted(defaults)}.")
    out[name] = {"type": kind, **defaults, **entry}
  return out


def from_config(config, setup: Setup, data: pipeline.PretrainingData,
                objectives: Objectives) -> list[Evaluator]:
  """The trainer's evaluators of `config.evals` (`evals_of`), on `setup`'s mesh, with
  the `COMMON` settings."""
  return [dataclasses.replace(e, at_start=entry["at_start"])
          for name, entry in evals_of(config).items()
          for e in EVALUATORS[entry["type"]][0](
              name, entry, config, setup, data, objectives)]
