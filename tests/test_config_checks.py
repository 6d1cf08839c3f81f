"""Config values out of range fail at start-up with one line naming the field: every
field of the pretraining and fine-tuning recipes, the model's sizes, the mesh against
the device count, and a resumed run's vocabulary against the tokenizer given now."""

from __future__ import annotations

import glob
import importlib
import json
import math
import os
import subprocess
import sys

import pytest

from bertjax import api
from bertjax.checkpoint import files, workdir as workdir_lib
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import CheckpointError, ConfigError
from bertjax.model.bert import ModelConfig
from bertjax.parallel import distributed, mesh as mesh_lib
from bertjax.tasks import finetune, sweep
from bertjax.train import pretrain
from configs import bert_tiny
from configs.finetune import glue

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
WORDPIECE = os.path.join(FIXTURES, "tokenizer")  # 400 tokens
BPE = os.path.join(FIXTURES, "bpe")  # 600 tokens

# (field, bad value, substrings the message must hold) on configs/bert_tiny.py.
PRETRAINING = [
    ("seed", -1, ["config.seed=-1"]),
    ("model.vocab_size", 0, ["config.model.vocab_size=0"]),
    ("model.num_layers", 0, ["config.model.num_layers=0"]),
    ("model.num_heads", 0, ["config.model.num_heads=0"]),
    ("model.hidden_size", 129, ["config.model.hidden_size=129", "config.model.num_heads=2"]),
    ("model.intermediate_size", -5, ["config.model.intermediate_size=-5"]),
    ("model.max_position_embeddings", 0, ["config.model.max_position_embeddings=0"]),
    ("model.type_vocab_size", 0, ["config.model.type_vocab_size=0"]),
    ("model.pad_token_id", 4096, ["config.model.pad_token_id=4096"]),
    ("model.position_offset", -1, ["config.model.position_offset=-1"]),
    ("model.dropout_rate", 1.0, ["config.model.dropout_rate=1.0"]),
    ("model.attention_dropout_rate", -0.1, ["config.model.attention_dropout_rate=-0.1"]),
    ("model.layer_norm_eps", 0.0, ["config.model.layer_norm_eps=0.0"]),
    ("model.initializer_range", -0.02, ["config.model.initializer_range=-0.02"]),
    ("model.attention_impl", "flash", ["config.model.attention_impl='flash'"]),
    ("model.remat_policy", "most", ["config.model.remat_policy='most'"]),
    ("model.dtype", "int8", ["config.model.dtype='int8'"]),
    ("model.pooler", False, ["config.model.pooler"]),
    ("data.max_seq_length", 4, ["config.data.max_seq_length=4"]),
    ("data.max_seq_length", 512, ["config.data.max_seq_length=512",
                                  "config.model.max_position_embeddings=128"]),
    ("data.max_predictions_per_seq", 0, ["config.data.max_predictions_per_seq=0"]),
    ("data.max_predictions_per_seq", 200, ["config.data.max_predictions_per_seq=200"]),
    ("data.masked_lm_prob", 1.5, ["config.data.masked_lm_prob=1.5"]),
    ("data.masked_lm_prob", 0.0, ["config.data.masked_lm_prob=0.0"]),
    ("data.mask_token_prob", -0.1, ["config.data.mask_token_prob=-0.1"]),
    ("data.random_token_prob", 1.2, ["config.data.random_token_prob=1.2"]),
    ("data.mask_token_prob", 0.95, ["config.data.mask_token_prob=0.95",
                                    "random_token_prob=0.1"]),
    ("data.masking", "words", ["config.data.masking='words'"]),
    ("data.random_token_distribution", "zipf", ["config.data.random_token_distribution"]),
    ("data.span_geometric_p", 0.0, ["config.data.span_geometric_p=0.0"]),
    ("data.max_span_length", 0, ["config.data.max_span_length=0"]),
    ("data.short_seq_prob", 2.0, ["config.data.short_seq_prob=2.0"]),
    ("data.dupe_factor", 0, ["config.data.dupe_factor=0"]),
    ("data.packing", "docs", ["config.data.packing='docs'"]),
    ("data.line_breaks", "newline", ["config.data.line_breaks='newline'"]),
    ("data.isolate_documents", True, ["config.data.isolate_documents"]),
    ("data.length_phases", ((0.5, 64),), ["config.data.length_phases"]),
    ("data.masked_lm_prob_phases", ((0.5, 0.3),), ["config.data.masked_lm_prob_phases"]),
    ("data.language_alpha", -1.0, ["config.data.language_alpha=-1.0"]),
    ("data.language_counts", "words", ["config.data.language_counts='words'"]),
    ("data.eval_fraction", 0.0, ["config.data.eval_fraction=0.0"]),
    ("data.worker_count", -1, ["config.data.worker_count=-1"]),
    ("data.raw_text_limit_mb", -1, ["config.data.raw_text_limit_mb=-1"]),
    ("data.tokenizer.kind", "bpe", ["config.data.tokenizer.kind='bpe'"]),
    ("data.tokenizer.vocab_size", 1000, ["config.data.tokenizer.vocab_size=1000",
                                         "config.model.vocab_size=4096"]),
    ("train.num_steps", -1, ["config.train.num_steps=-1"]),
    ("train.batch_size", 0, ["config.train.batch_size=0"]),
    ("train.batch_warmup_tokens", -1, ["config.train.batch_warmup_tokens=-1"]),
    ("train.batch_warmup_tokens", 10**6, ["config.train.batch_warmup_sizes=0"]),
    ("train.learning_rate_restarts", ((0.5, 1e-4, 0.0),),
     ["config.train.learning_rate_restarts", "schedule='wsd'"]),
    ("train.learning_rate_restarts", ((1.5, 1e-4, 0.0),),
     ["config.train.learning_rate_restarts[0]=(1.5, 0.0001, 0.0)"]),
    ("train.grad_accum_steps", 0, ["config.train.grad_accum_steps=0"]),
    ("train.warmup_steps", -1, ["config.train.warmup_steps=-1"]),
    ("train.warmup_steps", 1500, ["config.train.warmup_steps=1500",
                                  "config.train.num_steps=1500"]),
    ("train.decay_start", "peak", ["config.train.decay_start='peak'", "warmup_end"]),
    ("train.learning_rate", 0.0, ["config.train.learning_rate=0.0"]),
    ("train.learning_rate", math.nan, ["config.train.learning_rate=nan"]),
    ("train.optimizer", "sgd", ["config.train.optimizer='sgd'"]),
    ("train.schedule", "cosine", ["config.train.schedule='cosine'"]),
    ("train.weight_decay", -0.01, ["config.train.weight_decay=-0.01"]),
    ("train.b1", 1.0, ["config.train.b1=1.0"]),
    ("train.b2", -0.1, ["config.train.b2=-0.1"]),
    ("train.eps", 0.0, ["config.train.eps=0.0"]),
    ("train.max_grad_norm", -1.0, ["config.train.max_grad_norm=-1.0"]),
    ("train.log_every", 0, ["config.train.log_every=0"]),
    ("train.eval_every", 0, ["config.train.eval_every=0"]),
    ("train.checkpoint_every", 0, ["config.train.checkpoint_every=0"]),
    ("train.eval_batches", -1, ["config.train.eval_batches=-1"]),
    ("train.max_to_keep", 0, ["config.train.max_to_keep=0"]),
    ("train.spike_window", 1, ["config.train.spike_window=1"]),
    ("train.spike_sigma", 0.0, ["config.train.spike_sigma=0.0"]),
    ("train.profile_steps", (5, 2), ["config.train.profile_steps=(5, 2)"]),
    ("train.profile_steps", (0, 3), ["config.train.profile_steps=(0, 3)"]),
    ("data.text_field", "", ["config.data.text_field=''"]),
    ("data.corpus", "general:0=/a.parquet,domain:1=/b", ["config.data.corpus",
                                                         "weights must be positive"]),
    ("checkpoint.on_corrupt", "skip", ["config.checkpoint.on_corrupt='skip'"]),
    ("distributed.initialization_timeout_s", 0,
     ["config.distributed.initialization_timeout_s=0"]),
    ("distributed.heartbeat_timeout_s", -1, ["config.distributed.heartbeat_timeout_s=-1"]),
]

