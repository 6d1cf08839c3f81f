"""A run's workdir, read and written in one place: config.json (`save_config`,
`load_config`), the network its objectives export (`saved_network`), the tokenizer,
task.json of a fine-tuning run (`task_info`) and the parameters of a checkpoint
(`restore_params`, the one way anything reads weights back: predict, embed, convert,
fill_mask, init_from and the Python API). File names: `bertjax.checkpoint.files`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
from etils import epath
from jax.experimental import multihost_utils

from bertjax import model as model_lib, objectives as objectives_lib
from bertjax.checkpoint import files
from bertjax.checkpoint.manager import Checkpointer, abstract_on
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import CheckpointError


# The settings a resumed run may change: how and where it runs, what it logs, keeps and
# evaluates, and how long it trains (train.num_steps: a run extended or cut short, its
# schedule and phases laid over the new count), never what it trains on (its data,
# batch, optimizer, task, seed). config.json takes them and each change is logged; any
# other change is refused.
RESUMABLE = ("train.num_steps", "compilation_cache_dir", "distributed", "mesh",
             "logical_axis_rules",
             "checkpoint", "data.worker_count", "train.log_every", "train.checkpoint_every",
             "train.max_to_keep", "train.profile_steps", "train.eval_every",
             "train.eval_batches", "train.eval_batch_size", "evals", "data.dev",
             "data.dev_mismatched", "task.eval_at_start", "sweep")


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict) and v:
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def check_resume(workdir: str, config: ml_collections.ConfigDict) -> list[str]:
  """Checks `config` against the config.json of the run in `workdir` (none: a new run,
  []): the model section, the objectives (`bertjax.objectives.names_of`: a config.json
  written before config.objectives names them by the model's booleans) and the
  optimizer state's layout unchanged (else no checkpoint would restore), and every other
  setting but the `RESUMABLE` ones unchanged (else the resumed run would train on
  other data, batches or settings than its checkpoints). Returns the resumable
  settings it changes ('config.a.b=new (the run's: old)'), to be logged; a one-line
  CheckpointError naming the fields otherwise. Writes nothing."""
  path = epath.Path(workdir) / files.CONFIG_FILE
  if not path.exists():
    return []
  saved = json.loads(path.read_text())
  new = json.loads(config.to_json())
  old_model, new_model = saved.get("model", {}), new["model"]
  old_model.setdefault("family", "bert")  # written before bertjax had model families
  if model_lib.family_of(new_model).name != old_model["family"]:
    raise CheckpointError(
        f"{workdir} holds a run of the {old_model['family']!r} model family but "
        f"config.model.family={model_lib.family_of(new_model).name!r}: resume with "
        "the run's config (its config.json) or use a new --workdir.")
  # A model field added to bertjax after the run started counts at its default value;
  # the heads' booleans of older configs are compared as the objectives they name.
  defaults = model_lib.family_of(old_model).config().to_dict()
  old = lambda k: old_model.get(k, defaults.get(k))
  changed = [f"config.model.{k}={new_model[k]!r} (the run's: {old(k)!r})"
             for k in sorted(new_model)
             if k not in objectives_lib.LEGACY and old(k) != new_model[k]]
  if changed:
    raise CheckpointError(
        f"{workdir} holds a run of another model: {', '.join(changed)}; use a new "
        "--workdir or the run's model config.")
  theirs, ours = objectives_lib.names_of(saved), objectives_lib.names_of(config)
  if theirs != ours:
    raise CheckpointError(
        f"{workdir} holds a run of the objectives {theirs} but config.objectives="
        f"{ours}: the networks differ; resume with config.objectives={theirs} or use "
        "a new --workdir.")
  if "train" not in saved:  # A converted checkpoint holds parameters only.
    return []
  old_layout, new_layout = _optimizer_layout(saved["train"]), _optimizer_layout(
      new["train"])
  changed = [f"config.train.{k}={new_layout[k]!r} (the run's: {old_layout[k]!r})"
             for k in new_layout if old_layout[k] != new_layout[k]]
  if changed:
    raise CheckpointError(
        f"{workdir} holds a run whose optimizer state has another layout: "
        f"{', '.join(changed)}; use a new --workdir or the run's values.")
  # A setting added to bertjax after the run started (absent from its config.json), or
  # gone since, is not compared.
  before = _flat({k: v for k, v in saved.items() if k not in ("model", "objectives")})
  after = _flat({k: v for k, v in new.items() if k not in ("model", "objectives")})
  diff = [f"config.{k}={after[k]!r} (the run's: {before[k]!r})"
          for k in sorted(set(before) & set(after)) if before[k] != after[k]]
  resumable = lambda d: any(d.startswith(f"config.{r}=") or d.startswith(f"config.{r}.")
                            for r in RESUMABLE)
  refused = [d for d in diff if not resumable(d)]
  if refused:
    raise CheckpointError(
        f"{workdir} holds a run with other settings: {'; '.join(refused[:3])}"
        f"{f' and {len(refused) - 3} more' if len(refused) > 3 else ''}; resume with the "
        "run's settings (its config.json) or use a new --workdir.")
  return [d for d in diff if resumable(d)]


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes config.json (process 0), once `check_resume` has passed and every input
  has been read: the run's config, with the resumable settings it changes."""
  path = epath.Path(workdir) / files.CONFIG_FILE
  if jax.process_count() > 1:  # Every process reads before process 0 writes.
    multihost_utils.sync_global_devices("bertjax: config.json checked")
  if jax.process_index() == 0:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_json(indent=2))


