"""End to end on the embedded corpus with a tiny model on 8 CPU devices: training,
exact resume from a checkpoint, SIGTERM then restart, clear errors on bad input."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from bertjax.errors import BertjaxError, DataError, TrainingError
from bertjax.train import loop
from tests.helpers import tiny_config

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
  metrics = loop.train_and_evaluate(e2e_config(), workdir)
  return workdir, metrics


def test_trains_evaluates_and_checkpoints(reference):
  workdir, metrics = reference
  losses = train_losses(workdir)
  assert sorted(losses) == list(range(1, STEPS + 1))
  assert losses[STEPS] < losses[1]
  assert {"mlm_accuracy", "nsp_accuracy", "mlm_accuracy_most_frequent_baseline"} <= set(metrics)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["12", "4", "8"]
  assert os.path.exists(os.path.join(workdir, "tokenizer"))
  assert any(f.startswith("events") for f in os.listdir(os.path.join(workdir, "tensorboard")))


def test_resume_from_checkpoint_is_bit_exact(reference, tmp_path):
  """N steps, a restart from the step-N checkpoint, N more == 2N straight, bit for bit."""
  straight, _ = reference
  workdir = str(tmp_path / "resumed")
  shutil.copytree(straight, workdir)
  for step in ("8", "12"):  # Keep only the step-4 checkpoint: the restart resumes there.
    shutil.rmtree(os.path.join(workdir, "checkpoints", step))
  os.remove(os.path.join(workdir, "metrics.jsonl"))
  loop.train_and_evaluate(e2e_config(), workdir)
  resumed = train_losses(workdir)
  assert sorted(resumed) == list(range(5, STEPS + 1))
  expected = train_losses(straight)
  assert all(resumed[s] == expected[s] for s in resumed), (resumed, expected)


def test_sigterm_saves_and_restart_matches(reference, tmp_path):
  """SIGTERM mid-run: the trainer saves and exits 0; rerunning finishes identically.
  The run reuses the reference's tokenizer: `tokenizers`' WordPiece trainer is not
  deterministic across processes (huggingface/tokenizers#1794)."""
  straight, _ = reference
  workdir = str(tmp_path / "preempted")
  cmd = [sys.executable, "-m", "bertjax.main", "--config=configs/bert_tiny.py",
         f"--workdir={workdir}", *overrides(e2e_config()),
         "--config.train.checkpoint_every=1000",
         f"--config.data.tokenizer.path={os.path.join(straight, 'tokenizer')}"]
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
  metrics = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if os.path.exists(metrics) and len(train_losses(workdir)) >= 2:
      proc.send_signal(signal.SIGTERM)
      break
    time.sleep(0.05)
  out, _ = proc.communicate(timeout=240)
  assert proc.returncode == 0, out
  saved = [int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit()]
  assert len(saved) == 1 and 2 <= saved[0] < STEPS, (saved, out[-2000:])
  assert "SIGTERM: saved step" in out
  subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=240)
  losses, expected = train_losses(workdir), train_losses(straight)
  assert sorted(losses) == list(range(1, STEPS + 1))
  assert all(losses[s] == expected[s] for s in losses)


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
    loop.train_and_evaluate(config, str(tmp_path / "wd"))
  assert "\n" not in str(info.value)


def test_cli_reports_config_typo_in_one_line(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.main", "--config=configs/bert_tiny.py",
       f"--workdir={tmp_path}", "--config.train.batchsize=8"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip() == (
      "error: config has no field 'batchsize'; did you mean 'batch_size'?")


def test_model_change_in_existing_workdir_is_refused(reference, tmp_path):
  workdir = str(tmp_path / "copy")
  shutil.copytree(reference[0], workdir)
  config = e2e_config()
  config.model.hidden_size = 64
  with pytest.raises(BertjaxError,
                     match=r"another model: config.model.hidden_size=64 \(the run's: \d+\);"):
    loop.train_and_evaluate(config, workdir)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  """An absurd learning rate overflows the parameters at step 2: the run stops naming
  step 1, the last good checkpoint, and never saves the broken state."""
  config = e2e_config()
  config.train.learning_rate = 1e30
  config.train.warmup_steps = 1  # lr 0 at step 1, then 1e30
  config.train.checkpoint_every = 1
  workdir = str(tmp_path / "nan")
  with pytest.raises(TrainingError, match=r"non-finite .*step 2; the last good checkpoint "
                     r"is step 1 in") as info:
    loop.train_and_evaluate(config, workdir)
  assert "\n" not in str(info.value)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1"]


def test_fill_mask_on_the_trained_workdir(reference):
  workdir, _ = reference
  import bertjax
  from bertjax.fill_mask import fill_mask
  pretrained = bertjax.load_pretrained(workdir)
  (fillers,) = fill_mask(pretrained, "please turn [MASK] homework in .", top_k=5)
  probs = [p for _, p in fillers]
  assert len(fillers) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.fill_mask", f"--checkpoint={workdir}", "--top_k=3",
       "please turn [MASK] homework in ."], cwd=REPO, capture_output=True, text=True,
      timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines()[1].startswith("  mask 1: ")


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
  loop.train_and_evaluate(e2e_config(), workdir)  # resumes at the last step: no error
