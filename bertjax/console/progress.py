"""Progress of long operations: a tqdm bar on a terminal, plain log lines elsewhere.

  with Progress("train", total=1500, unit="steps") as bar:
    for _ in range(1500):
      ...
      bar.update()

On a terminal (stderr is a TTY) a tqdm bar shows the count, rate and ETA, and absl log
lines are printed above it instead of through it. Elsewhere (CI, pods, log files) a
line like `train: 300/1500 steps (20%) 5.1 steps/s, ETA 3m55s` is logged every
`interval` seconds, and a last one with the total time at the end. Only process 0
shows anything. `update` costs a counter increment and a clock read: no device sync.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Iterable, Iterator, TypeVar

from absl import logging
import tqdm

T = TypeVar("T")
_clock = time.perf_counter  # Seconds; tests substitute a fake clock.


def is_terminal() -> bool:
  """Whether progress goes to a terminal (stderr is a TTY): a bar, else log lines."""
  return sys.stderr.isatty()


def _process_zero() -> bool:
  jax = sys.modules.get("jax")  # Never import (or start) jax just to ask.
  return jax is None or jax.process_index() == 0


def format_duration(seconds: float) -> str:
  """'45s', '3m55s', '2h05m'."""
  s = int(round(seconds))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _rate(value: float) -> str:
  return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


class _AbslAboveBar:
  """While a bar is shown, absl's log lines go through `tqdm.write` (printed above the
  bar, which is then redrawn) instead of being written through the bar's line."""

  def __init__(self, stream):
    self.stream = stream

  def write(self, text: str) -> None:
    tqdm.tqdm.write(text, file=self.stream, end="")

  def flush(self) -> None:
    self.stream.flush()


class Progress:
  """Counts `total` (or an unknown number of) `unit` of one operation named `desc`.

  Args:
    desc: the operation ('train', 'eval', 'prepare', ...), the lines' prefix.
    total: the count at completion (None: unknown; lines then show count and rate).
    unit: plural unit name ('steps', 'batches', 'docs').
    initial: the count already done (a resumed run): rates count only new work.
    interval: seconds between plain log lines; None: none but the last (for callers
      whose own periodic lines carry `status()`).
    leave: keep the bar / log the last line at `close`.
    enable: False shows nothing (status() still works).
    terminal: bar (True) or lines (False); default: `is_terminal()`.
  """

  def __init__(self, desc: str, total: int | None = None, unit: str = "it", *,
               initial: int = 0, interval: float | None = 30.0, leave: bool = True,
               enable: bool = True, terminal: bool | None = None):
    self.desc, self.total, self.unit = desc, total, unit
    self.interval, self.leave = interval, leave
    self.n = self._n0 = self._mark_n = initial
    self._t0 = self._mark_t = self._last_line = _clock()
    show = enable and _process_zero()
    terminal = is_terminal() if terminal is None else terminal
    self._lines = show and not terminal
    self._bar = None
    self._handler, self._stream = None, None
    if show and terminal:
      self._bar = tqdm.tqdm(total=total, desc=desc, unit=f" {unit}", initial=initial,
                            leave=leave, dynamic_ncols=True)
      handler = logging.get_absl_handler().python_handler
      if not isinstance(handler.stream, _AbslAboveBar):  # An outer bar already does.
        self._handler, self._stream = handler, handler.stream
        handler.stream = _AbslAboveBar(handler.stream)
    self.closed = False

  def update(self, n: int = 1) -> None:
    self.n += n
    if self._bar is not None:
      self._bar.update(n)
    elif self._lines and self.interval is not None:
      now = _clock()
      if now - self._last_line >= self.interval:
        self._last_line = now
        logging.info("%s", self.line())

  def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
    """Yields the items of `iterable`, counting each; closes at the end."""
    try:
      for item in iterable:
        yield item
        self.update()
    finally:
      self.close()

  def status(self) -> str:
    """'5.1 steps/s, ETA 3m55s': the rate since the previous status or line (the
    average so far when nothing new was counted) and the time left at that rate."""
    now = _clock()
    if self.n > self._mark_n:
      rate = (self.n - self._mark_n) / max(now - self._mark_t, 1e-9)
      self._mark_n, self._mark_t = self.n, now
    else:
      rate = (self.n - self._n0) / max(now - self._t0, 1e-9)
    text = f"{_rate(rate)} {self.unit}/s"
    if self.total is not None and self.n < self.total and rate > 0:
      text += f", ETA {format_duration((self.total - self.n) / rate)}"
    return text

  def line(self, final: bool = False) -> str:
    """The plain progress line: 'train: 300/1500 steps (20%) 5.1 steps/s, ETA 3m55s';
    the final one ends with the elapsed time instead of the ETA and averages the rate
    over the whole operation."""
    count = f"{self.n:,}" if self.total is None else (
        f"{self.n:,}/{self.total:,} {self.unit} "
        f"({math.floor(100 * self.n / max(self.total, 1))}%)")
    if self.total is None:
      count += f" {self.unit},"
    elapsed = _clock() - self._t0
    if final:
      rate = (self.n - self._n0) / max(elapsed, 1e-9)
      return f"{self.desc}: {count} {_rate(rate)} {self.unit}/s, {format_duration(elapsed)}"
    status = self.status()
    if self.total is None:
      status += f", {format_duration(elapsed)} elapsed"
    return f"{self.desc}: {count} {status}"

  def close(self) -> None:
    if self.closed:
      return
    self.closed = True
    if self._bar is not None:
      self._bar.close()
      if self._handler is not None:
        self._handler.stream = self._stream
    elif self._lines and self.leave:
      logging.info("%s", self.line(final=True))

  def __enter__(self) -> Progress:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
