"""`bertjax.predict` on fine-tuned workdirs of three tasks: its predictions are the
loop's own dev predictions (same weights, same decoding), written per example next to
the input fields; the CLI reads a JSONL file without gold tags. The SQuAD run is also
the test that a whole span-QA fine-tuning run goes through the loop."""

import json
import os
import subprocess
import sys

import pytest

from bertjax import api, predict
from bertjax.errors import CheckpointError
from bertjax.tasks import loop
from configs.finetune import glue, ner, squad
from tests.tasks_helpers import fixture, fixture_tokenizer, tiny_finetune

RECIPES = {
    "sst2": (glue.get_config, "sst2", "sst2_train.tsv", "sst2_dev.tsv"),
    "ner": (ner.get_config, "ner", "conll_train.txt", "conll_dev.txt"),
    "squad": (squad.get_config, "v2", "squad_v2.json", "squad_v2.json"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  vocab = fixture_tokenizer(str(tmp_path_factory.mktemp("vocab")))
  out = {}
  for name, (get_config, arg, train, dev) in RECIPES.items():
    c = tiny_finetune(get_config(arg), vocab, num_epochs=2)
    c.data.train, c.data.dev = fixture(train), fixture(dev)
    workdir = str(tmp_path_factory.mktemp(name))
    out[name] = (workdir, loop.finetune(c, workdir))
  return out


def _dev_predictions(workdir):
  with open(os.path.join(workdir, "dev_predictions.json")) as f:
    return json.load(f)


def test_predictions_match_the_loops_dev_predictions(runs):
  workdir, _ = runs["sst2"]
  records = predict.predict(workdir, fixture("sst2_dev.tsv"))
  assert [r["prediction"] for r in records] == _dev_predictions(workdir)
  assert set(records[0]) == {"text_a", "text_b", "prediction"}  # No gold label echoed.
  workdir, _ = runs["ner"]
  records = predict.predict(workdir, fixture("conll_dev.txt"))
  assert [r["prediction"] for r in records] == _dev_predictions(workdir)
  assert all(len(r["prediction"]) == len(r["words"]) for r in records)


def test_squad_run_goes_through_the_loop_and_predicts_answer_text(runs):
  workdir, scores = runs["squad"]
  assert {"exact", "f1", "HasAns_exact", "NoAns_exact", "loss"} <= set(scores)
  records = predict.predict(workdir, fixture("squad_v2.json"))
  assert {r["id"]: r["prediction"] for r in records} == _dev_predictions(workdir)
  for r in records:  # Answers are cut from the passage (or '' for no answer).
    assert r["prediction"] in r["context"]


def test_cli_on_jsonl_without_gold(runs, tmp_path):
  workdir, _ = runs["ner"]
  src = tmp_path / "in.jsonl"
  src.write_text(json.dumps({"words": ["Mary", "visited", "Unbelievablecorporationworks"]})
                 + "\n")
  out = tmp_path / "out.jsonl"
  subprocess.run([sys.executable, "-m", "bertjax.predict", f"--checkpoint={workdir}",
                  f"--input={src}", f"--output={out}"], check=True, capture_output=True)
  (record,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert record["words"] == ["Mary", "visited", "Unbelievablecorporationworks"]
  assert len(record["prediction"]) == 3
  with pytest.raises(CheckpointError, match="task.json"):
    predict.predict(str(tmp_path), str(src))
  # Loading it as a pretrained encoder (init_from, convert) says what it is.
  with pytest.raises(CheckpointError, match="fine-tuning workdir"):
    api.load_pretrained(workdir)
