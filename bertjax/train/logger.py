"""Metrics out of the run: console lines, TensorBoard events and metrics.jsonl (process 0)."""

from __future__ import annotations

import json
import os
import sys

import jax
from etils import epath

from bertjax.checkpoint import files
from bertjax.data.tokenizer import is_remote


class MetricLogger:
  """Writes scalars to `WORKDIR/tensorboard` and `WORKDIR/metrics.jsonl` (process 0;
  every other process does nothing) for a run that resumes at `step`: what an earlier
  attempt logged after `step` (before it was killed) is dropped, so every step is
  logged once. Object stores (gs://) cannot append, so for a remote workdir
  metrics.jsonl is rewritten whole at each write (a line per log step)."""

  def __init__(self, workdir: str, step: int = 0):
    self.active = jax.process_index() == 0
    if self.active:
      SummaryWriter = _summary_writer()  # pylint: disable=invalid-name
      # TensorBoard hides the events of steps >= purge_step written before.
      self.tb = SummaryWriter(os.path.join(workdir, files.TENSORBOARD_DIR),
                              purge_step=step + 1)
      self.path = epath.Path(workdir) / files.METRICS_FILE
      old = self.path.read_text() if self.path.exists() else ""
      kept = "".join(line for line in old.splitlines(keepends=True)
                     if _logged_step(line) <= step)
      self.remote_lines = kept if is_remote(workdir) else None
      if kept != old and self.remote_lines is not None:
        self.path.write_text(kept)  # An object is replaced whole.
      elif kept != old:  # A new file, renamed over the old one: never half written.
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(kept)
        os.replace(tmp, self.path)
      if self.remote_lines is None:
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

  def close(self) -> None:
    if self.active:
      self.tb.close()
      if self.remote_lines is None:
        self.jsonl.close()


def _summary_writer():
  """tensorboardX's SummaryWriter (TensorBoard events without TensorFlow), imported
  without torch: its writer imports torch, when installed, only to accept torch
  tensors, which bertjax never logs (1-6 s of every run's start-up on 2 CPU cores)."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError meanwhile.
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  finally:
    del sys.modules["torch"]
  return SummaryWriter


def _logged_step(line: str) -> float:
  """The step of a metrics.jsonl line; inf for a line a killed process left half
  written (dropped)."""
  try:
    return json.loads(line)["step"]
  except (json.JSONDecodeError, KeyError, TypeError):
    return float("inf")


def format_metrics(metrics: dict[str, float]) -> str:
  """'loss 2.345 | mlm_accuracy 0.412 | ...' with sensible precision."""
  parts = []
  for k, v in metrics.items():
    fmt = "{:.2e}" if k == "learning_rate" else ("{:,.0f}" if k.endswith("_per_s") else "{:.4f}")
    parts.append(f"{k} {fmt.format(v)}")
  return " | ".join(parts)
