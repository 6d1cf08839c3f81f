"""Shared pieces of the fine-tuning tests: fixture paths, a WordPiece vocabulary
trained on the fixtures, a tiny fine-tuning config, and each family's check of a run
through `predict` and the Hugging Face export."""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np

from bertjax import convert as convert_cli
from bertjax.data import tokenizer as tok_lib
from bertjax.tasks import base, finetune, predict
from bertjax.tasks.finetuned import load_finetuned
from tests.helpers import hf_outputs, load_hf, tiny_config

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture(name: str) -> str:
  return os.path.join(FIXTURES, name)


def fixture_tokenizer(directory: str) -> str:
  """The fixtures' 400-id WordPiece tokenizer, copied to `directory`; returns it.

  It is stored (tests/fixtures/tokenizer/) rather than trained per run: the
  `tokenizers` WordPiece trainer breaks ties in hash order, so each process would get
  a different vocabulary and the tests different numbers. It was trained with
  `train_tokenizer(lines, 'wordpiece', vocab_size=400)` on the lines of the conll,
  squad, sst2, stsb and wsd fixtures (tabs and commas spaced out).
  """
  shutil.copytree(fixture("tokenizer"), directory, dirs_exist_ok=True)
  return directory


def tiny_finetune(config, tokenizer_dir: str, **train):
  """`config` (a finetune recipe) with a random tiny encoder, short rows, batch 8."""
  tiny = tiny_config()
  config.tokenizer = tokenizer_dir
  for k in ("hidden_size", "num_heads", "intermediate_size", "max_position_embeddings"):
    config.model[k] = tiny.model[k]
  config.model.num_layers = 1
  config.model.vocab_size = tok_lib.load_tokenizer(tokenizer_dir).vocab_size
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  config.model.initializer_range = 0.2  # A tiny random encoder leaves its plateau sooner.
  config.task.max_seq_length = 32
  config.train.batch_size = 8
  config.train.eval_batch_size = 8
  config.train.learning_rate = 3e-3
  config.train.log_every = 1
  for k, v in train.items():
    config.train[k] = v
  return config


def shorten(config, train: str, dev: str, batching: str):
  """`config` (a fine-tuning recipe) at the tests' size: one epoch of the fixtures'
  `train` and `dev` files in `batching`, batch 8, rows of 32 (SQuAD: 64, stride and
  question 16), learning rate 1e-3."""
  config.data.train, config.data.dev = fixture(train), fixture(dev)
  config.task.max_seq_length = 64 if config.task.name == "squad" else 32
  config.task.batching = batching
  config.train.num_epochs, config.train.batch_size, config.train.eval_batch_size = 1, 8, 8
  config.train.learning_rate = 1e-3
  if config.task.name == "squad":
    config.task.doc_stride, config.task.max_query_length = 16, 16
  return config


def fine_tune_and_predict(config, workdir: str) -> None:
  """Fine-tunes `config` into `workdir` (finite dev scores); `predict` on its dev file
  gives the run's dev predictions again."""
  scores = finetune.run(config, workdir)
  assert scores and all(np.isfinite(v) for v in scores.values())
  with open(os.path.join(workdir, "dev_predictions.json")) as f:
    dev_predictions = json.load(f)
  records = predict.predict(workdir, config.data.dev, "dev")
  if isinstance(dev_predictions, dict):  # SQuAD: {id: answer}
    dev_predictions = [dev_predictions[r["id"]] for r in records]
  assert [r["prediction"] for r in records] == dev_predictions


def export_matches(workdir: str, exported: str, dev: str, task_classes: dict,
                   token_types: bool = True) -> dict:
  """`convert --to=hf` of the fine-tuned `workdir` writes its task's class
  (`task_classes[task][0]`) with its labels (one, and the problem type, for a
  regression), whose outputs on the first dev rows equal the fine-tuned model's (on
  real tokens for per-token tasks; `token_types`: the family reads them). Returns the
  exported config.json."""
  convert_cli.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
  finetuned = load_finetuned(workdir)
  task = finetuned.task
  with open(os.path.join(exported, "config.json")) as f:
    hf = json.load(f)
  assert hf["architectures"] == [task_classes[task.name][0]]
  if task.regression:
    assert len(hf["id2label"]) == 1 and hf["problem_type"] == "regression"
  elif task.name in ("classification", "tagging"):
    assert list(hf["id2label"].values()) == task.labels
  features = task.featurize(task.read(dev, "dev"), False)
  n = min(4, len(features))
  batch = finetune.rows(features, np.arange(n), np.ones(n, bool))
  model = base.FinetuneModel(finetuned.model, task.head(finetuned.model))
  out = jax.jit(model.apply)({"params": finetuned.params}, batch)
  extra = ({"token_type_ids": np.asarray(batch["token_type_ids"])} if token_types else {})
  import torch  # pylint: disable=g-import-not-at-top
  theirs = hf_outputs(load_hf(exported), batch["input_ids"], batch["attention_mask"],
                      **{k: torch.as_tensor(v, dtype=torch.long) for k, v in extra.items()})
  if task.name == "squad":
    ours = np.stack([out["start_logits"], out["end_logits"]], -1)
    ref = np.stack([theirs.start_logits.numpy(), theirs.end_logits.numpy()], -1)
  else:
    ours, ref = np.asarray(out["logits"]), theirs.logits.numpy()
  diff = np.abs(ours - ref)
  if task.name in ("tagging", "squad"):
    diff = diff[np.asarray(batch["attention_mask"]) > 0]
  assert diff.max() < 1e-5, diff.max()
  return hf
