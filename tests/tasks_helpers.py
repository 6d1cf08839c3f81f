"""Shared pieces of the fine-tuning tests: fixture paths, a WordPiece vocabulary
trained on the fixtures, and a tiny fine-tuning config."""

from __future__ import annotations

import os

from bertjax.data import tokenizer as tok_lib
from tests.helpers import tiny_config

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture(name: str) -> str:
  return os.path.join(FIXTURES, name)


# The fixtures the test vocabulary is trained on: a fixed list, so that adding a
# fixture does not change how the others tokenize.
VOCAB_FIXTURES = ("conll_dev.txt", "conll_train.txt", "squad_v2.json", "sst2_dev.tsv",
                  "sst2_train.tsv", "stsb_dev.tsv", "stsb_train.tsv",
                  "wsd_semcor.gold.key.txt", "wsd_semcor.xml", "wsd_test.jsonl",
                  "wsd_train.jsonl")


def fixture_tokenizer(directory: str) -> str:
  """Trains a small WordPiece vocabulary on the VOCAB_FIXTURES' text; returns its dir."""
  texts = []
  for name in VOCAB_FIXTURES:
    with open(fixture(name), encoding="utf-8") as f:
      texts += f.read().replace("\t", " ").replace(",", " , ").splitlines()
  tok = tok_lib.train_tokenizer(texts, "wordpiece", vocab_size=400)
  tok.save(directory)
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
