"""Metrics out of the run: console lines, TensorBoard events and metrics.jsonl (process 0)."""

from __future__ import annotations

import json
import os

import jax
from absl import logging


class MetricLogger:
  """Writes scalars to the console, `WORKDIR/tensorboard` and `WORKDIR/metrics.jsonl`.
  Every other process does nothing."""

  def __init__(self, workdir: str):
    self.active = jax.process_index() == 0
    if self.active:
      from tensorboardX import SummaryWriter  # TensorBoard events without TensorFlow.
      self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
      self.jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")

  def write(self, step: int, metrics: dict[str, float], prefix: str = "train") -> None:
    if not self.active:
      return
    for k, v in metrics.items():
      self.tb.add_scalar(f"{prefix}/{k}", v, step)
    self.jsonl.write(json.dumps({"step": step, "split": prefix, **metrics}) + "\n")
    self.jsonl.flush()

  def info(self, msg: str, *args) -> None:
    if self.active:
      logging.info(msg, *args)

  def close(self) -> None:
    if self.active:
      self.tb.close()
      self.jsonl.close()


def format_metrics(metrics: dict[str, float]) -> str:
  """'loss 2.345 | mlm_accuracy 0.412 | ...' with sensible precision."""
  parts = []
  for k, v in metrics.items():
    fmt = "{:.2e}" if k == "learning_rate" else ("{:,.0f}" if k.endswith("_per_s") else "{:.4f}")
    parts.append(f"{k} {fmt.format(v)}")
  return " | ".join(parts)
