"""Fine-tuning on the trainer: every task of `bertjax.tasks` becomes an objective, a
data stream and a dev evaluator handed to `bertjax.train.trainer.Trainer`, which
resumes, checkpoints, logs and stops cleanly exactly as in pretraining.

Start from a pretrained encoder (`config.init_from`: a bertjax workdir or a Hugging
Face dir) or from scratch, add the task's head, train `num_epochs` over shuffled
features with BERT's warm-up + linear decay, evaluate on dev at the end and write
dev_results.json and dev_predictions.json. The pieces are separate so a task can
bring its own: `objective(task, model, sample)`, `train_stream(...)` (any grain
iterator of host batches: bucketed or packed batches fit), `dev_evaluator(...)`.

The workdir holds run.json, config.json (the model section is the encoder actually
used), tokenizer/, task.json (labels and the step count) and checkpoints/
(`bertjax.checkpoint.files`), each written once the run's data is read (`begin`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any, Callable

import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bertjax.checkpoint import files, workdir as workdir_lib
from bertjax.checkpoint.pretrained import checkpoint_family, load_pretrained
from bertjax.console import progress
from bertjax.data import tokenizer as tok_lib
from bertjax.data.pipeline import MIN_SEQ_LENGTH
from bertjax.errors import CheckpointError, ConfigError, at_least, within
from bertjax.hf.convert import hf_dropouts
from bertjax import model as model_lib, writes
from bertjax.model import stack
from bertjax.model.config import dtype_of
from bertjax.parallel import mesh as mesh_lib
from bertjax.tasks import (base, batching, colbert, finetuned, get_task, rerank, reranker,
                           retrieval, sparse)
from bertjax.train import compilation, optimizer, state as state_lib, trainer as trainer_lib
from bertjax.train.step import Objective
from bertjax.train.trainer import Evaluator, Trainer


def check_config(config: ml_collections.ConfigDict) -> None:
  """Every field of a fine-tuning config (configs/finetune/base.py) but the sweep's in
  range, each section by its owner (the model's dataclass only when it is used, without
  `init_from`; its dtype always; `trainer.check_config`): one ConfigError line, before
  the pretrained weights are read."""
  dtype_of(config.model.dtype)
  if not config.init_from:
    model_lib.config_from(config.model)
  t = config.train
  at_least("train.batch_size", t.batch_size, 1)
  at_least("train.eval_batch_size", t.eval_batch_size, 1)
  at_least("train.num_epochs", t.num_epochs, 1)
  within("train.warmup_fraction", t.warmup_fraction, 0, 1, "[)")
  trainer_lib.check_config(config)
  at_least("task.max_seq_length", config.task.max_seq_length, MIN_SEQ_LENGTH)
  at_least("freeze.top_k_layers", config.freeze.top_k_layers, -1)
  if config.task.name == rerank.NAME:
    rerank.check_config(config)


@dataclasses.dataclass
class Start:
  """Where a run starts: the encoder's config, its weights (None: random or resumed)
  and the tokenizer."""

  model: Any
  encoder_params: Any
  tokenizer: tok_lib.Tokenizer
  head: Any = None  # TaskHead of a fine-tuned init_from kept by config.init_keep_head
  # Parameters a retriever keeps beside the encoder: a sparse model's MLM head ('mlm'),
  # a ColBERT model's projection ('projection') where init_from has one.
  kept_params: dict = dataclasses.field(default_factory=dict)


def load_start(config: ml_collections.ConfigDict) -> Start:
  """The pretrained encoder of `config.init_from`, or a random one of `config.model`
  with the tokenizer of `config.tokenizer`."""
  dtype = config.model.dtype
  if config.init_from:
    pretrained = load_pretrained(config.init_from)
    _refuse_other_tokenizer(config, pretrained.tokenizer, f"config.init_from={config.init_from}")
    if pretrained.config.family != model_lib.family_of(config.model).name:
      logging.info("config.init_from=%s holds a %r model: its own config is the encoder's "
                   "(config.model, of family %r, gives only the dtype).", config.init_from,
                   pretrained.config.family, model_lib.family_of(config.model).name)
    model = dataclasses.replace(hf_dropouts(pretrained.config), dtype=dtype_of(dtype))
    changed = {k: (v, getattr(model, k)) for k, v in dataclasses.asdict(
        pretrained.config).items() if "dropout" in k and getattr(model, k) != v}
    if changed:  # A bertjax-pretrained checkpoint fine-tunes as its export would.
      logging.info("Fine-tuning with the dropouts Hugging Face's class holds for these "
                   "weights: %s.", ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()))
    head = (reranker.start_head(config, pretrained) if config.task.name == rerank.NAME else
            finetuned.start_head(pretrained, config.init_from, config.init_keep_head,
                                 config.task.name))
    return Start(model, pretrained.params["encoder"], pretrained.tokenizer, head,
                 _kept_params(config, pretrained))
  if not config.tokenizer:
    raise ConfigError("set config.init_from (a pretrained checkpoint) or, to train from "
                      "scratch, config.tokenizer (a vocab.txt / tokenizer dir).")
  tokenizer = tok_lib.load_tokenizer(config.tokenizer)
  model = model_lib.config_from(config.model)
  if tokenizer.vocab_size > model.vocab_size:
    raise ConfigError(f"config.model.vocab_size={model.vocab_size} is smaller than the "
                      f"tokenizer's {tokenizer.vocab_size}; raise it.")
  return Start(model, None, tokenizer)


def _kept_params(config, pretrained) -> dict:
  """`Start.kept_params` of `pretrained`: a sparse model's (`sparse.kept_params`), the
  projection of a ColBERT model's init_from (`colbert.start_projection`); {} otherwise."""
  if config.task.name == colbert.NAME:
    projection = colbert.start_projection(config.init_from)
    return {} if projection is None else {"projection": projection}
  return sparse.kept_params(config, pretrained) if config.task.name == sparse.NAME else {}


