"""A PNG of a run's curves from its metrics.jsonl: loss, MLM/NSP accuracy, learning rate
and throughput (tokens/s, the `perf` rows) against steps, train and eval. TensorBoard
stays the live view; this is the picture a finished (or stopped) run leaves in its
workdir.

  python -m bertjax.plot --workdir=/tmp/bert_tiny   # writes /tmp/bert_tiny/training.png

The trainer writes it at the end of every run (process 0; not with BERTJAX_PLOT=0 in
the environment). Workdirs may be
remote (gs://): the file is read and written through etils.epath.
"""

from __future__ import annotations

import io
import itertools
import json
import os
from typing import TYPE_CHECKING

from absl import logging
from etils import epath

from bertjax.checkpoint import files
from bertjax.errors import DataError

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn (0.24 s a process).
  from matplotlib.figure import Figure

HELD_OUT = ("eval", "dev")  # Splits drawn as held-out points.
# Panel title -> the metrics drawn in it (those a run logged; the others are skipped).
PANELS = {
    "loss": ("loss", "mlm_loss", "nsp_loss", "sbo_loss", "generator_loss", "rtd_loss"),
    "MLM / NSP accuracy": ("mlm_accuracy", "nsp_accuracy", "sbo_accuracy",
                           "generator_accuracy", "rtd_accuracy", "rtd_precision",
                           "rtd_recall",
                           # An embedding model's (bertjax.tasks.retrieval).
                           "in_batch_accuracy", "ndcg@10", "mrr@10", "recall@100",
                           "spearman"),
    "learning rate": ("learning_rate",),
    "throughput (tokens/s)": ("tokens_per_s",),
}
BASELINE = "mlm_accuracy_most_frequent_baseline"  # Eval: always the most frequent token.
_SIZE, _DPI = (12.0, 8.0), 100  # 1200 x 800 pixels.


def read_metrics(workdir: str) -> dict[str, dict[int, dict[str, float]]]:
  """{split: {step: metrics}} from WORKDIR/metrics.jsonl. A step logged twice (a run
  resumed from a checkpoint before its last log line) keeps its last line."""
  path = epath.Path(workdir) / files.METRICS_FILE
  if not path.exists():
    raise DataError(f"{path} does not exist; give the workdir of a training run.")
  splits: dict[str, dict[int, dict[str, float]]] = {}
  for n, line in enumerate(path.read_bytes().decode("utf-8").splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
      step, split = int(row.pop("step")), str(row.pop("split"))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
      raise DataError(f"{path} line {n} is not a metrics line ({type(e).__name__}: "
                      f"{e}); expected {{\"step\", \"split\", ...}}.") from e
    splits.setdefault(split, {})[step] = row
  if not splits:
    raise DataError(f"{path} is empty; the run has not logged a step yet.")
  return splits


def _series(rows: dict[int, dict[str, float]], key: str) -> tuple[list[int], list[float]]:
  steps = sorted(s for s, r in rows.items() if isinstance(r.get(key), (int, float)))
  return steps, [float(rows[s][key]) for s in steps]


def training_figure(splits: dict[str, dict[int, dict[str, float]]], title: str = ""
                    ) -> Figure:
  """A 2 x 2 figure, one panel per PANELS entry: train curves as lines, eval / dev as
  markers in the same colour, the eval most-frequent-token baseline dashed."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  # No pyplot: no global backend, no display.
  fig = Figure(figsize=_SIZE, dpi=_DPI, layout="constrained")
  axes = fig.subplots(2, 2).ravel()
  # The trainer logs wall-clock rates (tokens/s) apart, as `perf` rows of the same steps.
  train = {s: {**splits.get("perf", {}).get(s, {}), **r}
           for s, r in splits.get("train", {}).items()}
  held_out = [(name, splits[name]) for name in HELD_OUT if name in splits]
  for ax, (panel, keys) in zip(axes, PANELS.items()):
    colours = itertools.cycle(f"C{i}" for i in range(10))
    drawn = False
    for key in keys:
      colour = next(colours)
      steps, values = _series(train, key)
      if steps:
        ax.plot(steps, values, color=colour, lw=1.5, label=f"train {key}")
      for name, rows in held_out:
        h_steps, h_values = _series(rows, key)
        if h_steps:
          ax.plot(h_steps, h_values, "o--", color=colour, ms=5, lw=0.8,
                  label=f"{name} {key}")
        steps += h_steps
      drawn |= bool(steps)
    for name, rows in held_out:
      steps, values = _series(rows, BASELINE) if panel.startswith("MLM") else ([], [])
      if steps:
        ax.plot(steps, values, ":", color="grey", label=f"{name} most-frequent baseline")
    ax.set_title(panel)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if drawn:
      ax.legend(fontsize=8)
    else:
      ax.text(0.5, 0.5, "not logged by this run", ha="center", va="center",
              transform=ax.transAxes, color="grey")
  if title:
    fig.suptitle(title)
  return fig


def plot_training(workdir: str, out: str | None = None) -> Figure:
  """Writes the figure of WORKDIR/metrics.jsonl as a PNG to `out` (default
  WORKDIR/training.png) and returns it (its `axes` are the panels, in PANELS order)."""
  fig = training_figure(read_metrics(workdir), title=str(workdir))
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=_DPI)
  (epath.Path(out) if out else epath.Path(workdir) / files.PLOT_FILE).write_bytes(
      buffer.getvalue())
  return fig


def plot_after_run(workdir: str) -> None:
  """`plot_training` at the end of a run: a failure is a warning, never the run's error.
  `BERTJAX_PLOT=0` in the environment skips it (the test suite's setting: about a
  second of matplotlib a run, over a hundred runs; `python -m bertjax.plot` draws it
  on demand)."""
  if os.environ.get("BERTJAX_PLOT", "1") == "0":
    return
  try:
    plot_training(workdir)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("No %s written: %s", files.PLOT_FILE, str(e).splitlines()[0][:300])
