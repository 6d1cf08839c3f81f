"""The pretraining input pipeline: examples -> grain -> masked batches.

`build_pretraining_data` opens each source of `config.data` (the corpus, the sources
of a weighted mixture, or the languages: `bertjax.data.mixture`) as example rows
(`bertjax.data.corpora`): a directory `prepare` built (`manifest.json`) is read in
place, by random access, a row at a time; raw text (or a directory of tokenized
documents) below `config.data.raw_text_limit_mb` is tokenized and built into rows in
memory, the same way. It returns an infinite, checkpointable grain `IterDataset` of
training batches plus, per length phase, the held-out batches of every source made on
demand (`bertjax.data.held_out`).

Training order: element g of a source's stream is row permute(g mod n) of epoch
g // n (`permutation.permute`: a fresh global shuffle every epoch that holds no table),
sources interleaved by weight (`mixture.Interleave`: a mixture's weights, the
languages' q) into one global stream; global batch i is
its elements [i * B, (i + 1) * B), of which process p of P feeds the block
[i * B + p * b, i * B + (p + 1) * b) (b = B / P: the rows its devices hold, as the
meshes of `bertjax.parallel.mesh` order devices process after process). Each batch
is read and masked at once with one random stream per row keyed by (seed, the row's
index in the global stream): masks differ between epochs and replay exactly after a
restore, a process reads only the rows it trains on, and the global batches, masks
included, are the same whatever the process count. The masking rate is a function
of the step (`config.data.masked_lm_prob_phases`), so a restore draws the same masks
too. Shapes: b per-process batch, T
max_seq_length (or the phase's length), P max_predictions_per_seq (or the phase's).

Batch dict (numpy): input_ids, attention_mask, token_type_ids [b, T] int32;
masked_lm_positions, masked_lm_ids [b, P] int32; masked_lm_weights [b, P] float32;
next_sentence_labels [b] int32 (0 = B follows A, 1 = random B; only with NSP pairs:
`sentence_pairs` of the objectives' fields);
segment_ids, position_ids [b, T] int32 with config.data.isolate_documents;
span_left_positions, span_right_positions, span_relative_positions [b, P] int32 with
span masking; a length phase's constant inputs [b] float32 (ModernBERT's
global_rope_theta) (`batch_spec` lists them). Evaluation batches add example_weights
[b] float32 (0 for padding examples).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any, Collection, Sequence

from absl import flags, logging
import grain
import numpy as np

from bertjax.data import (builders, corpora, held_out as held_out_lib, manifest, masking,
                          mixture, multilingual, permutation, phases as phases_lib,
                          rows as rows_lib, seeds, sources)
from bertjax.data.phases import length_phases, masked_lm_prob_phases
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import ConfigError, DataError, at_least, one_of, within

MIN_SEQ_LENGTH = 8  # [CLS] a [SEP] b [SEP] with room for a few tokens



@dataclasses.dataclass
class PretrainingData:
  """Training stream, evaluation batches and corpus facts.

  train: infinite `grain.IterDataset` of batches; `iter(train)` has `get_state()` /
    `set_state()` and is saved with `grain.checkpoint.CheckpointSave(iterator)`.
  held_out: per length phase, its held-out evaluation (`held_out.HeldOut`: that
    phase's length and inputs, each source's batches; deterministic masks, made when
    indexed, the same count on every process).
  most_frequent_token: the commonest non-special id in the training tokens (the
    "always predict it" MLM baseline).
  stats: documents, train_documents, eval_documents, train_examples, eval_examples,
    tokens (training tokens), padding_fraction, phases, prepared, build_seconds;
    source_weights with several sources, masking_phases with
    config.data.masked_lm_prob_phases.
  """

  train: grain.IterDataset
  held_out: list[held_out_lib.HeldOut]
  most_frequent_token: int
  stats: dict[str, Any]

  @property
  def eval_batches(self) -> held_out_lib.EvalBatches:
    """The final length phase's held-out batches, every source's rows together."""
    return self.held_out[-1].all()


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class MaskBatch:
  """grain map-with-index transform: [b] stream elements -> one masked batch.

  An element is g (one source) or (k, g) (source k of several): row
  permute(g mod n_k, n_k, shuffle_seeds[k], epoch=g // n_k) of source k. The rows are
  read, decoded and masked as one [b, T] batch; row r of this process's batch i is
  element first_element + (i * process_count + process_index) * b + r of the global
  stream and its random numbers come from `masking.RowStreams` keyed by (seed, that
  index), so a row's mask does not depend on the process count. Batch i is masked with
  `cfg`, or with the last of `changes` (first batch, masking config) whose first batch
  is <= i. `inputs` (name, value) add a [b] float32 column of `value` each (a phase's
  constant model inputs, e.g. ModernBERT's `global_rope_theta`). Picklable, so it runs
  in grain worker processes too.
  """

  sources: tuple[Any, ...]  # rows_lib.MemoryRows / FileRows, all of one row dtype
  shuffle_seeds: tuple[int, ...]
  cfg: masking.MaskingConfig
  nsp: bool
  isolate: bool
  position_offset: int
  seed: int
  changes: tuple[tuple[int, masking.MaskingConfig], ...] = ()
  process_index: int = 0
  process_count: int = 1
  first_element: int = 0
  inputs: tuple[tuple[str, float], ...] = ()

  def __repr__(self) -> str:  # grain logs its stages: not the rows.
    return (f"MaskBatch({[len(s) for s in self.sources]} rows, nsp={self.nsp}, "
            f"seed={self.seed})")

  def rows(self, elements) -> np.ndarray:
    """The rows [b] of stream elements (g [b], or a tuple (k [b], g [b]))."""
    if not isinstance(elements, tuple):
      return self._read(0, np.asarray(elements, np.int64))
    k, g = np.asarray(elements[0]), np.asarray(elements[1], np.int64)
    out = np.empty(len(g), self.sources[0].dtype)
    for source in np.unique(k):
      picked = k == source
      out[picked] = self._read(source, g[picked])
    return out

  def _read(self, source: int, g: np.ndarray) -> np.ndarray:
    """Rows of elements g [m] of source `source`'s stream."""
    n = len(self.sources[source])
    epoch, index = np.divmod(g, n)
    for e in range(int(epoch.min()), int(epoch.max()) + 1):  # a batch spans 1-2 epochs
      at = epoch == e
      index[at] = permutation.permute(index[at], n, self.shuffle_seeds[source], e)
    return self.sources[source].read(index)

  def cfg_at(self, batch_index: int) -> masking.MaskingConfig:
    """The masking of batch `batch_index`."""
    cfg = self.cfg
    for first, later in self.changes:
      if batch_index >= first:
        cfg = later
    return cfg

  def __call__(self, batch_index: int, elements) -> dict[str, np.ndarray]:
    out = rows_lib.decode(self.rows(elements), isolate=self.isolate,
                          position_offset=self.position_offset,
                          word_starts=self.cfg.strategy != "token")
    b = len(out["input_ids"])
    element = self.first_element + (
        batch_index * self.process_count + self.process_index) * b + np.arange(b)
    out.update(masking.mask_tokens(out["input_ids"], masking.RowStreams(self.seed, element),
                                   self.cfg_at(batch_index),
                                   word_starts=out.pop("word_starts", None)))
    out.update({name: np.full(b, value, np.float32) for name, value in self.inputs})
    if not self.nsp:
      del out["next_sentence_labels"]
    # Start-up time at scale: when training could begin (benchmarks/data_scale.py).
    logging.log_first_n(logging.INFO, "Data: first batch ready (batch %d of this "
                        "process).", 1, batch_index)
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Phase:
  """A stage of training: batches of one shape (`bertjax.data.phases.Stage`).

  steps: batches in this stage (None: the last, which runs on).
  sources: example rows per language (one entry for a monolingual corpus), all of
    length T.
  weights: [K] sampling probabilities of the sources (None: one source).
  mask_cfg: masking for this length (its max_predictions_per_seq).
  mask_changes: (batch of the stage, masking from that batch on), ascending: the
    masking-rate phases that start inside this stage.
  batch_size: this process's rows per batch (None: `make_train_dataset`'s).
  stream: the length phase whose stream of rows (shuffle and mask seeds) it reads
    (None: its own index in the list).
  first_element: the global element of that stream its first batch starts at (the
    stages of one length phase, e.g. the batch-size warm-up's, take consecutive blocks).
  inputs: (name, value) constant per-row model inputs of its batches.
  segments: (first element, [K] weights) of its stream where the sources' sampling
    changes within it (`config.data.source_phases`: `mixture.PhasedInterleave`); ()
    `weights` throughout.
  """

  steps: int | None
  sources: tuple[Any, ...]
  weights: tuple[float, ...] | None
  mask_cfg: masking.MaskingConfig
  mask_changes: tuple[tuple[int, masking.MaskingConfig], ...] = ()
  batch_size: int | None = None
  stream: int | None = None
  first_element: int = 0
  inputs: tuple[tuple[str, float], ...] = ()
  segments: tuple[tuple[int, tuple[float, ...]], ...] = ()


# The last phase is cut at this many batches (grain concatenates finite datasets only).
_LAST_PHASE_BATCHES = 2**40


@dataclasses.dataclass(frozen=True)
class _Tag:
  """grain map: element g of source k's stream -> (k, g)."""
  k: int

  def __call__(self, g: int) -> tuple[int, int]:
    return self.k, g


def _phase_batches(phase: Phase, index: int, *, batch_size: int, seed: int, nsp: bool,
                   isolate: bool, position_offset: int, process_index: int,
                   process_count: int) -> grain.MapDataset:
  """The stage's (infinite) batches for one process: the sources' streams interleaved
  by weight into the global stream of length phase `index`, from its element
  `phase.first_element` on cut into blocks of `batch_size` elements, every
  `process_count`-th block (from `process_index`), then read and masked."""
  k = len(phase.sources)
  if k == 1:
    ds = grain.MapDataset.range(sys.maxsize)
  else:
    ds = grain.MapDataset.select_from_datasets(
        [grain.MapDataset.range(sys.maxsize).map(_Tag(i)) for i in range(k)],
        mixture.PhasedInterleave(phase.segments) if phase.segments else
        mixture.Interleave(phase.weights))
  if phase.first_element:
    ds = ds[phase.first_element:]
  ds = ds.batch(batch_size, drop_remainder=True)[process_index::process_count]
  return ds.map_with_index(MaskBatch(
      phase.sources,
      tuple(seeds.stream_seed(seed, seeds.SHUFFLE, index, i) for i in range(k)),
      phase.mask_cfg, nsp, isolate, position_offset,
      # (The 0 keeps the masks single-process runs have always had.)
      seeds.stream_seed(seed, seeds.TRAIN_MASKS, 0, index), phase.mask_changes,
      process_index, process_count, phase.first_element, phase.inputs))


def make_train_dataset(examples: builders.Examples | list[Phase],
                       mask_cfg: masking.MaskingConfig | None = None,
                       *, batch_size: int, seed: int, nsp: bool, process_index: int = 0,
                       process_count: int = 1, worker_count: int = 0,
                       isolate: bool = False, position_offset: int = 0
                       ) -> grain.IterDataset:
  """The infinite training stream of [b, ...] batches for one process.

  `examples` with `mask_cfg`: one phase of one source built in memory (isolated when
  it has segment_ids). Or a list of `Phase`s: their batches one phase after the other
  (the shapes change between phases: lengths, and the batch sizes of the batch-size
  warm-up). The stream is a grain `MapDataset` underneath, so its state is the index
  of the next batch and a restore anywhere, in any phase, replays exactly; batch k is
  this process's block of global batch k on any process count, so a state saved by P
  processes resumes the same global stream on P' (the same global batch sizes).
  """
  if isinstance(examples, builders.Examples):
    isolate = examples.segment_ids is not None
    if isolate:
      position_offset = int(examples.position_ids[0, 0])
    words = (mask_cfg.word_starts if mask_cfg.word_starts is not None
             else np.ones(int(examples.input_ids.max()) + 1, bool))
    source = rows_lib.MemoryRows(rows_lib.encode(examples, words, rows_lib.id_dtype(
        len(words))))
    examples = [Phase(None, (source,), None, mask_cfg)]
  parts = []
  for i, phase in enumerate(examples):
    ds = _phase_batches(phase, i if phase.stream is None else phase.stream,
                        batch_size=phase.batch_size or batch_size, seed=seed, nsp=nsp,
                        isolate=isolate, position_offset=position_offset,
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


def sentence_pairs(fields: Collection[str]) -> bool:
  """Whether batches carrying `fields` (what a run's objectives read:
  `bertjax.objectives.Objectives.fields`) are BERT's sentence pairs, the only rows with
  next_sentence_labels; else they are packed rows (`config.data.packing`)."""
  return "next_sentence_labels" in fields


def batch_spec(data_cfg, nsp: bool, rows: int, length: int, predictions: int,
               inputs: Collection[str] = ()) -> dict[str, tuple[tuple[int, ...], Any]]:
  """{field: (shape, dtype)} of a training batch of `rows` x `length` tokens with
  `predictions` masked slots per row, as `build_pretraining_data` makes it (the module
  docstring's batch dict; `nsp`: sentence pairs), with a length phase's constant
  `inputs` (names): what a pod's plan compiles the train step for."""
  B, T, P = rows, length, predictions
  spec = {k: ((B, T), np.int32) for k in ("input_ids", "attention_mask", "token_type_ids")}
  if nsp:
    spec["next_sentence_labels"] = ((B,), np.int32)
  if data_cfg.isolate_documents:
    spec.update(segment_ids=((B, T), np.int32), position_ids=((B, T), np.int32))
  spec.update(masked_lm_positions=((B, P), np.int32), masked_lm_ids=((B, P), np.int32),
              masked_lm_weights=((B, P), np.float32))
  if data_cfg.masking == "span":  # the span boundaries (`masking.mask_tokens`)
    spec.update({k: ((B, P), np.int32) for k in (
        "span_left_positions", "span_right_positions", "span_relative_positions")})
  spec.update({k: ((B,), np.float32) for k in inputs})
  return spec


def check_config(data_cfg, model, num_steps: int, trains_tokenizer: bool = True
                 ) -> list[tuple[int | None, int, int]]:
  """Every field of `config.data` in range (one ConfigError line each), given the
  model it feeds (`model`: the model's config dataclass) and the run's step count;
  `trains_tokenizer`: False when the tokenizer comes from a checkpoint (init_from).
  Returns the length phases (`phases.length_phases`: worked out here, once, for the
  caller to pass on)."""
  d, tok = data_cfg, data_cfg.tokenizer
  at_least("data.max_seq_length", d.max_seq_length, MIN_SEQ_LENGTH)
  if d.max_seq_length > model.max_length:
    raise ConfigError(
        f"config.data.max_seq_length={d.max_seq_length} + config.model.position_offset="
        f"{model.position_offset} exceeds config.model.max_position_embeddings="
        f"{model.max_position_embeddings}.")
  within("data.max_predictions_per_seq", d.max_predictions_per_seq, 1, d.max_seq_length)
  within("data.masked_lm_prob", d.masked_lm_prob, 0, 1, "(]")
  within("data.mask_token_prob", d.mask_token_prob, 0, 1)
  within("data.random_token_prob", d.random_token_prob, 0, 1)
  if d.mask_token_prob + d.random_token_prob > 1:
    raise ConfigError(f"config.data.mask_token_prob={d.mask_token_prob} + "
                      f"random_token_prob={d.random_token_prob} must be <= 1.")
  one_of("data.masking", d.masking, masking.STRATEGIES)
  one_of("data.masked_lm_draw", d.masked_lm_draw, masking.DRAWS)
  if not isinstance(d.mask_special_tokens, bool):
    raise ConfigError(f"config.data.mask_special_tokens={d.mask_special_tokens!r}: use "
                      "True or False.")
  one_of("data.random_token_distribution", d.random_token_distribution,
         masking.RANDOM_DISTRIBUTIONS)
  within("data.span_geometric_p", d.span_geometric_p, 0, 1, "(]")
  at_least("data.max_span_length", d.max_span_length, 1)
  within("data.short_seq_prob", d.short_seq_prob, 0, 1)
  at_least("data.dupe_factor", d.dupe_factor, 1)
  one_of("data.packing", d.packing, builders.PACKINGS)
  one_of("data.line_breaks", d.line_breaks, sources.LINE_BREAKS)
  phases = length_phases(d, num_steps)
  masked_lm_prob_phases(d, num_steps)
  within("data.language_alpha", d.language_alpha, 0, 1)
  one_of("data.language_counts", d.language_counts, multilingual.COUNTS)
  phases_lib.source_phases(d, num_steps, [s.name for s in mixture.sources_of(d)])
  within("data.eval_fraction", d.eval_fraction, 0, 1, "()")
  if not (isinstance(d.text_field, str) and d.text_field):
    raise ConfigError(f"config.data.text_field={d.text_field!r} must name the JSON / "
                      "TFDS field or the Parquet / Arrow column holding the text, e.g. "
                      "'text'.")
  at_least("data.worker_count", d.worker_count, 0)
  at_least("data.raw_text_limit_mb", d.raw_text_limit_mb, 0)
  if not tok.path and trains_tokenizer:  # It must be able to fill the vocabulary.
    one_of("data.tokenizer.kind", tok.kind, tok_lib.KINDS)
    if tok.vocab_size < model.vocab_size:
      raise ConfigError(
          f"config.data.tokenizer.vocab_size={tok.vocab_size} is smaller than "
          f"config.model.vocab_size={model.vocab_size}: the trained tokenizer cannot "
          "fill the model's vocabulary; set both to the same size.")
  return phases


def _mask_schedule(cfg: masking.MaskingConfig, length: int, first: int,
                   steps: int | None, rates: list[tuple[int, float]], base_rate: float
                   ) -> list[tuple[int, masking.MaskingConfig]]:
  """The masking of the length phase of steps [first, first + steps) ([first, inf)
  for None) at `length`, whose `cfg` has the phase's P for `base_rate`: [(batch of
  the phase, masking from it on)], the first at batch 0. At rate r, P scales by
  r / base_rate (at most the length)."""
  out = []
  for start, rate in rates:
    if steps is not None and start >= first + steps:
      break
    scaled = math.ceil(round(cfg.max_predictions_per_seq * rate / base_rate, 6))
    at = dataclasses.replace(cfg, masked_lm_prob=rate,
                             max_predictions_per_seq=min(max(1, scaled), length))
    if start <= first:
      out = [(0, at)]
    else:
      out.append((start - first, at))
  return out


def _source_weights(data_cfg, num_steps: int | None, sources, built, counts_unit: str
                    ) -> list[tuple[int, tuple[float, ...]]]:
  """[(first step, [K] sampling probabilities, 0 for a source the phase leaves out)] of
  `config.data.source_phases` (`phases.source_phases`; [] without): a phase's weights
  normalised, or q ~ p^alpha over its sources' sizes (`config.data.language_counts`)."""
  names = [s.name for s in sources]
  out = []
  for phase in phases_lib.source_phases(data_cfg, num_steps, names):
    chosen = [names.index(n) for n in phase.names]
    if phase.weights is not None:
      q = np.asarray(phase.weights, np.float64) / sum(phase.weights)
    else:
      sizes = [built[i].text[counts_unit] for i in chosen]
      if not all(sizes):
        raise DataError(f"config.data.language_counts={counts_unit!r} but a prepared "
                        f"corpus has no {counts_unit} count ({sizes}): prepare it again")
      q = (multilingual.sampling_probabilities(sizes, phase.alpha) if len(chosen) > 1
           else np.ones(1))
    w = np.zeros(len(names))
    w[chosen] = q
    out.append((phase.first_step, tuple(w.tolist())))
  return out


def _stream_segments(by_phase: Sequence[tuple[int, tuple[float, ...]]],
                     stages: Sequence[phases_lib.Stage], n_phases: int
                     ) -> list[tuple[tuple[int, tuple[float, ...]], ...]]:
  """Each length phase's stream segments (`Phase.segments`): the source phase in force
  at the length phase's first step from element 0, then each that starts inside it
  from the first element of its first batch; () for every stream without
  source phases."""
  if not by_phase:
    return [()] * n_phases
  out = []
  for k in range(n_phases):
    mine = [s for s in stages if s.phase == k]
    first = mine[0].first_step
    segments = [(0, next(w for step, w in reversed(by_phase) if step <= first))]
    for step, w in by_phase:
      stage = next((s for s in mine if s.first_step <= step and (
          s.steps is None or step < s.first_step + s.steps)), None)
      if stage is not None and step > first:
        segments.append((stage.first_element + (step - stage.first_step) * stage.rows, w))
    out.append(tuple(segments))
  return out


def build_pretraining_data(data_cfg, tokenizer, *, batch_size: int, seed: int, nsp: bool,
                           process_index: int = 0, process_count: int = 1,
                           position_offset: int = 0,
                           num_steps: int | None = None,
                           batch_schedule: phases_lib.BatchSchedule = (
                               phases_lib.BatchSchedule()),
                           phase_inputs: Sequence[dict[str, float]] = (),
                           schedule: phases_lib.Schedule | None = None
                           ) -> PretrainingData:
  """Builds the training stream and evaluation batches from `config.data`.

  `batch_size` is the per-process batch at max_seq_length; the run's `schedule`
  (`bertjax.data.phases.Schedule`: its length phases and the stages of its global
  batch, each phase's rows sized by tokens and with a batch-size warm-up) is given, or
  worked out here from `num_steps`, `batch_size` x `process_count` and
  `batch_schedule`; a phase's held-out batches have its full batch's rows.
  `phase_inputs` gives each length phase's constant per-row model inputs
  (ModernBERT's `global_rope_theta`; () none), its training and held-out batches alike.
  With `nsp` (`sentence_pairs` of the run's objectives' fields: NSP reads
  next_sentence_labels) the examples are BERT's sentence pairs, otherwise packed rows
  (`config.data.packing`: RoBERTa's FULL-SENTENCES or DOC-SENTENCES;
  `config.data.isolate_documents` adds segment_ids and position_ids starting at
  `position_offset`, the model's). `config.data.length_phases` splits `num_steps`
  into sequence-length phases and `config.data.masked_lm_prob_phases` into
  masking-rate phases (the held-out batches stay at `masked_lm_prob`). Several sources
  (`mixture.sources_of`: a weighted mixture in `config.data.corpus`, or
  `config.data.languages` with q_i ~ p_i^language_alpha) are interleaved by weight, and
  held out and evaluated each on its own. A corpus directory written by
  `prepare --config` is read in place (its manifest checked against the config);
  other corpora are built in memory. Deterministic given `seed`.
  """
  start = time.perf_counter()
  if batch_size < 1:
    raise ConfigError(f"per-process batch size must be >= 1, got {batch_size}")
  if not 0 <= process_index < process_count:
    raise ConfigError(f"process_index={process_index} must lie in [0, {process_count})")
  isolate = bool(data_cfg.isolate_documents)
  masking.MaskingConfig.create(data_cfg, tokenizer, np.ones(tokenizer.vocab_size))
  schedule = schedule or phases_lib.schedule(
      length_phases(data_cfg, num_steps), data_cfg.max_seq_length, num_steps,
      batch_size * process_count, batch_schedule)
  phases, stages = schedule.phases, schedule.stages
  if phase_inputs and len(phase_inputs) != len(phases):
    raise ConfigError(f"{len(phase_inputs)} phase inputs for {len(phases)} length phases")
  rates = masked_lm_prob_phases(data_cfg, num_steps)
  lengths = phases_lib.row_lengths(phases)
  sources = mixture.sources_of(data_cfg)
  counts_unit = multilingual.language_counts(data_cfg)
  fingerprint = None
  built = []
  for source in sources:
    kind = manifest.kind_of(source.spec)
    if kind == "examples":
      fingerprint = fingerprint or manifest.fingerprint(tokenizer)
      built.append(corpora.prepared(source.spec, data_cfg, fingerprint, nsp=nsp,
                                    lengths=lengths))
    else:
      built.append(corpora.in_memory(source.spec, data_cfg, tokenizer, seed=seed, nsp=nsp,
                                     lengths=lengths, tokenized=kind == "tokens"))
  counts = np.sum([c.counts for c in built], axis=0)
  mask_cfg = masking.MaskingConfig.create(data_cfg, tokenizer, counts)
  counts[mask_cfg.special_ids] = 0
  weights = None
  if len(sources) > 1:
    sizes = [c.text[counts_unit] for c in built]
    if sources[0].weight is None and not all(sizes):
      raise DataError(f"config.data.language_counts={counts_unit!r} but a prepared corpus "
                      f"has no {counts_unit} count ({sizes}): prepare it again")
    weights = tuple(mixture.weights(sources, sizes, data_cfg.language_alpha).tolist())
  by_phase = _source_weights(data_cfg, num_steps, sources, built, counts_unit)
  segments = _stream_segments(by_phase, stages, len(phases))
  inputs_of = lambda k: tuple(sorted(phase_inputs[k].items())) if phase_inputs else ()
  train_phases, masking_phases = [], []
  for stage in stages:
    length, rows = stage.length, stage.rows // process_count
    if stage.rows % process_count:
      raise ConfigError(f"the global batch of {stage.rows} rows (from step "
                        f"{stage.first_step + 1}) does not split over {process_count} "
                        "processes; make every batch size a multiple of the process count")
    phase_sources = tuple(c.train[length] for c in built)
    for source, rows_k in zip(sources, phase_sources):
      # One corpus must fill a batch; a source of several may be smaller than its share
      # (its rows then recur within a batch: a low-resource language up-sampled).
      if len(rows_k) // process_count < (rows if len(sources) == 1 else 1):
        raise DataError(f"corpus {source.spec!r} gives {len(rows_k)} training examples of "
                        f"length {length}, fewer than " + (
                            f"one batch of {rows}" if len(sources) == 1 else "one") +
                        f" on each of {process_count} processes: use a smaller batch or a "
                        "bigger corpus")
    masks = _mask_schedule(
        dataclasses.replace(mask_cfg, max_predictions_per_seq=stage.predictions), length,
        stage.first_step, stage.steps, rates, mask_cfg.masked_lm_prob)
    train_phases.append(Phase(stage.steps, phase_sources, weights, masks[0][1],
                              tuple(masks[1:]), rows, stage.phase, stage.first_element,
                              inputs_of(stage.phase), segments[stage.phase]))
    for b, c in masks:  # (a stage of the batch-size warm-up changes no masking)
      if not masking_phases or masking_phases[-1][1:] != (
          length, c.masked_lm_prob, c.max_predictions_per_seq):
        masking_phases.append((stage.first_step + b, length, c.masked_lm_prob,
                               c.max_predictions_per_seq))
  held_out = []
  for k, (_, length, predictions) in enumerate(phases):
    last = [s for s in stages if s.phase == k][-1]  # the phase's full batch
    first = next(s for s in stages if s.phase == k).first_step
    held_out.append(held_out_lib.HeldOut(
        k, first, length, inputs_of(k), {s.name: c.held_out[length]
                                         for s, c in zip(sources, built)},
        dataclasses.replace(mask_cfg, max_predictions_per_seq=predictions),
        dict(batch_size=last.rows // process_count,
             seed=seeds.stream_seed(seed, seeds.EVAL_MASKS), nsp=nsp, isolate=isolate,
             position_offset=position_offset, process_index=process_index,
             process_count=process_count)))
  first_length = stages[0].length
  first_rows = sum(len(c.train[first_length]) for c in built)
  first_tokens = sum(c.train_tokens[first_length] for c in built)
  return PretrainingData(
      train=make_train_dataset(
          train_phases, batch_size=batch_size, seed=seed, nsp=nsp,
          process_index=process_index, process_count=process_count,
          worker_count=data_cfg.worker_count, isolate=isolate,
          position_offset=position_offset),
      held_out=held_out,
      most_frequent_token=int(np.argmax(counts)),
      stats={
          "documents": sum(sum(c.documents) for c in built),
          "train_documents": sum(c.documents[0] for c in built),
          "eval_documents": sum(c.documents[1] for c in built),
          "train_examples": first_rows,
          # Share of the train rows' positions that are padding (packing drives it to ~0).
          "padding_fraction": round(1.0 - first_tokens / max(first_rows * first_length, 1),
                                    4),
          "eval_examples": len(held_out[-1]),
          "tokens": int(sum(c.counts.sum() for c in built)),
          "phases": [(steps, length, next(p for p, s in zip(train_phases, stages)
                                          if s.phase == k).mask_cfg.max_predictions_per_seq)
                     for k, (steps, length, _) in enumerate(phases)],
          # (first step, length, global rows) of each batch shape, when they vary.
          **({"batches": [(s.first_step, s.length, s.rows) for s in stages]}
             if len(stages) > len(phases) or schedule.batches.by_tokens else {}),
          **({"source_weights": dict(zip([s.name for s in sources],
                                         np.round(weights, 4).tolist()))}
             if weights and not by_phase else {}),
          # (first step, {source: probability}) of each source phase.
          **({"source_phases": [(step, {s.name: round(x, 4) for s, x in zip(sources, w)
                                        if x > 0}) for step, w in by_phase]}
             if by_phase else {}),
          # (first step, length, masking rate, P) of each masking-rate phase.
          **({"masking_phases": masking_phases}
             if data_cfg.masked_lm_prob_phases else {}),
          "prepared": all(c.prepared for c in built),
          "build_seconds": round(time.perf_counter() - start, 3),
      })
