"""The task registry (every name resolves, unknown names are one-line ConfigErrors,
the interface is abstract) and the paper's selection sweep: a 2 x 1 grid writes
sweep_results.json / .md with the best dev run marked."""

import json
import os

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
  assert table[0] == "| learning rate | seed | accuracy | loss |" and len(table) == 4
  best = [line for line in table if "**best**" in line]
  assert len(best) == 1 and best[0].startswith(f"| {saved['best']['learning_rate']:g} |")
