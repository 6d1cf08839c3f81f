"""The pretraining input pipeline: corpus -> examples -> grain -> masked batches.

`build_pretraining_data` reads and tokenizes the corpus once, holds out
`eval_fraction` of the documents, builds NSP pairs (BERT) or packed rows (RoBERTa),
and returns an infinite, checkpointable grain `IterDataset` of training batches plus
fixed evaluation batches. Training order: a global shuffle (reshuffled every epoch),
repeated forever, every `process_count`-th example for this process, masked with an
RNG derived from the seed and the element's index (so masks differ between epochs and
replay exactly after a restore). Indices are batched first and each batch is gathered
and masked at once (vectorised numpy, one random stream per row). Shapes: b per-process batch, T
max_seq_length, P max_predictions_per_seq.

Batch dict (numpy): input_ids, attention_mask, token_type_ids [b, T] int32;
masked_lm_positions, masked_lm_ids [b, P] int32; masked_lm_weights [b, P] float32;
next_sentence_labels [b] int32 (0 = B follows A, 1 = random B; only with NSP).
Evaluation batches add example_weights [b] float32 (0 for padding examples).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from typing import Any

from absl import flags
import grain
import numpy as np

from bertjax.data import corpus, masking, multilingual, prepare, pretraining
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


class ShuffledRows:
  """grain map: element g of a source's infinite stream -> its row. Epoch g // n
  visits the source's n rows [offset, offset + n) in the order of a permutation drawn
  from (seed, epoch): computed once per epoch (4 bytes a row; the two newest kept, as
  a batch may straddle epochs), then a lookup per element, where grain's
  `shuffle` (index_shuffle) costs ~40 us per element: most of a batch's time."""

  def __init__(self, offset: int, n: int, seed: int):
    self.offset, self.n, self.seed = offset, n, seed
    self._perms: dict[int, np.ndarray] = {}

  def _perm(self, epoch: int) -> np.ndarray:
    perm = self._perms.get(epoch)
    if perm is None:  # Two read-ahead threads may both draw it: the same array.
      perm = np.random.default_rng([self.seed, epoch]).permutation(
          np.arange(self.offset, self.offset + self.n, dtype=np.int64 if
                    self.offset + self.n > 2**31 else np.int32))
      self._perms = {e: p for e, p in self._perms.items() if e == epoch - 1}
      self._perms[epoch] = perm
    return perm

  def __call__(self, element: int) -> int:
    epoch, i = divmod(element, self.n)
    return int(self._perm(epoch)[i])

  def __getstate__(self):  # Pickled into grain workers without the permutations.
    return {"offset": self.offset, "n": self.n, "seed": self.seed, "_perms": {}}

  def __repr__(self) -> str:
    return f"ShuffledRows(offset={self.offset}, n={self.n}, seed={self.seed})"


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class MaskBatch:
  """grain map-with-index transform: [b] example indices -> one masked batch.

  Gathers the rows from `examples` and masks the [b, T] batch at once; row r of batch
  i is element i * b + r of this process's stream (which runs across epochs), and its
  random numbers come from `masking.RowStreams` keyed by (seed, that element index):
  masks differ between epochs, replay exactly after a restore and do not depend on
  the batch size. Drops next_sentence_labels when the model has no NSP head.
  Picklable, so it runs in grain worker processes too.
  """

  examples: pretraining.Examples
  cfg: masking.MaskingConfig
  nsp: bool
  seed: int

  def __repr__(self) -> str:  # grain logs its stages: not the examples' arrays.
    return f"MaskBatch({len(self.examples)} examples, nsp={self.nsp}, seed={self.seed})"

  def __call__(self, batch_index: int, rows: np.ndarray) -> dict[str, np.ndarray]:
    out = self.examples[rows]
    element = batch_index * len(rows) + np.arange(len(rows))
    out.update(masking.mask_tokens(out["input_ids"], masking.RowStreams(self.seed, element),
                                   self.cfg))
    if not self.nsp:
      del out["next_sentence_labels"]
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Phase:
  """One sequence-length phase of training.

  steps: batches in this phase (None: the last phase, which runs on).
  sources: examples per language (one entry for a monolingual corpus), all [N_i, T].
  weights: [K] sampling probabilities of the sources (None: one source).
  mask_cfg: masking for this length (its max_predictions_per_seq).
  """

  steps: int | None
  sources: tuple[pretraining.Examples, ...]
  weights: tuple[float, ...] | None
  mask_cfg: masking.MaskingConfig


