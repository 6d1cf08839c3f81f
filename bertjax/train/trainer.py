"""THE training loop: pretraining (`bertjax.train.pretrain`) and every fine-tuning task
(`bertjax.tasks.finetune`) hand it a `Setup` (an objective, an optimizer, the mesh and the
jitted step: `bertjax.train.state.setup`), a data stream and evaluators.

    trainer = Trainer(setup, config, workdir)
    results = trainer.fit(data, [Evaluator("eval", evaluate, every=1000)])

It owns, for every run alike:
- resuming: the newest checkpoint that restores gives the state and the data
  position (a field a checkpoint lacks, e.g. the optimizer state of an imported
  model, starts fresh); none: a fresh state;
- the steps, a checkpoint every `config.train.checkpoint_every` steps and at the end;
- SIGTERM (to any process of a multi-process job): every process saves the same step
  and `fit` returns; rerunning the same command resumes;
- a full or read-only disk: one-line error naming the intact checkpoints;
- a non-finite loss, gradient or parameter norm (or `spike_window` skipped spikes in a
  row): one-line `TrainingError` naming the last good checkpoint, which is never
  overwritten by a broken state;
- logging on process 0: console lines with progress, TensorBoard and metrics.jsonl.
  The train metrics of step s are the means over its log window (the steps since the
  last multiple of `log_every`), accumulated inside the checkpointed state: the same
  numbers whether or not the run was interrupted. Wall-clock rates go to a separate
  `perf` record;
- evaluation hooks, `config.train.profile_steps` (a `jax.profiler` trace for
  TensorBoard) and WORKDIR/training.png at the end.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import signal
import time
from typing import Any, Callable, Iterator, Sequence

import flax.linen as nn
import jax
from absl import logging
from etils import epath

from bertjax.checkpoint import files, manager as ckpt_lib
from bertjax.console import progress
from bertjax.errors import ConfigError, TrainingError, at_least, one_of, seed
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import curves, optimizer
from bertjax.train.logger import MetricLogger, format_metrics
from bertjax.train.state import Setup
from bertjax.train.step import TrainState

# Puts one host batch of the training stream onto the mesh (this process's rows of the
# global batch). A module attribute: the fault tests replace it to alter batches.
put_train_batch = mesh_lib.put_batch

# errno values of a write that failed because of the disk (full, quota, read-only, mode).
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
# Train metrics whose non-finite value stops the run.
_FINITE = ("loss", "grad_norm", "param_norm")


def check_config(config) -> None:
  """The fields every trained run shares, in range (one ConfigError line each): the
  seed, the optimizer's (`optimizer.check_config`), the trainer's own fields of
  `config.train` and `config.checkpoint` (`config.distributed` is checked where it is
  used, `parallel.distributed.initialize`)."""
  seed("seed", config.seed)
  t = config.train
  optimizer.check_config(t)
  at_least("train.log_every", t.log_every, 1)
  at_least("train.checkpoint_every", t.checkpoint_every, 1)
  at_least("train.max_to_keep", t.max_to_keep, 1)
  at_least("train.grad_accum_steps", t.grad_accum_steps, 1)
  steps = tuple(t.profile_steps)
  if steps and not (len(steps) == 2 and all(isinstance(s, int) for s in steps)
                    and 1 <= steps[0] <= steps[1]):
    raise ConfigError(f"config.train.profile_steps={steps!r}: give (first, last) steps "
                      "with 1 <= first <= last, or () for no trace.")
  one_of("checkpoint.on_corrupt", config.checkpoint.on_corrupt, ckpt_lib.ON_CORRUPT)


@dataclasses.dataclass(frozen=True)
class Evaluator:
  """An evaluation of the current parameters: `run(params, step) -> metrics` (`step`:
  the steps taken), called on every process (each feeds its own rows), every `every`
  steps (0: only at the end) and after the last step (`at_start`: also before the
  first step of a new run, logged at step 0); its metrics are logged under the split
  `name`."""

  name: str
  run: Callable[[Any, int], dict[str, float]]
  every: int = 0
  at_start: bool = False


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


class Trainer:
  """Runs (or resumes) the training of `setup` in `workdir` for `num_steps` steps
  (default `config.train.num_steps`). Reads `config.train`: log_every,
  checkpoint_every, max_to_keep, spike_window (with skip_step_on_spikes),
  profile_steps; `config.checkpoint.on_corrupt`; `config.seed`."""

  def __init__(self, setup: Setup, config, workdir: str, num_steps: int | None = None):
    self.setup, self.config, self.workdir = setup, config, workdir
    t = config.train
    self.num_steps = t.num_steps if num_steps is None else num_steps
    self.log_every, self.checkpoint_every = t.log_every, t.checkpoint_every
    self.spike_window = t.spike_window if t.skip_step_on_spikes else 0
    self.profile_steps = tuple(t.profile_steps)
    self.log: MetricLogger | None = None  # Opened by `fit` at the step it resumes from.
    self.checkpointer = ckpt_lib.Checkpointer(workdir, t.max_to_keep,
                                              on_corrupt=config.checkpoint.on_corrupt)
    self.last_good: int | None = None  # The newest checkpoint a rerun would resume from.
    self._skips: list[tuple[int, dict]] = []  # Spike skipping: (step, metrics), to warn.
    self._tokens, self._t0 = 0, 0.0  # Since the last log line.

  def restore(self, data: Any, init_params: Callable[[], Any] | None = None
              ) -> TrainState:
    """The state of the newest checkpoint that restores (with `data` set to its
    position), else a fresh one (parameters from `init_params()`, default drawn from
    `config.seed`)."""
    target = ckpt_lib.abstract_on(self.setup.abstract, self.setup.shardings).fields()
    restored = self.checkpointer.restore_latest(target, data)
    if restored is None:
      return self.setup.init_state(self.config, init_params() if init_params else None)
    self.last_good, fields = restored
    self.info("Resumed from step %d in %s.", self.last_good, self.checkpointer.directory)
    if set(fields) != set(target):  # E.g. parameters only: the rest starts afresh.
      fresh = self.setup.init_state(self.config, fields["params"])
      fields = {**fresh.fields(), **fields}
    return TrainState(**fields)

  def fit(self, data: Iterator[dict], evaluators: Sequence[Evaluator] = (),
          init_params: Callable[[], Any] | None = None) -> dict[str, dict[str, float]]:
    """Trains to `num_steps` on the host batches of `data` (a grain iterator: its
    position is checkpointed); returns {evaluator name: its last metrics} (a run
    stopped by SIGTERM returns those evaluated before)."""
    setup, results = self.setup, {}
    state = self.restore(data, init_params)
    step = int(jax.device_get(state.step))
    self.log = MetricLogger(self.workdir, step)
    preemption = Preemption(self.checkpointer)
    bar = progress.Progress("train", self.num_steps, "steps", initial=step, interval=None)
    profiling = False
    self._tokens, self._t0 = 0, time.perf_counter()
    try:
      with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        for e in evaluators:
          if step == 0 and e.at_start:
            results[e.name] = e.run(state.params, step)
            self.log.write(step, results[e.name], prefix=e.name)
            self.info("%s of the initial weights | %s", e.name, format_metrics(results[e.name]))
        while step < self.num_steps:
          profiling = self._profile(step + 1, profiling, state)
          batch = next(data)
          # Every real token the step reads (an embedding model's queries and documents
          # have a mask each).
          self._tokens += sum(int(v.sum()) for k, v in batch.items()
                              if k.endswith("attention_mask")) * jax.process_count()
          state, metrics = setup.train_step(state, put_train_batch(batch,
                                                                   setup.batch_sharding))
          step += 1
          bar.update()
          if self.spike_window:
            self._skips.append((step, {k: metrics[k] for k in (
                "skipped", "loss", "grad_norm", "skipped_steps")}))
          done = step == self.num_steps
          preempted = preemption.reached(step)
          if step % self.log_every == 0 or done:
            self._log(step, metrics, bar)
          for e in evaluators:
            if done or (e.every and step % e.every == 0):
              results[e.name] = e.run(state.params, step)
              self.log.write(step, results[e.name], prefix=e.name)
              self.info("%s at step %d | %s", e.name, step, format_metrics(results[e.name]))
          if step % self.checkpoint_every == 0 or done or preempted:
            self._check(step, metrics)
            self.checkpointer.save(step, state.fields(), data, force=True)
            self.last_good = step
          if preempted:
            self.info("SIGTERM: saved step %d; exiting. Rerun the same command to resume.",
                      step)
            break
      self.checkpointer.wait()  # The last asynchronous save's error, if any, is here.
    except OSError as e:  # metrics.jsonl and TensorBoard writes on a full/read-only disk.
      if e.errno not in _WRITE_ERRNOS:
        raise
      raise TrainingError(
          f"cannot write to {self.workdir}: {e.strerror} ({e.filename or 'a log file'}). "
          f"The run stopped at step {step}; {self.checkpointer.intact()}. Free space or "
          "make the workdir writable, then rerun the same command to resume.") from e
    finally:
      preemption.restore()
      stop_profile = lambda: profiling and _stop_trace(state)
      # After a failure these may fail again (a full disk); the first error is raised.
      for close in (stop_profile, bar.close, self.checkpointer.wait,
                    self.checkpointer.close, self.log.close):
        try:
          close()
        except Exception as e:  # pylint: disable=broad-except
          logging.warning("While stopping: %s", str(e).splitlines()[0][:300])
    if jax.process_index() == 0:  # WORKDIR/training.png; a failure only warns.
      curves.plot_after_run(self.workdir)
    return results

  def info(self, msg: str, *args) -> None:
    """A console line from process 0."""
    if jax.process_index() == 0:
      logging.info(msg, *args)

  def _log(self, step: int, metrics: dict, bar: progress.Progress) -> None:
    """Checks and writes the train metrics of the window ending at `step`, and the
    wall-clock rates since the previous log line as a `perf` record."""
    window = self._check(step, metrics)
    elapsed = time.perf_counter() - self._t0
    perf = {"tokens_per_s": self._tokens / max(elapsed, 1e-9)}
    self.log.write(step, window)
    self.log.write(step, perf, prefix="perf")
    self.info("step %d/%d | %s | %s | %s", step, self.num_steps, format_metrics(window),
              format_metrics(perf), bar.status())
    self._tokens, self._t0 = 0, time.perf_counter()

  def _check(self, step: int, metrics: dict) -> dict[str, float]:
    """The window's train metrics so far (host floats), after warning about skipped
    steps; a TrainingError when they are non-finite or too many spikes were skipped
    in a row."""
    host = jax.device_get(metrics["window"])
    for s, m in jax.device_get(self._skips):  # skip_step_on_spikes: only logged.
      if m["skipped"] and jax.process_index() == 0:
        logging.warning("Skipped step %d (update dropped, %d so far): loss %.4g, grad "
                        "norm %.4g.", s, m["skipped_steps"], m["loss"], m["grad_norm"])
    self._skips.clear()
    where = (f"the last good checkpoint is step {self.last_good} in "
             f"{self.checkpointer.directory}")
    if self.spike_window and host["longest_skip_run"] >= self.spike_window:
      raise TrainingError(
          f"{int(host['longest_skip_run'])} steps in a row up to step {step} were skipped "
          f"as spikes; {where}. Lower config.train.learning_rate or raise "
          "config.train.spike_sigma, then rerun to resume.")
    bad = [k for k in _FINITE if not math.isfinite(host[k])]
    if bad and host["window_steps"] > 0:
      raise TrainingError(
          f"non-finite {', '.join(bad)} at or before step {step}; {where}. Lower "
          "config.train.learning_rate or check the data, then rerun to resume.")
    order = ("loss", *self.setup.objective.metric_names, "grad_norm", "param_norm",
             "learning_rate", "skipped_steps")
    return {k: float(host[k]) for k in order if k in host}

  def _profile(self, step: int, profiling: bool, state: TrainState) -> bool:
    """Starts (process 0) a `jax.profiler` trace into WORKDIR/tensorboard before the
    first step of `config.train.profile_steps` (first, last) and stops it after the
    last; returns whether one is running."""
    if not self.profile_steps or jax.process_index() != 0:
      return False
    first, last = self.profile_steps
    if not profiling and first <= step <= last:
      jax.profiler.start_trace(str(epath.Path(self.workdir) / files.TENSORBOARD_DIR))
      return True
    if profiling and step > last:
      _stop_trace(state)
      return False
    return profiling


def _stop_trace(state: TrainState) -> None:
  """Ends the profiler trace once the traced steps' work is done."""
  jax.block_until_ready(state)
  jax.profiler.stop_trace()
