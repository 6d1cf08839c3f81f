"""The pretraining loop: build everything from the config, resume, train, evaluate,
checkpoint, stop cleanly on SIGTERM or a non-finite loss."""

from __future__ import annotations

import errno
import math
import os
import signal
import time
from typing import Any

import flax.linen as nn
import jax
import ml_collections
from etils import epath
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bertjax import checkpoint as ckpt_lib
from bertjax import config_checks
from bertjax import files
from bertjax import plot
from bertjax import progress
from bertjax.data import multilingual
from bertjax.data import pipeline
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import ConfigError, TrainingError
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import state as state_lib, step as step_lib
from bertjax.train.logger import MetricLogger, format_metrics


def get_tokenizer(config, workdir: str) -> tok_lib.Tokenizer:
  """The workdir's tokenizer on resume; else the configured file; else one trained on
  the corpus (saved into the workdir so the checkpoint carries it)."""
  saved = os.path.join(workdir, files.TOKENIZER_DIR)
  tcfg = config.data.tokenizer
  resumed = epath.Path(saved).is_dir()  # The workdir may be remote (gs://).
  multihost = jax.process_count() > 1
  if multihost:  # Every process looks before process 0 writes one.
    multihost_utils.sync_global_devices("bertjax: tokenizer directory checked")
  if resumed:
    tokenizer = tok_lib.load_tokenizer(saved)
    if tcfg.path:  # The checkpoint was trained with the saved one: refuse another.
      tok_lib.check_same_vocabulary(
          tok_lib.load_tokenizer(tcfg.path), tokenizer, f"config.data.tokenizer.path="
          f"{tcfg.path}", f"the run being resumed in {workdir}", "drop "
          "--config.data.tokenizer.path to resume with the run's own tokenizer, or use a "
          "new --workdir to train with this one")
  else:
    if tcfg.path:
      tokenizer = tok_lib.load_tokenizer(tcfg.path)
    elif jax.process_index() == 0:  # Training is not deterministic across processes.
      sentences = multilingual.tokenizer_sentences(config.data, config.seed)
      logging.info("Training a %s tokenizer (%d tokens) on %d sentences.", tcfg.kind,
                   tcfg.vocab_size, len(sentences))
      tokenizer = tok_lib.train_tokenizer(
          progress.Progress("tokenizer", len(sentences), "sentences").wrap(sentences),
          kind=tcfg.kind, vocab_size=tcfg.vocab_size, lowercase=tcfg.lowercase)
    if jax.process_index() == 0:
      tokenizer.save(saved)
    if multihost and not tcfg.path:  # The others read process 0's trained tokenizer.
      multihost_utils.sync_global_devices("bertjax: tokenizer saved")
      tokenizer = tok_lib.load_tokenizer(saved)
  if tokenizer.vocab_size != config.model.vocab_size:
    raise ConfigError(
        f"config.model.vocab_size={config.model.vocab_size} but the tokenizer has "
        f"{tokenizer.vocab_size} tokens; set --config.model.vocab_size="
        f"{tokenizer.vocab_size}.")
  return tokenizer