# The last phase is cut at this many batches (grain concatenates finite datasets only).
_LAST_PHASE_BATCHES = 2**40


def _phase_batches(phase: Phase, index: int, *, batch_size: int, seed: int, nsp: bool,
                   process_index: int, process_count: int) -> grain.MapDataset:
  """The phase's (infinite) batches for one process: each source's row indices
  shuffled and repeated, mixed by weight, every `process_count`-th one, batched, then
  gathered and masked a whole batch at a time."""
  offsets = np.cumsum([0, *map(len, phase.sources)])
  streams = [grain.MapDataset.range(sys.maxsize).map(ShuffledRows(
      int(offsets[k]), len(phase.sources[k]), _seed(seed, _SHUFFLE, index, k)))
             for k in range(len(phase.sources))]
  ds = streams[0] if len(streams) == 1 else grain.MapDataset.mix(streams, phase.weights)
  ds = ds[process_index::process_count].batch(batch_size, drop_remainder=True)
  return ds.map_with_index(MaskBatch(_concatenate(phase.sources), phase.mask_cfg, nsp,
                                     _seed(seed, _TRAIN_MASKS, process_index, index)))


def make_train_dataset(examples: pretraining.Examples | list[Phase],
                       mask_cfg: masking.MaskingConfig | None = None,
                       *, batch_size: int, seed: int, nsp: bool, process_index: int = 0,
                       process_count: int = 1, worker_count: int = 0) -> grain.IterDataset:
  """The infinite training stream of [b, ...] batches for one process.

  `examples` with `mask_cfg`: one phase, one source. Or a list of `Phase`s: their
  batches one phase after the other (the shapes change between phases). The stream
  is a grain `MapDataset` underneath, so its state is the index of the next batch and
  a restore anywhere, in any phase, replays exactly.
  """
  phases = examples if isinstance(examples, list) else [
      Phase(None, (examples,), None, mask_cfg)]
  parts = []
  for i, phase in enumerate(phases):
    ds = _phase_batches(phase, i, batch_size=batch_size, seed=seed, nsp=nsp,
                        process_index=process_index, process_count=process_count)
    parts.append(ds[:_LAST_PHASE_BATCHES if phase.steps is None else phase.steps])
  ds = (parts[0] if len(parts) == 1 else grain.MapDataset.concatenate(parts))
  # A few batches read ahead by two threads (grain's default, 500 batches, would hold
  # gigabytes of [b, 512] batches and costs ~40% throughput in polling on one core).
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=8))
  if worker_count > 0:
    # grain's workers read absl flags; outside an absl app (notebooks, scripts) they
    # would fail on unparsed flags, so fall back to the flag defaults there.
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
  return ds


