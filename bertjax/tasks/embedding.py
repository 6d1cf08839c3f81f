"""Embedding models: any family's encoder, a pooling step and optional normalisation
(`EmbeddingModel`); texts encoded with one in batches over a mesh (`Embedder`); and a
model read from a retrieval workdir, a sentence-transformers folder or any checkpoint
bertjax loads (`load_encoder`).

    encoder = load_encoder("/tmp/retrieval")  # or an all-MiniLM-L6-v2 folder
    vectors = encoder.encode(["what is a tuple?"], kind="query")  # [1, E] float32

A text of kind 'query' or 'document' gets the model's prompt of that kind in front
(sentence-transformers' `prompts`: 'query', and 'document' / 'passage' / 'corpus'),
is tokenized as sentence-transformers' Transformer module does (prompt and text
lower-cased first where the model says `do_lower_case`, truncated to max_seq_length
tokens, special tokens included) and pooled with the prompt's tokens.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from bertjax.checkpoint import workdir as workdir_lib
from bertjax.checkpoint.pretrained import load_pretrained
from bertjax.console import progress
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import ConfigError, DataError
from bertjax.hf import convert, sentence_transformers as st
from bertjax.model import family_of
from bertjax.parallel import mesh as mesh_lib
from bertjax.tasks import pooling
from bertjax.tasks.base import EMBEDDING_TASK

KINDS = ("query", "document")
NAME = EMBEDDING_TASK  # config.task.name of a run training an embedding model
_DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # sentence-transformers' order


class EmbeddingModel(nn.Module):
  """The encoder of `config`'s family (parameters under 'encoder', as in its
  pretraining model), pooled (`pooling.pool`) and optionally L2-normalised:
  input_ids, attention_mask [N, T] -> [N, E] float32."""

  config: Any
  pooling: str = "mean"
  normalize: bool = True

  def setup(self):
    self.encoder = family_of(self.config).encoder(self.config)

  def __call__(self, input_ids, attention_mask, deterministic: bool = True) -> jax.Array:
    out = self.encoder(input_ids, attention_mask, deterministic=deterministic)
    x = pooling.pool(out["last_hidden_state"], attention_mask, self.pooling)
    return pooling.normalize(x) if self.normalize else x


def prompt(settings: st.Settings, kind: str) -> str:
  """The prompt a text of `kind` gets ('' none)."""
  if kind not in KINDS:
    raise ConfigError(f"kind={kind!r}: use one of {KINDS}.")
  names = ("query",) if kind == "query" else _DOCUMENT_PROMPTS
  return next((settings.prompts[n] for n in names if settings.prompts.get(n)), "")


def text_tokenizer(tokenizer: tok_lib.Tokenizer, settings: st.Settings) -> tok_lib.Tokenizer:
  """What a text (its prompt in front) is tokenized with: `tokenizer`, lower-casing
  first with `settings.do_lower_case` (`tok_lib.lowercasing`)."""
  return tok_lib.lowercasing(tokenizer) if settings.do_lower_case else tokenizer


def tokenize(tokenizer: tok_lib.Tokenizer, texts: Sequence[str], prefix: str,
             max_length: int, specials: bool = True) -> list[list[int]]:
  """Each text's ids with special tokens: `prefix` + text tokenized as one text, cut to
  `max_length` ids with the special tokens (sentence-transformers' truncation); without
  them where not `specials` (an inference-free SPLADE model's queries)."""
  if not all(isinstance(t, str) and t.strip() for t in texts):
    bad = next(i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip())
    raise DataError(f"text {bad} is empty (or not a string): every query and document "
                    "must hold text")
  pieces = tokenizer.tokenize_batch([prefix + t for t in texts])
  if not specials:
    return [list(p[:max_length]) for p in pieces]
  room = max_length - tokenizer.num_special(pair=False)
  return [tokenizer.build_inputs(p[:room])[0] for p in pieces]


def bucket(length: int, max_length: int) -> int:
  """A padded length: the next power of two from 16, at most `max_length` (few shapes,
  each compiled once)."""
  out = 16
  while out < length:
    out *= 2
  return min(out, max_length)


def pad(rows: Sequence[Sequence[int]], length: int, pad_id: int
        ) -> tuple[np.ndarray, np.ndarray]:
  """[N, length] int32 ids (right-padded with `pad_id`) and attention mask."""
  ids = np.full((len(rows), length), pad_id, np.int32)
  mask = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  return ids, mask


class Embedder:
  """Texts -> embeddings with a model's parameters on a mesh: the texts sorted by
  length, batches of `batch_size` (a multiple of the data-parallel size) padded to a
  `bucket` length, each process feeding its share of every batch, the vectors
  gathered on every process in the texts' order."""

  def __init__(self, model: EmbeddingModel, tokenizer: tok_lib.Tokenizer,
               settings: st.Settings, mesh, rules, param_shardings):
    self.model, self.tokenizer, self.settings = model, tokenizer, settings
    self._text_tokenizer = text_tokenizer(tokenizer, settings)
    self.mesh, self.rules = mesh, rules
    self.batch_sharding = mesh_lib.batch_sharding(mesh, rules)
    self.dp = mesh_lib.data_parallel_size(mesh, rules)
    self._apply = {kind: jax.jit(
        lambda p, ids, mask, kind=kind: model.apply({"params": p}, ids, mask,
                                                    method=self.method(kind)),
        in_shardings=(param_shardings, self.batch_sharding, self.batch_sharding))
                   for kind in KINDS}

  def method(self, kind: str) -> str | None:
    """The model's method that embeds a text of `kind` (None: its __call__)."""
    del kind
    return None

  def tokenize(self, texts: Sequence[str], kind: str) -> list[list[int]]:
    return tokenize(self._text_tokenizer, texts, prompt(self.settings, kind),
                    self.settings.max_seq_length)

  def pad_batch(self, rows: Sequence[Sequence[int]], kind: str) -> dict[str, np.ndarray]:
    """input_ids and attention_mask [N, T] of a batch's token rows (T their `bucket`)."""
    del kind
    ids, mask = pad(rows, bucket(max(map(len, rows)), self.settings.max_seq_length),
                    self.tokenizer.pad_id)
    return {"input_ids": ids, "attention_mask": mask}

  def batches(self, params, texts: Sequence[str], kind: str, batch_size: int = 64,
              show: str = ""):
    """Yields (the texts' indices [n], the model's outputs [n, ...] float32, the padded
    inputs [n, T] of `pad_batch`) batch after batch, the longest texts first; `show`
    names a progress bar."""
    rows = self.tokenize(texts, kind)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    batch_size = -(-batch_size // self.dp) * self.dp
    share = batch_size // jax.process_count()
    mine = slice(jax.process_index() * share, (jax.process_index() + 1) * share)
    starts = range(0, len(rows), batch_size)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      for lo in progress.Progress(show or kind, len(starts), "batches",
                                  enable=bool(show)).wrap(starts):
        chosen = order[lo:lo + batch_size]
        batch = [rows[i] for i in chosen] + [rows[chosen[0]]] * (batch_size - len(chosen))
        inputs = self.pad_batch(batch, kind)
        out = self._apply[kind](params, *(jax.make_array_from_process_local_data(
            self.batch_sharding, inputs[k][mine]) for k in ("input_ids", "attention_mask")))
        out = (multihost_utils.process_allgather(out, tiled=True)
               if jax.process_count() > 1 else jax.device_get(out))
        yield (chosen, np.asarray(out, np.float32)[:len(chosen)],
               {k: v[:len(chosen)] for k, v in inputs.items()})

  def encode(self, params, texts: Sequence[str], kind: str, batch_size: int = 64,
             show: str = "") -> np.ndarray:
    """[N, E] float32 embeddings of `texts` as `kind` ('query' or 'document'); `show`
    names a progress bar."""
    parts = [(chosen, out) for chosen, out, _ in self.batches(params, texts, kind,
                                                              batch_size, show)]
    if not parts:
      return np.zeros((0, 0), np.float32)
    vectors = np.concatenate([out for _, out in parts])
    return vectors[np.argsort(np.concatenate([chosen for chosen, _ in parts]))]


@dataclasses.dataclass
class Encoder:
  """A loaded embedding model (`load_encoder`): `encode(texts, kind)` -> [N, E] (a
  ColBERT model's, `bertjax.tasks.colbert.load_encoder`: each text's token matrix)."""

  embedder: Embedder
  params: Any
  config: Any  # the encoder's config dataclass

  @property
  def tokenizer(self) -> tok_lib.Tokenizer:
    return self.embedder.tokenizer

  @property
  def settings(self) -> st.Settings:
    return self.embedder.settings

  def encode(self, texts: Sequence[str], kind: str = "document", batch_size: int = 64,
             show: str = "") -> np.ndarray:
    return self.embedder.encode(self.params, list(texts), kind, batch_size, show)


def settings_of(task_cfg) -> st.Settings:
  """The `Settings` of a retrieval config's task section (a workdir's from before
  task.do_lower_case: not lower-cased)."""
  return st.Settings(pooling=task_cfg.pooling, normalize=task_cfg.normalize,
                     max_seq_length=task_cfg.max_seq_length,
                     prompts={"query": task_cfg.query_prompt,
                              "document": task_cfg.document_prompt},
                     similarity=task_cfg.similarity,
                     do_lower_case=task_cfg.get("do_lower_case", False))


def holds(path: str, name: str, is_folder) -> bool:
  """Whether `path` holds a retriever of task `name`: a fine-tuning workdir of it, or a
  sentence-transformers folder `is_folder(path)` recognises."""
  if workdir_lib.is_finetuned(path):
    return workdir_lib.task_info(path)["name"] == name
  return is_folder(path)


def local_mesh():
  """A data-parallel mesh over this process's devices and its rules (parameters
  replicated): where a model is used outside a training run."""
  devices = jax.local_devices()
  mesh = jax.make_mesh((len(devices), 1, 1), mesh_lib.AXES, devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  return mesh, (("activation_batch", ("data", "fsdp")),)


def load_encoder(path: str, max_seq_length: int = 0) -> Encoder:
  """The embedding model of `path`: a retrieval fine-tuning workdir (its pooling,
  normalisation and prompts from its config), a sentence-transformers folder (from its
  files: `st.read`) or any checkpoint `load_pretrained` reads (mean pooling,
  normalised: sentence-transformers' defaults for a bare transformers model). With
  `max_seq_length`, texts are cut there instead of at the model's own length."""
  path = os.fspath(path)
  if workdir_lib.is_finetuned(path):
    name = workdir_lib.task_info(path)["name"]
    if name != NAME:
      raise ConfigError(f"{path} holds a fine-tuned {name!r} model, not an embedding "
                        f"model: give a {NAME!r} workdir, a sentence-transformers folder or "
                        "a pretrained checkpoint.")
    settings = settings_of(workdir_lib.load_config(path).task)
  elif st.is_folder(path):
    settings = st.read(path)
  else:
    settings = st.Settings()
    logging.info("%s is no sentence-transformers folder: mean pooling, normalised.", path)
  pretrained = load_pretrained(path)
  config = pretrained.config
  settings = dataclasses.replace(settings, max_seq_length=min(
      max_seq_length or settings.max_seq_length, config.max_length))
  return encoder_of(config, pretrained.params["encoder"], pretrained.tokenizer, settings)


def encoder_of(config, encoder_params, tokenizer: tok_lib.Tokenizer,
               settings: st.Settings, model: nn.Module | None = None,
               params: dict | None = None, embedder: Any = None) -> Encoder:
  """The `Encoder` of an encoder's config and parameters (replicated on this process's
  devices, `local_mesh`), its tokenizer and `settings`: an `EmbeddingModel` of the
  settings' pooling, or `model` with its `params` (a sparse model's encoder and MLM
  head, a ColBERT model's encoder and projection) and its `embedder` class (default
  `Embedder`; a ColBERT model's `TokenEmbedder` with its layout)."""
  model = model or EmbeddingModel(config, settings.pooling, settings.normalize)
  mesh, rules = local_mesh()
  replicated = NamedSharding(mesh, PartitionSpec())
  params = jax.device_put(params or {"encoder": encoder_params}, replicated)
  return Encoder((embedder or Embedder)(model, tokenizer, settings, mesh, rules,
                                        jax.tree.map(lambda _: replicated, params)),
                 params, config)


def export(directory: str, encoder: Encoder) -> str:
  """A sentence-transformers folder of `encoder` in `directory`: its transformers model
  (the bare encoder, `convert.save_hf`) and the sentence-transformers files of its
  settings (`st.write`), so that `SentenceTransformer(directory).encode` gives its
  `encode`. Returns the model_type."""
  params = jax.device_get(encoder.params)
  kind = convert.save_hf(directory, {"encoder": params["encoder"]}, encoder.config,
                         encoder.tokenizer)
  st.write(directory, encoder.settings, encoder.config.hidden_size)
  return kind
