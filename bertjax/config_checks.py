"""Start-up checks of config values: each failure is one `ConfigError` line naming the
field, its value and the allowed range, raised before anything slow (tokenizer
training, corpus reading, compilation) starts.

`pretraining(config)` covers every field of configs/bert_base.py (and the recipes that
override it); `finetuning(config)` every field of configs/finetune/base.py. The model
section is checked where the model's dataclass is built (`ModelConfig.__post_init__`),
the mesh against the device count where the mesh is built (`parallel/mesh.py`), and
the vocabulary of a resumed run against its tokenizer where the tokenizer is loaded.
"""

from __future__ import annotations

import math

from bertjax.errors import ConfigError

TOKENIZER_KINDS = ("wordpiece", "sentencepiece", "byte_level_bpe")
MIN_SEQ_LENGTH = 8  # [CLS] a [SEP] b [SEP] with room for a few tokens


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def at_least(field: str, value, lo) -> None:
  """`value` >= `lo` (NaN fails)."""
  if not (_number(value) and value >= lo):
    raise ConfigError(f"config.{field}={value!r} must be >= {lo}.")


def within(field: str, value, lo, hi, interval: str = "[]") -> None:
  """`value` in the interval from `lo` to `hi`, closed or open at each end as written
  in `interval` ('[]', '[)', '(]' or '()'); NaN fails."""
  ok = _number(value) and math.isfinite(value) and (
      (value >= lo if interval[0] == "[" else value > lo)
      and (value <= hi if interval[1] == "]" else value < hi))
  if not ok:
    raise ConfigError(f"config.{field}={value!r} must lie in {interval[0]}{lo}, {hi}"
                      f"{interval[1]}.")


def one_of(field: str, value, choices) -> None:
  if value not in choices:
    raise ConfigError(f"config.{field}={value!r}: use one of {tuple(choices)}.")


def _seed(config) -> None:
  if not (isinstance(config.seed, int) and config.seed >= 0):
    raise ConfigError(f"config.seed={config.seed!r} must be a non-negative integer "
                      "(numpy's generators refuse negative seeds).")


def _trainer(config) -> None:
  """The fields of the trainer both pretraining and fine-tuning share: optimizer,
  accumulation, logging, checkpoints, spikes, profiling, multi-process timeouts."""
  from bertjax import checkpoint  # pylint: disable=g-import-not-at-top
  from bertjax.train import optimizer  # pylint: disable=g-import-not-at-top
  t = config.train
  if not (_number(t.learning_rate) and 0 < t.learning_rate < math.inf):
    raise ConfigError(f"config.train.learning_rate={t.learning_rate!r} must be positive.")
  one_of("train.optimizer", t.optimizer, optimizer.OPTIMIZERS)
  at_least("train.weight_decay", t.weight_decay, 0)
  within("train.b1", t.b1, 0, 1, "[)")
  within("train.b2", t.b2, 0, 1, "[)")
  if not (_number(t.eps) and 0 < t.eps < math.inf):
    raise ConfigError(f"config.train.eps={t.eps!r} must be positive (Adam divides by "
                      "sqrt(v) + eps).")
  at_least("train.max_grad_norm", t.max_grad_norm, 0)
  at_least("train.log_every", t.log_every, 1)
  at_least("train.checkpoint_every", t.checkpoint_every, 1)
  at_least("train.max_to_keep", t.max_to_keep, 1)
  at_least("train.grad_accum_steps", t.grad_accum_steps, 1)
  at_least("train.spike_window", t.spike_window, 2)  # a standard deviation needs two
  if not (_number(t.spike_sigma) and 0 < t.spike_sigma < math.inf):
    raise ConfigError(f"config.train.spike_sigma={t.spike_sigma!r} must be positive.")
  steps = tuple(t.profile_steps)
  if steps and not (len(steps) == 2 and all(isinstance(s, int) for s in steps)
                    and 1 <= steps[0] <= steps[1]):
    raise ConfigError(f"config.train.profile_steps={steps!r}: give (first, last) steps "
                      "with 1 <= first <= last, or () for no trace.")
  one_of("checkpoint.on_corrupt", config.checkpoint.on_corrupt, checkpoint.ON_CORRUPT)
  d = config.distributed
  at_least("distributed.initialization_timeout_s", d.initialization_timeout_s, 1)
  at_least("distributed.heartbeat_timeout_s", d.heartbeat_timeout_s, 1)