# The same on configs/modernbert_tiny.py: the ModernBERT family's fields and its recipe's.
MODERNBERT = [
    ("model.local_attention", 96, ["config.model.local_attention=96",
                                   "config.data.length_phases[0]'s length=64"]),
    ("model.local_attention", 7, ["config.model.local_attention=7"]),
    ("model.global_rope_theta_phases", (1e4, 1.6e5),
     ["config.model.global_rope_theta_phases=(10000.0, 160000.0)", "3 length phases"]),
    ("model.global_rope_theta_phases", (1e4, 1e4, 1e4),
     ["config.model.global_rope_theta=160000.0"]),
    ("model.attention_output_dropout", 1.0, ["config.model.attention_output_dropout=1.0"]),
    ("model.attention_dropout", 0.1, ["config.model.attention_dropout=0.1",
                                      "attention_output_dropout=0.1"]),
    ("train.batch_warmup_sizes", 4, ["config.train.batch_warmup_sizes=4", "64 rows"]),
    ("train.batch_warmup_tokens", 10**7, ["config.train.batch_warmup_tokens=10,000,000"]),
    ("train.learning_rate_restarts", ((0.95, 1e-3, 0.0),),
     ["config.train.learning_rate_restarts", "before the final decay (step 450)"]),
    ("train.learning_rate_restarts", ((0.8, 1e-3),),
     ["config.train.learning_rate_restarts[0]=(0.8, 0.001)"]),
    ("data.length_phases", ((0.8, 96), (0.1, 128), (0.1, 128)),
     ["config.train.batch_by_tokens", "config.train.batch_size=32", "96 tokens"]),
]