def _optimizer_layout(train: dict) -> dict:
  """The config.train fields that change the optimizer state's tree in a checkpoint."""
  skip = train["skip_step_on_spikes"]
  return {"optimizer": train["optimizer"],
          "max_grad_norm": "> 0" if train["max_grad_norm"] > 0 else "0",
          "skip_step_on_spikes": skip,
          "spike_window": train["spike_window"] if skip else "unused"}


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config.json."""
  path = epath.Path(workdir) / files.CONFIG_FILE
  if not path.exists():
    raise CheckpointError(f"{workdir} has no {files.CONFIG_FILE}: it is not a bertjax "
                          "workdir.")
  return ml_collections.ConfigDict(json.loads(path.read_text()))


def saved_network(workdir: str, config: ml_collections.ConfigDict | None = None,
                  name: str | None = None) -> objectives_lib.Network:
  """The network `name` (default: the one its objectives export, `Networks.exported`)
  of a workdir (its config.json, or `config` when already read): where its parameters
  lie in a checkpoint's tree and its model config; a one-line CheckpointError when the
  workdir's model family is not one of this bertjax's (`bertjax.model.FAMILIES`)."""
  config = load_config(workdir) if config is None else config
  family = config.model["family"] if "family" in config.model else "bert"  # pre-families
  if family not in model_lib.FAMILIES:
    raise CheckpointError(
        f"{workdir} holds a model of family {family!r}, which this bertjax does not have "
        f"({', '.join(sorted(model_lib.FAMILIES))}): use the bertjax version that wrote "
        "it.")
  return objectives_lib.from_config(config).networks.member(name)


def other_networks(path: str) -> tuple[str, ...]:
  """The networks a pretraining workdir trains besides the one its objectives export
  (an ELECTRA pair's generator); () for one network, a fine-tuning workdir or a
  directory that is not a workdir."""
  if not (epath.Path(path) / files.CONFIG_FILE).exists() or is_finetuned(path):
    return ()
  config = load_config(path)
  if "model" not in config:
    return ()
  networks = objectives_lib.from_config(config).networks
  return tuple(name for name in networks.members if name != networks.exported)


def masked_lm_network(path: str) -> str | None:
  """The network fill_mask takes from `path`: None (the exported one) unless that one
  has no MLM head and another network of the workdir has (an ELECTRA pair: the
  generator)."""
  others = other_networks(path)
  if not others:
    return None
  networks = objectives_lib.from_config(load_config(path)).networks
  if "mlm" in networks.member().module.heads:
    return None
  return next((n for n in others if "mlm" in networks.member(n).module.heads), None)


def saved_model(workdir: str, config: ml_collections.ConfigDict | None = None) -> Any:
  """The model config dataclass of a workdir's exported network (`saved_network`): a
  fine-tuning workdir's encoder, a pretraining workdir's model with the heads its
  objectives trained."""
  return saved_network(workdir, config).config


def load_tokenizer(workdir: str) -> tok_lib.Tokenizer:
  """The tokenizer the run trained with (WORKDIR/tokenizer)."""
  directory = os.path.join(workdir, files.TOKENIZER_DIR)
  if not epath.Path(directory).is_dir():
    raise CheckpointError(f"{workdir} has no {files.TOKENIZER_DIR}/ directory "
                          "(Tokenizer.save writes it).")
  return tok_lib.load_tokenizer(directory)


def is_finetuned(path: str) -> bool:
  """Whether `path` is a fine-tuning workdir (it has the task file)."""
  return os.path.isfile(os.path.join(path, files.TASK_FILE))


def task_info(path: str) -> dict[str, Any]:
  """A fine-tuning workdir's task file: {'name', 'labels', 'num_steps'}."""
  if not is_finetuned(path):
    raise CheckpointError(f"{path} has no {files.TASK_FILE}: give a fine-tuning workdir "
                          "(python -m bertjax.finetune --workdir=...).")
  with open(os.path.join(path, files.TASK_FILE)) as f:
    return json.load(f)


def restore_params(workdir: str, step: int | None = None, shardings: Any = None) -> Any:
  """The parameters of step `step` (default: the newest) of a workdir, read alone (the
  optimizer state is neither built nor read), in the shapes and dtypes the checkpoint
  holds (its own metadata: no model is built), onto `shardings` (a tree of shardings
  matching the parameters, e.g. a mesh's) or, without, onto the default device."""
  checkpointer = Checkpointer(workdir, read_only=True)
  try:
    step = checkpointer.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"{workdir} has no checkpoint yet under "
                            f"{files.CHECKPOINT_DIR}/; finish (or resume) the run.")
    abstract = checkpointer.saved_shapes(step)["params"]
    if shardings is None:
      device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      shardings = jax.tree.map(lambda _: device, abstract)
    return checkpointer.restore(step, {"params": abstract_on(abstract, shardings)})["params"]
  finally:
    checkpointer.close()


@dataclasses.dataclass
class FinetunedRun:
  """What a fine-tuning workdir holds: its run `config` (config.json), the encoder's
  `model` config (`saved_model`), `task` (task.json: name, labels, num_steps),
  `tokenizer` and, when read, `params` ({'encoder', 'head'} of the newest checkpoint,
  on the default device)."""

  path: str
  config: ml_collections.ConfigDict
  model: Any
  task: dict[str, Any]
  tokenizer: tok_lib.Tokenizer
  params: Any = None


def open_finetuned(path: str, read_params: bool = True) -> FinetunedRun:
  """The one way a fine-tuning workdir (`python -m bertjax.finetune`) is opened: by
  predict, convert, the API (`bertjax.tasks.finetuned.load_finetuned`), a run resuming
  and `load_pretrained` of a fine-tuned encoder (init_from, embed, fill_mask)."""
  path = os.fspath(path)
  task = task_info(path)
  config = load_config(path)
  return FinetunedRun(path, config, saved_model(path, config), task, load_tokenizer(path),
                      restore_params(path) if read_params else None)
