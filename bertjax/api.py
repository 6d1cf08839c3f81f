"""Load a pretrained encoder (a Hugging Face dir or a bertjax workdir) and run it.

    pretrained = load_pretrained("path/to/model")
    out = pretrained.encode(["a sentence", "another one"])
    out["hidden_states"]  # [layers + 1, batch, seq, hidden], embedding output first
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
class Pretrained:
  """A model with its parameters and tokenizer. `params` has BertForPreTraining's tree;
  heads the checkpoint lacks ('mlm', 'nsp', the pooler) are absent."""

  config: ModelConfig
  params: dict
  tokenizer: Tokenizer
  model: BertForPreTraining

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


def _workdir_tokenizer(path: str) -> Tokenizer:
  if os.path.isfile(os.path.join(path, files.TASK_FILE)):
    raise CheckpointError(f"{path} is a fine-tuning workdir: predict with python -m "
                          "bertjax.predict; give a pretraining workdir or a Hugging Face dir.")
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
  weights, tokenizer files) or a bertjax workdir (config.json, checkpoints/,
  tokenizer/), with parameters and computation in `dtype`."""
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
                                   _load_workdir)
  else:
    raise CheckpointError(f"{config_path} is neither a Hugging Face config (model_type) "
                          "nor a bertjax config (a model section).")
  if vocab_size is not None and tokenizer.vocab_size > vocab_size:  # before the weights
    raise CheckpointError(
        f"{path}: the tokenizer has {tokenizer.vocab_size} ids but the checkpoint's "
        f"vocabulary only {vocab_size}: these tokenizer files do not belong to these "
        "weights; put the tokenizer the model was trained with next to them.")
  config, params = load(path)
  config = dataclasses.replace(config, dtype=dtype, param_dtype=dtype)
  params = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
  return Pretrained(config, params, tokenizer, BertForPreTraining(config))