# The same on configs/finetune/glue.py (a random-init model: config.model is used).
FINETUNING = [
    ("seed", -3, ["config.seed=-3"]),
    ("model.dtype", "fp8", ["config.model.dtype='fp8'"]),
    ("model.num_heads", 5, ["config.model.hidden_size=768", "config.model.num_heads=5"]),
    ("model.dropout_rate", 1.5, ["config.model.dropout_rate=1.5"]),
    ("train.batch_size", 0, ["config.train.batch_size=0"]),
    ("train.eval_batch_size", 0, ["config.train.eval_batch_size=0"]),
    ("train.num_epochs", 0, ["config.train.num_epochs=0"]),
    ("train.warmup_fraction", 1.0, ["config.train.warmup_fraction=1.0"]),
    ("train.decay_start", "peak", ["config.train.decay_start='peak'", "warmup_end"]),
    ("train.learning_rate", -2e-5, ["config.train.learning_rate=-2e-05"]),
    ("train.optimizer", "sgd", ["config.train.optimizer='sgd'"]),
    ("train.b2", 1.5, ["config.train.b2=1.5"]),
    ("train.eps", -1e-6, ["config.train.eps=-1e-06"]),
    ("train.max_grad_norm", -1.0, ["config.train.max_grad_norm=-1.0"]),
    ("train.log_every", 0, ["config.train.log_every=0"]),
    ("train.checkpoint_every", 0, ["config.train.checkpoint_every=0"]),
    ("train.max_to_keep", 0, ["config.train.max_to_keep=0"]),
    ("train.grad_accum_steps", 0, ["config.train.grad_accum_steps=0"]),
    ("train.spike_window", 1, ["config.train.spike_window=1"]),
    ("train.profile_steps", (3,), ["config.train.profile_steps=(3,)"]),
    ("checkpoint.on_corrupt", "skip", ["config.checkpoint.on_corrupt='skip'"]),
    ("distributed.heartbeat_timeout_s", 0, ["config.distributed.heartbeat_timeout_s=0"]),
    ("task.max_seq_length", 4, ["config.task.max_seq_length=4"]),
    ("freeze.top_k_layers", -2, ["config.freeze.top_k_layers=-2"]),
    ("sweep.learning_rates", (3e-5, -1.0), ["config.sweep.learning_rates"]),
    ("sweep.seeds", (0, -1), ["config.sweep.seeds"]),
]


def _set(config, field: str, value) -> None:
  *parents, name = field.split(".")
  for p in parents:
    config = config[p]
  config[name] = value


def checks(check):
  """What a run checks before anything slow: `check` (pretraining's or the sweep's,
  each section by its owner), then `config.distributed` where the programs read it."""

  def run(config):
    check(config)
    d = config.distributed  # One process: returns after checking the timeouts.
    distributed.initialize(timeout_s=d.initialization_timeout_s,
                           heartbeat_timeout_s=d.heartbeat_timeout_s)

  return run


