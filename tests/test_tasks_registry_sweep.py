"""The task registry (every name resolves, unknown names are one-line ConfigErrors,
the interface is abstract) and the paper's selection sweep: a 2 x 1 grid writes
sweep_results.json / .md with the best dev run marked."""

import json
import os

import numpy as np
import pytest

from bertjax.errors import ConfigError
from bertjax.tasks import TASKS, base, get_task, sweep
from configs.finetune import glue
from tests.tasks_helpers import fixture, fixture_tokenizer, tiny_finetune


def test_registry():
  for name, cls in TASKS.items():
    assert get_task(name) is cls and issubclass(cls, base.Task) and cls.name == name
  with pytest.raises(ConfigError, match=r"config.task.name='ner'.*use one of") as e:
    get_task("ner")
  assert "\n" not in str(e.value)
  with pytest.raises(TypeError, match="abstract"):
    base.Task(None, None, 8)  # pylint: disable=abstract-class-instantiated


@pytest.mark.slow
def test_sweep_writes_the_table_with_the_best_run(tmp_path):
  vocab = fixture_tokenizer(str(tmp_path / "vocab"))
  c = tiny_finetune(glue.get_config("sst2"), vocab, num_epochs=2)
  c.data.train, c.data.dev = fixture("sst2_train.tsv"), fixture("sst2_dev.tsv")
  c.sweep.learning_rates = (3e-3, 1e-5)
  c.sweep.seeds = (1,)
  workdir = str(tmp_path / "sweep")
  result = sweep.run(c, workdir)
  with open(os.path.join(workdir, "sweep_results.json")) as f:
    saved = json.load(f)
  assert saved == json.loads(json.dumps(result))
  runs = saved["runs"]
  assert [(r["learning_rate"], r["seed"]) for r in runs] == [(3e-3, 1), (1e-5, 1)]
  assert saved["metric"] == "accuracy"
  assert saved["best"]["dev"]["accuracy"] == max(r["dev"]["accuracy"] for r in runs)
  for r in runs:  # Each grid point is its own resumable run with its dev results.
    with open(os.path.join(r["workdir"], "dev_results.json")) as f:
      assert json.load(f) == r["dev"]
  with open(os.path.join(workdir, "sweep_results.md")) as f:
    table = f.read().splitlines()
  assert table[0] == "| learning rate | seed | accuracy | loss |" and len(table) == 11
  best = [line for line in table if "**best**" in line]
  assert len(best) == 1 and best[0].startswith(f"| {saved['best']['learning_rate']:g} |")
  # One seed per learning rate: each setting's mean is its run, its spread 0.
  assert [s["learning_rate"] for s in saved["by_learning_rate"]] == [3e-3, 1e-5]
  for s, r in zip(saved["by_learning_rate"], runs):
    assert s["seeds"] == [1] and s["mean"] == s["min"] == s["max"] == r["dev"]
    assert set(s["std"].values()) == {0.0}
  acc = runs[0]["dev"]["accuracy"]
  assert table[-2].startswith(f"| 0.003 | 1 | {acc:.4f} ± 0.0000 ({acc:.4f}, {acc:.4f}) |")


def test_sweep_reports_mean_and_spread_over_seeds_per_learning_rate():
  rows = [{"learning_rate": lr, "seed": seed, "dev": {"accuracy": acc, "loss": loss}}
          for lr, seed, acc, loss in [(5e-5, 0, 0.80, 0.5), (5e-5, 1, 0.70, 0.7),
                                      (5e-5, 2, 0.75, 0.6), (2e-5, 0, 0.60, 0.9),
                                      (2e-5, 1, 0.66, 0.8), (2e-5, 2, {}, None)]]
  rows[-1]["dev"] = {}  # Stopped by SIGTERM: no dev results, left out.
  summary = sweep.by_learning_rate(rows)
  assert [(s["learning_rate"], s["seeds"]) for s in summary] == [(5e-5, [0, 1, 2]),
                                                                  (2e-5, [0, 1])]
  first, second = summary
  assert first["mean"]["accuracy"] == pytest.approx(0.75)
  assert first["std"]["accuracy"] == pytest.approx(np.std([0.8, 0.7, 0.75], ddof=1))
  assert (first["min"]["accuracy"], first["max"]["accuracy"]) == (0.70, 0.80)
  assert second["mean"]["loss"] == pytest.approx(0.85)
  assert second["std"]["accuracy"] == pytest.approx(np.std([0.6, 0.66], ddof=1))
  table = sweep.markdown(rows[:-1], "accuracy").splitlines()
  assert "| 5e-05 | 3 | 0.7500 ± 0.0500 (0.7000, 0.8000) | 0.6000 ± 0.1000 (0.5000, 0.7000) |" in table
