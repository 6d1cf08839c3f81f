"""Continued pretraining: `config.init_from` starts pretraining from a checkpoint of any
family, a bertjax workdir or a Hugging Face dir, read by the one loader fine-tuning
uses too (`bertjax.checkpoint.pretrained.load_pretrained`), instead of from random
weights (`bertjax.train.pretrain.run` calls `open_run`, then the `Start` it returns).

  python -m bertjax.main --config=configs/continued.py --workdir=DIR \
      --config.init_from=PATH --config.data.corpus='general:0.3=...,domain:0.7=...'

- The model section is the checkpoint's. A field `config.model` gives must agree with
  it (the family, vocab_size, the sizes, ...: a one-line error naming both values),
  except the run's own choices, which the config sets: `TRAINING_FIELDS`, every
  dropout and the family's own heads. configs/continued.py gives only those. The
  heads the run trains are those of `config.objectives` (`bertjax.objectives`: 'nsp'
  puts BERT's NSP head on, whether the checkpoint has one or not; a discriminator's
  'rtd' head is trained by 'rtd' alone); a config without `config.objectives` keeps
  the checkpoint's.
- The weights: the encoder and every head of the run the checkpoint has (MLM, NSP,
  ...); the heads it lacks start fresh from `config.seed`, named in the log, as do the
  optimizer state, the learning-rate schedule and the step (its heads the run does not
  train are named too).
- Replaced-token detection (('rtd',), `bertjax.objectives.rtd`: a discriminator and a
  generator): the discriminator is the checkpoint's network (its encoder, and its
  'rtd' head where it has one: an ELECTRA or DeBERTa-v3 discriminator, a bertjax RTD
  workdir's; an MLM checkpoint's encoder, its MLM head left untrained). The generator
  starts from `config.init_generator_from` (a generator checkpoint: ELECTRA and
  DeBERTa-v3 publish both), else from init_from's own when that is a bertjax workdir
  that trained one, else fresh from `config.seed`; `config.generator`'s sizes of 0 are
  the generator checkpoint's, or for a fresh one the family's fraction of the
  discriminator's (`rtd.GENERATOR_FRACTIONS`). The embeddings the two share come as
  the objective shares them (`Networks.place`): ELECTRA's tied tables are the
  discriminator checkpoint's; DeBERTa-v3's (GDES) generator table is the generator
  checkpoint's, else the discriminator's, and the discriminator's residual the
  difference, so that it reads its checkpoint's table.
- The tokenizer: the checkpoint's, or `config.data.tokenizer.path`, which must hold
  every token of the checkpoint's (a copy extended by an earlier run is fine); with
  `config.vocab_extension`, extended by `bertjax.data.vocab_extension`. The vocabulary
  rows follow the tokenizer's ids (`bertjax.checkpoint.vocab_rows`): a new token's row
  is the mean of its old pieces' rows; the vocabulary is padded to a multiple of
  `vocab_extension.pad_to_multiple`; padding rows start far below every token.
- Resuming: WORKDIR/init_from.json records the start (the checkpoint's model, the
  vocabulary rows, the generator's source and model). A rerun resumes from the run's
  own checkpoints; it reads init_from's weights again only when it stopped before its
  first checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from etils import epath

from bertjax import model as model_lib, objectives as objectives_lib
from bertjax.checkpoint import files, vocab_rows, workdir as workdir_lib
from bertjax.checkpoint.pretrained import (Pretrained, checkpoint_family, checkpoint_tokenizer,
                                           load_pretrained)
from bertjax.data import vocab_extension
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import BertjaxError, CheckpointError, ConfigError, at_least
from bertjax.model.config import GENERATOR_SIZES

# config.model fields a continued run chooses whatever the checkpoint holds (with every
# field naming a dropout and the family's own heads): the config's value when given.
TRAINING_FIELDS = ("dtype", "param_dtype", "attention_impl", "scan_layers", "remat_policy",
                   "initializer_range", "initializer_cutoff_factor", "pooler", "sbo_max_positions",
                   "global_rope_theta_phases", "local_rope_theta_phases")
GENERATOR = "generator"  # the network config.init_generator_from starts (objectives/rtd.py)


def check_config(config) -> None:
  """`config.vocab_extension` in range, and only with `config.init_from`."""
  v = config.vocab_extension
  at_least("vocab_extension.num_new_tokens", v.num_new_tokens, 0)
  at_least("vocab_extension.pad_to_multiple", v.pad_to_multiple, 0)
  if v.tokens_file and v.num_new_tokens:
    raise ConfigError("config.vocab_extension.tokens_file and num_new_tokens both name new "
                      "tokens: set one of them.")
  if vocab_extension.extending(config) and not config.init_from:
    raise ConfigError("config.vocab_extension extends a checkpoint's vocabulary: set "
                      "config.init_from (a bertjax workdir or a Hugging Face dir).")


def _same(a, b) -> bool:
  norm = lambda v: tuple(v) if isinstance(v, (list, tuple)) else v
  return norm(a) == norm(b)


def with_model(config: ml_collections.ConfigDict, checkpoint: Any, rows: int,
               generator: Any = None, generator_from: str = "") -> ml_collections.ConfigDict:
  """A copy of `config` whose model section is `checkpoint`'s (its config dataclass)
  with `rows` vocabulary rows and the config's `TRAINING_FIELDS`, dropouts and heads
  (a line logged for each of those it gives that differs from the checkpoint's, the
  heads aside); a one-line ConfigError for any other field it gives that the checkpoint
  contradicts. With `generator` (the model config of the generator checkpoint
  `generator_from`), config.generator is its sizes."""
  family = model_lib.family_of(checkpoint)
  theirs, given = checkpoint.to_dict(), dict(config.model)
  source = f"config.init_from={config.init_from}"
  _check_family(config, family.name)
  training = {*TRAINING_FIELDS, *(h.name for h in family.heads),
              *(k for k in {*theirs, *given} if "dropout" in k)}
  for k, v in given.items():
    if k in training or k == "family" or k not in theirs or _same(v, theirs[k]):
      continue
    if k == "vocab_size":
      raise ConfigError(
          f"config.model.vocab_size={v} but {source} has {theirs[k]} vocabulary rows: set "
          f"--config.model.vocab_size={theirs[k]} or leave the field out (configs/"
          "continued.py); config.vocab_extension adds tokens.")
    raise ConfigError(
        f"config.model.{k}={v!r} but {source} holds {k}={theirs[k]!r}: set --config.model."
        f"{k}={theirs[k]!r}, or take the model section from the checkpoint "
        "(--config=configs/continued.py).")
  heads = {h.name for h in family.heads}  # Reported by the parameters' loading line.
  for k in sorted(k for k in given if k in training and k in theirs and k not in heads
                  and not _same(given[k], theirs[k])):
    _info("config.model.%s=%r replaces the %r of %s.", k, given[k], theirs[k], source)
  if "objectives" in config:  # They choose the heads: none rides along unread.
    theirs = {k: v for k, v in theirs.items() if k not in heads}
  merged = {**theirs, **{k: v for k, v in given.items() if k in training or k not in theirs},
            "vocab_size": rows}
  out = ml_collections.ConfigDict(config.to_dict())
  out.model = ml_collections.ConfigDict(merged)
  if generator is not None:
    out.generator = _generator_sizes(config, generator, generator_from)
  return out


def _generator_sizes(config, generator: Any, source: str) -> ml_collections.ConfigDict:
  """config.generator at the sizes of `generator` (the model config of the generator
  checkpoint `source`); a one-line ConfigError for a size it gives that differs."""
  theirs = {k: getattr(generator, k) for k in GENERATOR_SIZES}
  for k, v in dict(config.get(GENERATOR) or {}).items():
    if v and k in theirs and v != theirs[k]:
      raise ConfigError(
          f"config.generator.{k}={v} but the generator of {source} has {k}={theirs[k]}: "
          f"set --config.generator.{k}=0 (the checkpoint's), or --config.init_generator_"
          "from='' for a fresh generator (from a bertjax workdir: init_from another one).")
  return ml_collections.ConfigDict(theirs)


def _generator_source(config) -> str:
  """Where the generator of `config`'s run starts: config.init_generator_from, else
  config.init_from when that is a bertjax workdir whose run trained a generator, else
  '' (fresh; no generator trained). One-line ConfigErrors: init_generator_from in a run
  that trains no generator, or of another family."""
  given = os.fspath(config.get("init_generator_from", ""))
  if GENERATOR not in objectives_lib.from_config(config).networks.members:
    if given:
      raise ConfigError(
          f"config.init_generator_from={given} but config.objectives="
          f"{objectives_lib.names_of(config)} trains no generator: drop it, or continue "
          "with --config.objectives=\"('rtd',)\".")
    return ""
  if given:
    family = checkpoint_family(given)
    if family != config.model.family:
      raise ConfigError(
          f"config.init_generator_from={given} holds a {family!r} model but config."
          f"init_from={config.init_from} a {config.model.family!r} one: give the "
          "generator published with that discriminator, or '' for a fresh one.")
    return given
  return config.init_from if GENERATOR in workdir_lib.other_networks(config.init_from) else ""


def _check_family(config, family: str) -> None:
  """A one-line ConfigError when `config.model` names another family than `family`,
  the checkpoint's."""
  name = config.model.get("family", family)
  if name != family:
    raise ConfigError(
        f"config.model.family={name!r} but config.init_from={config.init_from} holds a "
        f"{family!r} model: set --config.model.family={family}, or use --config=configs/"
        f"continued.py{':modernbert' if family == 'modernbert' else ''}, whose model "
        "section is the checkpoint's.")