pretraining, finetuning = checks(pretrain.check_config), checks(sweep.check_config)


def _one_line_naming(error: Exception, substrings: list[str]) -> None:
  message = str(error)
  assert "\n" not in message, message
  for s in substrings:
    assert s in message, (s, message)


@pytest.mark.parametrize("field,value,names", PRETRAINING,
                         ids=[f"{f}={v}" for f, v, _ in PRETRAINING])
def test_pretraining_field_out_of_range(field, value, names):
  config = bert_tiny.get_config()
  pretraining(config)  # the recipe itself passes
  _set(config, field, value)
  with pytest.raises(ConfigError) as e:
    pretraining(config)
  _one_line_naming(e.value, names)


@pytest.mark.parametrize("field,value,names", MODERNBERT,
                         ids=[f"{f}={v}" for f, v, _ in MODERNBERT])
def test_modernbert_field_out_of_range(field, value, names):
  config = importlib.import_module("configs.modernbert_tiny").get_config()
  pretraining(config)
  _set(config, field, value)
  with pytest.raises(ConfigError) as e:
    pretraining(config)
  _one_line_naming(e.value, names)


@pytest.mark.parametrize("field,value,names", FINETUNING,
                         ids=[f"{f}={v}" for f, v, _ in FINETUNING])
def test_finetuning_field_out_of_range(field, value, names):
  config = glue.get_config("sst2")
  finetuning(config)
  _set(config, field, value)
  with pytest.raises(ConfigError) as e:
    finetuning(config)
  _one_line_naming(e.value, names)


PRETRAINING_RECIPES = sorted(
    os.path.basename(p)[:-3] for p in glob.glob(os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "*.py"))
    if not p.endswith("__init__.py"))


@pytest.mark.parametrize("recipe", PRETRAINING_RECIPES)
def test_every_pretraining_recipe_passes(recipe):
  pretraining(importlib.import_module(f"configs.{recipe}").get_config())


@pytest.mark.parametrize("recipe,arg", [("glue", "mnli"), ("glue", "stsb"), ("ner", "ner"),
                                        ("span_ner", "attention"), ("squad", "v2"),
                                        ("swag", None)])
def test_every_finetuning_recipe_passes(recipe, arg):
  module = importlib.import_module(f"configs.finetune.{recipe}")
  finetuning(module.get_config() if arg is None else module.get_config(arg))


def test_model_config_is_checked_where_it_is_built():
  with pytest.raises(ConfigError, match=r"config.model.hidden_size=30 is not divisible by "
                     r"config.model.num_heads=4"):
    ModelConfig(hidden_size=30, num_heads=4)
  with pytest.raises(ConfigError, match=r"config.model.num_heads=0 must be >= 1"):
    ModelConfig(num_heads=0)  # not a ZeroDivisionError


def test_mesh_that_does_not_match_the_devices():
  config = bert_tiny.get_config()
  config.mesh.data = 3  # 8 CPU devices in the tests
  with pytest.raises(ConfigError) as e:
    mesh_lib.create_mesh(config.mesh)
  _one_line_naming(e.value, ["config.mesh=", "'data': 3", "needs 3 devices but 8"])


def _workdir_with_tokenizer(path, tokenizer_dir: str, vocab_size: int) -> str:
  """A workdir's config.json and tokenizer/ (no checkpoint)."""
  config = bert_tiny.get_config()
  config.model.vocab_size = vocab_size
  workdir_lib.save_config(str(path), config)
  tok_lib.load_tokenizer(tokenizer_dir).save(str(path / files.TOKENIZER_DIR))
  return str(path)