def length_phases(data_cfg, num_steps: int | None) -> list[tuple[int | None, int, int]]:
  """`config.data.length_phases` -> [(steps or None for the last, length, P)].

  Each phase is (fraction of num_steps, length) or (fraction, length, P); without P,
  max_predictions_per_seq scales with the length (BERT: 20 at 128, 80 at 512). No
  phases: one phase at max_seq_length.
  """
  spec = tuple(data_cfg.get("length_phases", ()) or ())
  T, P = data_cfg.max_seq_length, data_cfg.max_predictions_per_seq
  if not spec:
    return [(None, T, P)]
  if num_steps is None or num_steps < len(spec):
    raise ConfigError(f"config.data.length_phases={spec} needs config.train.num_steps >= "
                      f"{len(spec)} to split the steps")
  out, fractions = [], []
  for k, phase in enumerate(spec):
    if len(phase) not in (2, 3) or not 0 < phase[0] <= 1 or not 8 <= phase[1] <= T:
      raise ConfigError(f"config.data.length_phases[{k}]={tuple(phase)}: write (fraction "
                        f"in (0, 1], length in [8, max_seq_length={T}][, predictions])")
    fractions.append(float(phase[0]))
    p = int(phase[2]) if len(phase) == 3 else max(1, int(math.ceil(P * phase[1] / T)))
    out.append((int(round(sum(fractions) * num_steps)) - sum(s for s, _, _ in out),
                int(phase[1]), min(p, int(phase[1]))))
  if abs(sum(fractions) - 1.0) > 1e-6:
    raise ConfigError(f"config.data.length_phases fractions sum to {sum(fractions)}: "
                      "they must sum to 1 (e.g. ((0.9, 128), (0.1, 512)))")
  out[-1] = (None, *out[-1][1:])
  return out


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
                           position_offset: int = 0,
                           num_steps: int | None = None) -> PretrainingData:
  """Builds the training stream and evaluation batches from `config.data`.

  `batch_size` is the per-process batch; with `nsp` the examples are BERT's sentence
  pairs, otherwise packed rows (`config.data.packing`: RoBERTa's FULL-SENTENCES or
  DOC-SENTENCES; `config.data.isolate_documents` adds segment_ids and position_ids
  starting at `position_offset`, the model's). `config.data.length_phases` splits
  `num_steps` into sequence-length phases; `config.data.languages` mixes per-language
  corpora with q_i ~ p_i^language_alpha. Deterministic given `seed`.
  """
  start = time.perf_counter()
  if batch_size < 1:
    raise ConfigError(f"per-process batch size must be >= 1, got {batch_size}")
  if not 0 <= process_index < process_count:
    raise ConfigError(f"process_index={process_index} must lie in [0, {process_count})")
  isolate = bool(data_cfg.get("isolate_documents", False))
  masking.MaskingConfig.create(data_cfg, tokenizer, np.ones(tokenizer.vocab_size))
  phases = length_phases(data_cfg, num_steps)
  languages = multilingual.parse_languages(data_cfg.get("languages", "")) or [
      ("", data_cfg.corpus)]
  train_docs, eval_docs, documents = [], [], 0
  for k, (_, spec) in enumerate(languages):
    train, held_out = _split_documents(_load_tokenized(spec, data_cfg, tokenizer), spec,
                                       data_cfg.eval_fraction, _seed(seed, _SPLIT, k))
    train_docs.append(train)
    eval_docs.append(held_out)
    documents += len(train) + len(held_out)

  def build(docs, length, *stream):
    if nsp:
      return pretraining.create_nsp_examples(
          docs, tokenizer, max_seq_length=length, short_seq_prob=data_cfg.short_seq_prob,
          dupe_factor=data_cfg.dupe_factor if stream[0] == _TRAIN_EXAMPLES else 1,
          rng=np.random.default_rng(_seed(seed, *stream)))
    return pretraining.create_packed_examples(
        docs, tokenizer, max_seq_length=length,
        packing=data_cfg.get("packing", "full_sentences"), isolate_documents=isolate,
        position_offset=position_offset)

  train_tokens = [np.concatenate([np.asarray(s, np.int64) for d in docs for s in d])
                  for docs in train_docs]
  counts = np.bincount(np.concatenate(train_tokens), minlength=tokenizer.vocab_size)
  mask_cfg = masking.MaskingConfig.create(data_cfg, tokenizer, counts)
  counts[mask_cfg.special_ids] = 0
  weights = None
  if len(languages) > 1:
    weights = tuple(multilingual.sampling_probabilities(
        [len(t) for t in train_tokens], data_cfg.get("language_alpha", 0.3)).tolist())
  train_phases = []
  for i, (steps, length, predictions) in enumerate(phases):
    sources = tuple(build(docs, length, _TRAIN_EXAMPLES, k, i)
                    for k, docs in enumerate(train_docs))
    for (name, spec), ex in zip(languages, sources):
      if len(ex) // process_count < batch_size:
        raise DataError(f"corpus {spec!r} gives {len(ex)} training examples of length "
                        f"{length}, fewer than one batch of {batch_size} on each of "
                        f"{process_count} processes: use a smaller batch or a bigger "
                        "corpus")
    train_phases.append(Phase(steps, sources, weights, dataclasses.replace(
        mask_cfg, max_predictions_per_seq=predictions)))
  eval_examples = _concatenate([build(docs, data_cfg.max_seq_length, _EVAL_EXAMPLES, k)
                                for k, docs in enumerate(eval_docs)])
  first = _concatenate(train_phases[0].sources)
  return PretrainingData(
      train=make_train_dataset(
          train_phases, batch_size=batch_size, seed=seed, nsp=nsp,
          process_index=process_index, process_count=process_count,
          worker_count=data_cfg.worker_count),
      eval_batches=make_eval_batches(
          eval_examples, mask_cfg, batch_size=batch_size, seed=seed, nsp=nsp,
          process_index=process_index, process_count=process_count),
      most_frequent_token=int(np.argmax(counts)),
      stats={
          "documents": documents,
          "train_documents": sum(map(len, train_docs)),
          "eval_documents": sum(map(len, eval_docs)),
          "train_examples": len(first),
          # Share of the train rows' positions that are padding (packing drives it to ~0).
          "padding_fraction": round(1.0 - float(np.sum(first.lengths))
                                    / max(first.input_ids.size, 1), 4),
          "eval_examples": len(eval_examples),
          "tokens": int(sum(map(len, train_tokens))),
          "phases": [(p.steps, p.sources[0].input_ids.shape[1],
                      p.mask_cfg.max_predictions_per_seq) for p in train_phases],
          **({"language_weights": dict(zip([n for n, _ in languages],
                                           np.round(weights, 4).tolist()))}
             if weights else {}),
          "build_seconds": round(time.perf_counter() - start, 3),
      })


