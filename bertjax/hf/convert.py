"""Hugging Face checkpoints <-> bertjax, for every family: a directory's config.json
names its `model_type`, which picks the family's table (`TABLES`: bertjax/hf/<name>.py
of each family of `bertjax.model.MODULES` that has one, each a mapping run by the one
engine `table.py`); this module reads and writes the directories (`load_hf`, `save_hf`,
`save_hf_finetuned`) through `files.py`.

A family's table module holds its `param_table` (`table.Entry` rows), FAMILY (its `bertjax.model.FAMILIES` name), MODEL_TYPES,
TASK_CLASSES (the bertjax tasks it exports), TOKENIZER_JSON (whether transformers'
AutoTokenizer reads that model type's tokenizer from tokenizer.json only),
`check_supported(config.json)`, `load(config.json, state dict) -> (config, params,
task or None)`, `export_pretrained(params, config, tokenizer, tokenizer kind)` and
`export_finetuned(finetuned, tokenizer kind)`, both -> (config.json, state dict),
`pretraining_model(config) -> (config.json, config)`: the transformers class that
pretrains it (`benchmark train --compare=hf`) and the heads that class computes, and
`model_config_from_hf(config.json) -> config`: the config dataclass of a config.json
alone (`hf_dropouts`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
from typing import Any

from bertjax import model as model_lib
from bertjax.errors import CheckpointError
from bertjax.hf import files

# The conversion table of each registered family that has one (bertjax/hf/<name>.py of
# `bertjax.model.MODULES`).
TABLES = tuple(importlib.import_module(f"bertjax.hf.{m}") for m in model_lib.MODULES
               if importlib.util.find_spec(f"bertjax.hf.{m}") is not None)


def table_of(hf_config: dict[str, Any]):
  """The table of a config.json's `model_type`, or a one-line CheckpointError."""
  model_type = hf_config.get("model_type")
  for table in TABLES:
    if model_type in table.MODEL_TYPES:
      return table
  supported = [t for table in TABLES for t in table.MODEL_TYPES]
  raise CheckpointError(f"config.json model_type={model_type!r} is not supported; "
                        f"bertjax converts {supported}.")


def family_table(family: str):
  """The table of a bertjax model family, or a one-line CheckpointError when the family
  has none (a family of `bertjax.model.FAMILIES` without its file in bertjax/hf/)."""
  for table in TABLES:
    if table.FAMILY == family:
      return table
  raise CheckpointError(f"a {family!r} model has no Hugging Face conversion table "
                        f"(bertjax/hf/ converts {[t.FAMILY for t in TABLES]}): it stays a "
                        "bertjax workdir, which every bertjax tool reads.")


def check_supported(hf_config: dict[str, Any]) -> None:
  """CheckpointError unless bertjax can represent the Hugging Face model."""
  table_of(hf_config).check_supported(hf_config)


def load_hf(directory: str) -> tuple[Any, dict]:
  """(config dataclass, params) of a Hugging Face model dir (config.json + weights):
  the encoder and the pretraining heads it has (a fine-tuned task head is not read)."""
  with open(os.path.join(directory, "config.json")) as f:
    hf_config = json.load(f)
  table = table_of(hf_config)
  table.check_supported(hf_config)
  config, params, _ = table.load(hf_config, files.read_state_dict(directory))
  return config, {k: v for k, v in params.items() if k != "head"}


def hf_dropouts(config) -> Any:
  """`config` (a family's config dataclass) with every dropout the Hugging Face class
  of its family holds for the same weights: its config.json written by the family's
  table and read back (what fine-tuning the exported model in transformers uses). A
  training-only dropout Hugging Face has no field for (ModernBERT's
  `attention_output_dropout`, 0.1 in the authors' pretraining) comes back 0."""
  table = family_table(config.family)
  back = table.model_config_from_hf(table.pretraining_model(config)[0])
  names = [f.name for f in dataclasses.fields(config) if "dropout" in f.name]
  return dataclasses.replace(config, **{k: getattr(back, k) for k in names})


def save_hf(directory: str, params: dict, config, tokenizer) -> str:
  """Writes config.json, model.safetensors and the tokenizer files of a Hugging Face
  model dir that `transformers.AutoModel*.from_pretrained` loads. Returns its
  model_type."""
  table = family_table(config.family)
  kind = files.save_hf_tokenizer(directory, tokenizer, config.max_length,
                                 table.TOKENIZER_JSON)
  hf_config, state = table.export_pretrained(params, config, tokenizer, kind)
  files.write(directory, hf_config, state)
  return hf_config["model_type"]


def check_exportable(task: str, family: str) -> None:
  """CheckpointError unless a fine-tuned `task` model of `family` has a Hugging Face
  class (the family table's TASK_CLASSES)."""
  if task not in family_table(family).TASK_CLASSES:
    raise CheckpointError(
        f"a {task!r} model has no Hugging Face class" + (
            " (span-based NER classifies spans; transformers has no such head): use "
            "python -m bertjax.predict on it" if task == "span_ner" else "") + ".")


def save_hf_finetuned(directory: str, finetuned) -> str:
  """Writes the Hugging Face *For<Task> dir (config.json with the labels,
  model.safetensors, tokenizer files) of a fine-tuned model
  (`bertjax.tasks.finetuned.load_finetuned`). Returns its class name."""
  task = finetuned.task
  check_exportable(task.name, finetuned.model.family)
  if task.feature_based:
    raise CheckpointError("a feature-based tagger (config.task.features) has no Hugging "
                          "Face class: use python -m bertjax.predict on it.")
  table = family_table(finetuned.model.family)
  kind = files.save_hf_tokenizer(directory, finetuned.tokenizer, finetuned.model.max_length,
                                 table.TOKENIZER_JSON)
  hf_config, state = table.export_finetuned(finetuned, kind)
  files.write(directory, hf_config, state)
  return hf_config["architectures"][0]