def _refuse_other_tokenizer(config, tokenizer: tok_lib.Tokenizer, source: str) -> None:
  """ConfigError when `config.tokenizer` is set to another tokenizer than `tokenizer`,
  the one `source` (a checkpoint) was trained with and that is used."""
  if config.tokenizer:
    tok_lib.check_same_vocabulary(
        tok_lib.load_tokenizer(config.tokenizer), tokenizer,
        f"config.tokenizer={config.tokenizer}", source, "it is the one used: set "
        "config.tokenizer to it or leave it empty, or use a new --workdir")


def _refuse_other_family(config, family: str, workdir: str) -> None:
  """CheckpointError when `config.init_from` is a checkpoint of another model family
  than `family`, the one of the run being resumed in `workdir`."""
  if config.init_from:
    theirs = checkpoint_family(config.init_from)
    if theirs != family:
      raise CheckpointError(
          f"{workdir} holds a fine-tuning run of a {family!r} model but config.init_from="
          f"{config.init_from} is a {theirs!r} checkpoint: use a new --workdir to "
          "fine-tune it, or the run's own init_from to resume.")


def _with_model(config, model: Any) -> ml_collections.ConfigDict:
  """A copy of `config` whose model section is `model` (written to config.json)."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.model = ml_collections.ConfigDict({**model.to_dict(),
                                       "attention_impl": model.attention_impl or ""})
  return c


def freeze_labels(params, model: Any, freeze_cfg):
  """'frozen' / 'train' per parameter, by its depth in the encoder
  (`stack.trunk_depth`: 0 the embedding, i + 1 block i, L the final norm): the
  embedding when `freeze.embeddings`; with `freeze.top_k_layers=k >= 0` everything
  below the top k blocks (the embedding included; an encoder's final norm, above the
  blocks, trains with k >= 1); the pooler and the head always train. The blocks are
  unscanned (`_check`)."""
  k, top = freeze_cfg.top_k_layers, model.num_layers

  def label(path):
    depth = stack.trunk_depth([getattr(p, "key", None) for p in path], top)
    frozen = depth is not None and k >= 0 and depth <= max(top - k, 0) or (
        depth == 0 and freeze_cfg.embeddings)
    return "frozen" if frozen else "train"

  return jax.tree_util.tree_map_with_path(lambda p, _: label(p), params)


def _boxed(x) -> bool:
  return isinstance(x, nn.meta.AxisMetadata)


def make_optimizer(config, model: Any, num_steps: int, feature_based: bool = False):
  """The optimizer and schedule of `config.train` over `num_steps` steps (warm-up: a
  fraction of them), with the parameters `config.freeze` names kept fixed, or the
  whole encoder, without optimizer state, when `feature_based` (a task's
  `config.task.features`). An inference-free sparse model's query weights train at
  `config.task.query_learning_rate` (`sparse.own_rates`), or not at all when
  `config.task.query_weights_frozen`."""
  t = ml_collections.ConfigDict(config.train.to_dict())
  t.num_steps = num_steps
  t.warmup_steps = int(config.train.warmup_fraction * num_steps)
  if feature_based:  # The encoder frozen, stateless.
    # A bool per (possibly boxed) parameter: optax then drops a frozen one whole.
    frozen = lambda params: {k: jax.tree.map(lambda _: k == "encoder", v, is_leaf=_boxed)
                             for k, v in params.items()}
    return (optimizer.create_optimizer(t, frozen, stateless_frozen=True),
            optimizer.learning_rate_schedule(t))
  freezing = config.freeze.embeddings or config.freeze.top_k_layers >= 0
  fixed, frozen = sparse.fixed_params(config.task), None
  if freezing or fixed:
    def frozen(params):
      labels = (freeze_labels(params, model, config.freeze) if freezing else
                jax.tree.map(lambda _: "train", params))
      return {k: jax.tree.map(lambda label, k=k: label == "frozen" or k in fixed, v)
              for k, v in labels.items()}
  return (optimizer.create_optimizer(t, frozen, own_rates=sparse.own_rates(config.task)),
          optimizer.learning_rate_schedule(t))


def example_batch(features: base.Features) -> dict[str, np.ndarray]:
  """A one-row batch (shapes for initialisation)."""
  return rows(features, np.zeros(1, np.int64), np.ones(1, bool))


def rows(features: base.Features, idx: np.ndarray, valid: np.ndarray) -> dict:
  """The batch of feature rows `idx` at full length; rows where `valid` is False
  weigh 0."""
  return batching.rows(features.arrays, idx, valid)


def batcher(task: base.Task, features: base.Features, model: Any, groups: int = 1,
            row_multiple: int = 1) -> batching.Batcher:
  """The batches of `features` as `config.task.batching` says ('auto': 'pack' where the
  task packs and the model can pool a packed example, else 'bucket'; for packing,
  `groups`: the data-parallel size, `row_multiple`: grad_accum_steps)."""
  mode = task.cfg.batching
  poolable = task.packing != "cls" or model.classifier_pooling in stack.SLOT_POOLINGS
  if mode == "auto":
    mode = "pack" if task.packing and poolable else "bucket"
  if mode not in batching.BATCHING:
    raise ConfigError(f"config.task.batching={mode!r}: use 'auto' or one of "
                      f"{batching.BATCHING}.")
  if mode == "pack" and not task.packing:
    raise ConfigError(f"config.task.batching='pack' does not apply to task {task.name!r} "
                      "(only classification and fine-tuned tagging); use 'bucket'.")
  if mode == "pack" and not poolable:
    raise ConfigError(f"config.task.batching='pack' with config.model.classifier_pooling="
                      f"{model.classifier_pooling!r}, which pools after the head's own "
                      "layers: a packed row's examples cannot be; use 'bucket' or 'auto'.")
  return batching.Batcher(
      features.arrays, mode, batching.bucket_lengths(task.cfg.bucket_lengths,
                                                     task.max_seq_length),
      task.token_arrays, task.packing, groups, model.position_offset, model.pad_token_id,
      row_multiple)


def objective(task: base.Task, model: base.FinetuneModel, sample: dict) -> Objective:
  """The task's summed loss over its count of terms (`Task.loss`). The count depends
  on the batch alone (its weights), so it is taken from the task's loss of zero
  outputs, which XLA computes without the model. `sample`: a one-row batch."""
  sample = {k: jnp.asarray(v) for k, v in sample.items()}
  init = lambda rng: model.init(rng, sample)["params"]
  abstract = nn.unbox(jax.eval_shape(init, jax.random.key(0)))

  def sums(params, batch, rng):
    return {"loss": task.loss(task.train_outputs(model, params, batch, rng), batch)[0]}

  def counts(batch):
    shapes = jax.eval_shape(lambda p, b: model.apply({"params": p}, b), abstract, batch)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    return {"loss": task.loss(zeros, batch)[1]}

  return Objective(init=init, sums=sums, counts=counts,
                   loss=lambda s, c: s["loss"] / jnp.maximum(c["loss"], 1.0),
                   metrics=lambda s, c: {}, metric_names=())


def inference(config, task: base.Task, model_cfg: Any, sample: dict
              ) -> state_lib.Inference:
  """The task's model (encoder + head) on `config.mesh`, to predict with
  (`predictor`); `sample`: a one-row batch."""
  model = base.FinetuneModel(model_cfg, task.head(model_cfg))
  sample = {k: jnp.asarray(v) for k, v in sample.items()}
  return state_lib.inference(config, model, lambda rng: model.init(rng, sample)["params"])


def build(config, task: base.Task, model_cfg: Any, sample: dict, num_steps: int,
          mesh=None) -> state_lib.Setup:
  """The task's model (encoder + head), objective, optimizer, shardings and jitted
  step on `mesh` (default: `config.mesh`'s)."""
  model = base.FinetuneModel(model_cfg, task.head(model_cfg))
  tx, schedule = make_optimizer(config, model_cfg, num_steps, task.feature_based)
  return state_lib.setup(config, model, objective(task, model, sample), tx, schedule, mesh)


@functools.lru_cache(maxsize=2)  # The epochs a stream's prefetching spans.
def epoch_order(seed: int, epoch: int, n: int, batch_size: int) -> np.ndarray:
  """The feature order of one epoch, padded with -1 to whole batches."""
  perm = np.random.default_rng([seed, epoch]).permutation(n)
  pad = -len(perm) % batch_size
  return np.concatenate([perm, np.full(pad, -1, perm.dtype)])


def steps_per_epoch(n: int, batch_size: int) -> int:
  return max(1, math.ceil(n / batch_size))


def train_stream(batches: batching.Batcher, batch_size: int, seed: int, num_steps: int
                 ) -> grain.DatasetIterator:
  """The training batches of `num_steps` steps: epoch after epoch of shuffled features
  (`epoch_order`), the last batch of an epoch padded with rows of weight 0, each cut
  by `batches` (bucketed or packed). Batch k is a pure function of (seed, k), whatever
  the number of processes: this process gets its contiguous share of the global
  batch. A grain iterator: its position is checkpointed with the train state."""
  n = len(batches.lengths)
  per_epoch = steps_per_epoch(n, batch_size)
  share = batch_size // jax.process_count()
  mine = slice(jax.process_index() * share, (jax.process_index() + 1) * share)

  def batch(step: int) -> dict[str, np.ndarray]:
    epoch, i = divmod(step, per_epoch)
    order = epoch_order(seed, epoch, n, batch_size)[i * batch_size:(i + 1) * batch_size]
    return batches.batch(np.maximum(order, 0), order >= 0, mine)

  return iter(grain.MapDataset.range(num_steps).map(batch).to_iter_dataset(
      grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)))


