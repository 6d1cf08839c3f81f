"""Flax Linen encoders: one shared stack (`stack.py`: embedding dispatch, blocks,
scan / remat, final norm and pooler slots, the MLM head, layouts, FLOPs) on one layer
kit (`layers.py`, `rotary.py`), and a file of parts per family (`bert.py`: BERT,
RoBERTa, XLM-R, SpanBERT; `modernbert.py`: ModernBERT, Ettin, mmBERT; `electra.py`:
ELECTRA's discriminators and generators; `deberta.py`: DeBERTa-v2 / v3;
`eurobert.py`, `ultrabert.py`, `gte.py`, `nomic_bert.py`); and the one place a model
is chosen: `family_of(config.model)` gives the `Family` (`family.py`) every other
package builds models through; `config_from(config.model)` its hyperparameter
dataclass.

The registry is `MODULES`: a family is its module bertjax/model/<name>.py (whose
`FAMILY` it lists) and, where it converts to Hugging Face, bertjax/hf/<name>.py
(`bertjax.hf.convert.TABLES` takes each that exists); adding a family is adding its
name here."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from bertjax.errors import ConfigError
from bertjax.model import bert
from bertjax.model.bert import ModelConfig
from bertjax.model.family import Family

# The family modules, in the order their families are listed.
MODULES = ("bert", "modernbert", "electra", "deberta", "eurobert", "ultrabert", "gte",
           "nomic_bert")
# config.model.family -> its Family.
FAMILIES = {f.name: f for f in (importlib.import_module(f"bertjax.model.{m}").FAMILY
                                for m in MODULES)}


def family_of(model: Any) -> Family:
  """The family of `model`: a config dataclass, a `config.model` section (a ConfigDict
  or dict; a saved config.json without `family` is of the 'bert' family, the one that
  existed before families did) or a family's name."""
  if isinstance(model, str):
    name = model
  elif hasattr(model, "family") and not hasattr(model, "keys"):
    name = model.family
  else:
    name = model["family"] if "family" in model else bert.FAMILY.name
  if name not in FAMILIES:
    raise ConfigError(f"config.model.family={name!r}: use one of {sorted(FAMILIES)}.")
  return FAMILIES[name]


# A head or input a family may lack: its `config.model` field -> what it is.
_HEADS = {"nsp": "next-sentence-prediction (NSP) head",
          "sbo": "span-boundary objective (SBO) head (SpanBERT's)",
          "pooler": "pooler", "position_offset": "position offset (positions count from 0)"}


def config_from(model_cfg) -> Any:
  """The hyperparameter dataclass of `config.model` (its family's `from_config`). A
  field the family fixes (`nsp`, `sbo`, `pooler`, `position_offset`: class constants
  of its dataclass) is accepted at the family's value and is a one-line ConfigError at
  another; fields of another family's dataclass name that family."""
  family = family_of(model_cfg)
  fields = dict(model_cfg)
  known = {f.name for f in dataclasses.fields(family.config)} | {"family"}
  foreign = sorted(set(fields) - known)
  for other in FAMILIES.values():
    theirs = {f.name for f in dataclasses.fields(other.config)}
    if other is not family and set(foreign) - set(_HEADS) and set(foreign) <= theirs:
      shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
      raise ConfigError(f"config.model.family={family.name!r} but config.model has the "
                        f"{other.name!r} family's fields ({shown}): set "
                        f"--config.model.family={other.name} or use a {family.name} "
                        "config.")
  for name in [k for k in foreign if k in _HEADS]:
    fixed = getattr(family.config, name)
    if fields.pop(name) != fixed:
      raise ConfigError(f"config.model.{name}={model_cfg[name]!r}: the {family.name!r} "
                        f"family has no {_HEADS[name]}; remove the field (or set it to "
                        f"{fixed!r}).")
  return family.config.from_config(fields)


__all__ = ["FAMILIES", "Family", "ModelConfig", "config_from", "family_of"]
