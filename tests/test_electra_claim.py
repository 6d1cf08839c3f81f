"""`python -m benchmarks electra_claim` (benchmarks/electra_claim.py) at a
tiny size: the recipes' pair at equal training FLOPs by the project's counter, both
pretrained, each fine-tuned on a real-text task with two seeds, the table written."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import electra_claim, text_tasks
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


def _without(config, section: str, *keys: str) -> dict:
  d = config.to_dict()
  for k in keys:
    del d[section][k]
  return d


def test_further_rtd_arms():
  """--generator_widths, --learning_rates, --discriminator_weights and --mask_probs add
  RTD arms that differ from 'electra' in the generator alone (heads and FFN scaled with
  its width), the peak rate alone, lambda alone or the masking rate alone (with the
  positions gathered for it, ELECTRA's int((p + 0.005) x T)), each at its own
  equal-FLOPs steps."""
  configs = electra_claim.pretraining_configs(600, generator_widths=(64, 128),
                                              learning_rates=(1e-3,),
                                              discriminator_weights=(10.0,),
                                              mask_probs=(0.25,))
  assert list(configs) == ["mlm", "electra", "electra_g64", "electra_g128",
                           "electra_lr0.001", "electra_lambda10", "electra_mask0.25"]
  electra = configs["electra"]
  # The recipe's, untouched by the arms.
  assert electra.train.learning_rate == 5e-4
  assert electra.generator.hidden_size == 32
  assert electra.rtd.discriminator_weight == 50.0
  assert (electra.data.masked_lm_prob, electra.data.max_predictions_per_seq) == (0.15, 19)
  assert configs["electra_lr0.001"].train.learning_rate == 1e-3
  assert configs["electra_lambda10"].rtd.discriminator_weight == 10.0
  mask = configs["electra_mask0.25"].data
  assert (mask.masked_lm_prob, mask.max_predictions_per_seq) == (0.25, 32)
  for name, section, keys in (("electra_lr0.001", "train", ("learning_rate",)),
                              ("electra_lambda10", "rtd", ("discriminator_weight",)),
                              ("electra_mask0.25", "data",
                               ("masked_lm_prob", "max_predictions_per_seq"))):
    assert _without(configs[name], section, *keys) == _without(electra, section, *keys), name
  for width, heads in ((64, 1), (128, 2)):
    arm = configs[f"electra_g{width}"].to_dict()
    generator = arm.pop("generator")
    assert generator == dict(configs["electra"].generator.to_dict(), hidden_size=width,
                             num_heads=heads, intermediate_size=4 * width)
    assert arm == {k: v for k, v in configs["electra"].to_dict().items() if k != "generator"}
  runs = electra_claim.equal_flops(configs)
  assert runs["electra_g128"]["steps"] < runs["electra_g64"]["steps"] < runs["electra"]["steps"]
  assert runs["electra_mask0.25"]["steps"] < runs["electra"]["steps"]  # More gathered.
  assert runs["electra_lambda10"]["steps"] == runs["electra"]["steps"]
  for name, run in runs.items():
    assert abs(run["total_flops"] - runs["mlm"]["total_flops"]) <= run["step_flops"] / 2, name



def test_pretraining_seed_arms_and_their_spread():
  """--pretraining_seeds adds both recipes again, differing in config.seed alone, at
  the steps of seed 0; the table closes with each recipe's spread between pretraining
  runs and MLM's lead with its standard error (none with one run per recipe)."""
  configs = electra_claim.pretraining_configs(600, pretraining_seeds=(1, 2))
  assert list(configs) == ["mlm", "electra", "mlm_s1", "electra_s1", "mlm_s2", "electra_s2"]
  runs = electra_claim.equal_flops(configs)
  for recipe in ("mlm", "electra"):
    assert configs[recipe].seed == 0
    for seed in (1, 2):
      arm = configs[f"{recipe}_s{seed}"]
      assert arm.seed == seed
      assert dict(arm.to_dict(), seed=0) == configs[recipe].to_dict()
      assert runs[f"{recipe}_s{seed}"] == runs[recipe]
  scores = {"mlm": (0.50, 0.40), "electra": (0.30, 0.30), "mlm_s1": (0.46, 0.40),
            "electra_s1": (0.34, 0.30), "electra_g64": (0.9, 0.9)}
  results = {"finetune": {name: {t: {"mean": m} for t, m in zip("ab", pair)}
                          for name, pair in scores.items()}}
  lines = electra_claim.seed_spread(results)
  assert lines[1:] == [
      "mlm, 2 pretraining runs: task averages 45.0, 43.0; mean 44.0 +- 1.4",
      "electra, 2 pretraining runs: task averages 30.0, 32.0; mean 31.0 +- 1.4",
      "MLM's lead over RTD: 13.0 points, standard error 1.4 (from the pretraining "
      "runs' spread)"]
  del results["finetune"]["mlm_s1"]
  assert electra_claim.seed_spread(results) == []


def test_held_out_reads_each_objective():
  assert electra_claim.held_out({"mlm_accuracy": 0.4602}) == "MLM accuracy 46.0%"
  rtd = {"rtd_loss": 0.3, "replaced_fraction": 0.5, "generator_accuracy": 0.219}
  assert electra_claim.held_out(rtd) == "BCE 0.3000 (entropy 0.6931), generator 21.9%"


def test_the_docstrings_corpus_is_written_once(tmp_path, monkeypatch):
  from benchmarks import docstrings
  source = tmp_path / "src"
  source.mkdir()
  document = "A module docstring of more than eight words, a document."
  (source / "m.py").write_text(f'"""{document}"""\ndef f():\n  """Too short."""\n')
  monkeypatch.setattr(docstrings, "roots", lambda packages: [str(source)])
  out = tmp_path / "out"
  path = electra_claim.corpus_path("docstrings", str(out))
  assert path == str(out / "docstrings" / "train.txt")
  assert open(path).read() == document + "\n"
  monkeypatch.setattr(docstrings, "roots", None)  # Not read again.
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
                              {"stdlib_few": task}, [0, 1], 3e-4, shrink, eval_every=2)
  assert results["pretraining"]["mlm"]["steps"] == 6
  assert results["pretraining"]["electra"]["steps"] < 6
  for name in ("mlm", "electra"):
    scores = results["finetune"][name]["stdlib_few"]["runs"]
    assert len(scores) == 2 and all(0 <= s <= 1 for s in scores)
    with open(tmp_path / "finetune" / "lr0.0003" / f"{name}_stdlib_few_0" / "config.json") as f:
      assert json.load(f)["model"]["family"] == ("bert" if name == "mlm" else "electra")
  lines = (tmp_path / "table_lr0.0003.md").read_text().splitlines()
  assert lines[0] == ("| pretraining | steps | training FLOPs | stdlib_few | average | "
                      "held-out at the end |")
  assert [l.split(" | ")[0] for l in lines[2:]] == ["| mlm", "| electra"]
  with open(results["pretraining"]["electra"]["curves"]) as f:
    evals = [r["step"] for r in map(json.loads, f) if r["split"] == "eval"]
  steps = results["pretraining"]["electra"]["steps"]
  assert evals == sorted(set(range(2, steps + 1, 2)) | {steps})  # --eval_every, the end
  assert "BCE" in lines[3] and "MLM accuracy" in lines[2]
  again = electra_claim.run(str(tmp_path), {"mlm": mlm, "electra": electra},
                            {"stdlib_few": task}, [0, 1], 3e-4, shrink, eval_every=2)
  assert again["table"] == results["table"]  # Resumed finished runs, skipped fine-tuning.
