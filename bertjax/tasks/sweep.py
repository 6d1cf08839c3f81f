"""The BERT paper's selection protocol: fine-tune once per (learning rate, seed) of
`config.sweep` from the same pretrained weights (each seed re-initialises the head and
reshuffles the data), score every run on dev, keep the best by the task's first metric,
and write the table as `sweep_results.json` and `sweep_results.md`, with each learning
rate's mean, standard deviation, min and max over its seeds (the best run alone
overstates what a setting gives: fine-tuning on small sets varies by seed)."""

from __future__ import annotations

import json
import os
import statistics

import jax
import ml_collections

from bertjax import writes
from bertjax.checkpoint import files
from bertjax.errors import ConfigError
from bertjax.tasks import finetune, get_task, retrieval
from bertjax.tasks.base import RETRIEVER_TASKS


def check_config(config) -> None:
  """`config.sweep` in range, and the rest of the config (`finetune.check_config`)."""
  finetune.check_config(config)
  for lr in config.sweep.learning_rates:
    if not (isinstance(lr, (int, float)) and 0 < lr < float("inf")):
      raise ConfigError(f"config.sweep.learning_rates={tuple(config.sweep.learning_rates)}"
                        " must all be positive.")
  for seed in config.sweep.seeds:
    if not (isinstance(seed, int) and seed >= 0):
      raise ConfigError(f"config.sweep.seeds={tuple(config.sweep.seeds)} must all be "
                        "non-negative integers.")


def grid(config) -> list[tuple[float, int]]:
  lrs = tuple(config.sweep.learning_rates) or (config.train.learning_rate,)
  seeds = tuple(config.sweep.seeds) or (config.seed,)
  return [(float(lr), int(seed)) for lr in lrs for seed in seeds]


def selection_metric(config) -> str:
  metrics = config.task.metrics
  if metrics:
    return metrics[0]
  if config.task.name in RETRIEVER_TASKS:
    return retrieval.default_metric(config)
  return get_task(config.task.name).default_metric


def by_learning_rate(rows: list[dict]) -> list[dict]:
  """Per learning rate (in grid order): its `seeds` and, for every dev metric, the
  `mean`, `std` (sample standard deviation; 0 for one seed), `min` and `max` over the
  seeds' runs. Runs without dev results (stopped by SIGTERM) are left out."""
  out = []
  for lr in dict.fromkeys(r["learning_rate"] for r in rows):
    runs = [r for r in rows if r["learning_rate"] == lr and r["dev"]]
    if not runs:
      continue
    values = {k: [r["dev"][k] for r in runs] for k in runs[0]["dev"]}
    out.append({"learning_rate": lr, "seeds": [r["seed"] for r in runs],
                **{stat: {k: fn(v) for k, v in values.items()} for stat, fn in (
                    ("mean", statistics.mean),
                    ("std", lambda v: statistics.stdev(v) if len(v) > 1 else 0.0),
                    ("min", min), ("max", max))}})
  return out


def markdown(rows: list[dict], metric: str) -> str:
  keys = [k for k in rows[0]["dev"] if k != "loss"] + ["loss"]
  lines = ["| learning rate | seed | " + " | ".join(keys) + " |",
           "|---|---|" + "---|" * len(keys)]
  best = max(rows, key=lambda r: r["dev"][metric])
  for r in rows:
    mark = " **best**" if r is best else ""
    lines.append(f"| {r['learning_rate']:g} | {r['seed']}{mark} | "
                 + " | ".join(f"{r['dev'][k]:.4f}" for k in keys) + " |")
  lines += ["", "Over seeds: mean ± standard deviation (min, max).", "",
            "| learning rate | seeds | " + " | ".join(keys) + " |",
            "|---|---|" + "---|" * len(keys)]
  for s in by_learning_rate(rows):
    lines.append(f"| {s['learning_rate']:g} | {len(s['seeds'])} | " + " | ".join(
        f"{s['mean'][k]:.4f} ± {s['std'][k]:.4f} ({s['min'][k]:.4f}, {s['max'][k]:.4f})"
        for k in keys) + " |")
  return "\n".join(lines) + "\n"


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """One run in `workdir` when the sweep is empty; else every grid point in
  `workdir/lr{LR}_seed{SEED}` (each resumable) and the table, the workdir claimed for
  the sweep (`writes.claim`: no single run's workdir takes one). Returns
  {'best': row, 'runs': [rows]} with rows {learning_rate, seed, workdir, dev}, and for
  a sweep also 'metric' and 'by_learning_rate' (`by_learning_rate`)."""
  check_config(config)  # before the pretrained weights are read
  points = grid(config)
  if len(points) == 1 and not config.sweep.learning_rates and not config.sweep.seeds:
    dev = finetune.train(config, workdir)
    row = {"learning_rate": points[0][0], "seed": points[0][1], "workdir": workdir,
           "dev": dev}
    return {"best": row, "runs": [row]}
  writes.claim(workdir, writes.SWEEP, config.task.name, finetune.inputs(config))
  if jax.process_index() == 0:
    writes.record(workdir, writes.SWEEP, config.task.name)
  start = None
  rows = []
  for lr, seed in points:
    run_dir = os.path.join(workdir, f"lr{lr:g}_seed{seed}")
    if start is None and not os.path.isfile(os.path.join(run_dir, files.TASK_FILE)):
      start = finetune.load_start(config)  # The pretrained weights, read once.
    c = ml_collections.ConfigDict(config.to_dict())
    c.train.learning_rate, c.seed = lr, seed
    rows.append({"learning_rate": lr, "seed": seed, "workdir": run_dir,
                 "dev": finetune.train(c, run_dir, start)})
  metric = selection_metric(config)
  best = max(rows, key=lambda r: r["dev"][metric])
  result = {"metric": metric, "best": best, "runs": rows,
            "by_learning_rate": by_learning_rate(rows)}
  with open(os.path.join(workdir, files.SWEEP_RESULTS_FILE), "w") as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(workdir, files.SWEEP_TABLE_FILE), "w") as f:
    f.write(markdown(rows, metric))
  return result
