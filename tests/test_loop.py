"""Pretraining end to end on the embedded corpus (a tokenizer trained on it) with a
tiny model on 8 CPU devices: training, evaluation, checkpoints, logs, fill-mask, clear
errors on bad input. Faults (SIGTERM, kill -9, disk, NaN...): test_reliability.py."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from bertjax.errors import BertjaxError, DataError
from bertjax.train import pretrain
from tests.helpers import tiny_config

pytestmark = pytest.mark.usefixtures("shared_trainers")  # reruns share one step
STEPS = 12
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def e2e_config():
  c = tiny_config(num_steps=STEPS, log_every=1, eval_every=STEPS, checkpoint_every=4,
                  eval_batches=2)
  c.model.vocab_size = c.data.tokenizer.vocab_size = 512
  c.data.max_seq_length = 32
  c.data.max_predictions_per_seq = 5
  c.data.dupe_factor = 1
  return c


def overrides(config) -> list[str]:
  """The e2e config as command-line overrides of configs/bert_tiny.py."""
  out = []
  for section in ("model", "data", "train"):
    for k, v in config[section].items():
      if not isinstance(v, (int, float, str)) or isinstance(v, bool):
        continue
      out.append(f"--config.{section}.{k}={v}")
  out.append(f"--config.data.tokenizer.vocab_size={config.data.tokenizer.vocab_size}")
  return out


def train_losses(workdir) -> dict[int, float]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One uninterrupted run of STEPS steps."""
  workdir = str(tmp_path_factory.mktemp("straight"))
  metrics = pretrain.run(e2e_config(), workdir)
  return workdir, metrics


@pytest.mark.slow
def test_trains_evaluates_and_checkpoints(reference):
  workdir, metrics = reference
  losses = train_losses(workdir)
  assert sorted(losses) == list(range(1, STEPS + 1))
  assert losses[STEPS] < losses[1]
  assert {"mlm_accuracy", "nsp_accuracy", "mlm_accuracy_most_frequent_baseline"} <= set(metrics)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["12", "4", "8"]
  assert os.path.exists(os.path.join(workdir, "tokenizer"))
  assert any(f.startswith("events") for f in os.listdir(os.path.join(workdir, "tensorboard")))


@pytest.mark.parametrize("corpus, message", [
    ("/nonexistent/corpus/*.txt", "matches no file"),
    ("EMPTY", "contains no text"),
])
def test_bad_corpus_fails_with_one_line(tmp_path, corpus, message):
  if corpus == "EMPTY":
    corpus = str(tmp_path / "empty.txt")
    open(corpus, "w").close()
  config = e2e_config()
  config.data.corpus = corpus
  with pytest.raises(DataError, match=message) as info:
    pretrain.run(config, str(tmp_path / "wd"))
  assert "\n" not in str(info.value)


@pytest.mark.slow
def test_cli_reports_config_typo_in_one_line(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.main", "--config=configs/bert_tiny.py",
       f"--workdir={tmp_path}", "--config.train.batchsize=8"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip() == (
      "error: config has no field 'batchsize'; did you mean 'batch_size'?")


@pytest.mark.slow
def test_model_change_in_existing_workdir_is_refused(reference, tmp_path):
  workdir = str(tmp_path / "copy")
  shutil.copytree(reference[0], workdir)
  config = e2e_config()
  config.model.hidden_size = 64
  with pytest.raises(BertjaxError,
                     match=r"another model: config.model.hidden_size=64 \(the run's: \d+\);"):
    pretrain.run(config, workdir)


@pytest.mark.slow
def test_fill_mask_on_the_trained_workdir(reference):
  workdir, _ = reference
  import bertjax
  pretrained = bertjax.load_pretrained(workdir)
  (fillers,) = pretrained.fill_mask("please turn [MASK] homework in .", top_k=5)
  probs = [p for _, p in fillers]
  assert len(fillers) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.fill_mask", f"--checkpoint={workdir}", "--top_k=3",
       "please turn [MASK] homework in ."], cwd=REPO, capture_output=True, text=True,
      timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines()[1].startswith("  mask 1: ")


@pytest.mark.slow
def test_workdir_from_before_a_new_model_field_still_resumes(reference, tmp_path):
  """config.json written before a model field existed: that field counts at its default."""
  workdir = str(tmp_path / "older")
  shutil.copytree(reference[0], workdir)
  path = os.path.join(workdir, "config.json")
  with open(path) as f:
    saved = json.load(f)
  del saved["model"]["remat_policy"]
  with open(path, "w") as f:
    json.dump(saved, f)
  pretrain.run(e2e_config(), workdir)  # resumes at the last step: no error
