"""Soak benchmark: `python -m bertjax.benchmark soak [--steps=2000 --every=100
--config=configs/bert_tiny.py --workdir=DIR --json=FILE]`.

Runs the real pretraining loop (`train.pretrain.run`) for `--steps` steps
with an evaluation, a metrics log and a checkpoint every `--every` steps, and watches
at each checkpoint (right before it is written, once the previous asynchronous save
has finished, where orbax itself waits): the host memory (RSS), the number of
checkpoint directories in the workdir, and the time since the previous checkpoint.
Each window of `--every` steps therefore holds the same work: its steps, one
evaluation and one checkpoint save. It prints a table and a verdict against three
bounds:

* memory: RSS grows by at most `--max_rss_growth_mb` from the end of the warm-up
  (`--warmup_windows` windows: compilation, first evaluation, the first
  `max_to_keep` checkpoints) to any later window;
* checkpoints: after the k-th save the workdir holds min(k, max_to_keep) of them,
  at the end exactly `max_to_keep`;
* throughput: steps per CPU-second of this process (all its threads: the step, the
  input pipeline, the asynchronous checkpoint writer), mean of the last 3 windows, is
  at least `--min_throughput_ratio` of the mean of the first 3 (the steps before the
  first checkpoint, which include compilation, are no window). CPU time, not wall
  time: on a shared machine wall-clock rates follow the other processes' load (shown
  per window with the load average); work per step does not.

Exit status 1 when a bound is broken. Any config field can be overridden
(`--config.train.batch_size=16`).

  python -m bertjax.benchmark soak
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from typing import Any
from unittest import mock

from absl import flags
from ml_collections import config_flags

from bertjax.checkpoint import manager as ckpt_lib, files
from bertjax.errors import ConfigError



def define_flags() -> None:
  """Defined by `python -m bertjax.benchmark soak` only: importing this module (the
  tests do, next to the other benchmarks) defines no flags."""
  config_flags.DEFINE_config_file(
      "config", "configs/bert_tiny.py", "Recipe file (default: the checkout's bert_tiny, "
      "run from the repository root).", lock_config=True)
  flags.DEFINE_integer("steps", 2000, "Training steps.")
  flags.DEFINE_integer("every", 100, "Steps between evaluations, logs and checkpoints "
                       "(one window).")
  flags.DEFINE_string("workdir", "", "Run directory (default: a temporary one, deleted "
                      "afterwards).")
  flags.DEFINE_integer("warmup_windows", 3, "Windows before the memory baseline.")
  flags.DEFINE_float("max_rss_growth_mb", 64.0, "Bound on RSS growth after the warm-up "
                     "(MB).")
  flags.DEFINE_float("min_throughput_ratio", 0.9, "Bound on last / first windows' "
                     "throughput.")
  flags.DEFINE_string("json", "/tmp/bertjax_benchmark_soak.json", "Results file.")


_MB = 1 << 20
_MEAN_OF = 3  # windows averaged at each end for the throughput ratio


def rss_mb() -> float:
  """This process's resident memory in MB (psutil, else /proc/self/statm)."""
  try:
    import psutil  # pylint: disable=g-import-not-at-top
    return psutil.Process().memory_info().rss / _MB
  except ImportError:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / _MB


def checkpoint_count(directory) -> int:
  """Finished checkpoint steps in `directory` (orbax's step dirs: integer names)."""
  if not os.path.isdir(directory):
    return 0
  return sum(name.isdigit() for name in os.listdir(directory))


@dataclasses.dataclass
class Sample:
  """At a checkpoint, before it is written: the step, the wall and CPU time (s), RSS
  (MB), the checkpoints then in the workdir (all earlier saves finished) and the
  machine's 1-minute load average."""

  step: int
  time: float
  cpu_s: float
  rss_mb: float
  checkpoints: int
  load: float


