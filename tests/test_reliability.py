"""Fault injection on the pretraining loop (in-process, a tiny model on 8 CPU devices):
preemption ten times in one run, corrupt checkpoints, a full or read-only disk, a NaN or
a spike in the loss. Every faulty run is compared with one uninterrupted reference run
of the same config: losses and final parameters bit for bit. The kill -9 during an
asynchronous save is a real process death: run as `python -m tests.test_reliability
ARGS` this file is `bertjax.main` with that save held open (the worker)."""

import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.checkpoint import manager as ckpt_lib, workdir as workdir_lib
from bertjax.errors import BertjaxError, CheckpointError, TrainingError
from bertjax.train import pretrain, optimizer, spikes
from tests import faults
from tests.faults import losses, train_rows
from tests.helpers import tiny_config

pytestmark = [
    pytest.mark.usefixtures("shared_trainers"),  # reruns share one step
    # Checkpoints broken on purpose: orbax's reads of them end in errors inside its
    # coroutines, which pytest reports as unraisable-exception warnings (250 in one
    # run in a fresh venv), not as the tests' own.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings(
        "ignore:coroutine '_read_array_index_and_device_put' was never awaited")]
STEPS = 20
TOKENIZER = os.path.join(os.path.dirname(__file__), "fixtures", "tokenizer")


def rel_config(**train):
  """20 steps of a tiny model on the embedded corpus with the stored 400-id tokenizer
  (a trained one would differ between processes); a checkpoint every 5 steps, train
  metrics logged every 3 (so the log windows straddle the checkpoints)."""
  c = tiny_config(num_steps=STEPS, log_every=3, eval_every=STEPS, checkpoint_every=5,
                  eval_batches=1, max_to_keep=3)
  c.model.vocab_size = c.data.tokenizer.vocab_size = 400
  c.data.tokenizer.path = TOKENIZER
  c.data.dupe_factor = 1
  for k, v in train.items():
    setattr(c.train, k, v)
  return c


def final_params(workdir, step=None):
  return workdir_lib.restore_params(workdir, step)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One uninterrupted run: checkpoints at 10, 15 and 20 remain (max_to_keep=3)."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  pretrain.run(rel_config(), workdir)
  return workdir


@pytest.mark.slow
def test_reference_run_keeps_max_to_keep_checkpoints(reference):
  assert sorted(losses(reference)) == [3, 6, 9, 12, 15, 18, 20]  # and the last step
  assert ckpt_lib.Checkpointer(reference, read_only=True).complete_steps() == [10, 15, 20]


@pytest.mark.slow
def test_sigterm_ten_times_in_one_run_is_bit_exact(reference, tmp_path, on_train_batch):
  """SIGTERM (to this process) before 10 random steps; each time the loop saves at the
  end of that step and returns, and calling it again resumes. The metrics logged
  (every 3 steps: windows cut by the restarts) and the final state equal the
  uninterrupted run's bit for bit, each record written once."""
  kill_at = sorted(np.random.default_rng(8).choice(np.arange(1, STEPS), 10, replace=False))
  workdir, stops = str(tmp_path / "preempted"), []
  done = 0
  for _ in range(len(kill_at) + 1):
    pending = [s - done for s in kill_at if s > done]
    on_train_batch(lambda n, _, first=pending[:1]: n in first and os.kill(os.getpid(),
                                                                          signal.SIGTERM))
    pretrain.run(rel_config(), workdir)
    done = int(faults.saved_state(workdir)["step"])
    stops.append(done)
  assert stops == [*kill_at, STEPS]
  faults.assert_same_metrics(workdir, reference)
  faults.assert_same_arrays(faults.saved_state(workdir), faults.saved_state(reference))


def _truncate_array_files(step_dir):
  """Cuts every data file of the step's arrays to 100 bytes (the largest alone is not
  always read: OCDBT may keep superseded files)."""
  for path in glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*")):
    with open(path, "r+b") as f:
      f.truncate(100)


