"""bertjax.console.progress: a tqdm bar on a terminal, plain timed log lines elsewhere."""

import re
import sys

from absl import logging
import pytest

from bertjax.console import progress

LINE = re.compile(r"^train: (\d+)/1,000 steps \((\d+)%\) ([\d.,]+) steps/s, ETA (\w+)$")


class FakeClock:
  def __init__(self):
    self.t = 100.0

  def __call__(self) -> float:
    return self.t


@pytest.fixture
def clock(monkeypatch):
  fake = FakeClock()
  monkeypatch.setattr(progress, "_clock", fake)
  return fake


@pytest.fixture
def lines(monkeypatch):
  """The messages progress logs (absl drops INFO before flags are parsed)."""
  out = []
  monkeypatch.setattr(progress.logging, "info", lambda fmt, *args: out.append(fmt % args))
  return out


def test_lines_at_the_interval_with_rate_and_eta(clock, lines):
  bar = progress.Progress("train", 1000, "steps", interval=150, terminal=False)
  for _ in range(1000):  # 2 steps a second: a line every 300 steps.
    clock.t += 0.5
    bar.update()
  bar.close()
  assert len(lines) == 4, lines  # at 300, 600, 900 steps and the final one
  for k, line in enumerate(lines[:3]):
    n, pct, rate, eta = LINE.match(line).groups()
    assert int(n) == 300 * (k + 1) and int(pct) == 30 * (k + 1)
    assert float(rate) == 2
    assert eta == progress.format_duration((1000 - int(n)) / 2)
  assert lines[0].endswith("ETA 5m50s")
  assert lines[-1] == "train: 1,000/1,000 steps (100%) 2 steps/s, 8m20s"
  bar.close()  # Closing twice logs nothing more.
  assert len(lines) == 4


def test_resumed_run_counts_only_new_work(clock, lines):
  bar = progress.Progress("train", 1000, "steps", initial=800, interval=None,
                          terminal=False)
  for _ in range(100):
    clock.t += 0.5
    bar.update()
  assert bar.status() == "2 steps/s, ETA 50s"
  bar.close()
  assert lines == ["train: 900/1,000 steps (90%) 2 steps/s, 50s"]  # interval None: last only


def test_unknown_total_and_no_final_line_when_not_left(clock, lines):
  with progress.Progress("prepare", unit="docs", interval=10, terminal=False) as bar:
    clock.t += 12
    bar.update(2400)
  assert lines == ["prepare: 2,400 docs, 200 docs/s, 12s elapsed",
                   "prepare: 2,400 docs, 200 docs/s, 12s"]
  lines.clear()
  for _ in progress.Progress("eval", 3, "batches", leave=False, terminal=False).wrap(range(3)):
    clock.t += 1
  assert not lines


def test_disabled_shows_nothing(clock, lines, capsys):
  bar = progress.Progress("embed", 5, "batches", enable=False, interval=0)
  assert list(bar.wrap(range(5))) == list(range(5))
  assert not lines and not capsys.readouterr().err


def test_terminal_shows_a_bar_and_logs_above_it(capsys, lines, monkeypatch):
  handler = logging.get_absl_handler().python_handler
  monkeypatch.setattr(handler, "stream", sys.stderr)  # pytest's captured stderr
  stream = handler.stream
  bar = progress.Progress("train", 40, "steps", terminal=True)
  assert handler.stream is not stream  # absl lines go through tqdm.write meanwhile
  handler.stream.write("a log line\n")
  bar.update(40)
  bar.close()
  assert handler.stream is stream
  err = capsys.readouterr().err
  assert "a log line\n" in err
  assert re.search(r"train: 100%\|.*\| 40/40 \[.* steps/s\]", err), err
  assert not lines  # no plain lines next to the bar


def test_only_process_zero_shows_progress(monkeypatch, lines):
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  with progress.Progress("train", 2, "steps", interval=0, terminal=False) as bar:
    bar.update(2)
  assert not lines


@pytest.mark.slow
def test_pretraining_reports_eta_and_a_final_train_line(tmp_path, monkeypatch):
  """One real operation: the pretraining loop's step lines carry the rate and ETA, and
  the run ends with the train progress line (stderr is not a terminal under pytest)."""
  from bertjax.train import pretrain  # pylint: disable=g-import-not-at-top
  from tests.helpers import tiny_config  # pylint: disable=g-import-not-at-top
  messages = []
  monkeypatch.setattr(logging, "info",
                      lambda fmt, *args: messages.append(str(fmt) % args))
  config = tiny_config(num_steps=4, log_every=2, eval_every=4, eval_batches=1)
  config.model.vocab_size = config.data.tokenizer.vocab_size = 512
  config.data.dupe_factor = 1
  pretrain.run(config, str(tmp_path))
  assert re.match(r"^tokenizer: ([\d,]+)/\1 sentences \(100%\) [\d.,]+ sentences/s, \w+$",
                  next(m for m in messages if m.startswith("tokenizer: "))), messages
  steps = [m for m in messages if m.startswith("step ")]
  assert len(steps) == 2
  assert re.search(r"^step 2/4 \| .*loss .* \| [\d.,]+ steps/s, ETA \w+$", steps[0]), steps
  assert re.search(r"^step 4/4 \| .* \| [\d.,]+ steps/s$", steps[1]), steps  # done: no ETA
  train = [m for m in messages if m.startswith("train: ")]
  assert len(train) == 1 and re.match(r"^train: 4/4 steps \(100%\) [\d.,]+ steps/s, \w+$",
                                      train[0]), messages
