"""Checkpoints with orbax: the train state and the data-iterator state saved together.

Layout of a workdir:
  config.json      the full config of the run (written once; the model must not change)
  tokenizer/       the tokenizer (`Tokenizer.save`)
  checkpoints/N/   orbax step N: `state` (TrainState) and `data` (grain iterator state)
"""

from __future__ import annotations

import json
from typing import Any

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from bertjax.errors import CheckpointError
from bertjax.model.config import ModelConfig

CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizer"
CHECKPOINT_DIR = "checkpoints"


class Checkpointer:
  """Saves asynchronously every `save` and restores the newest step of the workdir."""

  def __init__(self, workdir: str, max_to_keep: int = 3, read_only: bool = False):
    self.directory = epath.Path(workdir) / CHECKPOINT_DIR
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
        enable_async_checkpointing=not read_only)
    self.manager = ocp.CheckpointManager(self.directory, options=options,
                                         item_names=("state", "data"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_iterator: Any, force: bool = False) -> None:
    items = {"state": ocp.args.StandardSave(state)}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    self.manager.save(step, args=ocp.args.Composite(**items), force=force)

  def restore(self, step: int, abstract_state: Any, data_iterator: Any = None) -> Any:
    """Restores `state` (onto the shardings of `abstract_state`'s leaves) and, when an
    iterator is given, sets its position. Returns the state."""
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    try:
      restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # orbax raises many types for unreadable files.
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} cannot be restored "
          f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); it is corrupt or from "
          "another model: move it aside or use a new --workdir.") from e
    return restored["state"]

  def reached_preemption(self, step: int) -> bool:
    """True on every process at the step they agreed to save at after a SIGTERM to
    any of them (JAX's preemption service; always False in a single process)."""
    return self.manager.reached_preemption(step)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def abstract_on(abstract_state: Any, shardings: Any) -> Any:
  """The restore target: the state's shapes and dtypes placed on `shardings`. Any mesh
  works: a checkpoint written on 8 devices restores onto 4, or onto another
  data/fsdp/tensor split, because orbax reads each new shard from the saved arrays."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract_state, shardings)


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes config.json; on resume, checks that the model section is unchanged."""
  path = epath.Path(workdir) / CONFIG_FILE
  if path.exists():
    old = json.loads(path.read_text()).get("model", {})
    new = json.loads(config.to_json())["model"]
    # A field added to bertjax after the run started counts at its default value.
    defaults = ModelConfig().to_dict()
    changed = sorted(k for k in new if old.get(k, defaults.get(k)) != new[k])
    if changed:
      raise CheckpointError(
          f"{workdir} holds a run of another model (config.model fields {changed} differ); "
          "use a new --workdir or the original model config.")
  if jax.process_count() > 1:  # Every process reads before process 0 writes.
    multihost_utils.sync_global_devices("bertjax: config.json checked")
  if jax.process_index() == 0:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_json(indent=2))


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = epath.Path(workdir) / CONFIG_FILE
  if not path.exists():
    raise CheckpointError(f"{workdir} has no {CONFIG_FILE}: it is not a bertjax workdir.")
  return ml_collections.ConfigDict(json.loads(path.read_text()))


def restore_params(workdir: str, step: int | None = None) -> tuple[ml_collections.ConfigDict, Any]:
  """The config and the parameters (a nested dict on the default device) of the newest
  (or the given) step of a bertjax workdir."""
  from bertjax.train import state as state_lib  # The trainer imports this module.

  config = load_config(workdir)
  ckpt = Checkpointer(workdir, read_only=True)
  step = ckpt.latest_step() if step is None else step
  if step is None:
    raise CheckpointError(f"{workdir} has no checkpoint yet under {CHECKPOINT_DIR}/.")
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                          state_lib.abstract_state(config)[0])
  state = ckpt.restore(step, abstract)
  ckpt.close()
  return config, state.params