def run(config, workdir: str, every: int) -> dict[str, Any]:
  """Trains `config` in `workdir` with an evaluation and a checkpoint every `every`
  steps; returns the samples (one per checkpoint) and the final checkpoint count."""
  from bertjax.train import pretrain  # pylint: disable=g-import-not-at-top

  config.train.eval_every = config.train.checkpoint_every = config.train.log_every = every
  if config.train.num_steps % every:
    raise ConfigError(f"--steps={config.train.num_steps} must be a multiple of "
                      f"--every={every}.")
  config.train.warmup_steps = min(config.train.warmup_steps, config.train.num_steps // 10)
  samples: list[Sample] = []
  save = ckpt_lib.Checkpointer.save

  def watched_save(self, step, *args, **kwargs):
    self.wait()  # The previous save's directory is final (orbax would wait here too).
    samples.append(Sample(step, time.perf_counter(), time.process_time(), rss_mb(),
                          checkpoint_count(self.directory), os.getloadavg()[0]))
    return save(self, step, *args, **kwargs)

  start = time.perf_counter()
  with mock.patch.object(ckpt_lib.Checkpointer, "save", watched_save):
    pretrain.run(config, workdir)
  return {"samples": samples, "seconds": time.perf_counter() - start,
          "final_checkpoints": checkpoint_count(os.path.join(workdir, files.CHECKPOINT_DIR))}


def verdict(result: dict[str, Any], *, batch_size: int, max_to_keep: int,
            warmup_windows: int, max_rss_growth_mb: float, min_throughput_ratio: float
            ) -> dict[str, Any]:
  """The windows' throughput and the three checks (see the module docstring)."""
  samples = result["samples"]
  windows = [{"steps": f"{a.step + 1}-{b.step}",
              "steps_per_s": (b.step - a.step) / (b.time - a.time),
              "examples_per_s": (b.step - a.step) * batch_size / (b.time - a.time),
              "steps_per_cpu_s": (b.step - a.step) / (b.cpu_s - a.cpu_s),
              "rss_mb": b.rss_mb, "load": b.load}
             for a, b in zip(samples, samples[1:])]
  expected = [min(k, max_to_keep) for k in range(len(samples) + 1)]
  counts = [s.checkpoints for s in samples] + [result["final_checkpoints"]]
  base = samples[min(warmup_windows, len(samples) - 1)].rss_mb
  growth = max(s.rss_mb for s in samples[min(warmup_windows, len(samples) - 1):]) - base
  rates = [w["steps_per_cpu_s"] for w in windows]
  head, tail = rates[:_MEAN_OF], rates[-_MEAN_OF:]
  ratio = (sum(tail) / len(tail)) / (sum(head) / len(head)) if rates else float("nan")
  checks = {
      "rss_growth_mb": (growth, growth <= max_rss_growth_mb, f"<= {max_rss_growth_mb:g}"),
      "checkpoint_counts": (counts, counts == expected, f"== {expected}"),
      "throughput_ratio": (ratio, ratio >= min_throughput_ratio,
                           f">= {min_throughput_ratio:g}"),
  }
  return {"windows": windows, "rss_baseline_mb": base,
          "checks": {k: {"value": v, "ok": ok, "bound": b} for k, (v, ok, b) in checks.items()},
          "passed": all(ok for _, ok, _ in checks.values())}


def table(result: dict[str, Any], judged: dict[str, Any]) -> str:
  lines = [f"{'steps':>11} {'steps/s':>8} {'examples/s':>10} {'steps/CPU-s':>11} "
           f"{'load':>5} {'RSS MB':>8} {'checkpoints':>11}"]
  for w, s in zip(judged["windows"], result["samples"][1:]):
    lines.append(f"{w['steps']:>11} {w['steps_per_s']:8.2f} {w['examples_per_s']:10.1f} "
                 f"{w['steps_per_cpu_s']:11.3f} {w['load']:5.1f} {w['rss_mb']:8.1f} "
                 f"{s.checkpoints:11d}")
  c = judged["checks"]
  lines.append(
      f"soak {'PASS' if judged['passed'] else 'FAIL'}: RSS growth after warm-up "
      f"{c['rss_growth_mb']['value']:.1f} MB ({c['rss_growth_mb']['bound']} MB, from "
      f"{judged['rss_baseline_mb']:.0f} MB); checkpoints after each save "
      f"{'match' if c['checkpoint_counts']['ok'] else 'do not match'} "
      f"min(k, max_to_keep), {result['final_checkpoints']} at the end; steps/CPU-s last/first "
      f"{_MEAN_OF} windows {c['throughput_ratio']['value']:.3f} "
      f"({c['throughput_ratio']['bound']}); {result['seconds']:.0f} s, load average "
      f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
  return "\n".join(lines)


def main(argv):
  del argv
  FLAGS = flags.FLAGS  # pylint: disable=invalid-name
  config = FLAGS.config
  config.train.num_steps = FLAGS.steps
  workdir = FLAGS.workdir or tempfile.mkdtemp(prefix="bertjax-soak-")
  try:
    result = run(config, workdir, FLAGS.every)
  finally:
    if not FLAGS.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  judged = verdict(result, batch_size=config.train.batch_size,
                   max_to_keep=config.train.max_to_keep, warmup_windows=FLAGS.warmup_windows,
                   max_rss_growth_mb=FLAGS.max_rss_growth_mb,
                   min_throughput_ratio=FLAGS.min_throughput_ratio)
  print(table(result, judged))
  with open(FLAGS.json, "w") as f:
    json.dump({"steps": FLAGS.steps, "every": FLAGS.every,
               "samples": [dataclasses.asdict(s) for s in result["samples"]],
               **{k: v for k, v in result.items() if k != "samples"}, **judged},
              f, indent=1, default=str)
  print(f"wrote {FLAGS.json}")
  return 0 if judged["passed"] else 1