def _load_tokenized(spec: str, data_cfg, tokenizer) -> list[pretraining.Document]:
  """A corpus spec's tokenized documents (read directly when `prepare`d)."""
  if os.path.isfile(os.path.join(spec, prepare.SUMMARY)):  # pre-tokenized
    return list(prepare.read_documents(spec))
  return pretraining.tokenize_documents(
      corpus.load_documents(spec, data_cfg.text_field), tokenizer)


def _split_documents(documents, spec: str, eval_fraction: float, seed: int):
  """(train, held-out) documents, each kept in corpus order."""
  num_eval = max(2, int(round(eval_fraction * len(documents))))
  if len(documents) - num_eval < 2:
    raise DataError(f"corpus {spec!r} has {len(documents)} non-empty "
                    f"documents: too few to hold out {num_eval} for evaluation and train "
                    "on the rest; give more documents (blank lines separate them)")
  order = np.random.default_rng(seed).permutation(len(documents))
  return ([documents[k] for k in np.sort(order[num_eval:])],
          [documents[k] for k in np.sort(order[:num_eval])])


def _concatenate(parts: list[pretraining.Examples]) -> pretraining.Examples:
  """The examples of several builders, one after the other."""
  if len(parts) == 1:
    return parts[0]
  return pretraining.Examples(*(
      None if getattr(parts[0], f.name) is None
      else np.concatenate([getattr(p, f.name) for p in parts])
      for f in dataclasses.fields(pretraining.Examples)))
