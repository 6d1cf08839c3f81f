"""`python -m bertjax.benchmark electra_claim` (bertjax/benchmarks/electra_claim.py) at a
tiny size: the recipes' pair at equal training FLOPs by the project's counter, both
pretrained, each fine-tuned on a real-text task with two seeds, the table written."""

from __future__ import annotations

import json
import os

import pytest

from bertjax.benchmarks import electra_claim, text_tasks
from tests.helpers import tiny_config
from tests.rtd_helpers import TOKENIZER, rtd_config


def test_the_recipes_spend_equal_flops():
  """bert_tiny (MLM alone) and electra_tiny ('rtd') on the same data section, each with
  its masking; ELECTRA's steps spend the MLM run's FLOPs within one step's."""
  configs = electra_claim.pretraining_configs(600)
  assert configs["mlm"].objectives == ("mlm",) and configs["electra"].objectives == ("rtd",)
  assert configs["electra"].data.mask_token_prob == 0.85
  assert configs["mlm"].data.mask_token_prob == 0.8
  assert configs["electra"].data.packing == configs["mlm"].data.packing
  assert configs["electra"].data.corpus == configs["mlm"].data.corpus == "embedded"
  on_text = electra_claim.pretraining_configs(600, "/data/docstrings.txt")
  assert {c.data.corpus for c in on_text.values()} == {"/data/docstrings.txt"}
  runs = electra_claim.equal_flops(configs)
  assert runs["mlm"]["steps"] == 600
  assert 0 < runs["electra"]["steps"] < 600  # the generator costs steps
  assert abs(runs["electra"]["total_flops"] - runs["mlm"]["total_flops"]) <= runs[
      "electra"]["step_flops"] / 2


def test_the_docstrings_corpus_is_written_once(tmp_path, monkeypatch):
  from bertjax.benchmarks import pretrain_fidelity
  source = tmp_path / "src"
  source.mkdir()
  document = "A module docstring of more than eight words, a document."
  (source / "m.py").write_text(f'"""{document}"""\ndef f():\n  """Too short."""\n')
  monkeypatch.setattr(pretrain_fidelity, "corpus_roots", lambda packages: [str(source)])
  out = tmp_path / "out"
  path = electra_claim.corpus_path("docstrings", str(out))
  assert path == str(out / "docstrings" / "train.txt")
  assert open(path).read() == document + "\n"
  monkeypatch.setattr(pretrain_fidelity, "corpus_roots", None)  # Not read again.
  assert electra_claim.corpus_path("docstrings", str(out)) == path
  assert electra_claim.corpus_path("/data/text.txt", str(out)) == "/data/text.txt"


@pytest.mark.slow
def test_the_benchmark_runs_tiny(tmp_path):
  mlm = tiny_config(num_steps=6, log_every=3, eval_batches=1)
  mlm.objectives = ("mlm",)
  mlm.model.vocab_size = mlm.data.tokenizer.vocab_size = 400
  mlm.data.tokenizer.path = TOKENIZER
  mlm.data.dupe_factor = 1
  electra = rtd_config(num_steps=6, log_every=3, eval_batches=1)
  task = text_tasks.stdlib_few(train_per_label=2, dev_per_label=1)

  def shrink(c):
    c.task.max_seq_length, c.train.num_epochs, c.train.batch_size = 32, 1, 8
    c.train.eval_batch_size = 8

  results = electra_claim.run(str(tmp_path), {"mlm": mlm, "electra": electra},
                              {"stdlib_few": task}, [0, 1], 3e-4, shrink)
  assert results["pretraining"]["mlm"]["steps"] == 6
  assert results["pretraining"]["electra"]["steps"] < 6
  for name in ("mlm", "electra"):
    scores = results["finetune"][name]["stdlib_few"]["runs"]
    assert len(scores) == 2 and all(0 <= s <= 1 for s in scores)
    with open(tmp_path / "finetune" / f"{name}_stdlib_few_0" / "config.json") as f:
      assert json.load(f)["model"]["family"] == ("bert" if name == "mlm" else "electra")
  lines = (tmp_path / "table.md").read_text().splitlines()
  assert lines[0].startswith("| pretraining | steps | training FLOPs | stdlib_few |")
  assert [l.split(" | ")[0] for l in lines[2:]] == ["| mlm", "| electra"]
  assert os.path.exists(results["pretraining"]["electra"]["curves"])
