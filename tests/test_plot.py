"""bertjax.train.curves: the PNG of a run's curves from a metrics.jsonl in the logger's format.
(The pretraining loop writing it at the end of a real run is checked by
tests/test_notebooks.py, whose pretraining notebook shows WORKDIR/training.png.)"""

import json
import os
import struct
import subprocess
import sys

import pytest

from bertjax.train import curves
from bertjax.errors import DataError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_metrics(workdir, rows) -> None:
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")


def pretraining_rows(nsp=True, resumed=True) -> list[dict]:
  """Train lines every 10 steps, eval at 20 and 40; with `resumed`, steps 30-40 are
  logged twice (a run resumed from step 20), the second time with other values."""
  rows = []
  for step in range(10, 50, 10):
    heads = {"mlm_loss": 6.0 - step / 20, "mlm_accuracy": step / 100}
    if nsp:
      heads |= {"nsp_loss": 0.7, "nsp_accuracy": 0.5 + step / 200}
    rows.append({"step": step, "split": "train", "loss": 7.0 - step / 20, **heads,
                 "learning_rate": 1e-3 * step / 40})
    rows.append({"step": step, "split": "perf", "tokens_per_s": 20000.0 + step})
    if step % 20 == 0:
      rows.append({"step": step, "split": "eval", **heads,
                   "mlm_accuracy_most_frequent_baseline": 0.05})
  if resumed:
    rows += [dict(r, loss=1.0) if r["split"] == "train" else r for r in rows
             if r["step"] >= 30 and r["split"] in ("train", "perf")]
  return rows


def png_size(path) -> tuple[int, int]:
  with open(path, "rb") as f:
    head = f.read(24)
  assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
  return struct.unpack(">II", head[16:24])


def test_plot_has_every_panel_and_a_png_of_1200x800(tmp_path):
  write_metrics(tmp_path, pretraining_rows())
  fig = curves.plot_training(str(tmp_path))
  assert [ax.get_title() for ax in fig.axes] == list(curves.PANELS)
  assert png_size(tmp_path / "training.png") == (1200, 800)
  loss, accuracy, lr, throughput = fig.axes
  labels = [line.get_label() for line in accuracy.get_lines()]
  assert labels == ["train mlm_accuracy", "eval mlm_accuracy", "train nsp_accuracy",
                    "eval nsp_accuracy", "eval most-frequent baseline"]
  train_loss = loss.get_lines()[0]
  assert list(train_loss.get_xdata()) == [10, 20, 30, 40]
  assert list(train_loss.get_ydata())[2:] == [1.0, 1.0]  # a resumed step: its last line
  assert [line.get_label() for line in lr.get_lines()] == ["train learning_rate"]
  assert list(throughput.get_lines()[0].get_ydata()) == [20010.0, 20020.0, 20030.0, 20040.0]


def test_a_metric_the_run_did_not_log_leaves_a_labelled_empty_panel(tmp_path):
  rows = [r for r in pretraining_rows(nsp=False, resumed=False) if r["split"] != "perf"]
  write_metrics(tmp_path, rows)
  fig = curves.plot_training(str(tmp_path), out=str(tmp_path / "other.png"))
  assert (tmp_path / "other.png").exists() and not (tmp_path / "training.png").exists()
  throughput = fig.axes[3]
  assert not throughput.get_lines()
  assert [t.get_text() for t in throughput.texts] == ["not logged by this run"]
  assert "train nsp_accuracy" not in [l.get_label() for l in fig.axes[1].get_lines()]


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("", "is empty"),
    ('{"step": 1, "split": "train", "loss": 2.0}\nnot json\n', "line 2 is not a metrics line"),
    ('{"loss": 2.0}\n', "line 1 is not a metrics line"),
])
def test_missing_or_bad_metrics_are_one_line_errors(tmp_path, content, message):
  if content is not None:
    (tmp_path / "metrics.jsonl").write_text(content)
  with pytest.raises(DataError, match=message) as e:
    curves.plot_training(str(tmp_path))
  assert "\n" not in str(e.value)


def test_plot_after_run_only_warns(tmp_path, caplog, monkeypatch):
  monkeypatch.setenv("BERTJAX_PLOT", "1")  # A user's default (the suite sets 0).
  curves.plot_after_run(str(tmp_path))  # no metrics.jsonl: must not raise
  assert not (tmp_path / "training.png").exists()
  assert any("No training.png written" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("setting, written", [("1", True), ("0", False)])
def test_plot_after_run_follows_bertjax_plot(tmp_path, monkeypatch, setting, written):
  write_metrics(tmp_path, pretraining_rows())
  monkeypatch.setenv("BERTJAX_PLOT", setting)
  curves.plot_after_run(str(tmp_path))
  assert (tmp_path / "training.png").exists() == written


def test_command_line(tmp_path):
  write_metrics(tmp_path, pretraining_rows())
  run = lambda workdir: subprocess.run(
      [sys.executable, "-m", "bertjax.plot", f"--workdir={workdir}"], cwd=ROOT,
      capture_output=True, text=True, check=False)
  done = run(tmp_path)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == (f"wrote {tmp_path / 'training.png'}: loss, MLM / NSP "
                                 "accuracy, learning rate, throughput (tokens/s)")
  assert png_size(tmp_path / "training.png") == (1200, 800)
  failed = run(tmp_path / "missing")
  assert failed.returncode == 2
  assert failed.stderr.strip() == (f"error: {tmp_path / 'missing' / 'metrics.jsonl'} does "
                                   "not exist; give the workdir of a training run.")
