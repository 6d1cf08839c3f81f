"""Tests run on CPU with 8 fake devices (set before jax starts), tiny configs."""

import os
import tempfile

import pytest

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Compiled programs are shared between the tests' own runs and the CLIs they start.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "bertjax-test-jax-cache"))


# The embedded corpus, a WordPiece vocabulary trained on it and its tokenized documents
# (per test module: the data tests share them).


@pytest.fixture(scope="module")
def documents():
  from bertjax.data import corpus
  return corpus.load_documents("embedded")


@pytest.fixture(scope="module")
def tokenizer(documents):
  from bertjax.data.tokenizer import train_tokenizer
  return train_tokenizer([s for d in documents for s in d], kind="wordpiece",
                         vocab_size=4096)


@pytest.fixture(scope="module")
def tokenized(documents, tokenizer):
  from bertjax.data import pretraining
  return pretraining.tokenize_documents(documents, tokenizer)
