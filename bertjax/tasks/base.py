"""What every fine-tuning task shares: the `Task` interface, the encoder + head model,
and helpers to pad token rows and to build label vocabularies.

A task turns examples (dicts read from files) into `Features` (numpy arrays with a
leading feature dimension N, and the host-side bookkeeping needed to decode), owns a
Flax head over the encoder's outputs, a summed loss, on-device prediction outputs, a
decoder from those outputs back to one prediction per example, and a scorer.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.data.tokenizer import Tokenizer
from bertjax.errors import DataError
from bertjax.model import family_of

# An embedding model ('retrieval', `bertjax.tasks.retrieval`) is no per-example Task:
# its loss spans the batch; fine-tuning trains it on its own data and evaluation.
EMBEDDING_TASK = "retrieval"
SPARSE_TASK = "sparse"  # A SPLADE model (`bertjax.tasks.sparse`), on the same trainer.
COLBERT_TASK = "colbert"  # A multi-vector model (`bertjax.tasks.colbert`), on it too.
# The tasks of retrievers: trained by `bertjax.tasks.retrieval`, their vectors encoded
# by python -m bertjax.embed encode.
RETRIEVER_TASKS = (EMBEDDING_TASK, SPARSE_TASK, COLBERT_TASK)

TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids")


@dataclasses.dataclass
class Features:
  """`arrays`: model inputs and targets, each [N, ...]; `example_index` [N]: the
  example each feature row came from (SQuAD's doc-stride windows share one);
  `meta`: per-row host data for decoding (token -> word maps, offsets)."""

  arrays: dict[str, np.ndarray]
  example_index: np.ndarray
  meta: list[Any]

  def __len__(self) -> int:
    return len(self.example_index)


class FinetuneModel(nn.Module):
  """The pretrained encoder of the config's family (params under 'encoder', as in its
  pretraining model) and a task head (params under 'head'), which reads the encoder's
  output through the family's hooks (`bertjax.model.family.Family`). Inputs [B, T] or,
  for multiple choice, [B, C, T] (flattened to [B*C, T] for the encoder; the head
  folds them back). Packed rows (`bertjax.tasks.batching`) add `segment_ids` and
  `position_ids` [B, T] and, for one prediction per example, `cls_positions` [B, K]:
  the head then sees each packed example as a row of its own ([B*K, 1, E], the
  encoder's `slots`) and its outputs come back as [B, K, ...]."""

  config: Any  # the family's config dataclass
  head: nn.Module

  def setup(self):
    self.encoder = family_of(self.config).encoder(self.config)

  def __call__(self, batch: dict, deterministic: bool = True) -> dict:
    ids = batch["input_ids"]
    length = ids.shape[-1]
    flat = {k: batch[k].reshape(-1, length) for k in TOKEN_KEYS}
    # A feature-based head (tasks/features.py): the pretrained encoder's activations
    # as they are (no dropout), every layer's, with no gradient into the encoder.
    frozen = getattr(self.head, "frozen_encoder", False)
    out = self.encoder(flat["input_ids"], flat["attention_mask"], flat["token_type_ids"],
                       batch.get("position_ids"), batch.get("segment_ids"),
                       deterministic=deterministic or frozen, output_hidden_states=frozen)
    if frozen:
      out = jax.lax.stop_gradient(out)
    out = dict(out, attention_mask=flat["attention_mask"])
    if "cls_positions" not in batch:
      return self.head(out, batch, deterministic)
    B, K = batch["cls_positions"].shape
    slots = self.encoder.slots(out, batch)
    outputs = self.head(slots, batch, deterministic)
    return jax.tree.map(lambda x: x.reshape(B, K, *x.shape[1:]), outputs)


def masked_xent(logits: jax.Array, labels: jax.Array, weights: jax.Array
                ) -> tuple[jax.Array, jax.Array]:
  """Summed cross-entropy of logits [..., K] against int labels [...] (any label where
  the weight is 0), and the summed weight."""
  import optax  # pylint: disable=g-import-not-at-top
  safe = jnp.where(weights > 0, labels, 0)
  xent = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), safe)
  return jnp.sum(xent * weights), jnp.sum(weights)


