"""Pretraining on the trainer: the tokenizer, the grain data stream (the rows the
objectives read: `config.objectives`) and the evaluations of `config.evals`, handed
with the objectives to `bertjax.train.trainer.Trainer` (which resumes, checkpoints,
logs and stops cleanly).

  python -m bertjax.main --config=configs/bert_tiny.py --workdir=DIR   # runs this
"""

from __future__ import annotations

import functools
import os
from typing import Callable

import jax
import ml_collections
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bertjax.checkpoint import files, workdir as workdir_lib
from bertjax.console import progress
from bertjax.data import mixture, phases, pipeline
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import ConfigError, at_least
from bertjax import model as model_lib, objectives as objectives_lib, writes
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import (compilation, continued, evaluators, state as state_lib,
                           trainer as trainer_lib)
from bertjax.train.trainer import Trainer


def get_tokenizer(config, workdir: str, fresh: Callable[[], tok_lib.Tokenizer] | None = None
                  ) -> tok_lib.Tokenizer:
  """The workdir's tokenizer on resume; else `fresh()` (continued pretraining: the
  checkpoint's, extended; made on process 0, which saves it for the others) or the
  configured file; else one trained on the corpus (saved into the workdir so the
  checkpoint carries it). A one-line ConfigError when the model has fewer rows than
  the tokenizer has ids, or other than a tokenizer trained here (a continued run's
  rows follow its tokenizer: `continued.Start.finish`)."""
  saved = os.path.join(workdir, files.TOKENIZER_DIR)
  tcfg = config.data.tokenizer
  resumed = epath.Path(saved).is_dir()  # The workdir may be remote (gs://).
  multihost = jax.process_count() > 1
  if multihost:  # Every process looks before process 0 writes one.
    multihost_utils.sync_global_devices("bertjax: tokenizer directory checked")
  if resumed:
    tokenizer = tok_lib.load_tokenizer(saved)
    if tcfg.path and fresh is None:  # Trained with the saved one: refuse another.
      tok_lib.check_same_vocabulary(
          tok_lib.load_tokenizer(tcfg.path), tokenizer, f"config.data.tokenizer.path="
          f"{tcfg.path}", f"the run being resumed in {workdir}", "drop "
          "--config.data.tokenizer.path to resume with the run's own tokenizer, or use a "
          "new --workdir to train with this one")
  else:
    if tcfg.path and fresh is None:
      tokenizer = tok_lib.load_tokenizer(tcfg.path)
    elif fresh is not None and jax.process_index() == 0:
      tokenizer = fresh()
    elif jax.process_index() == 0:  # Training is not deterministic across processes.
      sentences = mixture.tokenizer_sentences(config.data, config.seed)
      logging.info("Training a %s tokenizer (%d tokens) on %d sentences.", tcfg.kind,
                   tcfg.vocab_size, len(sentences))
      tokenizer = tok_lib.train_tokenizer(
          progress.Progress("tokenizer", len(sentences), "sentences").wrap(sentences),
          kind=tcfg.kind, vocab_size=tcfg.vocab_size, lowercase=tcfg.lowercase)
    if jax.process_index() == 0:
      tokenizer.save(saved)
    if multihost and (fresh is not None or not tcfg.path):  # Process 0's is read.
      multihost_utils.sync_global_devices("bertjax: tokenizer saved")
      tokenizer = tok_lib.load_tokenizer(saved)
  # A tokenizer may have fewer ids than the model has rows (a checkpoint's padded
  # embedding: DeBERTa-v3's 128,100 rows for 128,001 ids; a SentencePiece model trained
  # here on a corpus too small for all the pieces asked: its rows beyond stay unused).
  if fresh is not None:
    return tokenizer
  if tokenizer.vocab_size > config.model.vocab_size:
    raise ConfigError(
        f"config.model.vocab_size={config.model.vocab_size} but the tokenizer has "
        f"{tokenizer.vocab_size} tokens; set --config.model.vocab_size="
        f"{tokenizer.vocab_size}.")
  if not resumed and not tcfg.path and tokenizer.vocab_size < config.model.vocab_size:
    logging.info("The tokenizer trained on this corpus has %d ids (of %d asked): the "
                 "model's last %d rows stay unused (--config.model.vocab_size=%d: none).",
                 tokenizer.vocab_size, tcfg.vocab_size,
                 config.model.vocab_size - tokenizer.vocab_size, tokenizer.vocab_size)
  return tokenizer


def check_config(config: ml_collections.ConfigDict) -> phases.Schedule:
  """Every field of a pretraining config (configs/bert_base.py) in range, each section
  by its owner (the objectives, the model's dataclass, `trainer.check_config`,
  `pipeline.check_config`, `evaluators.evals_of`): one ConfigError line, before
  anything slow starts (`run` calls it once). Returns the run's length phases and the
  stages of its global batch (`phases.schedule`), which `run` passes on."""
  model = objectives_lib.check(config).model
  t = config.train
  at_least("train.num_steps", t.num_steps, 1)
  at_least("train.batch_size", t.batch_size, 1)
  at_least("train.warmup_steps", t.warmup_steps, 0)
  if t.warmup_steps >= t.num_steps:
    raise ConfigError(f"config.train.warmup_steps={t.warmup_steps} must be smaller than "
                      f"config.train.num_steps={t.num_steps}.")
  at_least("train.batch_warmup_tokens", t.batch_warmup_tokens, 0)
  if t.batch_warmup_tokens:
    at_least("train.batch_warmup_sizes", t.batch_warmup_sizes, 1)
  trainer_lib.check_config(config)
  at_least("train.eval_every", t.eval_every, 1)
  at_least("train.eval_batches", t.eval_batches, 0)
  evaluators.evals_of(config)
  continued.check_config(config)
  length_phases = pipeline.check_config(config.data, model, t.num_steps,
                                        trains_tokenizer=not config.init_from)
  schedule = phases.schedule(length_phases, config.data.max_seq_length, t.num_steps,
                             t.batch_size, phases.BatchSchedule.from_config(t))
  phase_inputs(config, schedule)
  return schedule