def _info(msg: str, *args) -> None:
  if jax.process_index() == 0:
    logging.info(msg, *args)


def _modules(paths, present) -> list[str]:
  """The outermost modules ('nsp', 'encoder/pooler') holding `paths` absent from
  `present` (parameter paths)."""
  prefixes = {p[:k] for p in present for k in range(1, len(p) + 1)}
  out = set()
  for p in paths:
    if p not in present:
      k = next(k for k in range(1, len(p) + 1) if p[:k] not in prefixes)
      out.add("/".join(p[:k]))
  return sorted(out)


def _flat(tree) -> dict[tuple[str, ...], Any]:
  return {tuple(k.key for k in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


@dataclasses.dataclass
class Start:
  """Where a continued run starts (`open_run`): its `config` (the model section the
  checkpoint's), the checkpoint's model config, `record`, the init_from.json of the
  run being resumed (None: a new run), and the config as `given`."""

  config: ml_collections.ConfigDict
  checkpoint_model: Any = None
  record: dict | None = None
  given: ml_collections.ConfigDict | None = None  # the config as given (its own model)
  generator_from: str = ""  # the generator's checkpoint ('': none; `_generator_source`)
  generator_model: Any = None  # its model config
  _loaded: tuple[Pretrained, tok_lib.Tokenizer] | None = None
  _base: tok_lib.Tokenizer | None = None  # what `new_tokenizer` extends
  _generator: Pretrained | None = None

  def loaded(self) -> tuple[Pretrained, tok_lib.Tokenizer]:
    """The checkpoint (read once), and the tokenizer whose ids its vocabulary rows
    follow (its own, else `config.data.tokenizer.path`'s, which may extend it)."""
    if self._loaded is None:
      path, given_path = self.config.init_from, self.config.data.tokenizer.path
      given = tok_lib.load_tokenizer(given_path) if given_path else None
      try:
        own = checkpoint_tokenizer(path)
      except BertjaxError:
        if given is None:
          raise
        own = None
        _info("%s has no tokenizer files: its vocabulary rows are taken as "
              "config.data.tokenizer.path=%s's ids.", path, given_path)
      if given is not None and own is not None:
        missing = vocab_extension.missing_tokens(own, given)
        if missing:
          raise ConfigError(
              f"config.data.tokenizer.path={given_path} lacks {len(missing)} of the tokens "
              f"of config.init_from={path}'s tokenizer (e.g. {missing[0]!r}): give the "
              "checkpoint's tokenizer or one extending it, or leave the field empty.")
      pretrained = load_pretrained(path, tokenizer=own or given)
      self._loaded, self._base = (pretrained, own or given), given or own
    return self._loaded

  def generator(self) -> Pretrained:
    """The generator checkpoint `generator_from` (read once: a bertjax workdir's
    'generator' network where it trained one, else the network it holds), its
    vocabulary rows on the ids of init_from's tokenizer (the pair shares one)."""
    if self._generator is None:
      path = self.generator_from
      network = GENERATOR if GENERATOR in workdir_lib.other_networks(path) else None
      self._generator = load_pretrained(path, network=network, tokenizer=self.loaded()[1])
    return self._generator

  def new_tokenizer(self) -> tok_lib.Tokenizer:
    """The run's tokenizer: the checkpoint's (or the given one), extended as
    `config.vocab_extension` says."""
    self.loaded()
    tokenizer = self._base
    extended, words, added = vocab_extension.run_tokenizer(self.config, tokenizer)
    if words:
      _info("Vocabulary extension: %d of %d words added (%s%s); %d new ids in all, %d -> "
            "%d tokens.", len(added), len(words), ", ".join(added[:12]),
            ", ..." if len(added) > 12 else "", extended.vocab_size - tokenizer.vocab_size,
            tokenizer.vocab_size, extended.vocab_size)
    return extended

  def finish(self, tokenizer: tok_lib.Tokenizer, workdir: str) -> ml_collections.ConfigDict:
    """The run's config with its vocabulary rows (the checkpoint's, or with a larger
    or extended tokenizer its size padded to `vocab_extension.pad_to_multiple`); a new
    run's init_from.json written (process 0)."""
    ckpt_rows = self.checkpoint_model.vocab_size
    if self.record is not None:
      rows = self.record["rows"]
    elif vocab_extension.extending(self.config) or tokenizer.vocab_size > ckpt_rows:
      rows = vocab_extension.padded_size(max(ckpt_rows, tokenizer.vocab_size),
                                         self.config.vocab_extension.pad_to_multiple)
    else:
      rows = ckpt_rows
    self.config = with_model(self.given, self.checkpoint_model, rows, self.generator_model,
                             self.generator_from)
    if self.record is None and jax.process_index() == 0:
      record = {"init_from": self.config.init_from, "rows": rows,
                "tokenizer_size": tokenizer.vocab_size,
                "checkpoint_model": self.checkpoint_model.to_dict(),
                "generator_from": self.generator_from,
                "generator_model": self.generator_model and self.generator_model.to_dict()}
      (epath.Path(workdir) / files.INIT_FROM_FILE).write_text(json.dumps(record, indent=2))
    return self.config

  def initial_params(self, setup, tokenizer: tok_lib.Tokenizer) -> Any:
    """The parameters a new run starts from, on `setup`'s shardings: each trained
    network's checkpoint (init_from the exported one's, `generator_from` the
    generator's; in the model's layout, vocabulary rows on `tokenizer`'s ids) where
    the networks place it (`Networks.placed`), and fresh ones from `config.seed` for
    the rest; logged."""
    pretrained, old = self.loaded()
    networks = objectives_lib.from_config(self.config).networks
    family = model_lib.family_of(self.checkpoint_model)
    sources = {networks.exported: pretrained}
    if self.generator_from:
      sources[GENERATOR] = self.generator()
    model = setup.model.config
    rows = vocab_extension.row_sources(old, tokenizer)
    remapped = (model.vocab_size != self.checkpoint_model.vocab_size
                or any(s != (i,) for i, s in enumerate(rows)))
    padding = ([i for i in range(model.vocab_size) if i >= len(rows) or not rows[i]]
               if remapped else [])
    loaded, axes = {}, {}
    for name, member in networks.members.items():
      member_axes = vocab_rows.vocab_axes(member.config) if remapped else {}
      axes.update({(*member.path, *p): a for p, a in member_axes.items()})
      if name in sources:
        params = jax.device_get(family.to_layout(sources[name].params,
                                                 member.config.scan_layers))
        if remapped:
          params = vocab_rows.remap(params, member_axes, rows, member.config.vocab_size)
        loaded[name] = _flat(params)
    theirs = networks.placed(loaded)

    def merge(path, fresh):
      p = tuple(k.key for k in path)
      x = theirs.get(p)
      if x is not None and tuple(x.shape) != tuple(fresh.shape):
        raise CheckpointError(f"parameter {'/'.join(p)} of config.init_from="
                              f"{self.config.init_from} has shape {x.shape}; the model "
                              f"needs {fresh.shape}.")
      if padding and p in axes:
        x = vocab_rows.pad_rows(jax.device_get(fresh) if x is None else x, axes[p], padding)
      return fresh if x is None else jax.device_put(np.asarray(x, fresh.dtype),
                                                     fresh.sharding)

    fresh = setup.init_params(self.config)
    ours = _flat(fresh)
    if not set(theirs) & set(ours):  # Training from scratch under a continued run's name.
      raise CheckpointError(
          f"config.init_from={self.config.init_from} ({family.name}) holds none of the "
          f"parameters this run trains (the checkpoint's modules: "
          f"{', '.join(sorted({p[0] for p in theirs}))}; the run's: "
          f"{', '.join(sorted({p[0] for p in ours}))}): continuing it with "
          f"config.objectives={tuple(self.config.objectives)} is not supported yet; "
          "continue it with an objective whose networks it holds (('mlm',) for an "
          "encoder or a discriminator).")
    params = jax.tree_util.tree_map_with_path(merge, fresh)
    left = []  # what each checkpoint holds that its network does not train
    for name, flat in loaded.items():
      trained = _flat(jax.eval_shape(networks.members[name].params, fresh))
      prefix = f"{name}/" if len(networks.members) > 1 else ""
      left += [prefix + m for m in _modules(flat, trained)]
    _info("Continued pretraining from %s (%s)%s: %d of %d parameter arrays loaded; "
          "initialised fresh: %s; in the checkpoint but not trained: %s. The optimizer "
          "state, the learning-rate schedule and the step start fresh (step 0).",
          self.config.init_from, family.name,
          f", the generator from {self.generator_from}" if self.generator_from else "",
          len(set(theirs) & set(ours)), len(ours), ", ".join(_modules(ours, theirs)) or
          "nothing", ", ".join(left) or "nothing")
    if padding:
      _info("Vocabulary rows: %d (%d from the checkpoint's %d, %d new from their "
            "pieces), %d padding rows (never targets, far below every token).",
            model.vocab_size,
            sum(len(s) == 1 for s in rows), self.checkpoint_model.vocab_size,
            sum(len(s) > 1 for s in rows), len(padding))
    return params


def open_run(config: ml_collections.ConfigDict, workdir: str) -> Start:
  """The `Start` of a run with `config.init_from`: a new one (the checkpoint read now)
  or, with WORKDIR/init_from.json, one being resumed (nothing read but that file).
  One-line errors: a workdir holding another run, or one continued from elsewhere."""
  record_file = epath.Path(workdir) / files.INIT_FROM_FILE
  path = os.fspath(config.init_from)
  if record_file.exists():
    record = json.loads(record_file.read_text())
    if record["init_from"] != path:
      raise CheckpointError(
          f"{workdir} holds a run continued from {record['init_from']} but config.init_from"
          f"={path}: resume with the run's init_from, or use a new --workdir.")
    start = Start(config, model_lib.config_from(record["checkpoint_model"]), record, config)
    start.generator_from = record.get("generator_from", "")
    given = os.fspath(config.get("init_generator_from", ""))
    if given and given != start.generator_from:
      raise CheckpointError(
          f"{workdir} holds a run whose generator started "
          f"{'from ' + start.generator_from if start.generator_from else 'fresh'} but "
          f"config.init_generator_from={given}: resume with the run's, or use a new "
          "--workdir.")
    if record.get("generator_model"):
      start.generator_model = model_lib.config_from(record["generator_model"])
    start.config = with_model(config, start.checkpoint_model, record["rows"],
                              start.generator_model, start.generator_from)
    return start
  if (epath.Path(workdir) / files.CONFIG_FILE).exists():
    raise CheckpointError(
        f"{workdir} holds a run that did not start from config.init_from={path}: use a new "
        "--workdir to continue the checkpoint, or drop config.init_from to resume the run.")
  _check_family(config, checkpoint_family(path))  # before the weights are read
  start = Start(config, given=config)
  start.checkpoint_model = start.loaded()[0].config
  rows = start.checkpoint_model.vocab_size
  start.config = with_model(config, start.checkpoint_model, rows)
  start.generator_from = _generator_source(start.config)
  if start.generator_from:
    start.generator_model = start.generator().config
    start.config = with_model(config, start.checkpoint_model, rows, start.generator_model,
                              start.generator_from)
  return start