class Task(abc.ABC):
  """Interface of a fine-tuning task (one subclass per module of bertjax/tasks)."""

  name = ""
  default_metric = ""  # the dev metric that selects the best run of a sweep
  # Batching (`bertjax.tasks.batching`): the feature arrays whose last axis is the token
  # axis (cut to a batch's bucket length), the prediction outputs whose axis 1 is
  # (padded back to max_seq_length with this value, so that batches concatenate), and
  # how examples pack into rows: '' (they do not), 'cls' (one prediction per example
  # from its [CLS]) or 'tokens' (per-token targets only).
  token_arrays: tuple[str, ...] = TOKEN_KEYS
  token_outputs: dict[str, float] = {}
  packing = ""
  regression = False  # One output, mean squared error (a classification setting).

  # A feature-based task trains its head over a frozen encoder (no optimizer state).
  feature_based = False

  def __init__(self, task_cfg, tokenizer: Tokenizer, max_seq_length: int):
    self.cfg = task_cfg
    self.tokenizer = tokenizer
    self.max_seq_length = max_seq_length
    self.labels: list[str] = []

  # Data.
  @abc.abstractmethod
  def read(self, path: str, split: str) -> list[dict]:
    """The examples of a file (native format or .jsonl) or tfds:NAME split."""

  def fit_labels(self, train: Sequence[dict]) -> list[str]:
    """The label vocabulary (from the config, else from the training examples)."""
    return []

  @abc.abstractmethod
  def featurize(self, examples: Sequence[dict], train: bool) -> Features:
    """Model rows (padded to max_seq_length) and the bookkeeping to decode them."""

  # Model.
  @abc.abstractmethod
  def head(self, config) -> nn.Module:
    """The Flax head over the encoder's outputs (called as head(out, batch, det)),
    for the model config `config` of any family (its hooks: `family_of(config)`)."""

  def train_outputs(self, model: nn.Module, params, batch: dict, rng: jax.Array | None
                    ) -> dict:
    """The model's outputs on a training batch (`rng` None: no dropout); one apply.
    A task may compute them in pieces (rerank: `task.mini_batch_size`)."""
    return model.apply({"params": params}, batch, deterministic=rng is None,
                       rngs=None if rng is None else {"dropout": rng})

  @abc.abstractmethod
  def loss(self, outputs: dict, batch: dict) -> tuple[jax.Array, jax.Array]:
    """(summed loss, number of loss terms) of a batch; rows with `example_weights` 0
    (padding of the last batch) contribute nothing."""

  @abc.abstractmethod
  def predict_outputs(self, outputs: dict) -> dict:
    """The (small) arrays the decoder needs, computed on device: [B, ...] each."""

  # Host side.
  @abc.abstractmethod
  def decode(self, outputs: dict[str, np.ndarray], features: Features,
             examples: Sequence[dict]) -> list[Any]:
    """One prediction per example (a label, a tag per word, an answer string...)."""

  @abc.abstractmethod
  def score(self, predictions: Sequence[Any], examples: Sequence[dict]) -> dict[str, float]:
    """The task's dev metrics of the decoded predictions against the gold examples."""


def label_vocab(configured: Sequence[str], seen: Sequence[str], what: str) -> list[str]:
  """`configured` when given (in that order), else the sorted labels seen in training."""
  if configured:
    return [str(x) for x in configured]
  labels = sorted({str(x) for x in seen})
  if not labels:
    raise DataError(f"the training data has no {what}; check config.data.train.")
  return labels


def check_labels(found: Sequence[str], configured: Sequence[str], what: str,
                 source: str) -> None:
  """DataError naming the first of `found` that is none of the `configured` labels (''
  means no gold label, as in test files). Nothing to check when none are configured:
  the labels are then the training data's, and a dev label never seen in training is
  scored as a miss."""
  if not configured:
    return
  allowed = [str(x) for x in configured]
  unknown = sorted({str(x) for x in found} - set(allowed) - {""})
  if unknown:
    more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
    raise DataError(f"{source}: {what} {unknown[0]!r}{more} is none of config.task.labels "
                    f"{allowed}; fix the data or set --config.task.labels.")


def pad_rows(rows: Sequence[Sequence[int]], length: int, value: int) -> np.ndarray:
  """Right-pads int rows to [N, length] (rows longer than `length` are a bug)."""
  out = np.full((len(rows), length), value, np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def encode_rows(tokenizer: Tokenizer, pairs: Sequence[tuple[Sequence[int], Sequence[int] | None]],
                length: int) -> dict[str, np.ndarray]:
  """Special tokens added to (ids_a, ids_b or None) pairs already cut to fit; padded
  to [N, length]: input_ids, token_type_ids, attention_mask."""
  built = [tokenizer.build_inputs(a, b) for a, b in pairs]
  return {"input_ids": pad_rows([ids for ids, _ in built], length, tokenizer.pad_id),
          "token_type_ids": pad_rows([t for _, t in built], length, 0),
          "attention_mask": pad_rows([[1] * len(ids) for ids, _ in built], length, 0)}


def word_pieces(tokenizer: Tokenizer, words: Sequence[str]) -> list[list[int]]:
  """Subword ids of each word; a word the vocabulary cannot spell becomes [UNK] (so
  every word keeps at least one token and word boundaries survive)."""
  pieces = tokenizer.tokenize_batch(list(words)) if words else []
  return [p or [tokenizer.unk_id] for p in pieces]