@pytest.mark.slow
def test_corrupt_checkpoint_is_named_and_previous_step_used_on_request(reference, tmp_path,
                                                                       caplog):
  """Step 20 with truncated array files, step 15 without its array metadata: by default
  a one-line CheckpointError names step 20 and nothing is touched; with
  on_corrupt=previous both are moved to corrupt_checkpoints/ and the run resumes from
  step 10: its metrics.jsonl (the records after step 10 rewritten) and final state are
  the reference's."""
  workdir = str(tmp_path / "corrupt")
  shutil.copytree(reference, workdir)
  ckpts = os.path.join(workdir, "checkpoints")
  _truncate_array_files(os.path.join(ckpts, "20"))
  os.remove(os.path.join(ckpts, "15", "state", "_METADATA"))

  with pytest.raises(CheckpointError, match=r"checkpoint step 20 in .* cannot be restored.*"
                     r"--config.checkpoint.on_corrupt=previous") as info:
    pretrain.run(rel_config(), workdir)
  assert "\n" not in str(info.value)
  assert sorted(os.listdir(ckpts)) == ["10", "15", "20"]

  config = rel_config()
  config.checkpoint.on_corrupt = "previous"
  with caplog.at_level("WARNING"):
    pretrain.run(config, workdir)
  assert "Skipping checkpoint step 20" in caplog.text
  assert "Skipping checkpoint step 15" in caplog.text
  assert sorted(os.listdir(os.path.join(workdir, "corrupt_checkpoints"))) == ["15", "20"]
  faults.assert_same_metrics(workdir, reference)
  faults.assert_same_arrays(faults.saved_state(workdir), faults.saved_state(reference))


@pytest.mark.slow
def test_all_checkpoints_corrupt_never_restarts_from_step_0(reference, tmp_path):
  workdir = str(tmp_path / "all_corrupt")
  shutil.copytree(reference, workdir)
  for step in ("10", "15", "20"):
    _truncate_array_files(os.path.join(workdir, "checkpoints", step))
  before = losses(workdir)
  config = rel_config()
  config.checkpoint.on_corrupt = "previous"
  with pytest.raises(CheckpointError, match="refusing to start over from step 0") as info:
    pretrain.run(config, workdir)
  assert "\n" not in str(info.value)
  assert losses(workdir) == before  # Not a single step trained.
  assert sorted(os.listdir(os.path.join(workdir, "corrupt_checkpoints"))) == ["10", "15", "20"]


