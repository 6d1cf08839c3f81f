"""Shared pieces of the fine-tuning tests: fixture paths, a WordPiece vocabulary
trained on the fixtures, and a tiny fine-tuning config."""

from __future__ import annotations

import os
import shutil

from bertjax.data import tokenizer as tok_lib
from tests.helpers import tiny_config

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
