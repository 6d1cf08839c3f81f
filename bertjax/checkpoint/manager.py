"""Checkpoints with orbax: the train state and the data-iterator state saved together
in WORKDIR/checkpoints/N/ (`state` and `data`); the workdir's other files are read and
written by `bertjax.checkpoint.workdir`."""

from __future__ import annotations

import json
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bertjax.checkpoint import files
from bertjax.errors import CheckpointError, ConfigError

ON_CORRUPT = ("error", "previous")
# Substrings of OS and TensorStore errors that mean the disk cannot take the checkpoint.
_WRITE_FAILURES = ("No space left on device", "Read-only file system", "Permission denied",
                   "Disk quota exceeded")


def _type_handlers() -> ocp.type_handlers.TypeHandlerRegistry:
  """orbax's standard handlers; on one process its jax.Array handler without
  replica-parallel writing. That writes each replica's slice of a replicated array;
  with every replica on this host it spreads nothing and costs a compiled slice per
  array and replica at a process's first save: for 50 replicated arrays on 8 CPU
  devices 400 programs and 9.2 s, against 0.1 s without. Across processes it spreads
  the writing of replicated arrays over the hosts: kept there."""
  th = ocp.type_handlers
  handlers = [(t, th.get_type_handler(t)) for t in th.supported_types()]
  if jax.process_count() == 1:
    handlers = [(t, th.ArrayHandler(use_replica_parallel=False) if t is jax.Array else h)
                for t, h in handlers]
  return th.create_type_handler_registry(*handlers)


