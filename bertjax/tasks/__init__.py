"""Fine-tuning tasks, one module each, run by one loop (`bertjax.tasks.loop`)."""

from __future__ import annotations

import importlib

from bertjax.errors import ConfigError

# config.task.name -> (module, class)
TASKS = {
    "classification": ("classification", "Classification"),
    "tagging": ("tagging", "Tagging"),
    "squad": ("squad", "SquadQA"),
    "span_ner": ("span_ner", "SpanNER"),
    "multiple_choice": ("multiple_choice", "MultipleChoice"),
}


def get_task(name: str):
  """The Task class registered under `name`."""
  if name not in TASKS:
    raise ConfigError(f"config.task.name={name!r}: use one of {sorted(TASKS)}.")
  module, cls = TASKS[name]
  return getattr(importlib.import_module(f"bertjax.tasks.{module}"), cls)