def test_a_state_missing_fields_restores_the_others_never_one_without_params(tmp_path):
  """A checkpoint from an older bertjax (no log window) or from bertjax.hf.convert
  (parameters only) restores what it holds, for the trainer to start the rest afresh;
  one without parameters is a CheckpointError, not a fresh start."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  spec = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=device)
  ckpt = ckpt_lib.Checkpointer(str(tmp_path))
  ckpt.save(1, {"step": jnp.int32(1), "params": {"w": jnp.ones(3)}}, None, force=True)
  ckpt.save(2, {"step": jnp.int32(2)}, None, force=True)
  ckpt.wait()
  target = {"step": jax.ShapeDtypeStruct((), jnp.int32, sharding=device),
            "params": {"w": spec((3,))}, "window": {"loss": spec(())}}
  restored = ckpt.restore(1, target)
  assert set(restored) == {"step", "params"} and restored["params"]["w"].sum() == 3
  with pytest.raises(CheckpointError, match=r"step 2 .* cannot be restored .*no params"):
    ckpt.restore(2, target)
  ckpt.close()


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["disk_full", "read_only"])
def test_disk_full_or_read_only_stops_in_one_line_and_keeps_checkpoints(
    reference, small_disk, on_train_batch, monkeypatch, fault):
  """As root, not simulated: the workdir is a 32 MiB tmpfs that a file fills up before
  step 8 ('disk_full'), or its checkpoints/ is bind-mounted read-only then
  ('read_only'). Without mount rights the save's directory creation is made to fail
  with ENOSPC / EROFS instead (`faults.break_disk`). The run stops with one line naming
  the cause and the intact steps; every checkpoint left restores; once the disk is
  fixed, rerunning finishes like the reference."""
  disk, mounts = small_disk
  workdir = disk / "wd"
  ckpts = workdir / "checkpoints"
  repair = []

  def inject(n, _):
    if n == 8:
      faults.wait_for(ckpts / "5")  # Step 5's asynchronous save completes first.
      repair.append(faults.break_disk(disk, mounts, fault, ckpts, monkeypatch))

  on_train_batch(inject)
  cause = "No space left on device" if fault == "disk_full" else "Read-only file system"
  with pytest.raises(BertjaxError, match=f"cannot write .*{cause}.*steps 5.* are intact"
                     ) as info:
    pretrain.run(rel_config(), str(workdir))
  assert "\n" not in str(info.value)
  assert max(losses(workdir)) <= 10  # It stopped at the first save after the fault.

  repair.pop()()
  kept = ckpt_lib.Checkpointer(str(workdir), read_only=True).complete_steps()
  assert 5 in kept and max(kept) < 10, kept
  for step in kept:
    final_params(str(workdir), step)  # Restores.
  pretrain.run(rel_config(), str(workdir))
  faults.assert_same_metrics(workdir, reference)
  faults.assert_same_arrays(faults.saved_state(workdir), faults.saved_state(reference))


@pytest.mark.parametrize("used", [4096, 100, 1 << 20])
def test_filling_the_disk_ends_full_without_error_wherever_the_free_space_ends(
    small_disk, used):
  """`faults.fill` (the 'disk_full' fault) fills the tmpfs to its last page and
  returns, whatever the free space modulo its 1 MiB chunks: with 4096 bytes used the
  free space ends one page below a MiB boundary, where a buffered file kept the
  chunk's last page and raised ENOSPC when closed (the disk_full fault test then
  failed now and then: the run's one-line error, raised by the fault itself, and no
  repair)."""
  disk, mounts = small_disk
  if mounts is None:
    pytest.skip("needs mount rights for a tmpfs (root); the fault is simulated then")
  (disk / "used").write_bytes(b"x" * used)
  faults.fill(disk / "filler")
  assert shutil.disk_usage(disk).free < 4096
  with pytest.raises(OSError, match="No space left"):
    (disk / "more").write_bytes(b"x" * 4096)


@pytest.mark.slow
def test_switching_spike_skipping_on_resume_is_refused_not_taken_for_corruption(
    reference, tmp_path):
  """skip_step_on_spikes changes the optimizer state's tree: resuming a run with it
  switched is one line naming the field, before any checkpoint is read or moved."""
  workdir = str(tmp_path / "switched")
  shutil.copytree(reference, workdir)
  config = rel_config(skip_step_on_spikes=True)
  config.checkpoint.on_corrupt = "previous"
  with pytest.raises(CheckpointError, match=r"optimizer state has another layout: "
                     r"config.train.skip_step_on_spikes=True \(the run's: False\)") as info:
    pretrain.run(config, workdir)
  assert "\n" not in str(info.value)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["10", "15", "20"]


def _nan_batch(batch):
  """One masked-token weight NaN: the loss and every gradient become NaN."""
  batch = dict(batch, masked_lm_weights=batch["masked_lm_weights"].copy())
  batch["masked_lm_weights"][0, 0] = np.nan
  return batch


def _spike_batch(batch):
  """Every masked position labelled [PAD] (id 0), a token never a target in training:
  at step 14 the loss is still ~log V but the gradient norm jumps to ~2.4x the recent
  ones (6.3 vs 2.4-2.9), far above mean + 6 std."""
  return dict(batch, masked_lm_ids=np.zeros_like(batch["masked_lm_ids"]))


@pytest.mark.slow
def test_nan_loss_stops_naming_the_step_and_the_last_good_checkpoint(tmp_path,
                                                                      on_train_batch):
  on_train_batch(lambda n, batch: _nan_batch(batch) if n == 8 else None)
  workdir = str(tmp_path / "nan")
  with pytest.raises(TrainingError, match=r"non-finite loss, grad_norm, param_norm at or "
                     r"before step 9; the last good checkpoint is step 5 in") as info:
    pretrain.run(rel_config(), workdir)  # Found where step 9 logs step 7-9.
  assert "\n" not in str(info.value)
  assert max(losses(workdir)) == 6
  assert ckpt_lib.Checkpointer(workdir, read_only=True).complete_steps() == [5]


@pytest.mark.slow
def test_skip_step_on_spikes_drops_nan_and_spike_updates(reference, tmp_path,
                                                         on_train_batch, caplog):
  """A NaN batch at step 8 and a spike at step 14 (window 5, k = 6): both updates are
  dropped, logged and counted, the schedule does not advance; the run finishes. Logged
  every step, compared with the reference's windows of 3."""
  on_train_batch(lambda n, batch: {8: _nan_batch, 14: _spike_batch}.get(
      n, lambda b: None)(batch))
  workdir = str(tmp_path / "skip")
  config = rel_config(skip_step_on_spikes=True, spike_window=5, spike_sigma=6.0,
                      log_every=1)
  with caplog.at_level("WARNING"):
    pretrain.run(config, workdir)
  rows, expected = train_rows(workdir), train_rows(reference)
  assert "Skipped step 8 (update dropped, 1 so far)" in caplog.text
  assert "Skipped step 14 (update dropped, 2 so far)" in caplog.text
  assert [rows[s]["skipped_steps"] for s in (7, 8, 13, 14, STEPS)] == [0, 1, 1, 2, 2]
  # Up to float reassociation (the wrapper changes XLA's fusion of the update).
  for end in (3, 6):
    np.testing.assert_allclose(np.mean([rows[s]["loss"] for s in range(end - 2, end + 1)]),
                               expected[end]["loss"], rtol=1e-5)
  schedule = optimizer.learning_rate_schedule(config.train)
  np.testing.assert_allclose(rows[9]["learning_rate"], schedule(7), rtol=1e-6)  # 1 behind
  np.testing.assert_allclose(rows[15]["learning_rate"], schedule(12), rtol=1e-6)  # 2


