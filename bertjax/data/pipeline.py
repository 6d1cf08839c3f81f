"""The pretraining input pipeline: corpus -> examples -> grain -> masked batches.

`build_pretraining_data` reads and tokenizes the corpus once, holds out
`eval_fraction` of the documents, builds NSP pairs (BERT) or packed rows (RoBERTa),
and returns an infinite, checkpointable grain `IterDataset` of training batches plus
fixed evaluation batches. Training order: a global shuffle (reshuffled every epoch),
repeated forever, every `process_count`-th example for this process, masked with an
RNG derived from the seed and the element's index (so masks differ between epochs and
replay exactly after a restore), batched. Shapes: b per-process batch, T
max_seq_length, P max_predictions_per_seq.

Batch dict (numpy): input_ids, attention_mask, token_type_ids [b, T] int32;
masked_lm_positions, masked_lm_ids [b, P] int32; masked_lm_weights [b, P] float32;
next_sentence_labels [b] int32 (0 = B follows A, 1 = random B; only with NSP).
Evaluation batches add example_weights [b] float32 (0 for padding examples).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from absl import flags
import grain
import numpy as np

from bertjax.data import corpus, masking, prepare, pretraining
from bertjax.errors import ConfigError, DataError

# Streams drawn from the one config seed, so that each use gets independent numbers.
_SPLIT, _TRAIN_EXAMPLES, _EVAL_EXAMPLES, _SHUFFLE, _TRAIN_MASKS, _EVAL_MASKS = range(6)


@dataclasses.dataclass
class PretrainingData:
  """Training stream, evaluation batches and corpus facts.

  train: infinite `grain.IterDataset` of batches; `iter(train)` has `get_state()` /
    `set_state()` and is saved with `grain.checkpoint.CheckpointSave(iterator)`.
  eval_batches: fixed batches of the held-out documents (deterministic masks), the
    same count on every process.
  most_frequent_token: the commonest non-special id in the training tokens (the
    "always predict it" MLM baseline).
  stats: documents, train_documents, eval_documents, train_examples, eval_examples,
    tokens (training tokens), build_seconds.
  """

  train: grain.IterDataset
  eval_batches: list[dict[str, np.ndarray]]
  most_frequent_token: int
  stats: dict[str, Any]


def _seed(seed: int, stream: int, *extra: int) -> int:
  """A 32-bit seed for one use of the config seed (grain wants [0, 2**32))."""
  return int(np.random.SeedSequence([seed, stream, *extra]).generate_state(1)[0])


@dataclasses.dataclass(frozen=True)
class MaskExample:
  """grain random-map transform: masks one example with the element's generator.

  Drops next_sentence_labels when the model has no NSP head. Picklable, so it runs in
  grain worker processes too.
  """

  cfg: masking.MaskingConfig
  nsp: bool

  def __call__(self, example: dict[str, np.ndarray],
               rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = dict(example)
    out.update(masking.mask_tokens(example["input_ids"], rng, self.cfg))
    if not self.nsp:
      del out["next_sentence_labels"]
    return out


def make_train_dataset(examples: pretraining.Examples, mask_cfg: masking.MaskingConfig,
                       *, batch_size: int, seed: int, nsp: bool, process_index: int = 0,
                       process_count: int = 1, worker_count: int = 0) -> grain.IterDataset:
  """The infinite training stream of [b, ...] batches for one process."""
  ds = grain.MapDataset.source(examples).shuffle(seed=_seed(seed, _SHUFFLE)).repeat()
  ds = ds[process_index::process_count]
  ds = ds.random_map(MaskExample(mask_cfg, nsp),
                     seed=_seed(seed, _TRAIN_MASKS, process_index))
  ds = ds.batch(batch_size, drop_remainder=True).to_iter_dataset()
  if worker_count > 0:
    # grain's workers read absl flags; outside an absl app (notebooks, scripts) they
    # would fail on unparsed flags, so fall back to the flag defaults there.
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
  return ds


def make_eval_batches(examples: pretraining.Examples, mask_cfg: masking.MaskingConfig,
                      *, batch_size: int, seed: int, nsp: bool, process_index: int = 0,
                      process_count: int = 1) -> list[dict[str, np.ndarray]]:
  """This process's share of the evaluation examples as fixed masked batches.

  Every process gets ceil(N / (b * process_count)) batches; the last ones are padded
  with copies of a real example whose masked_lm_weights and example_weights are 0.
  """
  masked = masking.mask_tokens(examples.input_ids, np.random.default_rng(
      _seed(seed, _EVAL_MASKS)), mask_cfg)
  index = np.arange(process_index, len(examples), process_count)
  num_batches = -(-len(examples) // (batch_size * process_count))
  slots = num_batches * batch_size
  real = np.arange(slots) < len(index)
  index = np.concatenate([index, np.full(slots - len(index), index[0] if len(index) else 0)])
  lengths = examples.lengths[index]
  arrays = {
      "input_ids": masked["input_ids"][index],
      "attention_mask": (np.arange(examples.input_ids.shape[1])[None, :]
                         < lengths[:, None]).astype(np.int32),
      "token_type_ids": examples.token_type_ids[index].astype(np.int32),
      "masked_lm_positions": masked["masked_lm_positions"][index],
      "masked_lm_ids": masked["masked_lm_ids"][index],
      "masked_lm_weights": masked["masked_lm_weights"][index] * real[:, None],
      "example_weights": real.astype(np.float32),
  }
  if nsp:
    arrays["next_sentence_labels"] = examples.next_sentence_labels[index].astype(np.int32)
  if examples.segment_ids is not None:
    arrays["segment_ids"] = examples.segment_ids[index].astype(np.int32)
    arrays["position_ids"] = examples.position_ids[index].astype(np.int32)
  return [{k: v[i * batch_size:(i + 1) * batch_size] for k, v in arrays.items()}
          for i in range(num_batches)]


def build_pretraining_data(data_cfg, tokenizer, *, batch_size: int, seed: int, nsp: bool,
                           process_index: int = 0, process_count: int = 1,
                           position_offset: int = 0) -> PretrainingData:
  """Builds the training stream and evaluation batches from `config.data`.

  `batch_size` is the per-process batch; with `nsp` the examples are BERT's sentence
  pairs, otherwise packed rows (`config.data.packing`: RoBERTa's FULL-SENTENCES or
  DOC-SENTENCES; `config.data.isolate_documents` adds segment_ids and position_ids
  starting at `position_offset`, the model's). Deterministic given `seed`.
  """
  start = time.perf_counter()
  if batch_size < 1:
    raise ConfigError(f"per-process batch size must be >= 1, got {batch_size}")
  if not 0 <= process_index < process_count:
    raise ConfigError(f"process_index={process_index} must lie in [0, {process_count})")
  if not 0.0 < data_cfg.eval_fraction < 1.0:
    raise ConfigError(f"config.data.eval_fraction={data_cfg.eval_fraction} must lie in "
                      "(0, 1): some documents must be held out for evaluation")
  isolate = bool(data_cfg.get("isolate_documents", False))
  if nsp and isolate:
    raise ConfigError("config.data.isolate_documents applies to packed rows: set "
                      "config.model.nsp=False or isolate_documents=False")
  masking.MaskingConfig.create(data_cfg, tokenizer, np.ones(tokenizer.vocab_size))
  if os.path.isfile(os.path.join(data_cfg.corpus, prepare.SUMMARY)):  # pre-tokenized
    documents = list(prepare.read_documents(data_cfg.corpus))
  else:
    documents = pretraining.tokenize_documents(
        corpus.load_documents(data_cfg.corpus, data_cfg.get("text_field", "text")),
        tokenizer)
  num_eval = max(2, int(round(data_cfg.eval_fraction * len(documents))))
  if len(documents) - num_eval < 2:
    raise DataError(f"corpus {data_cfg.corpus!r} has {len(documents)} non-empty "
                    f"documents: too few to hold out {num_eval} for evaluation and train "
                    "on the rest; give more documents (blank lines separate them)")
  order = np.random.default_rng(_seed(seed, _SPLIT)).permutation(len(documents))
  eval_docs = [documents[k] for k in np.sort(order[:num_eval])]
  train_docs = [documents[k] for k in np.sort(order[num_eval:])]

  def build(docs, stream, dupe_factor):
    if nsp:
      return pretraining.create_nsp_examples(
          docs, tokenizer, max_seq_length=data_cfg.max_seq_length,
          short_seq_prob=data_cfg.short_seq_prob, dupe_factor=dupe_factor,
          rng=np.random.default_rng(_seed(seed, stream)))
    return pretraining.create_packed_examples(
        docs, tokenizer, max_seq_length=data_cfg.max_seq_length,
        packing=data_cfg.get("packing", "full_sentences"), isolate_documents=isolate,
        position_offset=position_offset)

  train_examples = build(train_docs, _TRAIN_EXAMPLES, data_cfg.dupe_factor)
  eval_examples = build(eval_docs, _EVAL_EXAMPLES, 1)
  if len(train_examples) // process_count < batch_size:
    raise DataError(f"corpus {data_cfg.corpus!r} gives {len(train_examples)} training "
                    f"examples, fewer than one batch of {batch_size} on each of "
                    f"{process_count} processes: use a smaller batch or a bigger corpus")

  train_tokens = np.concatenate([np.asarray(s, np.int64) for d in train_docs for s in d])
  counts = np.bincount(train_tokens, minlength=tokenizer.vocab_size)
  mask_cfg = masking.MaskingConfig.create(data_cfg, tokenizer, counts)
  counts[mask_cfg.special_ids] = 0
  return PretrainingData(
      train=make_train_dataset(
          train_examples, mask_cfg, batch_size=batch_size, seed=seed, nsp=nsp,
          process_index=process_index, process_count=process_count,
          worker_count=data_cfg.worker_count),
      eval_batches=make_eval_batches(
          eval_examples, mask_cfg, batch_size=batch_size, seed=seed, nsp=nsp,
          process_index=process_index, process_count=process_count),
      most_frequent_token=int(np.argmax(counts)),
      stats={
          "documents": len(documents),
          "train_documents": len(train_docs),
          "eval_documents": len(eval_docs),
          "train_examples": len(train_examples),
          # Share of the train rows' positions that are padding (packing drives it to ~0).
          "padding_fraction": round(1.0 - float(np.sum(train_examples.lengths))
                                    / max(train_examples.input_ids.size, 1), 4),
          "eval_examples": len(eval_examples),
          "tokens": len(train_tokens),
          "build_seconds": round(time.perf_counter() - start, 3),
      })