def predictor(inference: state_lib.Inference, task: base.Task
              ) -> Callable[[Any, base.Features, int], tuple[dict[str, np.ndarray], float]]:
  """`(params, features, batch_size) -> (outputs, loss)`: the task's prediction outputs
  over all features ([N, ...] numpy, on every process) and the mean loss (over rows
  with a known target) of `inference`'s model. Each process feeds its share of every
  batch."""

  def eval_step(params, batch):
    out = inference.model.apply({"params": params}, batch, deterministic=True)
    total, count = task.loss(out, batch)
    maps = {k: batch[k] for k in batching.PACKING_MAPS if k in batch}  # Gathered alike.
    return dict(task.predict_outputs(out), loss_sum=total, loss_count=count, **maps)

  step = jax.jit(eval_step, in_shardings=(inference.params, inference.batch_sharding))
  dp = mesh_lib.data_parallel_size(inference.mesh, inference.rules)

  def outputs(params, features: base.Features, batch_size: int):
    n = len(features)
    batch_size = -(-batch_size // dp) * dp
    share = batch_size // jax.process_count()
    mine = slice(jax.process_index() * share, (jax.process_index() + 1) * share)
    batches = batcher(task, features, inference.model.config, dp)
    starts = range(0, n, batch_size)
    idx = lambda lo: np.minimum(np.arange(lo, lo + batch_size), n - 1)
    valid = lambda lo: np.arange(lo, lo + batch_size) < n
    most = 0
    if batches.mode == "pack":  # One shape: every batch with the most rows any needs.
      most = max(batches.packed_rows(idx(lo), valid(lo)) for lo in starts)
    parts, loss, count = [], 0.0, 0.0
    with jax.set_mesh(inference.mesh), nn.logical_axis_rules(inference.rules):
      for lo in progress.Progress("eval", len(starts), "batches").wrap(starts):
        batch = batches.batch(idx(lo), valid(lo), mine, most)
        out = step(params, mesh_lib.put_batch(batch, inference.batch_sharding))
        out = (multihost_utils.process_allgather(out, tiled=True)
               if jax.process_count() > 1 else jax.device_get(out))
        loss, count = loss + float(out.pop("loss_sum")), count + float(out.pop("loss_count"))
        maps = {k: out.pop(k) for k in batching.PACKING_MAPS if k in out}
        if maps:
          parts.append(batching.unpack(out, maps, batch_size, task.max_seq_length,
                                       task.token_outputs))
          continue
        T = batch["input_ids"].shape[-1]
        parts.append({k: np.pad(v, [(0, 0), (0, task.max_seq_length - T)]
                                + [(0, 0)] * (v.ndim - 2), constant_values=task.token_outputs[k])
                      if k in task.token_outputs else v for k, v in out.items()})
    merged = {k: np.concatenate([p[k] for p in parts])[:n] for k in parts[0]}
    return merged, loss / max(count, 1.0)

  return outputs


# Second dev sets (config.data field, split): their metrics and predictions file take
# the suffix (Hugging Face's run_glue names MNLI's mismatched accuracy eval_accuracy_mm).
SECOND_DEV_SETS = {"dev_mismatched": "_mm"}


def dev_sets(task: base.Task, config) -> list[tuple[str, list[dict], base.Features]]:
  """The dev sets the run scores, read and featurized before the run writes anything:
  (metric suffix, examples, features) of config.data.dev and of each second dev set
  given (`SECOND_DEV_SETS`)."""
  sets = []
  for split, suffix in [("dev", ""), *SECOND_DEV_SETS.items()]:
    if split == "dev" or config.data[split]:
      examples = read_split(task, config, split)
      sets.append((suffix, examples, task.featurize(examples, train=False)))
  return sets


def dev_evaluator(setup: state_lib.Setup, task: base.Task, config, workdir: str,
                  sets: list[tuple[str, list[dict], base.Features]]) -> Evaluator:
  """After training: the task's dev metrics (and the mean dev loss) of the decoded
  predictions of the dev `sets` (`dev_sets`); process 0 writes dev_results.json and
  dev_predictions.json. A second dev set's metrics are named with its suffix (MNLI's
  mismatched one: `accuracy_mm`, `loss_mm`) and its predictions go to
  dev_predictions_mm.json."""
  outputs = predictor(setup.inference, task)

  def run(params, step: int) -> dict[str, float]:
    del step  # after the last step only
    scores = {}
    for suffix, examples, features in sets:
      out, loss = outputs(params, features, config.train.eval_batch_size)
      predictions = task.decode(out, features, examples)
      part = dict(task.score(predictions, examples), loss=loss)
      scores.update({k + suffix: v for k, v in part.items()})
      if jax.process_index() == 0:
        name, ext = os.path.splitext(files.DEV_PREDICTIONS_FILE)
        with open(os.path.join(workdir, name + suffix + ext), "w") as f:
          json.dump(predictions, f, indent=1)
    if jax.process_index() == 0:
      with open(os.path.join(workdir, files.DEV_RESULTS_FILE), "w") as f:
        json.dump(scores, f, indent=2)
    return scores

  return Evaluator("dev", run, every=0)


def read_split(task: base.Task, config, split: str) -> list[dict]:
  path = config.data[split]
  if not path:
    raise ConfigError(f"config.data.{split} is empty; give a file or tfds:NAME.")
  examples = task.read(path, split)
  if not examples:
    raise ConfigError(f"config.data.{split}={path} holds no examples.")
  return examples


def _check(config, model: Any) -> None:
  """The checks that need the encoder (the rest: `check_config`). A ModernBERT local
  window longer than `task.max_seq_length` is no error here, unlike in pretraining
  (`modernbert.check_window`): the window is the pretrained model's, and rows shorter
  than it (short tasks, small buckets) are attended whole, as Hugging Face does."""
  if config.task.max_seq_length > model.max_length:
    raise ConfigError(f"config.task.max_seq_length={config.task.max_seq_length} exceeds "
                      f"the model's {model.max_length} positions.")
  k = config.freeze.top_k_layers
  if k > model.num_layers:
    raise ConfigError(f"config.freeze.top_k_layers={k} exceeds the model's "
                      f"{model.num_layers} layers.")
  if k >= 0 and model.scan_layers:
    raise ConfigError(
        f"config.freeze.top_k_layers={k} freezes whole blocks, but the encoder's are "
        "scanned (one stacked parameter): " + (
            f"config.init_from={config.init_from} has scan_layers=True; start from an "
            "unscanned export of it (python -m bertjax.convert --to=hf)"
            if config.init_from else "set config.model.scan_layers=False")
        + " or config.freeze.top_k_layers=-1.")


def initial_params(setup: state_lib.Setup, config, encoder_params, head, labels) -> Any:
  """The head drawn from `config.seed` (or a kept fine-tuned `head`, a TaskHead
  that must predict `labels`) and the encoder `encoder_params` (pretrained) or drawn
  too (None)."""
  if head is not None:
    head = jax.device_put(finetuned.kept_head_params(
        head, labels, setup.abstract.params["head"]), setup.shardings.params["head"],
        may_alias=False)
  if encoder_params is None:
    params = setup.init_params(config)
    return params if head is None else dict(params, head=head)
  if jax.tree.structure(encoder_params) != jax.tree.structure(
      setup.abstract.params["encoder"]):
    raise CheckpointError("the pretrained encoder's parameters do not match the model "
                          "built from its config.")
  # Only what is not given is drawn. A copy of the encoder (may_alias=False): the train
  # step donates the state, and on one device an aliased `encoder_params` would be
  # deleted before the next run from the same start (a sweep's next point, another task).
  encoder = jax.device_put(
      jax.tree.map(lambda x, a: jnp.asarray(x, a.dtype), encoder_params,
                   setup.abstract.params["encoder"]), setup.shardings.params["encoder"],
      may_alias=False)
  return {"encoder": encoder,
          "head": setup.init_params(config, "head") if head is None else head}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Checks `config` (`check_config`), then runs (or resumes) one fine-tuning run in
  `workdir`; returns the dev metrics ({} when stopped by SIGTERM)."""
  check_config(config)
  return train(config, workdir)


def inputs(config: ml_collections.ConfigDict) -> dict[str, str]:
  """What a fine-tuning run reads ({config field: path}): no run writes into them
  (`writes.claim`)."""
  found = {"config.init_from": config.init_from, "config.tokenizer": config.tokenizer,
           **{f"config.data.{k}": config.data[k] for k in ("train", "dev", *SECOND_DEV_SETS)
              if k in config.data}}
  return {k: os.fspath(v) for k, v in found.items() if v}


@dataclasses.dataclass
class Opened:
  """A run opened in its workdir (`open_run`): its `start`, whether it is `resuming`,
  and the resumable settings the config changes (logged by `begin`)."""

  start: Start
  resuming: bool
  changes: list[str]


def open_run(config: ml_collections.ConfigDict, workdir: str, start: Start | None
             ) -> Opened:
  """The run's start in `workdir` (the saved run's encoder config and tokenizer when
  resuming, after checking that the config's agree; else `start` or `load_start`),
  checked against the config and the run being resumed (`workdir_lib.check_resume`).
  Writes nothing: `begin` does, once the data is read."""
  writes.claim(workdir, writes.FINETUNING, config.task.name, inputs(config))
  resuming = workdir_lib.is_finetuned(workdir)  # Read by every process before `begin`.
  if resuming:
    saved = workdir_lib.open_finetuned(workdir, read_params=False)
    _refuse_other_tokenizer(config, saved.tokenizer, f"the run being resumed in {workdir}")
    _refuse_other_family(config, saved.model.family, workdir)
    if saved.task["name"] != config.task.name:
      raise CheckpointError(f"{workdir} holds a {saved.task['name']!r} run but "
                            f"config.task.name={config.task.name!r}: use a new --workdir.")
    start = Start(saved.model, None, saved.tokenizer)
  elif start is None:
    start = load_start(config)
  _check(config, start.model)
  changes = workdir_lib.check_resume(workdir, _with_model(config, start.model))
  return Opened(start, resuming, changes)


def begin(config: ml_collections.ConfigDict, workdir: str, opened: Opened,
          task_record: dict[str, Any]) -> None:
  """Writes the run's files once every check has passed and every input has been read:
  run.json, config.json (with the resumable changes, logged) and, for a new run, the
  tokenizer and task.json (`task_record`: name, labels, num_steps). A resumed run whose
  data gives another step count than its task.json is refused in one line."""
  if opened.resuming:
    saved = workdir_lib.task_info(workdir)["num_steps"]
    if saved != task_record["num_steps"]:
      raise CheckpointError(
          f"{workdir} holds a run of {saved} steps but its data now gives "
          f"{task_record['num_steps']} (config.data.train={config.data.train} changed): "
          "resume with the run's data, or use a new --workdir.")
  for change in opened.changes:
    logging.info("Resuming with %s.", change)
  if jax.process_index() == 0:
    writes.record(workdir, writes.FINETUNING, config.task.name)
  workdir_lib.save_config(workdir, _with_model(config, opened.start.model))
  if not opened.resuming and jax.process_index() == 0:
    opened.start.tokenizer.save(os.path.join(workdir, files.TOKENIZER_DIR))
    with open(os.path.join(workdir, files.TASK_FILE), "w") as f:
      json.dump(task_record, f)


def train(config: ml_collections.ConfigDict, workdir: str, start: Start | None = None
          ) -> dict[str, float]:
  """`run` of a checked config (a sweep checks once, then trains each point): `start`
  (the loaded pretrained encoder) lets a sweep load it once. An embedding model
  ('retrieval') or a sparse one ('sparse') trains on its own data, objective and
  evaluation (`bertjax.tasks.retrieval.train`), as does a ColBERT one ('colbert')."""
  if config.task.name in base.RETRIEVER_TASKS:
    config = retrieval.resolve(config)
    retrieval.check_config(config)
    opened = open_run(config, workdir, start)
    return retrieval.train(config, workdir, opened.start, opened.resuming,
                           lambda: load_start(config),
                           functools.partial(make_optimizer, config),
                           functools.partial(begin, config, workdir, opened))
  if config.task.name == rerank.NAME:  # A cross-encoder folder's head and activation.
    config = rerank.resolve(config)
  opened = open_run(config, workdir, start)
  start, resuming = opened.start, opened.resuming
  task = get_task(config.task.name)(config.task, start.tokenizer, config.task.max_seq_length)
  train_examples = read_split(task, config, "train")
  task.labels = (workdir_lib.task_info(workdir)["labels"] if resuming
                 else task.fit_labels(train_examples))
  train = task.featurize(train_examples, train=True)
  num_steps = steps_per_epoch(len(train), config.train.batch_size) * config.train.num_epochs
  dev = dev_sets(task, config)
  begin(config, workdir, opened, {"name": task.name, "labels": task.labels,
                                  "num_steps": num_steps})
  setup = build(config, task, start.model, example_batch(train), num_steps)
  trainer = Trainer(setup, config, workdir, num_steps)
  evaluate = dev_evaluator(setup, task, config, workdir, dev)
  trainer.info("Task %s: %d train features, %d labels, %d steps.", task.name,
                   len(train), len(task.labels), num_steps)

  def init_params():
    first = load_start(config) if resuming else start  # Stopped before its first checkpoint.
    return initial_params(setup, config, first.encoder_params, first.head, task.labels)

  batches = batcher(task, train, start.model,
                    mesh_lib.data_parallel_size(setup.mesh, setup.rules),
                    config.train.grad_accum_steps)
  trainer.info("Batching: %s%s.", batches.mode, "" if batches.mode == "max" else
               f", bucket lengths {batches.buckets}")
  data = train_stream(batches, config.train.batch_size, config.seed, num_steps)
  with compilation.logged(trainer.info):
    return trainer.fit(data, [evaluate], init_params).get("dev", {})
