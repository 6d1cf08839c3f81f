"""Remote (gs://) workdirs: the tokenizer and metrics.jsonl go through etils.epath.
Object stores are not reachable here, so the remote code paths run on local paths
(epath treats both alike) with `is_remote` forced to True."""

import json

from bertjax.data import tokenizer as tok_lib
from bertjax.train import logger as logger_lib

TEXTS = ["the cat sat on the mat .", "a dog ran in the park ."] * 20


def test_tokenizer_round_trips_through_the_remote_path(tmp_path, monkeypatch):
  tok = tok_lib.train_tokenizer(TEXTS, "wordpiece", vocab_size=60)
  monkeypatch.setattr(tok_lib, "is_remote", lambda path: True)
  remote = tmp_path / "bucket" / "run" / "tokenizer"
  tok.save(str(remote))  # local copy, then copied file by file
  assert (remote / "tokenizer.json").exists()
  loaded = tok_lib.load_tokenizer(str(remote))  # copied back to a local temp dir
  assert loaded.tokenize("the cat ran") == tok.tokenize("the cat ran")
  assert loaded.vocab_size == tok.vocab_size


def test_metrics_are_rewritten_whole_on_a_remote_workdir(tmp_path, monkeypatch):
  monkeypatch.setattr(logger_lib, "is_remote", lambda path: True)
  steps = lambda: [json.loads(line)["step"]
                   for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  for step in (1, 2, 3):  # each logger a run resumed at the step before: lines kept
    log = logger_lib.MetricLogger(str(tmp_path), step - 1)
    log.write(step, {"loss": 1.0 / step})
    log.close()
  assert steps() == [1, 2, 3]
  logger_lib.MetricLogger(str(tmp_path), 1).close()  # resumed at 1: 2 and 3 go
  assert steps() == [1]
