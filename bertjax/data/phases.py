"""The run's phases: which shape each optimizer step trains on, and at what masking rate.

- Length phases (`config.data.length_phases`): fractions of `num_steps` at a row length
  (BERT: 90% at 128, then 512; ModernBERT: 1,024, then 8,192).
- Masking-rate phases (`config.data.masked_lm_prob_phases`): fractions at a rate.
- The global batch of each length phase (`BatchSchedule`, from `config.train`):
  `batch_size` rows in every phase, or with `batch_by_tokens` the tokens of
  `batch_size` rows of `max_seq_length` (rows = batch_size * max_seq_length / length:
  ModernBERT's 576 x 8,192 = 4,608 x 1,024 tokens per step).
- Batch-size warm-up (`batch_warmup_tokens`, `batch_warmup_sizes` = n): the first
  length phase starts at the n smaller batches B * k / (n + 1), k = 1..n (B its rows),
  each for the same number of steps, round(tokens / (T * sum of the n sizes)), then
  runs on at B. That is the ramp of the ModernBERT authors' packer
  (src/sequence_packer.py `BatchSizeWarmupScheduler`: sizes of 1 .. n micro-batches
  per rank, each given tokens in proportion to its size, so the same number of steps),
  with tokens counted as rows x length (the packer counts non-padding tokens; packed
  rows are full to within a few tenths of a percent). Each size is one more compiled
  shape of the train step; the warm-up's steps are part of the first phase's.

Every boundary is round(cumulative fraction * num_steps), so phases given the same
fractions switch at the same step (the learning-rate restarts of
`bertjax.train.optimizer` use the same rounding, `boundary`). A `Stage` is a run of
steps with one batch shape. Each length phase reads one stream of rows (its own
shuffle and mask seeds); its stages take consecutive blocks of it, so batch i's rows
and masks are a function of (seed, i) alone and a restore replays them.

Each is worked out once and passed on: `length_phases` is the one function that reads
`config.data.length_phases` (a run's config check calls it, through
`pipeline.check_config`), `schedule` the one that makes the stages of its result, and
the run hands the `Schedule` to the pipeline and to the model's per-phase inputs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from bertjax.errors import ConfigError


def boundary(fraction: float, num_steps: int) -> int:
  """The step at which a phase starting after `fraction` of `num_steps` starts."""
  return int(round(fraction * num_steps))


def length_phases(data_cfg, num_steps: int | None) -> list[tuple[int | None, int, int]]:
  """`config.data.length_phases` -> [(steps or None for the last, length, P)].

  Each phase is (fraction of num_steps, length) or (fraction, length, P); without P,
  max_predictions_per_seq scales with the length (BERT: 20 at 128, 80 at 512). No
  phases: one phase at max_seq_length.
  """
  spec = tuple(data_cfg.length_phases)
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
    out.append((boundary(sum(fractions), num_steps) - sum(s for s, _, _ in out),
                int(phase[1]), min(p, int(phase[1]))))
  if abs(sum(fractions) - 1.0) > 1e-6:
    raise ConfigError(f"config.data.length_phases fractions sum to {sum(fractions)}: "
                      "they must sum to 1 (e.g. ((0.9, 128), (0.1, 512)))")
  out[-1] = (None, *out[-1][1:])
  return out


def masked_lm_prob_phases(data_cfg, num_steps: int | None) -> list[tuple[int, float]]:
  """`config.data.masked_lm_prob_phases` -> [(first step, masking rate)], ascending:
  the rate from that step on (phase k starts at round(sum of the fractions before it *
  num_steps), as `length_phases` splits the steps). No phases: [(0, masked_lm_prob)]."""
  spec = tuple(data_cfg.masked_lm_prob_phases)
  if not spec:
    return [(0, float(data_cfg.masked_lm_prob))]
  number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
  for k, phase in enumerate(spec):
    if not (isinstance(phase, (tuple, list)) and len(phase) == 2 and all(map(number, phase))
            and 0 < phase[0] <= 1 and 0 < phase[1] <= 1):
      raise ConfigError(f"config.data.masked_lm_prob_phases[{k}]={phase!r}: write "
                        "(fraction of the steps in (0, 1], masking rate in (0, 1])")
  if num_steps is None or num_steps < len(spec):
    raise ConfigError(f"config.data.masked_lm_prob_phases={spec} needs "
                      f"config.train.num_steps >= {len(spec)} to split the steps")
  out, done = [], 0.0
  for fraction, rate in spec:
    out.append((boundary(done, num_steps), float(rate)))
    done += float(fraction)
  if abs(done - 1.0) > 1e-6:
    raise ConfigError(f"config.data.masked_lm_prob_phases fractions sum to {done}: they "
                      "must sum to 1 (e.g. ((0.7, 0.3), (0.2, 0.15), (0.1, 0.05)))")
  return out


@dataclasses.dataclass(frozen=True)
class SourcePhase:
  """From `first_step` on, the run reads the sources `names` (in the run's order),
  with the given `weights` (normalised) or, None, q_i ~ p_i^`alpha` of their sizes."""

  first_step: int
  names: tuple[str, ...]
  weights: tuple[float, ...] | None
  alpha: float


def source_phases(data_cfg, num_steps: int | None, names: Sequence[str]
                  ) -> list[SourcePhase]:
  """`config.data.source_phases` over the run's sources `names` (`mixture.sources_of`)
  -> their `SourcePhase`s, ascending (phase k starts at round(sum of the fractions
  before it * num_steps), as the length phases split the steps). Each entry is
  (fraction, sources[, alpha]): sources '' (every source), 'a,b' (those, sampled with
  q ~ p^alpha of their sizes, alpha default config.data.language_alpha) or
  'a:0.3,b:0.7' (those weights). No phases: [] (the sources of config.data throughout)."""
  spec = tuple(data_cfg.get("source_phases", ()))
  if not spec:
    return []
  if len(names) < 2:
    raise ConfigError("config.data.source_phases needs several sources: name them in "
                      "config.data.languages or as a mixture in config.data.corpus")
  if num_steps is None or num_steps < len(spec):
    raise ConfigError(f"config.data.source_phases has {len(spec)} phases and needs "
                      f"config.train.num_steps >= {len(spec)} to split the steps")
  number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
  out, done = [], 0.0
  for k, phase in enumerate(spec):
    where = f"config.data.source_phases[{k}]={phase!r}"
    if not (isinstance(phase, (tuple, list)) and len(phase) in (2, 3)
            and number(phase[0]) and 0 < phase[0] <= 1 and isinstance(phase[1], str)
            and (len(phase) == 2 or number(phase[2]) and 0 <= phase[2] <= 1)):
      raise ConfigError(f"{where}: write (fraction of the steps in (0, 1], sources: '' "
                        "(all), 'a,b' or 'a:0.3,b:0.7'[, alpha in [0, 1]])")
    parts = [p.strip() for p in phase[1].split(",") if p.strip()]
    chosen = [p.split(":", 1)[0].strip() for p in parts] or list(names)
    unknown = [n for n in chosen if n not in names]
    if unknown or len(set(chosen)) != len(chosen):
      raise ConfigError(f"{where}: {'sources ' + str(unknown) + ' are not' if unknown else 'a source repeats in'} "
                        f"the run's sources {list(names)}; name each at most once")
    weighted = [":" in p for p in parts]
    weights = None
    if any(weighted):
      try:
        weights = tuple(float(p.split(":", 1)[1]) for p in parts)
      except (ValueError, IndexError):  # a source without a weight, or not a number
        weights = ()
      if not all(weighted) or len(weights) != len(parts) or not all(
          math.isfinite(w) and w > 0 for w in weights) or len(phase) == 3:
        raise ConfigError(f"{where}: give every source of the phase a positive weight, "
                          "or none (then alpha samples them by size), not both")
    order = sorted(range(len(chosen)), key=lambda i: names.index(chosen[i]))
    out.append(SourcePhase(boundary(done, num_steps), tuple(chosen[i] for i in order),
                           None if weights is None else tuple(weights[i] for i in order),
                           float(phase[2] if len(phase) == 3 else data_cfg.language_alpha)))
    done += float(phase[0])
  if abs(done - 1.0) > 1e-6:
    raise ConfigError(f"config.data.source_phases fractions sum to {done}: they must sum "
                      "to 1 (e.g. ((0.8, 'en,de', 0.7), (0.2, '', 0.3)))")
  return out


@dataclasses.dataclass(frozen=True)
class BatchSchedule:
  """How the global batch is sized in each length phase (see the module docstring)."""

  by_tokens: bool = False  # config.train.batch_by_tokens
  warmup_tokens: int = 0  # config.train.batch_warmup_tokens (0: no warm-up)
  warmup_sizes: int = 0  # config.train.batch_warmup_sizes: n smaller sizes

  @classmethod
  def from_config(cls, train_cfg) -> "BatchSchedule":
    return cls(bool(train_cfg.batch_by_tokens), int(train_cfg.batch_warmup_tokens),
               int(train_cfg.batch_warmup_sizes))


@dataclasses.dataclass(frozen=True)
class Stage:
  """Steps [first_step, first_step + steps) (None: to the end) of `rows` x `length`
  global batches with `predictions` masked slots per row, reading the stream of length
  phase `phase` from its element `first_element` on."""

  first_step: int
  steps: int | None
  length: int
  rows: int
  predictions: int
  phase: int
  first_element: int = 0


def phase_rows(rows: int, max_seq_length: int, length: int, schedule: BatchSchedule
               ) -> int:
  """A length phase's global rows: `rows`, or by tokens rows * max_seq_length / length."""
  if not schedule.by_tokens:
    return rows
  tokens = rows * max_seq_length
  if tokens % length:
    raise ConfigError(
        f"config.train.batch_by_tokens: config.train.batch_size={rows} rows of "
        f"config.data.max_seq_length={max_seq_length} ({tokens:,} tokens) do not make "
        f"whole rows of the length phase's {length} tokens; choose a batch_size whose "
        f"tokens divide by {length}.")
  return tokens // length


def row_lengths(phases: Sequence[tuple[int | None, int, int]]) -> list[int]:
  """The row lengths of `phases` (`length_phases`' result), each once, ascending: the
  rows a corpus is built or prepared at."""
  return sorted({t for _, t, _ in phases})


@dataclasses.dataclass(frozen=True)
class Schedule:
  """A run's length phases and the stages of its global batch (`schedule`)."""

  phases: tuple[tuple[int | None, int, int], ...]  # `length_phases`' (steps, length, P)
  stages: tuple[Stage, ...]  # in order, the first at step 0
  batches: BatchSchedule  # how the stages' rows were sized

  @property
  def lengths(self) -> list[int]:
    """Each length phase's row length, in order."""
    return [t for _, t, _ in self.phases]


def schedule(phases: Sequence[tuple[int | None, int, int]], max_seq_length: int,
             num_steps: int | None, rows: int, batches: BatchSchedule = BatchSchedule()
             ) -> Schedule:
  """The run's `Schedule` of `phases` (`length_phases(config.data, num_steps)`): a
  stage per length phase (at its global rows, see `phase_rows`), the first preceded by
  the batch-size warm-up's sizes. One-line ConfigErrors: tokens that make no whole
  rows, a first phase whose rows the warm-up cannot split into n + 1 equal parts, a
  warm-up as long as the first phase."""
  out, first = [], 0
  for k, (steps, length, predictions) in enumerate(phases):
    full = phase_rows(rows, max_seq_length, length, batches)
    element = 0
    if k == 0 and batches.warmup_tokens:
      n = batches.warmup_sizes
      if full % (n + 1):
        raise ConfigError(
            f"config.train.batch_warmup_sizes={n}: the first length phase's {full} rows "
            f"do not split into {n + 1} equal parts (sizes {full} * k / {n + 1}); choose "
            f"a batch_warmup_sizes + 1 that divides {full}.")
      sizes = [full * j // (n + 1) for j in range(1, n + 1)]
      each = max(1, int(round(batches.warmup_tokens / (length * sum(sizes)))))
      limit = steps if steps is not None else num_steps
      if limit is not None and n * each >= limit:
        raise ConfigError(
            f"config.train.batch_warmup_tokens={batches.warmup_tokens:,} takes {n} x "
            f"{each:,} steps, not fewer than the first length phase's {limit:,}; lower "
            "it or raise config.train.num_steps.")
      for size in sizes:
        out.append(Stage(first, each, length, size, predictions, k, element))
        first, element = first + each, element + each * size
      steps = None if steps is None else steps - n * each
    out.append(Stage(first, steps, length, full, predictions, k, element))
    first += steps or 0
  return Schedule(tuple(phases), tuple(out), batches)


def check_divisible(stages: Sequence[Stage], devices: int, accum: int) -> None:
  """Every stage's rows divide by the `devices` the batch is split over times the
  `accum` micro-batches (one-line ConfigError naming the first that does not)."""
  for s in stages:
    if s.rows % (devices * accum):
      raise ConfigError(
          f"the global batch of {s.rows} rows x {s.length} tokens (from step "
          f"{s.first_step + 1}: config.train.batch_size, batch_by_tokens, "
          f"batch_warmup_sizes) is not divisible by the {devices} data-parallel devices "
          f"x {accum} grad_accum_steps; make every size a multiple of {devices * accum}.")
