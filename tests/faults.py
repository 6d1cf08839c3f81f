"""What the fault tests of pretraining (test_reliability.py) and fine-tuning
(test_reliability_finetune.py) share: reading what a run left in its workdir (metrics,
the saved state), comparing two runs, and breaking the disk. The fixtures
`on_train_batch` and `small_disk` are in conftest.py."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax.checkpoint import manager as ckpt_lib, files


def tree(path: str) -> dict[str, str]:
  """Every file under `path` (or `path` itself) -> its sha256, directories as '': what
  a command must leave byte-identical."""
  import hashlib  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    return {}
  if os.path.isfile(path):
    with open(path, "rb") as f:
      return {"": hashlib.sha256(f.read()).hexdigest()}
  out = {}
  for parent, dirs, names in os.walk(path):
    for d in dirs:
      out[os.path.relpath(os.path.join(parent, d), path) + "/"] = ""
    for n in names:
      p = os.path.join(parent, n)
      with open(p, "rb") as f:
        out[os.path.relpath(p, path)] = hashlib.sha256(f.read()).hexdigest()
  return out


def metrics(workdir) -> list[dict]:
  """The records of WORKDIR/metrics.jsonl, in order."""
  with open(os.path.join(workdir, files.METRICS_FILE)) as f:
    return [json.loads(line) for line in f]


def train_rows(workdir) -> dict[int, dict]:
  return {r["step"]: r for r in metrics(workdir) if r["split"] == "train"}


def losses(workdir) -> dict[int, float]:
  return {s: r["loss"] for s, r in train_rows(workdir).items()}


def assert_same_metrics(workdir, reference) -> None:
  """The two runs logged the same records, each once, in the same order, with the same
  numbers, except the wall-clock rates of the `perf` records (same steps only)."""
  ours, theirs = metrics(workdir), metrics(reference)
  strip = lambda rows: [r if r["split"] != "perf" else {"step": r["step"]} for r in rows]
  assert strip(ours) == strip(theirs), (strip(ours), strip(theirs))


def saved_state(workdir, step: int | None = None) -> dict:
  """Every array of the newest (or the given) complete checkpoint, as numpy."""
  step = max(ckpt_lib.Checkpointer(str(workdir), read_only=True).complete_steps()
             ) if step is None else step
  path = os.path.join(workdir, files.CHECKPOINT_DIR, str(step), "state")
  tree = ocp.PyTreeCheckpointer().metadata(path).item_metadata.tree
  return ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(
      restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)))


def assert_same_arrays(a, b) -> None:
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def break_disk(disk, mounts, fault: str, checkpoints, monkeypatch):
  """Makes the workdir's disk full ('disk_full') or its `checkpoints` directory
  read-only ('read_only'): for real when `mounts` (the tmpfs `disk` of the
  `small_disk` fixture, as root), else simulated (orbax's creation of a step's
  temporary directory fails as it would: the array writes happen in TensorStore's C++,
  which Python cannot reach). Returns the repair."""
  if mounts is None:
    from orbax.checkpoint._src.path import async_path  # pylint: disable=g-import-not-at-top
    mkdir = async_path.mkdir
    code = errno.ENOSPC if fault == "disk_full" else errno.EROFS

    async def failing_mkdir(path, *args, **kwargs):
      if "orbax-checkpoint-tmp" in str(path):
        raise OSError(code, os.strerror(code), str(path))
      return await mkdir(path, *args, **kwargs)

    monkeypatch.setattr(async_path, "mkdir", failing_mkdir)
    return lambda: monkeypatch.setattr(async_path, "mkdir", mkdir)
  if fault == "disk_full":
    fill(disk / "filler")
    return lambda: os.remove(disk / "filler")
  subprocess.run(["mount", "--bind", str(checkpoints), str(checkpoints)], check=True)
  mounts.append(checkpoints)
  subprocess.run(["mount", "-o", "remount,bind,ro", str(checkpoints)], check=True)

  def repair():
    subprocess.run(["umount", str(checkpoints)], check=True)
    mounts.remove(checkpoints)

  return repair


def fill(path) -> None:
  """Writes zeros to `path` until its file system is full (ENOSPC), unbuffered: a
  buffered file keeps the bytes of a chunk that did not fit whole (up to its 8 KiB
  buffer) and raises ENOSPC again when closed, which happened when the free space
  ended within 8 KiB below a MiB boundary; each os.write here either writes what fits
  or raises, so nothing is left to write at close."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
  try:
    chunk = b"\0" * (1 << 20)
    while True:
      os.write(fd, chunk)
  except OSError as e:
    if e.errno != errno.ENOSPC:
      raise
  finally:
    os.close(fd)


def wait_for(path, timeout_s: float = 60) -> None:
  """Until `path` exists (an asynchronous save completing); an AssertionError after
  `timeout_s` (a fault injected before would race the save)."""
  deadline = time.time() + timeout_s
  while not os.path.exists(path):
    assert time.time() < deadline, f"{path} did not appear within {timeout_s} s"
    time.sleep(0.05)
