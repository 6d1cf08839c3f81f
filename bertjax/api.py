"""Load a pretrained encoder (a Hugging Face dir, a bertjax pretraining workdir or a
fine-tuning workdir) and run it; load a fine-tuned model whole.

    pretrained = load_pretrained("path/to/model")
    out = pretrained.encode(["a sentence", "another one"])
    out["hidden_states"]  # [layers + 1, batch, seq, hidden], embedding output first

    finetuned = load_finetuned("path/to/finetuning/workdir")  # encoder + task head
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import convert, files
from bertjax.data.tokenizer import Tokenizer, load_tokenizer
from bertjax.errors import CheckpointError
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import ModelConfig, dtype_of

_BUCKET = 16  # sequence lengths are padded to a multiple of this: fewer recompilations


@dataclasses.dataclass
class TaskHead:
  """The task head of a fine-tuning workdir: the task's name, its labels in the head's
  output order ([] for regression and span QA) and the head's parameters."""

  name: str
  labels: list[str]
  params: Any


@dataclasses.dataclass
class Pretrained:
  """A model with its parameters and tokenizer. `params` has BertForPreTraining's tree;
  heads the checkpoint lacks ('mlm', 'nsp', the pooler) are absent. Loaded from a
  fine-tuning workdir: the encoder, and its task head in `head`."""

  config: ModelConfig
  params: dict
  tokenizer: Tokenizer
  model: BertForPreTraining
  head: TaskHead | None = None

  def __post_init__(self):
    self._encode = jax.jit(functools.partial(self.model.apply,
                                             method=BertForPreTraining.encode))
    self._logits = jax.jit(self.model.apply)

  @property
  def has_mlm(self) -> bool:
    return "mlm" in self.params

  def _inputs(self, texts, text_pairs, max_length) -> tuple[dict[str, np.ndarray], int]:
    """Tokenised batch padded to a length bucket, and the unpadded length T."""
    batch = self.tokenizer(texts, text_pairs, max_length=max_length)
    length = batch["input_ids"].shape[1]
    limit = self.config.max_position_embeddings - self.config.position_offset
    if length > limit:
      raise CheckpointError(f"inputs of {length} tokens exceed the model's {limit} "
                            "positions; lower max_length.")
    padded = min(-(-length // _BUCKET) * _BUCKET, limit)
    pad = [(0, 0), (0, padded - length)]
    batch = {"input_ids": np.pad(batch["input_ids"], pad,
                                 constant_values=self.tokenizer.pad_id),
             "attention_mask": np.pad(batch["attention_mask"], pad),
             "token_type_ids": np.pad(batch["token_type_ids"], pad)}
    return batch, length

  def encode(self, texts: str | Sequence[str], text_pairs=None, max_length: int = 512
             ) -> dict[str, np.ndarray]:
    """Tokenises and encodes a batch. Returns numpy `input_ids` and `attention_mask`
    [B, T], `hidden_states` [L+1, B, T, E] (embedding output first), `pooled` [B, E]
    when the model has a pooler."""
    batch, length = self._inputs(texts, text_pairs, max_length)
    out = self._encode({"params": self.params}, batch["input_ids"],
                       batch["attention_mask"], batch["token_type_ids"])
    result = {"input_ids": batch["input_ids"][:, :length],
              "attention_mask": batch["attention_mask"][:, :length],
              "hidden_states": np.asarray(out["hidden_states"][:, :, :length])}
    if "pooled" in out:
      result["pooled"] = np.asarray(out["pooled"])
    return result

  def logits(self, texts: str | Sequence[str], text_pairs=None, max_length: int = 512
             ) -> dict[str, np.ndarray]:
    """Pretraining heads on a batch: numpy `input_ids`, `attention_mask` [B, T],
    `mlm_logits` [B, T, vocab] (float32) and, with NSP, `nsp_logits` [B, 2]."""
    if not self.has_mlm:
      raise CheckpointError("this checkpoint has no MLM head (it holds the encoder only).")
    batch, length = self._inputs(texts, text_pairs, max_length)
    out = self._logits({"params": self.params}, batch["input_ids"],
                       batch["attention_mask"], batch["token_type_ids"])
    result = {"input_ids": batch["input_ids"][:, :length],
              "attention_mask": batch["attention_mask"][:, :length],
              "mlm_logits": np.asarray(out["mlm_logits"][:, :length])}
    if "nsp_logits" in out:
      result["nsp_logits"] = np.asarray(out["nsp_logits"])
    return result


@dataclasses.dataclass
class Finetuned:
  """A fine-tuning workdir: its run config (config.json), its task (labels set), the
  encoder's config, the tokenizer and `params` {'encoder', 'head'} (float32 numpy)."""

  config: Any
  task: Any
  model: ModelConfig
  params: dict
  tokenizer: Tokenizer


def is_finetuned(path: str) -> bool:
  """Whether `path` is a fine-tuning workdir (it has the task file)."""
  return os.path.isfile(os.path.join(path, files.TASK_FILE))


def task_info(path: str) -> dict[str, Any]:
  """A fine-tuning workdir's task file: {'name', 'labels', 'num_steps'}."""
  if not is_finetuned(path):
    raise CheckpointError(f"{path} has no {files.TASK_FILE}: give a fine-tuning workdir "
                          "(python -m bertjax.finetune --workdir=...).")
  with open(os.path.join(path, files.TASK_FILE)) as f:
    return json.load(f)


def _restore_params(workdir: str) -> dict:
  """The `params` of the newest checkpoint of a workdir (numpy, on the host), read
  alone: the optimizer state is neither built nor read."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from bertjax import checkpoint  # pylint: disable=g-import-not-at-top
  ckpt = checkpoint.Checkpointer(workdir, read_only=True)
  step = ckpt.latest_step()
  ckpt.close()
  if step is None:
    raise CheckpointError(f"{workdir} has no checkpoint yet; finish (or resume) the run.")
  path = os.path.join(workdir, files.CHECKPOINT_DIR, str(step), "state")
  tree = ocp.StandardCheckpointer().metadata(path).item_metadata.tree
  target = {"params": jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), tree["params"])}
  with ocp.PyTreeCheckpointer() as reader:
    restored = reader.restore(path, args=ocp.args.PyTreeRestore(
        item=target, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(
            restore_type=np.ndarray), target), partial_restore=True))
  return jax.tree.map(lambda x: np.asarray(x, np.float32), restored["params"])


def load_finetuned(path: str) -> Finetuned:
  """The fine-tuned model of a fine-tuning workdir (`python -m bertjax.finetune`)."""
  from bertjax import checkpoint  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import get_task  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  saved = task_info(path)
  config = checkpoint.load_config(path)
  tokenizer = load_tokenizer(os.path.join(path, files.TOKENIZER_DIR))
  task = get_task(saved["name"])(config.task, tokenizer, config.task.max_seq_length)
  task.labels = saved["labels"]
  return Finetuned(config, task, ModelConfig.from_config(config.model), _restore_params(path),
                   tokenizer)


def _load_finetuned_encoder(path: str) -> tuple[ModelConfig, dict, TaskHead]:
  finetuned = load_finetuned(path)
  head = TaskHead(finetuned.task.name, list(finetuned.task.labels),
                  finetuned.params["head"])
  return finetuned.model, {"encoder": finetuned.params["encoder"]}, head


def start_head(pretrained: Pretrained, init_from: str, keep: bool, task_name: str):
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


def _workdir_tokenizer(path: str) -> Tokenizer:
  tokenizer_dir = os.path.join(path, files.TOKENIZER_DIR)
  if not os.path.isdir(tokenizer_dir):
    raise CheckpointError(f"{path} has no tokenizer/ directory (Tokenizer.save writes it).")
  return load_tokenizer(tokenizer_dir)


def _load_workdir(path: str) -> tuple[ModelConfig, Any]:
  from bertjax import checkpoint  # pylint: disable=g-import-not-at-top
  config, params = checkpoint.restore_params(path)
  return ModelConfig.from_config(config.model), params


def load_pretrained(path: str, dtype: str = "float32") -> Pretrained:
  """A Hugging Face model dir (config.json with a BERT / RoBERTa / XLM-R model_type,
  weights, tokenizer files), a bertjax pretraining workdir (config.json, checkpoints/,
  tokenizer/) or a fine-tuning workdir (its encoder, and its task head in `head`),
  with parameters and computation in `dtype`."""
  path = os.fspath(path)
  dtype = dtype_of(dtype, "dtype")
  config_path = os.path.join(path, files.CONFIG_FILE)
  if not os.path.isfile(config_path):
    what = "does not exist" if not os.path.exists(path) else "has no config.json"
    raise CheckpointError(f"{path} {what}: give a Hugging Face model dir or a bertjax "
                          "workdir.")
  with open(config_path) as f:
    raw = json.load(f)
  if "model_type" in raw:
    convert.check_supported(raw)
    tokenizer, vocab_size, load = load_tokenizer(path), raw.get("vocab_size"), convert.load_hf
  elif isinstance(raw.get("model"), dict):
    tokenizer, vocab_size, load = (_workdir_tokenizer(path), raw["model"].get("vocab_size"),
                                   _load_finetuned_encoder if is_finetuned(path)
                                   else _load_workdir)
  else:
    raise CheckpointError(f"{config_path} is neither a Hugging Face config (model_type) "
                          "nor a bertjax config (a model section).")
  if vocab_size is not None and tokenizer.vocab_size > vocab_size:  # before the weights
    raise CheckpointError(
        f"{path}: the tokenizer has {tokenizer.vocab_size} ids but the checkpoint's "
        f"vocabulary only {vocab_size}: these tokenizer files do not belong to these "
        "weights; put the tokenizer the model was trained with next to them.")
  config, params, *head = load(path)
  config = dataclasses.replace(config, dtype=dtype, param_dtype=dtype)
  params = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
  return Pretrained(config, params, tokenizer, BertForPreTraining(config), *head)