class Preemption:
  """SIGTERM to any process makes every process save at the same step, then exit.

  One process: a SIGTERM handler sets a flag checked at each step boundary. Several:
  JAX's preemption service (started by `jax.distributed.initialize`) catches SIGTERM
  and agrees on a step with the other processes; `reached(step)` is then True on all
  of them at that step (orbax `CheckpointManager.reached_preemption`).
  """

  def __init__(self, checkpointer: ckpt_lib.Checkpointer):
    self.requested = False
    self._checkpointer = checkpointer
    self._previous = None
    if jax.process_count() == 1:
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def reached(self, step: int) -> bool:
    if jax.process_count() > 1:
      self.requested = self._checkpointer.reached_preemption(step)
    return self.requested

  def restore(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


# errno values of a write that failed because of the disk (full, quota, read-only, mode).
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def _mean_metrics(host: list[dict[str, Any]]) -> dict[str, float]:
  return {k: float(np.mean([m[k] for m in host])) for k in host[0]}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Runs (or resumes) pretraining in `workdir`; returns the last eval metrics."""
  config_checks.pretraining(config)
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  ckpt_lib.save_config(workdir, config)
  log = MetricLogger(workdir)
  rules = tuple(map(tuple, config.logical_axis_rules))
  mesh = mesh_lib.create_mesh(config.mesh)
  dp = mesh_lib.data_parallel_size(mesh, rules)
  accum = config.train.grad_accum_steps
  if config.train.batch_size % (dp * accum):
    raise ConfigError(
        f"config.train.batch_size={config.train.batch_size} is not divisible by the "
        f"{dp} data-parallel devices x {accum} grad_accum_steps; use a multiple of "
        f"{dp * accum}.")

  tokenizer = get_tokenizer(config, workdir)
  data = pipeline.build_pretraining_data(
      config.data, tokenizer, batch_size=config.train.batch_size // jax.process_count(),
      seed=config.seed, nsp=config.model.nsp, process_index=jax.process_index(),
      process_count=jax.process_count(), position_offset=config.model.position_offset,
      num_steps=config.train.num_steps)
  log.info("Data: %s", data.stats)

  trainer = state_lib.build_trainer(config, mesh)
  abstract, state_shardings = trainer.abstract, trainer.shardings
  batch_sharding, train_step = trainer.batch_sharding, trainer.train_step
  log.info("Model: %s parameters; mesh %s.", f"{state_lib.param_count(abstract.params):,}",
           dict(mesh.shape))
  eval_step = jax.jit(step_lib.make_eval_step(trainer.model),
                      in_shardings=(state_shardings.params, batch_sharding))

  checkpointer = ckpt_lib.Checkpointer(workdir, config.train.max_to_keep,
                                      on_corrupt=config.checkpoint.on_corrupt)
  train_iter = iter(data.train)
  restored = checkpointer.restore_latest(
      ckpt_lib.abstract_on(abstract, state_shardings).fields(), train_iter)
  start = None
  if restored is not None:
    start, fields = restored
    if "opt_state" not in fields:  # Parameters only (bertjax.convert): a fresh optimizer.
      fields["opt_state"] = jax.jit(trainer.tx.init, out_shardings=state_shardings.opt_state)(
          fields["params"])
    state = step_lib.TrainState(**fields)
    log.info("Resumed from step %d in %s.", start, checkpointer.directory)
  else:
    state = trainer.init_state(config)

  def evaluate(params) -> dict[str, float]:
    totals: dict[str, float] = {}
    baseline = 0.0
    batches = data.eval_batches[:config.train.eval_batches or None]
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      for batch in progress.Progress("eval", len(batches), "batches", leave=False).wrap(
          batches):
        sums = jax.device_get(eval_step(params, mesh_lib.put_batch(batch, batch_sharding)))
        for k, v in sums.items():
          totals[k] = totals.get(k, 0.0) + float(v)
        baseline += float(np.sum((batch["masked_lm_ids"] == data.most_frequent_token)
                                 * batch["masked_lm_weights"]))
    if jax.process_count() > 1:  # Each process counted its own eval rows.
      baseline = float(np.sum(multihost_utils.process_allgather(np.float32(baseline))))
    metrics = step_lib.eval_metrics(totals)
    metrics["mlm_accuracy_most_frequent_baseline"] = baseline / max(totals["mlm_count"], 1)
    return metrics

  preemption = Preemption(checkpointer)
  pending: list[dict[str, Any]] = []
  eval_result: dict[str, float] = {}
  step = int(jax.device_get(state.step))
  last_good = start
  consecutive_skips = 0  # skip_step_on_spikes: stops the run at spike_window in a row.
  t0, tokens = time.perf_counter(), 0
  # A bar on a terminal; elsewhere the step lines below carry its rate and ETA.
  bar = progress.Progress("train", config.train.num_steps, "steps", initial=step,
                          interval=None)

  def flush(step: int) -> None:
    nonlocal t0, tokens, consecutive_skips
    if not pending:
      return
    host = jax.device_get(pending)
    pending.clear()
    for i, m in enumerate(host):  # skip_step_on_spikes: skipped steps are only logged.
      if m.get("skipped") and log.active:
        logging.warning("Skipped step %d (update dropped, %d so far): loss %.4g, grad "
                        "norm %.4g.", step - len(host) + 1 + i, m["skipped_steps"],
                        m["loss"], m["grad_norm"])
      consecutive_skips = consecutive_skips + 1 if m.get("skipped") else 0
      if consecutive_skips >= config.train.spike_window:
        raise TrainingError(
            f"{consecutive_skips} steps in a row up to step {step} were skipped as spikes; "
            f"the last good checkpoint is step {last_good} in {checkpointer.directory}. "
            "Lower config.train.learning_rate or raise config.train.spike_sigma, then "
            "rerun to resume.")
    kept = [m for m in host if not m.get("skipped")]
    metrics = _mean_metrics(kept or host)
    metrics.pop("skipped", None)
    if "skipped_steps" in host[-1]:
      metrics["skipped_steps"] = float(host[-1]["skipped_steps"])
    for m in kept:  # The loss, the gradients and the updated parameters.
      bad = [k for k in ("loss", "grad_norm", "param_norm") if not math.isfinite(m[k])]
      if bad:
        raise TrainingError(
            f"non-finite {', '.join(bad)} at or before step {step}; the last good "
            f"checkpoint is step {last_good} in {checkpointer.directory}. Lower "
            "config.train.learning_rate or check the data, then rerun to resume.")
    elapsed = time.perf_counter() - t0
    metrics["tokens_per_s"] = tokens / max(elapsed, 1e-9)
    log.write(step, metrics)
    log.info("step %d/%d | %s | %s", step, config.train.num_steps,
             format_metrics(metrics), bar.status())
    t0, tokens = time.perf_counter(), 0

  try:
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      while step < config.train.num_steps:
        batch = next(train_iter)
        tokens += int(batch["attention_mask"].sum()) * jax.process_count()
        state, metrics = train_step(state, mesh_lib.put_batch(batch, batch_sharding))
        step += 1
        bar.update()
        pending.append(metrics)
        done = step == config.train.num_steps
        preempted = preemption.reached(step)
        if step % config.train.log_every == 0 or done or preempted:
          flush(step)
        if step % config.train.eval_every == 0 or done:
          eval_result = evaluate(state.params)
          log.write(step, eval_result, prefix="eval")
          log.info("eval at step %d | %s", step, format_metrics(eval_result))
        if step % config.train.checkpoint_every == 0 or done or preempted:
          flush(step)
          checkpointer.save(step, state.fields(), train_iter, force=True)
          last_good = step
        if preempted:
          log.info("SIGTERM: saved step %d; exiting. Rerun the same command to resume.", step)
          break
    checkpointer.wait()  # The last asynchronous save's error, if any, surfaces here.
  except OSError as e:  # metrics.jsonl and TensorBoard writes on a full/read-only disk.
    if e.errno not in _WRITE_ERRNOS:
      raise
    raise TrainingError(
        f"cannot write to {workdir}: {e.strerror} ({e.filename or 'a log file'}). The run "
        f"stopped at step {step}; {checkpointer.intact()}. Free space or make the workdir "
        "writable, then rerun the same command to resume.") from e
  finally:
    preemption.restore()
    # After a failure these may fail again (a full disk); the first error is the one raised.
    for close in (bar.close, checkpointer.wait, checkpointer.close, log.close):
      try:
        close()
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("While stopping: %s", str(e).splitlines()[0][:300])
  if jax.process_index() == 0:  # WORKDIR/training.png; a failure only warns.
    plot.plot_after_run(workdir)
  return eval_result