class Checkpointer:
  """Saves asynchronously every `save` and restores the newest step of the workdir.

  A step is complete once orbax renames its temporary directory
  (`N.orbax-checkpoint-tmp*`) to `N`; a process killed mid-save leaves only the
  temporary directory, which is never listed, restored, nor counted in `max_to_keep`.
  `on_corrupt` says what `restore_latest` does with a step that cannot be read: 'error'
  stops with a CheckpointError naming it; 'previous' moves it aside to
  WORKDIR/corrupt_checkpoints/N (never deleted) and tries the step before.
  """

  def __init__(self, workdir: str, max_to_keep: int = 3, read_only: bool = False,
               on_corrupt: str = "error"):
    self.on_corrupt = on_corrupt
    self.workdir = epath.Path(workdir)
    self.directory = epath.Path(workdir) / files.CHECKPOINT_DIR
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
        enable_async_checkpointing=not read_only,
        # The step's temporary directory is made before `save` returns: a read-only or
        # full disk then raises at once (made in orbax's background thread, the failure
        # left `save` waiting 300 s for a signal that never came).
        async_options=ocp.AsyncOptions(create_directories_asynchronously=False))
    self.manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "data"),
        item_handlers={"state": ocp.PyTreeCheckpointHandler(
                           type_handler_registry=_type_handlers()),
                       "data": grain.checkpoint.CheckpointHandler()})

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_iterator: Any, force: bool = False) -> None:
    """Saves `state` (a pytree: a dict or dataclass of fields) and, when given, the data
    iterator's position (a grain iterator) as step `step`, asynchronously."""
    items = {"state": ocp.args.PyTreeSave(state)}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    try:  # An asynchronous save's failure surfaces at the next save or wait.
      self.manager.save(step, args=ocp.args.Composite(**items), force=force)
    except Exception as e:  # orbax/TensorStore raise ValueError, OSError, ...
      raise self._write_error(e) from e

  def _write_error(self, e: Exception) -> Exception:
    """One line for a failed save; errors that are not about the disk pass through."""
    text = str(e)
    reason = next((r for r in _WRITE_FAILURES if r in text), None)
    if reason is None:
      return e
    return CheckpointError(
        f"cannot write a checkpoint to {self.directory}: {reason}. The run stopped; "
        f"{self.intact()}. Free space or make the directory writable, then rerun the "
        "same command to resume.")

  def complete_steps(self) -> list[int]:
    """The steps on disk whose save finished (temporary directories excluded)."""
    return sorted(ocp.utils.checkpoint_steps(self.directory))

  def intact(self) -> str:
    """'the complete checkpoints (steps 5, 10) are intact', for error messages."""
    steps = self.complete_steps()
    if not steps:
      return "no checkpoint had been completed yet"
    return f"the complete checkpoints (steps {', '.join(map(str, steps))}) are intact"

  def saved_shapes(self, step: int) -> dict[str, Any]:
    """{field: tree of `jax.ShapeDtypeStruct`} of the state step `step` holds, read from
    its metadata (no array is read)."""
    try:
      tree = self.manager.item_metadata(step)["state"].tree
      return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), dict(tree))
    except Exception as e:  # orbax raises many types for unreadable files.
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} cannot be read "
          f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); it is corrupt: move it "
          "aside or use a new --workdir.") from e

  def restore(self, step: int, target: dict[str, Any], data_iterator: Any = None
              ) -> dict[str, Any]:
    """Restores the fields of `target` ({field: abstract tree}, leaves
    `jax.ShapeDtypeStruct`s with shardings) that step `step` holds, onto those
    shardings, and, when an iterator is given, sets its position. Returns {field: tree}
    for the fields present: one the step lacks (a state written before the field
    existed, or by `bertjax.hf.convert`, which saves parameters only) is left out, for the
    caller to initialise; a step without the `params` the target asks for is
    unreadable (a CheckpointError, never a silent fresh start). A parameters-only step
    (no optimizer state: `save_workdir`'s) has no data position either: the iterator
    then stays at its start; any other step without one is unreadable."""
    try:
      saved = set(self.manager.item_metadata(step)["state"].tree)
      if "params" in target and "params" not in saved:  # Never a silent fresh start.
        raise ValueError(f"it holds {sorted(saved)}, no params")
      present = {k: v for k, v in target.items() if k in saved}
      items = {"state": ocp.args.PyTreeRestore(
          item=present, restore_args=ocp.checkpoint_utils.construct_restore_args(present),
          partial_restore=True)}
      has_data = (self.directory / str(step) / "data").exists()
      if data_iterator is not None and not has_data and "opt_state" in saved:
        raise ValueError("it has an optimizer state but no data-iterator position")
      other_count = data_iterator is not None and has_data and self._data_files(step)
      if data_iterator is not None and has_data and not other_count:
        items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
      restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # orbax raises many types for unreadable files.
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} cannot be restored "
          f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); it is corrupt or from "
          "another model: move it aside or use a new --workdir.") from e
    if other_count:
      self._restore_data_position(step, other_count, data_iterator)
    return dict(restored["state"])

  def _data_files(self, step: int) -> list[epath.Path]:
    """The iterator files of step `step` when another number of processes wrote them
    (grain names them process_I-of-N.json); [] when this process's own file is there."""
    data = self.directory / str(step) / "data"
    own = data / f"process_{jax.process_index()}-of-{jax.process_count()}.json"
    if own.exists() or not data.exists():
      return []
    return sorted(data.glob("process_*-of-*.json"))

  def _restore_data_position(self, step: int, files: list[epath.Path],
                             data_iterator: Any) -> None:
    """Continues the data stream of a checkpoint written by another process count.

    Global batch k is elements [k * B, (k + 1) * B) of one global stream and process p
    of P feeds its block p of B / P rows, each masked by its global index, so after k
    batches the processes together have fed exactly the first k global batches,
    whatever P is: every process of the new count resumes at its batch k (the same
    global batch size B is assumed) and the global batches go on unchanged, row for
    row. The run continues bit for bit where the collectives add in the same order
    (tests/test_multihost_exact.py: 2 processes <-> 1, both on gloo).
    """
    states = [json.loads(f.read_text()) for f in files]
    positions = {json.dumps(st, sort_keys=True) for st in states}
    if any(set(st) != {"next_index"} for st in states) or len(positions) != 1:
      raise ConfigError(  # Not a corrupt step: on_corrupt must not move it aside.
          f"checkpoint step {step} was written by {len(files)} processes and its data "
          f"position ({states[0]}) cannot be moved to {jax.process_count()} (grain worker "
          f"processes, or processes out of step); resume with {len(files)} processes.")
    data_iterator.set_state(states[0])
    logging.warning("Checkpoint step %d was written by %d processes, resuming on %d: the "
                    "data stream continues at batch %d of the same global stream.", step,
                    len(files), jax.process_count(), states[0]["next_index"])

  def reached_preemption(self, step: int) -> bool:
    """True on every process at the step they agreed to save at after a SIGTERM to
    any of them (JAX's preemption service; always False in a single process)."""
    return self.manager.reached_preemption(step)

  def restore_latest(self, target: dict[str, Any], data_iterator: Any = None
                     ) -> tuple[int, dict[str, Any]] | None:
    """(step, `restore`'s fields) of the newest step that restores, None when there is
    none yet.

    A step that fails raises a CheckpointError naming it (on_corrupt='error') or is moved
    aside and the step before is tried (on_corrupt='previous'); when steps exist but
    none restores this raises instead of letting training start over from step 0."""
    tried = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        return step, self.restore(step, target, data_iterator)
      except CheckpointError as e:
        if self.on_corrupt == "error":
          raise CheckpointError(f"{e} To resume from the step before instead, rerun with "
                                "--config.checkpoint.on_corrupt=previous.") from e
        logging.warning("Skipping checkpoint step %d: %s", step, e)
        tried.append(f"{step} -> {self._move_aside(step)}")
    if tried:
      raise CheckpointError(
          f"no checkpoint in {self.directory} can be restored (moved aside: "
          f"{'; '.join(tried)}); refusing to start over from step 0. Inspect them, or "
          "use a new --workdir to start afresh.")
    return None

  def _move_aside(self, step: int) -> str:
    """Moves step `step` to WORKDIR/corrupt_checkpoints/ (process 0; all wait)."""
    target = self.workdir / files.CORRUPT_DIR / str(step)
    n = 0
    while target.exists():  # The same step can go bad twice.
      n += 1
      target = self.workdir / files.CORRUPT_DIR / f"{step}.{n}"
    if jax.process_count() > 1:  # Every process has seen the step fail.
      multihost_utils.sync_global_devices(f"bertjax: checkpoint {step} found corrupt")
    if jax.process_index() == 0:
      target.parent.mkdir(parents=True, exist_ok=True)
      (self.directory / str(step)).rename(target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"bertjax: checkpoint {step} moved aside")
    self.manager.reload()
    return str(target)

  def wait(self) -> None:
    try:
      self.manager.wait_until_finished()
    except Exception as e:
      raise self._write_error(e) from e

  def close(self) -> None:
    self.manager.close()


def abstract_on(abstract_state: Any, shardings: Any) -> Any:
  """The restore target: the state's shapes and dtypes placed on `shardings`. Any mesh
  works: a checkpoint written on 8 devices restores onto 4, or onto another
  data/fsdp/tensor split, because orbax reads each new shard from the saved arrays."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract_state, shardings)
