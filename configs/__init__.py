"""Recipes: one file per recipe, `get_config(arg)` returns an ml_collections ConfigDict;
`model_section` builds its `config.model` from the family's defaults."""

import dataclasses

import jax.numpy as jnp
import ml_collections


def model_section(family: str, **fields) -> ml_collections.ConfigDict:
  """`config.model` of a `family` (a key of `bertjax.model.FAMILIES`): every field of
  its config dataclass at its default (documented there, once), `fields` stating what
  the recipe changes; every key present, so `--config.model.<field>=...` overrides any.
  The objectives' booleans (`nsp`, `sbo`, `rtd`) are left to `config.objectives` unless
  stated (a discriminator's `rtd=True` is part of the network it describes); the
  activation `dtype` is '' (the platform's: bfloat16 on GPUs and TPUs, float32 on the
  CPU) unless given, where the dataclass built in Python keeps float32 (Hugging Face's
  numerics, which converters and parity tests build)."""
  from bertjax import model, objectives  # pylint: disable=g-import-not-at-top
  config = model.family_of(family).config
  m = ml_collections.ConfigDict()
  m.family = family
  for f in dataclasses.fields(config):
    if f.name in objectives.REGISTRY:
      continue
    value = f.default
    if f.name in ("dtype", "param_dtype"):
      value = jnp.dtype(value).name
    m[f.name] = value
  m.dtype = ""
  unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(config)})
  if unknown:
    raise ValueError(f"model_section({family!r}): no fields {unknown}.")
  m.update(fields)
  return m
