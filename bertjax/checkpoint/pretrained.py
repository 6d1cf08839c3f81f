"""A pretrained encoder loaded from a Hugging Face dir, a bertjax pretraining workdir or
a fine-tuning workdir (its encoder, and its task head in `head`), ready to run; and
the reverse of a Hugging Face import: a bertjax workdir holding given parameters.

    pretrained = load_pretrained("path/to/model")
    out = pretrained.encode(["a sentence", "another one"])
    out["hidden_states"]  # [layers + 1, batch, seq, hidden], embedding output first
    pretrained.fill_mask("please turn [MASK] homework in .")
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.checkpoint import files, workdir
from bertjax.checkpoint.manager import Checkpointer
from bertjax.data import vocab_extension
from bertjax.data.tokenizer import Tokenizer
from bertjax.errors import CheckpointError, DataError
from bertjax import model as model_lib, writes
from bertjax.hf import convert, sentence_transformers as st
from bertjax.model.config import dtype_of

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
  """A model of any family with its parameters and tokenizer. `params` has the tree of
  its family's pretraining model; heads the checkpoint lacks ('mlm', 'nsp', the pooler;
  an ELECTRA discriminator's 'mlm', a generator's 'rtd') are absent, and the model runs
  the heads it has. Loaded from a fine-tuning workdir: the encoder, and its task head
  in `head`."""

  config: Any  # the family's config dataclass
  params: dict
  tokenizer: Tokenizer
  head: TaskHead | None = None

  def __post_init__(self):
    family = model_lib.family_of(self.config)
    self.heads = tuple(h for h in family.config_heads(self.config) if h in self.params)
    self.model = family.pretraining(self.config, self.heads)
    self._encode = jax.jit(functools.partial(self.model.apply, method="encode"))
    self._logits = jax.jit(self.model.apply)

  @property
  def has_mlm(self) -> bool:
    return "mlm" in self.params

  def _inputs(self, texts, text_pairs, max_length) -> tuple[dict[str, np.ndarray], int]:
    """Tokenised batch padded to a length bucket, and the unpadded length T."""
    batch = self.tokenizer(texts, text_pairs, max_length=max_length)
    length = batch["input_ids"].shape[1]
    limit = self.config.max_length
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
    """The checkpoint's pretraining heads on a batch: numpy `input_ids`,
    `attention_mask` [B, T] and, float32, `mlm_logits` [B, T, vocab] with an MLM
    head, `rtd_logits` [B, T] with ELECTRA's replaced-token detector, and every other
    head's logits it computes without inputs of its own (with NSP, `nsp_logits`
    [B, 2])."""
    if not self.heads:
      raise CheckpointError("this checkpoint has no pretraining head (it holds the "
                            "encoder only).")
    batch, length = self._inputs(texts, text_pairs, max_length)
    out = self._logits({"params": self.params}, batch["input_ids"],
                       batch["attention_mask"], batch["token_type_ids"])
    per_token = {f"{h}_logits" for h in ("mlm", "rtd")}
    return {"input_ids": batch["input_ids"][:, :length],
            "attention_mask": batch["attention_mask"][:, :length],
            **{k: np.asarray(v[:, :length] if k in per_token else v)
               for k, v in out.items()}}

  def fill_mask(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """For each mask of `text` (the tokenizer's mask token; `[MASK]` is accepted for
    every tokenizer), left to right, the `top_k` (token, probability) pairs."""
    if not self.has_mlm:
      raise CheckpointError(
          f"this checkpoint has no MLM head (its heads: {list(self.heads) or 'none'}) to "
          "fill masks with: use one that has (of ELECTRA, the generator).")
    tok = self.tokenizer
    text = text.replace("[MASK]", tok.mask_token)
    out = self.logits([text])
    positions = np.flatnonzero(out["input_ids"][0] == tok.mask_id)
    if positions.size == 0:
      raise DataError(f"the text has no {tok.mask_token} to fill: {text!r}")
    logits = out["mlm_logits"][0, positions, :tok.vocab_size]  # [P, vocab]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return [[(tok.id_to_token(int(i)), float(row[i])) for i in np.argsort(-row)[:top_k]]
            for row in probs]


def _finetuned_encoder(path: str) -> tuple[Any, dict, TaskHead | None]:
  """The encoder of a fine-tuning workdir (with its MLM head, a sparse model's, or its
  projection, a ColBERT model's) and its task head (None for an embedding model, which
  has none)."""
  run = workdir.open_finetuned(path)
  head = (TaskHead(run.task["name"], list(run.task["labels"]), run.params["head"])
          if "head" in run.params else None)
  return run.model, {k: run.params[k] for k in ("encoder", "mlm", "projection")
                     if k in run.params}, head


def _pretraining_workdir(path: str, network: str | None = None) -> tuple[Any, Any]:
  """The config and parameters of the pretraining workdir's network `network` (default:
  the one its objectives export; `workdir.saved_network`)."""
  member = workdir.saved_network(path, name=network)
  return member.config, member.params(workdir.restore_params(path))


def _config_json(path: str) -> dict:
  """The config.json of a Hugging Face model dir (with its model_type) or of a bertjax
  workdir (with a model section), else a one-line CheckpointError."""
  config_path = os.path.join(path, files.CONFIG_FILE)
  if not os.path.isfile(config_path):
    what = "does not exist" if not os.path.exists(path) else "has no config.json"
    raise CheckpointError(f"{path} {what}: give a Hugging Face model dir or a bertjax "
                          "workdir.")
  with open(config_path) as f:
    raw = json.load(f)
  if "model_type" not in raw and not isinstance(raw.get("model"), dict):
    raise CheckpointError(f"{config_path} is neither a Hugging Face config (model_type) "
                          "nor a bertjax config (a model section).")
  return raw


def checkpoint_family(path: str) -> str:
  """The model family (`bertjax.model.FAMILIES`) of what `load_pretrained(path)` reads,
  from its config.json alone (no weights are read)."""
  raw = _config_json(os.fspath(path))
  if "model_type" in raw:
    return convert.table_of(raw).FAMILY
  return workdir.saved_model(os.fspath(path)).family


def checkpoint_tokenizer(path: str) -> Tokenizer:
  """The tokenizer files of what `load_pretrained(path)` reads (a Hugging Face dir's,
  a workdir's tokenizer/), or the one-line error of their absence."""
  path = st.transformer_dir(os.fspath(path))
  _config_json(path)  # a checkpoint
  return vocab_extension.checkpoint_tokenizer(path)


def load_pretrained(path: str, dtype: str = "float32", network: str | None = None,
                    tokenizer: Tokenizer | None = None) -> Pretrained:
  """A Hugging Face model dir (config.json with a model_type of `bertjax.hf.convert`'s
  tables: BERT, RoBERTa, XLM-R, ModernBERT; weights; tokenizer files), a bertjax
  pretraining workdir (config.json, checkpoints/, tokenizer/: the network its
  objectives export, or the one named `network` where they train several) or a
  fine-tuning workdir (its encoder, and its task head in `head`), with parameters and
  computation in `dtype`; with `tokenizer`, that one instead of the checkpoint's files
  (`checkpoint_tokenizer`). An inference-free SPLADE folder's model is its document
  route's (`st.transformer_dir`)."""
  path = st.transformer_dir(os.fspath(path))
  dtype = dtype_of(dtype, "dtype")
  raw = _config_json(path)
  if network and ("model_type" in raw or workdir.is_finetuned(path)):
    raise CheckpointError(f"network={network!r}: {path} holds one network (only a "
                          "pretraining workdir holds several); leave it out.")
  if "model_type" in raw:
    convert.check_supported(raw)
    vocab_size, load = raw["vocab_size"], convert.load_hf
  else:
    vocab_size = raw["model"]["vocab_size"]
    load = (_finetuned_encoder if workdir.is_finetuned(path) else
            functools.partial(_pretraining_workdir, network=network))
  tokenizer = tokenizer or checkpoint_tokenizer(path)
  if tokenizer.vocab_size > vocab_size:  # before the weights
    raise CheckpointError(
        f"{path}: the tokenizer has {tokenizer.vocab_size} ids but the checkpoint's "
        f"vocabulary only {vocab_size}: these tokenizer files do not belong to these "
        "weights; put the tokenizer the model was trained with next to them.")
  config, params, *head = load(path)
  config = dataclasses.replace(config, dtype=dtype, param_dtype=dtype)
  params = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
  return Pretrained(config, params, tokenizer, *head)


def save_workdir(directory: str, params: dict, config, tokenizer) -> None:
  """A bertjax workdir (run.json, config.json, tokenizer/, checkpoints/0) holding
  `params` (e.g. a Hugging Face checkpoint's); heads the checkpoint lacks (those of its
  family's `pretraining_heads`: MLM, and BERT's NSP and pooler) are freshly
  initialised, so that continued pretraining or fine-tuning can start from it
  (`config.init_from`; the workdir is a conversion's, which no run trains in:
  `bertjax.writes`)."""
  family = model_lib.family_of(config)
  config = family.pretraining_heads(config)
  merged = jax.device_get(nn.unbox(jax.jit(family.pretraining(config).init_params)(
      jax.random.key(0))))

  def overlay(dst, src):
    for k, v in src.items():
      if isinstance(v, dict):
        overlay(dst[k], v)
      else:
        if dst[k].shape != v.shape:
          raise CheckpointError(f"parameter {k} has shape {v.shape}, expected {dst[k].shape}.")
        dst[k] = np.asarray(v, np.float32)

  overlay(merged, params)
  os.makedirs(directory, exist_ok=True)
  workdir.save_config(directory, ml_collections.ConfigDict({"model": {
      **config.to_dict(), "attention_impl": config.attention_impl or ""}}))
  tokenizer.save(os.path.join(directory, files.TOKENIZER_DIR))
  checkpointer = Checkpointer(directory)
  checkpointer.save(0, {"step": np.zeros((), np.int32), "params": merged}, None, force=True)
  checkpointer.wait()
  checkpointer.close()
  writes.record(directory, writes.CONVERSION)
