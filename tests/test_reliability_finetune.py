"""Fine-tuning keeps every promise pretraining keeps (it runs on the same trainer),
checked on one tiny task (SST-2 fixture, 24 steps, a checkpoint every 4, metrics every
3) against one uninterrupted reference run: SIGTERMs and a SIGKILL resume bit for bit
with the same logged metrics, a full disk stops in one line, a NaN names the last good
checkpoint, gradient accumulation is exact, and a 2-process job matches the single
process. Run as `python -m tests.test_reliability_finetune ARGS` this file is
`bertjax.finetune` that SIGKILLs itself before training batch $BERTJAX_TEST_KILL_AT
(the worker)."""

import glob
import json
import os
import signal
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from bertjax.checkpoint import manager as ckpt_lib, files
from bertjax.errors import BertjaxError, TrainingError
from bertjax.parallel import mesh as mesh_lib
from bertjax.tasks import get_task, finetune
from configs.finetune import glue
from tests import faults
from tests.tasks_helpers import FIXTURES, fixture, tiny_finetune

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(FIXTURES, "tokenizer")
STEPS = 24  # 48 sentences / batch 8 x 4 epochs


def ft_config(**train):
  c = tiny_finetune(glue.get_config("sst2"), TOKENIZER, num_epochs=4, log_every=3,
                    checkpoint_every=4, max_to_keep=3, **train)
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.1  # RNG folded from the step
  c.data.train, c.data.dev = fixture("sst2_train.tsv"), fixture("sst2_dev.tsv")
  return c


RECIPE = "configs/finetune/glue.py:sst2"


def cli_args(config) -> list[str]:
  """`--config.a.b=v` flags that make RECIPE `config`."""
  out = []

  def walk(node, base, prefix):
    for k, v in node.items():
      if isinstance(v, ml_collections.ConfigDict):
        walk(v, base[k], f"{prefix}{k}.")
      elif v != base[k]:
        out.append(f"--config.{prefix}{k}={v}")

  walk(config, glue.get_config("sst2"), "")
  return out


def dev_outputs(workdir) -> tuple:
  with open(os.path.join(workdir, files.DEV_RESULTS_FILE)) as f1, open(
      os.path.join(workdir, files.DEV_PREDICTIONS_FILE)) as f2:
    return json.load(f1), json.load(f2)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One uninterrupted run."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  finetune.run(ft_config(), workdir)
  return workdir


@pytest.mark.slow
def test_reference_run(reference):
  assert sorted(faults.losses(reference)) == [3, 6, 9, 12, 15, 18, 21, 24]
  assert ckpt_lib.Checkpointer(reference, read_only=True).complete_steps() == [16, 20, 24]
  assert set(dev_outputs(reference)[0]) == {"accuracy", "loss"}


