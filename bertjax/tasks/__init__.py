"""Fine-tuning tasks, one module each, run by one loop (`bertjax.tasks.finetune`)."""

from __future__ import annotations

from bertjax.errors import ConfigError
from bertjax.tasks.base import RETRIEVER_TASKS
from bertjax.tasks.classification import Classification
from bertjax.tasks.multiple_choice import MultipleChoice
from bertjax.tasks.rerank import Rerank
from bertjax.tasks.span_ner import SpanNER
from bertjax.tasks.squad import SquadQA
from bertjax.tasks.tagging import Tagging

# config.task.name -> Task class
TASKS = {
    "classification": Classification,
    "tagging": Tagging,
    "squad": SquadQA,
    "span_ner": SpanNER,
    "multiple_choice": MultipleChoice,
    "rerank": Rerank,
}


def get_task(name: str):
  """The Task class registered under `name`."""
  if name not in TASKS:
    raise ConfigError(f"config.task.name={name!r}: use one of "
                      f"{sorted([*TASKS, *RETRIEVER_TASKS])}"
                      + (" (an embedding model is no classifier: encode texts with "
                         "python -m bertjax.embed encode)" if name in RETRIEVER_TASKS
                         else "") + ".")
  return TASKS[name]