def phase_inputs(config: ml_collections.ConfigDict,
                 schedule: phases.Schedule | None = None) -> list[dict[str, float]]:
  """Each length phase's constant per-row inputs of the run's model (the objectives'
  exported network: `Family.phase_inputs`, a one-line ConfigError when the model
  cannot train at a phase's length), at the phases of `schedule` (the run's,
  `check_config`'s; None: `config`'s length phases)."""
  lengths = (schedule.lengths if schedule else
             [t for _, t, _ in phases.length_phases(config.data, config.train.num_steps)])
  model = objectives_lib.from_config(config).model
  return model_lib.family_of(model).phase_inputs(model, lengths)


def inputs(config: ml_collections.ConfigDict) -> dict[str, str]:
  """What a pretraining run reads ({config field: path}): no run writes into them
  (`writes.claim`)."""
  found = {"config.init_from": config.init_from,
           "config.init_generator_from": config.get("init_generator_from", ""),
           "config.data.tokenizer.path": config.data.tokenizer.path,
           "config.vocab_extension.tokens_file": config.vocab_extension.tokens_file,
           "config.vocab_extension.corpus": config.vocab_extension.corpus}
  try:
    sources = mixture.sources_of(config.data)
  except ConfigError:  # check_config names it
    sources = []
  found.update({f"config.data.corpus ({s.name or 'corpus'})": s.spec for s in sources})
  return {k: os.fspath(v) for k, v in found.items() if v}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Runs (or resumes) pretraining in `workdir`, from `config.init_from` when set
  (`continued`); returns the last eval metrics ({} when stopped by SIGTERM before the
  first evaluation). Writes as `bertjax.writes` says: the workdir claimed and the config
  checked against the run being resumed before anything is written, config.json once
  the data is read."""
  writes.claim(workdir, writes.PRETRAINING, inputs=inputs(config))
  start = continued.open_run(config, workdir) if config.init_from else None
  config = start.config if start else config
  schedule = check_config(config)
  changes = workdir_lib.check_resume(workdir, config)
  if jax.process_index() == 0:
    writes.record(workdir, writes.PRETRAINING)
  tokenizer = None
  if start is not None:  # The vocabulary rows follow the (extended) tokenizer.
    tokenizer = get_tokenizer(config, workdir, start.new_tokenizer)
    config = start.finish(tokenizer, workdir)
  objectives = objectives_lib.from_config(config)
  setup = state_lib.build_trainer(config)
  model = objectives.model
  phases.check_divisible(schedule.stages,
                         mesh_lib.data_parallel_size(setup.mesh, setup.rules),
                         config.train.grad_accum_steps)
  tokenizer = tokenizer or get_tokenizer(config, workdir)
  data = pipeline.build_pretraining_data(
      config.data, tokenizer, batch_size=config.train.batch_size // jax.process_count(),
      seed=config.seed, nsp=pipeline.sentence_pairs(objectives.fields),
      process_index=jax.process_index(), process_count=jax.process_count(),
      position_offset=model.position_offset, num_steps=config.train.num_steps,
      phase_inputs=phase_inputs(config, schedule), schedule=schedule)
  for change in changes:
    logging.info("Resuming with %s.", change)
  workdir_lib.save_config(workdir, config)
  trainer = Trainer(setup, config, workdir)
  trainer.info("Data: %s", data.stats)
  members = objectives.networks.members
  # Each member's count on shapes: one may be assembled from others' arrays (GDES).
  counts = {name: state_lib.param_count(jax.eval_shape(m.params, setup.abstract.params))
            for name, m in members.items()}
  trainer.info("Model: %s parameters%s; objectives %s; mesh %s.",
               f"{state_lib.param_count(setup.abstract.params):,}",
               "" if len(members) == 1 else " (" + ", ".join(
                   f"{name} {n:,}" for name, n in counts.items()) + ")",
               ", ".join(objectives.names), dict(setup.mesh.shape))
  evaluate = evaluators.from_config(config, setup, data, objectives)
  init = start and functools.partial(start.initial_params, setup, tokenizer)
  with compilation.logged(trainer.info):
    return trainer.fit(iter(data.train), evaluate, init).get("eval", {})


def summary(metrics: dict) -> str:
  """The line `python -m bertjax.main` ends with, from the run's final held-out metrics
  (README's first command shows one; tests/test_readme_figures.py checks its figures)."""
  if "rtd_accuracy" in metrics:
    return (f"held-out generator MLM accuracy {metrics['generator_accuracy']:.4f}; "
            f"replaced-token detection accuracy {metrics['rtd_accuracy']:.4f}, precision "
            f"{metrics['rtd_precision']:.4f}, recall {metrics['rtd_recall']:.4f} of the "
            f"{metrics['replaced_fraction']:.4f} replaced")
  return (f"held-out MLM accuracy {metrics['mlm_accuracy']:.4f} vs "
          f"{metrics['mlm_accuracy_most_frequent_baseline']:.4f} for always predicting the "
          "most frequent token"
          + (f"; NSP accuracy {metrics['nsp_accuracy']:.4f}" if "nsp_accuracy" in metrics
             else ""))
