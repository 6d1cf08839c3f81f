"""Tests run on CPU with 8 fake devices (set before jax starts), tiny configs.

`BERTJAX_TEST_PLATFORM=gpu` (or `tpu`) runs the suite on the host's accelerator instead:
float32 matmuls in full precision (no TF32) so that float32 comparisons hold, no
preallocation (the CLIs the tests start share the device), and the tests that need the
CPU (`CPU_ONLY`: its 8 fake devices, gloo collectives) skip with their reason.
"""

import os
import tempfile

import pytest

PLATFORM = os.environ.get("BERTJAX_TEST_PLATFORM", "cpu")
_JAX_PLATFORMS = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}
if PLATFORM not in _JAX_PLATFORMS:
  raise pytest.UsageError(f"BERTJAX_TEST_PLATFORM={PLATFORM!r}: use one of "
                          f"{sorted(_JAX_PLATFORMS)}.")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
if "BERTJAX_TEST_PLATFORM" in os.environ:  # Chosen for this run: it wins.
  os.environ["JAX_PLATFORMS"] = _JAX_PLATFORMS[PLATFORM]
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if PLATFORM != "cpu":
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# What needs the CPU platform: a module (all its tests) or module::test -> why.
CPU_ONLY = {
    "test_parallel.py": "meshes of up to 8 devices (the CPU's fake ones)",
    "test_reliability_multihost.py": "processes joined by CPU collectives (gloo)",
    "test_config_checks.py::test_mesh_that_does_not_match_the_devices":
        "its message counts the 8 fake CPU devices",
    "test_config_checks.py::test_main_exits_with_one_line":
        "its message counts the 8 fake CPU devices",
    "test_fast_paths.py::test_scanned_parameters_shard_like_unscanned_ones":
        "a 2x2x2 mesh of fake CPU devices",
    "test_tpu.py::test_plan_figures_match_the_shardings_and_the_compiler":
        "live arrays on 4 fake CPU devices",
    "test_flops.py::test_benchmark_cli_with_hf_comparison":
        "8 fake CPU devices sharing the CPU's cores with PyTorch",
}


def pytest_collection_modifyitems(config, items):
  """On another platform than the CPU, CPU_ONLY tests skip with their reason."""
  del config
  if PLATFORM == "cpu":
    return
  for item in items:
    module = os.path.basename(item.nodeid.split("::")[0])
    reason = (CPU_ONLY.get(module)
              or CPU_ONLY.get(f"{module}::{getattr(item, 'originalname', item.name)}"))
    if reason:
      item.add_marker(pytest.mark.skip(
          reason=f"needs the CPU platform ({reason}); BERTJAX_TEST_PLATFORM={PLATFORM}"))
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