def test_skipped_update_leaves_parameters_and_optimizer_state_unchanged():
  """The wrapper on its own, exact: before `window` accepted steps only non-finite
  values skip; then a loss or a gradient norm above mean + k std skips too. A skipped
  step returns zero updates and the inner state (Adam moments and count) as it was."""
  tx = spikes.skip_spikes(optax.adam(0.1), window=4, sigma=6.0)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)

  def step(state, loss, grad):
    updates, new = jax.jit(tx.update)({"w": jnp.full(3, grad, jnp.float32)}, state, params,
                                      loss=loss)
    return updates, new

  for loss in (50.0, 1.0, 1.1, 0.9):  # A large first loss: the window is not full yet.
    updates, state = step(state, loss, 1.0)
    assert not state.last_skipped and np.any(updates["w"] != 0)
  for loss, grad in ((np.nan, 1.0), (1.0, np.inf), (200.0, 1.0), (1.0, 50.0)):
    updates, new = step(state, loss, grad)
    assert new.last_skipped and np.all(updates["w"] == 0)
    assert new.skipped == state.skipped + 1 and new.accepted == state.accepted
    faults.assert_same_arrays(new.inner, state.inner)
    state = new
  assert optax.tree.get(state.inner, "count") == 4 and state.skipped == 4
  updates, state = step(state, 30.0, 1.0)  # mean 13.25, std 21.1: within 6 std.
  assert not state.last_skipped and optax.tree.get(state.inner, "count") == 5


def _worker_main() -> None:
  """bertjax.main whose asynchronous save of step $BERTJAX_TEST_HOLD_STEP stops just
  before orbax commits it (renames N.orbax-checkpoint-tmp to N), touches
  $BERTJAX_TEST_MARKER and waits there to be killed."""
  import time as time_lib

  from orbax.checkpoint._src.path import atomicity

  from bertjax.console import cli
  from bertjax import main
  from bertjax.train import program

  finalize = atomicity.AtomicRenameTemporaryPath.finalize

  async def held_finalize(self, *args, **kwargs):
    if self.get_final().name == os.environ["BERTJAX_TEST_HOLD_STEP"]:
      open(os.environ["BERTJAX_TEST_MARKER"], "w").close()
      time_lib.sleep(600)
    return await finalize(self, *args, **kwargs)

  atomicity.AtomicRenameTemporaryPath.finalize = held_finalize
  cli.run(main.main, flags_parser=program.parse_flags)


@pytest.mark.slow
def test_kill_9_during_an_asynchronous_save_resumes_from_the_last_complete_step(
    reference, tmp_path):
  """The trainer process is SIGKILLed while step 10's checkpoint is written (its files
  are on disk, orbax's commit, the rename, is not): step 10 is never listed nor read,
  the restart resumes from step 5 and ends with the reference's state and metrics.jsonl
  (what the killed process logged after step 5 is dropped and logged again)."""
  from tests.test_loop import overrides
  workdir, marker = tmp_path / "killed", tmp_path / "saving"
  config = rel_config()
  env = dict(os.environ, BERTJAX_TEST_HOLD_STEP="10", BERTJAX_TEST_MARKER=str(marker))
  proc = subprocess.Popen(
      [sys.executable, "-m", "tests.test_reliability", "--config=configs/bert_tiny.py",
       f"--workdir={workdir}", *overrides(config),
       f"--config.data.tokenizer.path={TOKENIZER}"],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.time() + 180
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
      time.sleep(0.05)
    assert marker.exists(), proc.communicate(timeout=10)[0][-3000:] if proc.poll() else ""
    proc.kill()
    proc.wait(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  ckpts = workdir / "checkpoints"
  partial = [p.name for p in ckpts.iterdir() if p.name.startswith("10.")]
  assert partial and glob.glob(str(ckpts / partial[0] / "state" / "**" / "d" / "*"),
                               recursive=True)  # Half-written: data files, no commit.
  assert ckpt_lib.Checkpointer(str(workdir), read_only=True).complete_steps() == [5]
  assert max(losses(workdir)) > 5  # Logged by the killed process after step 5.
  pretrain.run(config, str(workdir))
  faults.assert_same_metrics(workdir, reference)
  faults.assert_same_arrays(faults.saved_state(workdir), faults.saved_state(reference))
  assert ckpt_lib.Checkpointer(str(workdir), read_only=True).complete_steps() == [10, 15, 20]


if __name__ == "__main__":
  _worker_main()