def test_resumed_run_refuses_another_tokenizer(tmp_path):
  workdir = _workdir_with_tokenizer(tmp_path, WORDPIECE, 400)
  config = bert_tiny.get_config()
  config.model.vocab_size = 400
  config.data.tokenizer.path = BPE
  with pytest.raises(ConfigError) as e:
    pretrain.get_tokenizer(config, workdir)
  _one_line_naming(e.value, ["config.data.tokenizer.path=", "600 tokens", "400-token",
                             "drop --config.data.tokenizer.path"])
  # Same size, other tokens: id 7 and 8 swapped.
  tokens = [tok_lib.load_tokenizer(WORDPIECE).id_to_token(i) for i in range(400)]
  tokens[7], tokens[8] = tokens[8], tokens[7]
  (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
  config.data.tokenizer.path = str(tmp_path / "vocab.txt")
  with pytest.raises(ConfigError, match=r"differs from the tokenizer .* was trained with "
                     r"\(id 7"):
    pretrain.get_tokenizer(config, workdir)
  config.data.tokenizer.path = WORDPIECE  # the run's own tokenizer: fine
  assert pretrain.get_tokenizer(config, workdir).vocab_size == 400


def test_a_tokenizer_trained_short_of_the_rows_leaves_them_unused(tmp_path, caplog):
  """SentencePiece on a corpus too small for the pieces asked (deberta_tiny's 4,096 on
  the embedded corpus) gives fewer ids: the model keeps its rows, and the log says how
  many stay unused; more ids than rows is a one-line error."""
  config = bert_tiny.get_config()
  config.data.corpus = str(tmp_path / "small.txt")
  (tmp_path / "small.txt").write_text("the cat sat on the mat .\n\na dog ran in the "
                                      "old garden .\n" * 3)
  config.data.tokenizer.kind = "sentencepiece_bert"
  config.data.tokenizer.vocab_size = config.model.vocab_size = 300
  with caplog.at_level("INFO"):
    tokenizer = pretrain.get_tokenizer(config, str(tmp_path / "run"))
  assert tokenizer.vocab_size < 300
  assert (f"has {tokenizer.vocab_size} ids (of 300 asked): the model's last "
          f"{300 - tokenizer.vocab_size} rows stay unused") in caplog.text
  config.model.vocab_size = tokenizer.vocab_size - 1
  with pytest.raises(ConfigError) as e:
    pretrain.get_tokenizer(config, str(tmp_path / "other"))
  _one_line_naming(e.value, [f"but the tokenizer has {tokenizer.vocab_size} tokens"])

def test_resumed_run_refuses_another_vocab_size(tmp_path):
  workdir = _workdir_with_tokenizer(tmp_path, WORDPIECE, 400)
  config = bert_tiny.get_config()
  config.model.vocab_size = 500
  with pytest.raises(CheckpointError) as e:
    workdir_lib.check_resume(workdir, config)
  _one_line_naming(e.value, ["config.model.vocab_size=500 (the run's: 400)"])


def test_checkpoint_with_a_larger_tokenizer_is_refused_before_the_weights(tmp_path):
  workdir = _workdir_with_tokenizer(tmp_path / "w", WORDPIECE, 300)
  hf = tmp_path / "hf"
  hf.mkdir()
  (hf / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 300}))
  tok_lib.load_tokenizer(WORDPIECE).save(str(hf))
  for path in (workdir, str(hf)):  # neither has weights: the check comes first
    with pytest.raises(CheckpointError) as e:
      api.load_pretrained(path)
    _one_line_naming(e.value, ["tokenizer has 400 ids", "vocabulary only 300"])


def test_finetune_resume_refuses_another_tokenizer(tmp_path):
  workdir = _workdir_with_tokenizer(tmp_path, WORDPIECE, 400)
  (tmp_path / files.TASK_FILE).write_text(json.dumps({"labels": ["0", "1"]}))
  config = glue.get_config("sst2")
  config.tokenizer = BPE
  with pytest.raises(ConfigError) as e:
    finetune.run(config, workdir)
  _one_line_naming(e.value, ["config.tokenizer=", "600 tokens", "400-token"])


@pytest.mark.slow
@pytest.mark.parametrize("flag,message", [
    ("--config.model.dropout_rate=1.5", "error: config.model.dropout_rate=1.5 must lie in [0, 1)."),
    ("--config.mesh.data=3", "error: config.mesh={'data': 3, 'fsdp': 1, 'tensor': 1} needs 3 "
     "devices but 8 are available; set one size to -1."),
])
def test_main_exits_with_one_line(tmp_path, flag, message):
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.main", "--config=configs/bert_tiny.py",
       f"--workdir={tmp_path}", flag],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip() == message
