"""A fine-tuned model whole (`load_finetuned`: its task with labels, encoder config,
parameters and tokenizer, for predict, export and the Python API), and the checks of a
run that starts from a fine-tuned head (`config.init_keep_head`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from bertjax.checkpoint import workdir
from bertjax.checkpoint.pretrained import Pretrained, TaskHead
from bertjax.data.tokenizer import Tokenizer
from bertjax.errors import CheckpointError
from bertjax.tasks import base, get_task


@dataclasses.dataclass
class Finetuned:
  """A fine-tuning workdir: its run config (config.json), its task (labels set), the
  encoder's config, the tokenizer and `params` {'encoder', 'head'}."""

  config: Any
  task: base.Task
  model: Any
  params: dict
  tokenizer: Tokenizer


def task_of(run: workdir.FinetunedRun) -> base.Task:
  """The task object of a fine-tuning run, with the labels it was trained on."""
  task = get_task(run.task["name"])(run.config.task, run.tokenizer,
                                    run.config.task.max_seq_length)
  task.labels = list(run.task["labels"])
  return task


def load_finetuned(path: str) -> Finetuned:
  """The fine-tuned model of a fine-tuning workdir (`python -m bertjax.finetune`)."""
  run = workdir.open_finetuned(path)
  return Finetuned(run.config, task_of(run), run.model,
                   run.params, run.tokenizer)


def start_head(pretrained: Pretrained, init_from: str, keep: bool, task_name: str
               ) -> TaskHead | None:
  """The head a fine-tuning run starts from: None (a fresh one) or, with `keep`
  (`config.init_keep_head`), the task head of the fine-tuned `init_from`, which must
  be of task `task_name` (its labels are checked by `kept_head_params`)."""
  if not keep:
    return None
  if pretrained.head is None:
    raise CheckpointError(f"config.init_keep_head=True needs a fine-tuning workdir as "
                          f"config.init_from; {init_from} has no task head.")
  if pretrained.head.name != task_name:
    raise CheckpointError(f"config.init_keep_head=True: {init_from} was fine-tuned for "
                          f"task {pretrained.head.name!r}, this run is {task_name!r}; set "
                          "config.init_keep_head=False for a fresh head.")
  return pretrained.head


def kept_head_params(head: TaskHead, labels: list[str], abstract: Any) -> Any:
  """The kept `head`'s parameters in the dtypes of `abstract` (the run's head, shapes);
  CheckpointError unless it predicts this run's `labels`, in order, with those shapes."""
  if list(head.labels) != list(labels):
    raise CheckpointError(f"config.init_keep_head=True: the kept head predicts the labels "
                          f"{head.labels}, this run has {list(labels)}; use the same labels in "
                          "the same order (config.task.labels) or config.init_keep_head=False.")
  shapes = lambda tree: jax.tree.map(lambda x: tuple(x.shape), tree)
  if shapes(head.params) != shapes(abstract):
    raise CheckpointError("config.init_keep_head=True: the kept head's parameters do not "
                          "match this run's head (another config.task setting?); use "
                          "config.init_keep_head=False.")
  return jax.tree.map(lambda x, a: jnp.asarray(x, a.dtype), head.params, abstract)