@pytest.mark.slow
def test_sigterms_and_a_sigkill_resume_bit_for_bit_with_the_same_logged_metrics(
    reference, tmp_path, on_train_batch):
  """SIGTERM before step 5 (in this process: the trainer saves step 5 and returns);
  the `bertjax.finetune` CLI resumes and is SIGKILLed before step 12 (step 8 saved, 9
  logged); SIGTERM before step 14; then the run finishes. Parameters, optimizer state,
  dev predictions and every record of metrics.jsonl (its windows of 3 cut by every
  restart; what the killed process logged after step 8 is logged once) equal the
  uninterrupted run's, bit for bit."""
  workdir = str(tmp_path / "interrupted")
  sigterm = lambda at: lambda n, _: n == at and os.kill(os.getpid(), signal.SIGTERM)

  on_train_batch(sigterm(5))
  assert finetune.run(ft_config(), workdir) == {}  # Preempted: no dev results.
  assert int(faults.saved_state(workdir)["step"]) == 5

  env = dict(os.environ, BERTJAX_TEST_KILL_AT="7",
             BERTJAX_TEST_WAIT_FOR=os.path.join(workdir, files.CHECKPOINT_DIR, "8"))
  proc = subprocess.run([sys.executable, "-m", "tests.test_reliability_finetune",
                         f"--config={RECIPE}", f"--workdir={workdir}",
                         *cli_args(ft_config())], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
  assert max(faults.losses(workdir)) == 9  # Logged after the last checkpoint, 8.

  on_train_batch(sigterm(6))  # Resumes at step 8.
  finetune.run(ft_config(), workdir)
  assert int(faults.saved_state(workdir)["step"]) == 14
  on_train_batch(lambda n, _: None)
  assert finetune.run(ft_config(), workdir) == dev_outputs(reference)[0]

  faults.assert_same_metrics(workdir, reference)
  assert dev_outputs(workdir) == dev_outputs(reference)
  faults.assert_same_arrays(faults.saved_state(workdir), faults.saved_state(reference))


@pytest.mark.slow
def test_full_disk_stops_in_one_line_and_keeps_checkpoints(reference, small_disk,
                                                           on_train_batch, monkeypatch):
  """The disk fills before step 6 (real tmpfs as root, else simulated: see
  faults.break_disk): the run stops at the step-8 save in one line naming step 4 as
  intact; once space is freed the rerun ends like the reference."""
  disk, mounts = small_disk
  workdir = disk / "wd"
  repair = []

  def inject(n, _):
    if n == 6:
      faults.wait_for(workdir / files.CHECKPOINT_DIR / "4")
      repair.append(faults.break_disk(disk, mounts, "disk_full",
                                      workdir / files.CHECKPOINT_DIR, monkeypatch))

  on_train_batch(inject)
  with pytest.raises(BertjaxError, match=r"cannot write .*No space left on device.*"
                     r"steps 4\) are intact") as info:
    finetune.run(ft_config(), str(workdir))
  assert "\n" not in str(info.value)
  repair.pop()()
  assert ckpt_lib.Checkpointer(str(workdir), read_only=True).complete_steps() == [4]
  finetune.run(ft_config(), str(workdir))
  faults.assert_same_metrics(workdir, reference)
  assert dev_outputs(workdir) == dev_outputs(reference)


@pytest.mark.slow
def test_nan_stops_naming_the_last_good_checkpoint(tmp_path, on_train_batch):
  """A NaN example weight in the batch of step 6: found where step 6 is logged; the
  run stops naming step 4 and never saves the broken state."""

  def nan(n, batch):
    if n == 6:
      batch = dict(batch, example_weights=batch["example_weights"].copy())
      batch["example_weights"][0] = np.nan
      return batch

  on_train_batch(nan)
  workdir = str(tmp_path / "nan")
  with pytest.raises(TrainingError, match=r"non-finite loss, grad_norm, param_norm at or "
                     r"before step 6; the last good checkpoint is step 4 in") as info:
    finetune.run(ft_config(), workdir)
  assert "\n" not in str(info.value)
  assert ckpt_lib.Checkpointer(workdir, read_only=True).complete_steps() == [4]


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["bucket", "pack"])
def test_gradient_accumulation_equals_the_full_batch(batching):
  """2 micro-batches of 8 give the loss, the gradient norm and the parameters of
  batches of 16 (no dropout), over 3 steps of the real stream (its last batch half
  padding), up to float reassociation: parameters within 1e-5 (Adam's steps here are
  ~3e-3). Packed rows too: the micro-batches split rows, each with its examples."""
  results = []
  for accum in (1, 2):
    c = ft_config(grad_accum_steps=accum, batch_size=16)
    c.task.batching = batching
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
    # Adam moves a parameter whose gradient is ~0 by ~lr * g / (|g| + eps): the
    # reassociation noise of such gradients would decide its sign. With BERT's 1e-6 a
    # gradient of ~1e-7 moved a parameter by 1.2e-5 one way or the other on an AMD EPYC
    # (2026-12-02); 1e-4 damps them below 1e-5 and leaves a real gradient's step (a
    # micro-batch lost or counted twice moves parameters by ~lr = 1e-3).
    c.train.eps = 1e-4
    start = finetune.load_start(c)
    task = get_task(c.task.name)(c.task, start.tokenizer, c.task.max_seq_length)
    examples = task.read(c.data.train, "train")
    task.labels = task.fit_labels(examples)
    features = task.featurize(examples[:40], train=True)  # 3 batches, the last of 8 rows
    setup = finetune.build(c, task, start.model, finetune.example_batch(features), 3)
    state, step_losses = setup.init_state(c), []
    dp = mesh_lib.data_parallel_size(setup.mesh, setup.rules)
    stream = finetune.train_stream(finetune.batcher(task, features, start.model, dp, accum), 16,
                               c.seed, 3)
    with jax.set_mesh(setup.mesh):
      for batch in stream:
        state, m = setup.train_step(state, mesh_lib.put_batch(batch, setup.batch_sharding))
        step_losses.append((float(m["loss"]), float(m["grad_norm"])))
    results.append((step_losses, jax.device_get(state.params)))
  (l1, p1), (l2, p2) = results
  np.testing.assert_allclose(l1, l2, rtol=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), p1, p2)


@pytest.mark.slow
def test_two_processes_match_one_and_only_process_0_writes(reference, tmp_path):
  """2 processes x 4 devices (the same 8-device data mesh), each feeding its half of
  every batch and of the dev set: the single process's dev predictions and metrics;
  logs, results and the profile (steps 2-3) written by process 0 alone. (SIGTERM to
  one process of a job: test_multihost.py, through the same trainer.)"""
  from tests.test_multihost import _finish, _launch
  workdir = str(tmp_path / "wd")
  outs = _finish(_launch(workdir, str(tmp_path), 1,
                         [*cli_args(ft_config()), "--config.train.profile_steps=(2,3)"],
                         RECIPE, "tests.test_reliability_finetune"))
  assert "best dev:" in outs[0] and "best dev:" not in outs[1]
  ours, theirs = dev_outputs(workdir), dev_outputs(reference)
  assert ours[1] == theirs[1]
  np.testing.assert_allclose([ours[0][k] for k in sorted(ours[0])],
                             [theirs[0][k] for k in sorted(theirs[0])], rtol=1e-5)
  assert sorted(faults.losses(workdir)) == sorted(faults.losses(reference))
  traces = glob.glob(os.path.join(workdir, files.TENSORBOARD_DIR, "plugins", "profile",
                                  "*", "*.xplane.pb"))
  assert len(traces) == 1, traces


def _worker_main() -> None:
  """bertjax.finetune; with $BERTJAX_TEST_KILL_AT=n it SIGKILLs itself before its n-th
  training batch, once $BERTJAX_TEST_WAIT_FOR (a checkpoint) exists."""
  from bertjax.console import cli
  from bertjax import finetune
  from bertjax.train import program
  from bertjax.train import trainer

  put, count = trainer.put_train_batch, [0]
  kill_at = int(os.environ.get("BERTJAX_TEST_KILL_AT", 0))

  def hooked(batch, sharding):
    count[0] += 1
    if count[0] == kill_at:
      faults.wait_for(os.environ["BERTJAX_TEST_WAIT_FOR"])
      os.kill(os.getpid(), signal.SIGKILL)
    return put(batch, sharding)

  trainer.put_train_batch = hooked
  cli.run(finetune.main, flags_parser=program.parse_flags)


if __name__ == "__main__":
  _worker_main()
