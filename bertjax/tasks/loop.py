"""The one fine-tuning loop every task shares.

Start from a pretrained encoder (`config.init_from`: a bertjax workdir or a Hugging
Face dir) or from scratch, add the task's head, train `num_epochs` over shuffled
features with BERT's warm-up + linear decay, checkpoint with orbax (resume is exact:
the data order is a pure function of (seed, epoch), so the step alone says where the
data stands), evaluate on dev and write `dev_results.json` and `dev_predictions.json`.

The workdir holds config.json (the model section is the encoder actually used),
tokenizer/, task.json (labels and the step count) and checkpoints/.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax import api, checkpoint as ckpt_lib, config_checks, files, progress
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import CheckpointError, ConfigError, TrainingError
from bertjax.model import ModelConfig
from bertjax.parallel import mesh as mesh_lib
from bertjax.tasks import base, get_task
from bertjax.train import optimizer
from bertjax.train.logger import MetricLogger, format_metrics
from bertjax.train.loop import Preemption
from bertjax.train.step import TrainState

@dataclasses.dataclass
class Start:
  """Where a run starts: the encoder's config, its weights (None: random or resumed)
  and the tokenizer."""

  model: ModelConfig
  encoder_params: Any
  tokenizer: tok_lib.Tokenizer


def load_start(config: ml_collections.ConfigDict) -> Start:
  """The pretrained encoder of `config.init_from`, or a random one of `config.model`
  with the tokenizer of `config.tokenizer`."""
  dtype = config.model.dtype
  if config.init_from:
    pretrained = api.load_pretrained(config.init_from)
    _refuse_other_tokenizer(config, pretrained.tokenizer, f"config.init_from={config.init_from}")
    model = dataclasses.replace(pretrained.config, dtype=jnp.dtype(dtype))
    return Start(model, pretrained.params["encoder"], pretrained.tokenizer)
  if not config.tokenizer:
    raise ConfigError("set config.init_from (a pretrained checkpoint) or, to train from "
                      "scratch, config.tokenizer (a vocab.txt / tokenizer dir).")
  tokenizer = tok_lib.load_tokenizer(config.tokenizer)
  model = ModelConfig.from_config(config.model)
  if tokenizer.vocab_size > model.vocab_size:
    raise ConfigError(f"config.model.vocab_size={model.vocab_size} is smaller than the "
                      f"tokenizer's {tokenizer.vocab_size}; raise it.")
  return Start(model, None, tokenizer)


def _refuse_other_tokenizer(config, tokenizer: tok_lib.Tokenizer, source: str) -> None:
  """ConfigError when `config.tokenizer` is set to another tokenizer than `tokenizer`,
  the one `source` (a checkpoint) was trained with and that is used."""
  if config.tokenizer:
    tok_lib.check_same_vocabulary(
        tok_lib.load_tokenizer(config.tokenizer), tokenizer,
        f"config.tokenizer={config.tokenizer}", source, "it is the one used: set "
        "config.tokenizer to it or leave it empty, or use a new --workdir")


def _with_model(config, model: ModelConfig) -> ml_collections.ConfigDict:
  """A copy of `config` whose model section is `model` (written to config.json)."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.model = ml_collections.ConfigDict({**model.to_dict(),
                                       "attention_impl": model.attention_impl or ""})
  return c


def freeze_labels(params, model: ModelConfig, freeze_cfg):
  """'frozen' / 'train' per parameter: embeddings when `freeze.embeddings`; with
  `freeze.top_k_layers=k >= 0` everything below the top k blocks (embeddings
  included); the pooler and the head always train."""
  k = freeze_cfg.top_k_layers
  if k > model.num_layers:
    raise ConfigError(f"config.freeze.top_k_layers={k} exceeds the model's "
                      f"{model.num_layers} layers.")

  def label(path):
    names = [getattr(p, "key", None) for p in path]
    if names[0] != "encoder":
      return "train"
    if names[1] == "embeddings":
      return "frozen" if freeze_cfg.embeddings or k >= 0 else "train"
    if names[1] == "layers" and k >= 0:
      raise ConfigError("config.freeze.top_k_layers needs config.model.scan_layers=False.")
    if names[1].startswith("layer_") and k >= 0:
      return "frozen" if int(names[1][len("layer_"):]) < model.num_layers - k else "train"
    return "train"

  return jax.tree_util.tree_map_with_path(lambda p, _: label(p), params)