def pretraining(config) -> None:
  """Every field of a pretraining config (configs/bert_base.py) in range."""
  from bertjax.data import masking, multilingual, pipeline, pretraining as builders  # pylint: disable=g-import-not-at-top
  from bertjax.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from bertjax.train import optimizer  # pylint: disable=g-import-not-at-top

  _seed(config)
  model = ModelConfig.from_config(config.model)
  t, d, tok = config.train, config.data, config.data.tokenizer
  at_least("train.num_steps", t.num_steps, 1)
  at_least("train.batch_size", t.batch_size, 1)
  at_least("train.warmup_steps", t.warmup_steps, 0)
  if t.warmup_steps >= t.num_steps:
    raise ConfigError(f"config.train.warmup_steps={t.warmup_steps} must be smaller than "
                      f"config.train.num_steps={t.num_steps}.")
  _trainer(config)
  optimizer.check(t)
  at_least("train.eval_every", t.eval_every, 1)
  at_least("train.eval_batches", t.eval_batches, 0)

  at_least("data.max_seq_length", d.max_seq_length, MIN_SEQ_LENGTH)
  if d.max_seq_length + model.position_offset > model.max_position_embeddings:
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
  one_of("data.random_token_distribution", d.random_token_distribution,
         masking.RANDOM_DISTRIBUTIONS)
  within("data.span_geometric_p", d.span_geometric_p, 0, 1, "(]")
  at_least("data.max_span_length", d.max_span_length, 1)
  within("data.short_seq_prob", d.short_seq_prob, 0, 1)
  at_least("data.dupe_factor", d.dupe_factor, 1)
  one_of("data.packing", d.packing, builders.PACKINGS)
  if model.nsp and d.isolate_documents:
    raise ConfigError("config.data.isolate_documents applies to packed rows: set "
                      "config.model.nsp=False or isolate_documents=False.")
  pipeline.length_phases(d, t.num_steps)
  pipeline.masked_lm_prob_phases(d, t.num_steps)
  within("data.language_alpha", d.language_alpha, 0, 1)
  one_of("data.language_counts", d.language_counts, multilingual.COUNTS)
  within("data.eval_fraction", d.eval_fraction, 0, 1, "()")
  if not (isinstance(d.text_field, str) and d.text_field):
    raise ConfigError(f"config.data.text_field={d.text_field!r} must name the JSON / "
                      "TFDS field holding the text, e.g. 'text'.")
  at_least("data.worker_count", d.worker_count, 0)
  at_least("data.raw_text_limit_mb", d.raw_text_limit_mb, 0)
  if not tok.path:  # A tokenizer is trained: it must be able to fill the vocabulary.
    one_of("data.tokenizer.kind", tok.kind, TOKENIZER_KINDS)
    if tok.vocab_size < model.vocab_size:
      raise ConfigError(
          f"config.data.tokenizer.vocab_size={tok.vocab_size} is smaller than "
          f"config.model.vocab_size={model.vocab_size}: the trained tokenizer cannot "
          "fill the model's vocabulary; set both to the same size.")


def finetuning(config) -> None:
  """Every field of a fine-tuning config (configs/finetune/base.py) in range; the
  model section only when it is used (no `init_from`), its dtype always."""
  from bertjax.model.config import ModelConfig, dtype_of  # pylint: disable=g-import-not-at-top

  _seed(config)
  dtype_of(config.model.dtype)
  if not config.init_from:
    ModelConfig.from_config(config.model)
  t = config.train
  at_least("train.batch_size", t.batch_size, 1)
  at_least("train.eval_batch_size", t.eval_batch_size, 1)
  at_least("train.num_epochs", t.num_epochs, 1)
  within("train.warmup_fraction", t.warmup_fraction, 0, 1, "[)")
  from bertjax.train import optimizer  # pylint: disable=g-import-not-at-top
  one_of("train.decay_start", t.decay_start, optimizer.DECAY_STARTS)
  _trainer(config)
  at_least("task.max_seq_length", config.task.max_seq_length, MIN_SEQ_LENGTH)
  at_least("freeze.top_k_layers", config.freeze.top_k_layers, -1)
  for lr in config.sweep.learning_rates:
    if not (_number(lr) and 0 < lr < math.inf):
      raise ConfigError(f"config.sweep.learning_rates={tuple(config.sweep.learning_rates)}"
                        " must all be positive.")
  for seed in config.sweep.seeds:
    if not (isinstance(seed, int) and seed >= 0):
      raise ConfigError(f"config.sweep.seeds={tuple(config.sweep.seeds)} must all be "
                        "non-negative integers.")
