"""Flax Linen encoders, one file per family (`bert.py`: BERT, RoBERTa, XLM-R,
SpanBERT; `modernbert.py`: ModernBERT, Ettin, mmBERT), and the one place a model is
chosen: `family_of(config.model)` gives the `Family` (`family.py`) every other package
builds models through; `config_from(config.model)` its hyperparameter dataclass."""

from __future__ import annotations

from typing import Any

from bertjax.errors import ConfigError
from bertjax.model import bert, modernbert
from bertjax.model.bert import BertForPreTraining, Encoder, MLMHead
from bertjax.model.config import ModelConfig
from bertjax.model.family import Family

# config.model.family -> its Family.
FAMILIES = {f.name: f for f in (bert.FAMILY, modernbert.FAMILY)}


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


def config_from(model_cfg) -> Any:
  """The hyperparameter dataclass of `config.model` (its family's `from_config`)."""
  return family_of(model_cfg).config.from_config(model_cfg)


__all__ = ["BertForPreTraining", "Encoder", "FAMILIES", "Family", "MLMHead",
           "ModelConfig", "config_from", "family_of"]
