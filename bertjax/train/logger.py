"""Metrics out of the run: console lines, TensorBoard events and metrics.jsonl (process 0)."""

from __future__ import annotations

import json
import os

import jax
from absl import logging
from etils import epath

from bertjax import files
from bertjax.data.tokenizer import is_remote


class MetricLogger:
  """Writes scalars to the console, `WORKDIR/tensorboard` and `WORKDIR/metrics.jsonl`.
  Every other process does nothing. Object stores (gs://) cannot append, so for a
  remote workdir metrics.jsonl is rewritten whole at each write (a line per log step)."""

  def __init__(self, workdir: str):
    self.active = jax.process_index() == 0
    if self.active:
      from tensorboardX import SummaryWriter  # TensorBoard events without TensorFlow.
      self.tb = SummaryWriter(os.path.join(workdir, files.TENSORBOARD_DIR))
      self.path = epath.Path(workdir) / files.METRICS_FILE
      self.remote_lines = None
      if is_remote(workdir):
        self.remote_lines = self.path.read_text() if self.path.exists() else ""
      else:
        self.jsonl = open(self.path, "a")

  def write(self, step: int, metrics: dict[str, float], prefix: str = "train") -> None:
    if not self.active:
      return
    line = json.dumps({"step": step, "split": prefix, **metrics}) + "\n"
    if self.remote_lines is not None:
      self.remote_lines += line
      self.path.write_text(self.remote_lines)
    else:
      self.jsonl.write(line)
      self.jsonl.flush()
    for k, v in metrics.items():
      self.tb.add_scalar(f"{prefix}/{k}", v, step)
    # A full or read-only disk raises here, in this thread: tensorboardX's writer thread
    # would die silently on it and the next add_scalar block forever on its full queue.
    self.tb.flush()

  def info(self, msg: str, *args) -> None:
    if self.active:
      logging.info(msg, *args)

  def close(self) -> None:
    if self.active:
      self.tb.close()
      if self.remote_lines is None:
        self.jsonl.close()


def format_metrics(metrics: dict[str, float]) -> str:
  """'loss 2.345 | mlm_accuracy 0.412 | ...' with sensible precision."""
  parts = []
  for k, v in metrics.items():
    fmt = "{:.2e}" if k == "learning_rate" else ("{:,.0f}" if k.endswith("_per_s") else "{:.4f}")
    parts.append(f"{k} {fmt.format(v)}")
  return " | ".join(parts)
