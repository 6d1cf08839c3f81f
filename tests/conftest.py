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
  from bertjax.data import sources
  return sources.load_documents("embedded")


@pytest.fixture(scope="module")
def tokenizer(documents):
  from bertjax.data.tokenizer import train_tokenizer
  return train_tokenizer([s for d in documents for s in d], kind="wordpiece",
                         vocab_size=4096)


@pytest.fixture(scope="module")
def tokenized(documents, tokenizer):
  from bertjax.data import builders
  return builders.tokenize_documents(documents, tokenizer)


# The fault tests' fixtures (tests/faults.py holds their other helpers).


@pytest.fixture
def on_train_batch(monkeypatch):
  """`on_train_batch(fn)`: fn(n, batch) runs before the n-th training batch (1-based)
  of each run goes to the devices, i.e. just before step n of a fresh run; a dict it
  returns replaces the batch."""
  from bertjax.train import trainer
  put_batch = trainer.put_train_batch

  def install(fn):
    count = [0]

    def hooked(batch, sharding):
      count[0] += 1
      return put_batch(fn(count[0], batch) or batch, sharding)

    monkeypatch.setattr(trainer, "put_train_batch", hooked)
    return count

  return install


@pytest.fixture
def small_disk(tmp_path):
  """(directory, mounts): a real 32 MiB tmpfs, or mounts None without mount rights
  (not root): the test then simulates the fault (`faults.break_disk`)."""
  import subprocess
  disk = tmp_path / "disk"
  disk.mkdir()
  mounts = [disk]
  try:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(disk)],
                   check=True, capture_output=True)
  except (OSError, subprocess.CalledProcessError):
    mounts = None
  yield disk, mounts
  for path in reversed(mounts or []):
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


# Fine-tuning fixtures generated per session (tiny, beside tests/fixtures/ files).


@pytest.fixture(scope="session")
def mnli_tsvs(tmp_path_factory):
  """MNLI-format TSVs (GLUE's columns, `gold_label`): train (24 rows), dev_matched (8)
  and dev_mismatched (6, another genre's words): {'train', 'dev_matched',
  'dev_mismatched'} -> path."""
  directory = tmp_path_factory.mktemp("mnli")
  header = ["index", "promptID", "pairID", "genre", "sentence1", "sentence2", "gold_label"]
  pairs = {"entailment": ("the film was good", "the film was good"),
           "contradiction": ("the film was good", "the film was not good"),
           "neutral": ("the film was good", "the actor is in rome")}
  other = {"entailment": ("john plays in new york", "john plays in new york"),
           "contradiction": ("john plays in new york", "john does not play"),
           "neutral": ("john plays in new york", "his team won")}
  labels = sorted(pairs)
  sizes = {"train": (pairs, 24), "dev_matched": (pairs, 8), "dev_mismatched": (other, 6)}
  paths = {}
  for name, (source, n) in sizes.items():
    rows = ["\t".join(header)]
    for i in range(n):
      label = labels[i % 3]
      a, b = source[label]
      rows.append("\t".join([str(i), str(i), f"{i}n", "fiction", a, b, label]))
    paths[name] = str(directory / f"{name}.tsv")
    with open(paths[name], "w") as f:
      f.write("\n".join(rows) + "\n")
  return paths