def train_settings(config, num_steps: int) -> ml_collections.ConfigDict:
  """config.train with the step count of the data and warm-up as a fraction of it."""
  t = ml_collections.ConfigDict(config.train.to_dict())
  t.num_steps = num_steps
  t.warmup_steps = int(config.train.warmup_fraction * num_steps)
  return t


def make_optimizer(config, model: ModelConfig, num_steps: int):
  settings = train_settings(config, num_steps)
  tx = optimizer.create_optimizer(settings)
  if config.freeze.embeddings or config.freeze.top_k_layers >= 0:
    # Frozen parameters get a zero update (their unused moments keep the state's shape
    # equal to the parameters', so shardings and checkpoints stay uniform).
    tx = optax.chain(tx, optax.masked(optax.set_to_zero(), lambda params: jax.tree.map(
        lambda label: label == "frozen", freeze_labels(params, model, config.freeze))))
  return tx, optimizer.learning_rate_schedule(settings)


def example_batch(features: base.Features) -> dict[str, np.ndarray]:
  """A one-row batch (shapes for initialisation)."""
  batch = {k: v[:1] for k, v in features.arrays.items()}
  batch["example_weights"] = np.ones((1,), np.float32)
  return batch


class Runner:
  """The model, optimizer, shardings and jitted steps of one task + encoder."""

  def __init__(self, config, task: base.Task, model_cfg: ModelConfig, sample: dict,
               num_steps: int):
    self.config, self.task = config, task
    self.rules = tuple(map(tuple, config.logical_axis_rules))
    self.mesh = mesh_lib.create_mesh(config.mesh)
    self.dp = mesh_lib.data_parallel_size(self.mesh, self.rules)
    self.model = base.FinetuneModel(model_cfg, task.head(model_cfg))
    self.tx, self.schedule = make_optimizer(config, model_cfg, num_steps)
    sample = {k: jnp.asarray(v) for k, v in sample.items()}

    def init_params():
      return self.model.init(jax.random.key(config.seed), sample)["params"]

    def init_boxed():
      params = init_params()
      return TrainState(jnp.zeros((), jnp.int32), params, self.tx.init(params))

    boxed = jax.eval_shape(init_boxed)
    self.abstract = nn.unbox(boxed)
    self.state_shardings = mesh_lib.logical_shardings(boxed, self.mesh, self.rules)
    self.params_shardings = self.state_shardings.params
    self._init_params = jax.jit(lambda: nn.unbox(init_params()),
                                out_shardings=self.params_shardings)
    self.batch_sharding = mesh_lib.batch_sharding(self.mesh, self.rules)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      self.train_step = jax.jit(self._train_step, in_shardings=(
          self.state_shardings, self.batch_sharding), out_shardings=(
              self.state_shardings, None), donate_argnums=0)
      self.eval_step = jax.jit(self._eval_step, in_shardings=(
          self.params_shardings, self.batch_sharding))

  def init_state(self, encoder_params=None) -> TrainState:
    """A fresh state: the head from `config.seed`, the encoder from `encoder_params`
    (pretrained) or random."""
    params = self._init_params()
    if encoder_params is not None:
      want = jax.tree.structure(params["encoder"])
      if jax.tree.structure(encoder_params) != want:
        raise CheckpointError("the pretrained encoder's parameters do not match the "
                              "model built from its config.")
      # A copy (may_alias=False): the train step donates the state, and on one device
      # an aliased `encoder_params` would be deleted before the next run from the same
      # start (a sweep's next point, another task).
      params = dict(params, encoder=jax.device_put(
          jax.tree.map(lambda x, a: jnp.asarray(x, a.dtype), encoder_params,
                       self.abstract.params["encoder"]), self.params_shardings["encoder"],
          may_alias=False))
    opt_state = jax.jit(self.tx.init, out_shardings=self.state_shardings.opt_state)(params)
    # Placed like the step's output: an unplaced step would retrace the step once.
    step = jax.device_put(jnp.zeros((), jnp.int32), self.state_shardings.step)
    return TrainState(step, params, opt_state)

  def _train_step(self, state: TrainState, batch: dict):
    rng = jax.random.fold_in(jax.random.key(self.config.seed), state.step)

    def loss_fn(params):
      out = self.model.apply({"params": params}, batch, deterministic=False,
                             rngs={"dropout": rng})
      total, count = self.task.loss(out, batch)
      return total / jnp.maximum(count, 1.0)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(state.step + 1, params, opt_state), {
        "loss": loss, "grad_norm": optax.tree.norm(grads),
        "learning_rate": self.schedule(state.step)}

  def _eval_step(self, params, batch: dict):
    out = self.model.apply({"params": params}, batch, deterministic=True)
    total, count = self.task.loss(out, batch)
    return dict(self.task.predict_outputs(out), loss_sum=total, loss_count=count)

  def put(self, batch: dict) -> dict:
    return mesh_lib.put_batch(batch, self.batch_sharding)

  def outputs(self, params, features: base.Features, batch_size: int
              ) -> tuple[dict[str, np.ndarray], float]:
    """The task's prediction outputs over all features ([N, ...] numpy) and the mean
    loss (over rows that have a known target)."""
    n = len(features)
    batch_size = -(-batch_size // self.dp) * self.dp
    parts, loss, count = [], 0.0, 0.0
    starts = range(0, n, batch_size)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      for lo in progress.Progress("eval", len(starts), "batches").wrap(starts):
        idx = np.arange(lo, lo + batch_size)
        batch = rows(features, np.minimum(idx, n - 1), idx < n)
        out = jax.device_get(self.eval_step(params, self.put(batch)))
        loss, count = loss + float(out.pop("loss_sum")), count + float(out.pop("loss_count"))
        parts.append(out)
    merged = {k: np.concatenate([p[k] for p in parts])[:n] for k in parts[0]}
    return merged, loss / max(count, 1.0)


def rows(features: base.Features, idx: np.ndarray, valid: np.ndarray) -> dict:
  """The batch of feature rows `idx`; rows where `valid` is False weigh 0."""
  batch = {k: v[idx] for k, v in features.arrays.items()}
  batch["example_weights"] = valid.astype(np.float32)
  return batch


def epoch_order(seed: int, epoch: int, n: int, batch_size: int) -> np.ndarray:
  """The feature order of one epoch, padded with -1 to whole batches."""
  perm = np.random.default_rng([seed, epoch]).permutation(n)
  pad = -len(perm) % batch_size
  return np.concatenate([perm, np.full(pad, -1, perm.dtype)])


def steps_per_epoch(n: int, batch_size: int) -> int:
  return max(1, math.ceil(n / batch_size))


def read_split(task: base.Task, config, split: str) -> list[dict]:
  path = config.data[split]
  if not path:
    raise ConfigError(f"config.data.{split} is empty; give a file or tfds:NAME.")
  examples = task.read(path, split)
  if not examples:
    raise ConfigError(f"config.data.{split}={path} holds no examples.")
  return examples


def evaluate(runner: Runner, params, task: base.Task, features: base.Features,
             examples: Sequence[dict]) -> tuple[dict[str, float], list]:
  outputs, loss = runner.outputs(params, features, runner.config.train.eval_batch_size)
  predictions = task.decode(outputs, features, examples)
  scores = task.score(predictions, examples)
  scores["loss"] = loss
  return scores, predictions


def _check(config, model: ModelConfig) -> None:
  """The checks that need the encoder (the rest: `config_checks.finetuning`)."""
  if config.task.max_seq_length + model.position_offset > model.max_position_embeddings:
    raise ConfigError(f"config.task.max_seq_length={config.task.max_seq_length} exceeds "
                      f"the model's {model.max_position_embeddings - model.position_offset} "
                      "positions.")


def finetune(config: ml_collections.ConfigDict, workdir: str, start: Start | None = None
             ) -> dict[str, float]:
  """Runs (or resumes) one fine-tuning run in `workdir`; returns the dev metrics.
  `start` (the loaded pretrained encoder) lets a sweep load it once."""
  config_checks.finetuning(config)
  os.makedirs(workdir, exist_ok=True)
  task_path = os.path.join(workdir, files.TASK_FILE)
  resuming = os.path.isfile(task_path)
  if resuming:
    saved = ckpt_lib.load_config(workdir)
    tokenizer = tok_lib.load_tokenizer(os.path.join(workdir, files.TOKENIZER_DIR))
    _refuse_other_tokenizer(config, tokenizer, f"the run being resumed in {workdir}")
    start = Start(ModelConfig.from_config(saved.model), None, tokenizer)
  elif start is None:
    start = load_start(config)
  _check(config, start.model)
  run_config = _with_model(config, start.model)
  ckpt_lib.save_config(workdir, run_config)
  log = MetricLogger(workdir)
  task = get_task(config.task.name)(config.task, start.tokenizer, config.task.max_seq_length)
  train_examples = read_split(task, config, "train")
  dev_examples = read_split(task, config, "dev")
  if resuming:
    with open(task_path) as f:
      task.labels = json.load(f)["labels"]
  else:
    task.labels = task.fit_labels(train_examples)
  train = task.featurize(train_examples, train=True)
  dev = task.featurize(dev_examples, train=False)
  B = config.train.batch_size
  per_epoch = steps_per_epoch(len(train), B)
  num_steps = per_epoch * config.train.num_epochs
  if not resuming and jax.process_index() == 0:
    start.tokenizer.save(os.path.join(workdir, files.TOKENIZER_DIR))
    with open(task_path, "w") as f:
      json.dump({"name": task.name, "labels": task.labels, "num_steps": num_steps}, f)
  runner = Runner(config, task, start.model, example_batch(train), num_steps)
  if B % runner.dp:
    raise ConfigError(f"config.train.batch_size={B} is not divisible by the {runner.dp} "
                      "data-parallel devices.")
  log.info("Task %s: %d train features, %d dev examples, %d labels, %d steps.",
           task.name, len(train), len(dev_examples), len(task.labels), num_steps)

  checkpointer = ckpt_lib.Checkpointer(workdir, config.train.max_to_keep)
  step0 = checkpointer.latest_step()
  if step0 is not None:
    state = TrainState(**checkpointer.restore(
        step0, ckpt_lib.abstract_on(runner.abstract, runner.state_shardings).fields()))
    log.info("Resumed from step %d.", step0)
  else:
    if resuming:
      start = load_start(config)
    state = runner.init_state(start.encoder_params)
  step = int(jax.device_get(state.step))
  preemption = Preemption(checkpointer)
  # A bar on a terminal; elsewhere the step lines below carry its rate and ETA.
  bar = progress.Progress("train", num_steps, "steps", initial=step, interval=None)
  try:
    with jax.set_mesh(runner.mesh), nn.logical_axis_rules(runner.rules):
      while step < num_steps:
        epoch, i = divmod(step, per_epoch)
        order = epoch_order(config.seed, epoch, len(train), B)[i * B:(i + 1) * B]
        state, m = runner.train_step(state, runner.put(rows(train, np.maximum(order, 0),
                                                            order >= 0)))
        step += 1
        bar.update()
        done = step == num_steps
        if step % config.train.log_every == 0 or done:
          m = {k: float(v) for k, v in jax.device_get(m).items()}
          if not math.isfinite(m["loss"]):
            raise TrainingError(f"non-finite loss at step {step}; lower "
                                "config.train.learning_rate or check the data.")
          log.write(step, m)
          log.info("step %d/%d | %s | %s", step, num_steps, format_metrics(m), bar.status())
        stop = preemption.reached(step)
        if step % config.train.checkpoint_every == 0 or done or stop:
          checkpointer.save(step, state.fields(), None, force=True)
        if stop:
          log.info("SIGTERM: saved step %d; exiting. Rerun the same command to resume.", step)
          return {}
  finally:
    bar.close()
    preemption.restore()
    checkpointer.wait()
    checkpointer.close()
  scores, predictions = evaluate(runner, state.params, task, dev, dev_examples)
  log.write(step, scores, prefix="dev")
  log.info("dev | %s", format_metrics(scores))
  log.close()
  if jax.process_index() == 0:
    with open(os.path.join(workdir, files.DEV_RESULTS_FILE), "w") as f:
      json.dump(scores, f, indent=2)
    with open(os.path.join(workdir, files.DEV_PREDICTIONS_FILE), "w") as f:
      json.dump(predictions, f, indent=1)
  return scores
