"""Continued pretraining (`config.init_from`, bertjax/train/continued.py) and vocabulary
extension (bertjax/data/vocab_extension.py, bertjax/checkpoint/vocab_rows.py), on tiny
Hugging Face checkpoints of each tokenizer kind: what is loaded and what starts fresh,
the model section from the checkpoint, one-line errors, new rows from their pieces,
padding rows, the export transformers reads back, and a SIGTERM resume."""

import dataclasses
import json
import os
import signal

import flax.linen as nn
import jax
import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bertjax.checkpoint import pretrained as pretrained_lib  # pylint: disable=wrong-import-position
from bertjax.checkpoint import vocab_rows
from bertjax.data import manifest, pipeline, prepare, sources, tokenizer as tok_lib, vocab_extension
from bertjax.errors import BertjaxError, CheckpointError, ConfigError, DataError
from bertjax import model as model_lib, objectives as objectives_lib
from bertjax.hf import convert, files
from bertjax.objectives import rtd
from bertjax.train import continued, evaluators, pretrain, state as state_lib
from configs import continued as continued_config
from tests import faults
from tests.deberta_helpers import hf_deberta
from tests.electra_helpers import hf_electra
from tests.helpers import perturb
from tests.modernbert_helpers import hf_modernbert
from tests.tasks_helpers import fixture

CORPUS = ["The package manager dpkg installs packages and debhelper builds them.",
          "A daemon started by systemd logs to the journal through journald.",
          "The library libgtk draws widgets; the toolkit gtk themes them."] * 30
WORDS = ["dpkg", "debhelper", "systemd", "journald", "libgtk"]
TEXTS = ["dpkg and debhelper build packages.", "systemd starts journald", "the libgtk toolkit"]
# kind -> (transformers class, its config's extra fields, bertjax's trained tokenizer kind)
KINDS = {
    "wordpiece": ("BertForMaskedLM", {}),
    "byte_level_bpe": ("RobertaForMaskedLM", dict(type_vocab_size=1, pad_token_id=1,
                                                  bos_token_id=0, eos_token_id=2)),
    "sentencepiece": ("XLMRobertaForMaskedLM", dict(type_vocab_size=1, pad_token_id=1,
                                                    bos_token_id=0, eos_token_id=2)),
}


def _general_sentences() -> list[str]:
  return [s for d in sources.load_documents("embedded", "text") for s in d][:400]


def _hf_checkpoint(directory, kind: str) -> str:
  """A tiny Hugging Face MLM checkpoint of `kind`'s model with its tokenizer files, the
  tokenizer trained on general text (Python's docs: the domain's words split)."""
  tok = tok_lib.train_tokenizer(_general_sentences(), kind, vocab_size=120,
                                lowercase=kind == "wordpiece")
  files.save_hf_tokenizer(str(directory), tok)
  cls, extra = KINDS[kind]
  config = getattr(transformers, cls.replace("ForMaskedLM", "Config"))(
      vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
      intermediate_size=64, max_position_embeddings=40, **extra)
  torch.manual_seed(0)
  perturb(getattr(transformers, cls)(config)).save_pretrained(str(directory))
  return str(directory)


class _Checkpoints(dict):
  """kind -> its tiny Hugging Face checkpoint, made when first asked for."""

  def __init__(self, factory):
    super().__init__()
    self.factory = factory

  def __missing__(self, kind):
    self[kind] = _hf_checkpoint(self.factory.mktemp(kind), kind)
    return self[kind]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  return _Checkpoints(tmp_path_factory)


def _workdir_checkpoint(directory: str, family: str) -> str:
  """A bertjax workdir of a tiny random model of `family` (2 blocks of 32, sliding
  windows of 8 where it has them, every pretraining head of its recipe) on the
  fixtures' 400-id WordPiece tokenizer: drawn at a seed no test runs at and every
  array moved (norms and biases too), so that no fresh draw holds its values."""
  tokenizer = tok_lib.load_tokenizer(fixture("tokenizer"))
  fields = {f.name for f in dataclasses.fields(model_lib.FAMILIES[family].config)}
  config = model_lib.config_from(dict(
      family=family, vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=2,
      num_heads=2, intermediate_size=64, max_position_embeddings=64,
      pad_token_id=tokenizer.pad_id, dtype="float32",
      **{k: 8 for k in ("sliding_window",) if k in fields}))
  model = model_lib.family_of(config).pretraining(
      model_lib.family_of(config).pretraining_heads(config))
  params = nn.unbox(jax.jit(model.init_params)(jax.random.key(55)))
  params = jax.tree.map(lambda x: np.asarray(x + 0.05 * jax.random.normal(
      jax.random.key(56), x.shape)), params)
  pretrained_lib.save_workdir(directory, params, config, tokenizer)
  return directory


@pytest.fixture(scope="module")
def family_checkpoints(checkpoints, tmp_path_factory):
  """family -> a tiny checkpoint of it, made when first asked for: Hugging Face's
  BERT MLM, ModernBERT MLM, ELECTRA discriminator and DeBERTa-v3 MLM; for every other
  family of `bertjax.model.FAMILIES` a bertjax workdir (`_workdir_checkpoint`)."""
  hf = {"bert": lambda d: checkpoints["wordpiece"], "modernbert": hf_modernbert,
        "electra": hf_electra, "deberta": hf_deberta}

  class Made(dict):
    def __missing__(self, family):
      directory = str(tmp_path_factory.mktemp(family))
      self[family] = (hf[family](directory) if family in hf
                      else _workdir_checkpoint(directory, family))
      return self[family]

  return Made()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  path = tmp_path_factory.mktemp("corpus") / "domain.txt"
  path.write_text("\n\n".join(CORPUS) + "\n")
  return str(path)


def cont_config(init_from: str, corpus: str, config=None, **train):
  """configs/continued.py (or `config`, one of it), tiny: 16-token rows of the corpus,
  batch 8."""
  c = config or continued_config.get_config()
  c.init_from = init_from
  c.model.dtype = "float32"
  c.data.corpus = corpus
  c.data.max_seq_length = 16
  c.data.max_predictions_per_seq = 3
  c.data.eval_fraction = 0.1
  c.train.update(batch_size=8, num_steps=6, warmup_steps=1, eval_every=6, eval_batches=1,
                 checkpoint_every=2, log_every=1, learning_rate=1e-3)
  c.train.update(train)
  return c


def _start(config, workdir):
  """A new run's start as `pretrain.run` makes it (its checks included), up to the
  initial parameters."""
  start = continued.open_run(config, workdir)
  pretrain.check_config(start.config)
  os.makedirs(workdir, exist_ok=True)
  tokenizer = start.new_tokenizer()
  config = start.finish(tokenizer, workdir)
  setup = state_lib.build_trainer(config)
  return start, tokenizer, setup, jax.device_get(start.initial_params(setup, tokenizer))


def _tokens_file(tmp_path) -> str:
  path = tmp_path / "tokens.txt"
  path.write_text("# domain words\n" + "\n".join(WORDS + ["the"]) + "\n")
  return str(path)


def test_the_checkpoint_is_loaded_its_missing_heads_start_fresh(checkpoints, corpus, tmp_path,
                                                                caplog):
  """The model section is the checkpoint's (configs/continued.py gives none of its
  sizes); the encoder and MLM head are its weights; the NSP head and pooler it lacks
  start fresh and are named, as are the fresh optimizer, schedule and step."""
  c = cont_config(checkpoints["wordpiece"], corpus)
  c.objectives, c.model.pooler = ("mlm", "nsp"), True  # BertForMaskedLM has neither
  caplog.set_level("INFO")
  _, tokenizer, setup, params = _start(c, str(tmp_path / "run"))
  ours = pretrained_lib.load_pretrained(checkpoints["wordpiece"])
  assert setup.model.config.hidden_size == 32 and setup.model.config.nsp
  assert tokenizer.vocab_size == ours.tokenizer.vocab_size == setup.model.config.vocab_size
  theirs = ours.params
  jax.tree.map(np.testing.assert_array_equal, theirs["mlm"], params["mlm"])
  encoder = {k: v for k, v in params["encoder"].items() if k != "pooler"}
  jax.tree.map(np.testing.assert_array_equal, theirs["encoder"], encoder)
  assert "nsp" in params and "pooler" in params["encoder"]
  log = caplog.text
  assert "initialised fresh: encoder/pooler, nsp" in log
  assert "optimizer state, the learning-rate schedule and the step start fresh" in log


def test_new_rows_are_the_mean_of_their_pieces_and_padding_rows_start_low(checkpoints,
                                                                           corpus, tmp_path):
  """A tokens file adds each domain word as one token; its embedding row and MLM bias
  are the means of the rows of the pieces the old tokenizer split it into; the
  vocabulary is padded to a multiple of 64, the padding rows with embedding 0 and a
  bias 10 below the lowest (that they take no probability: the export test)."""
  c = cont_config(checkpoints["wordpiece"], corpus)
  c.vocab_extension.tokens_file = _tokens_file(tmp_path)
  start, tokenizer, setup, params = _start(c, str(tmp_path / "run"))
  old = start.loaded()[0]
  rows = setup.model.config.vocab_size
  assert rows % 64 == 0 and rows >= old.tokenizer.vocab_size + len(WORDS)
  emb = lambda p: p["encoder"]["embeddings"]["word_embeddings"]["embedding"]
  for word in WORDS:
    (new_id,) = tokenizer.tokenize(word)
    pieces = old.tokenizer.tokenize(word)
    assert len(pieces) > 1 and new_id >= old.tokenizer.vocab_size
    np.testing.assert_allclose(emb(params)[new_id], np.asarray(emb(old.params))[pieces].mean(0),
                               rtol=1e-6)
    np.testing.assert_allclose(params["mlm"]["bias"][new_id],
                               np.asarray(old.params["mlm"]["bias"])[pieces].mean(), rtol=1e-6)
  assert tokenizer.tokenize("the") == old.tokenizer.tokenize("the")  # known: unchanged
  pad = np.arange(tokenizer.vocab_size, rows)
  assert np.all(emb(params)[pad] == 0)
  bias = params["mlm"]["bias"]
  assert np.allclose(bias[pad], bias[:tokenizer.vocab_size].min() - vocab_rows.PAD_MARGIN)


@pytest.mark.parametrize("kind", [pytest.param(k, marks=[pytest.mark.slow] if i else [])
                                  for i, k in enumerate(KINDS)])
def test_an_extended_model_exports_and_transformers_predicts_as_bertjax(kind, checkpoints,
                                                                        corpus, tmp_path):
  """WordPiece (BERT), byte-level BPE (RoBERTa), SentencePiece (XLM-R): after the
  extension each domain word is one token; the padding rows take no probability worth
  counting; the export writes the extended tokenizer and transformers' AutoTokenizer
  gives bertjax's ids, its MLM class bertjax's logits."""
  c = cont_config(checkpoints[kind], corpus)
  c.vocab_extension.tokens_file = _tokens_file(tmp_path)
  _, tokenizer, setup, params = _start(c, str(tmp_path / "run"))
  for word in WORDS:
    assert len(tokenizer.tokenize(" " + word)) == 1, (word, tokenizer.tokenize(" " + word))
  workdir, exported = str(tmp_path / "workdir"), str(tmp_path / "exported")
  pretrained_lib.save_workdir(workdir, params, setup.model.config, tokenizer)
  ours = pretrained_lib.load_pretrained(workdir)
  convert.save_hf(exported, ours.params, ours.config, ours.tokenizer)
  batch = transformers.AutoTokenizer.from_pretrained(exported)(TEXTS, padding=True,
                                                                return_tensors="np")
  logits = ours.logits(TEXTS)
  probs = np.exp(logits["mlm_logits"] - logits["mlm_logits"].max(-1, keepdims=True))
  assert probs.shape[-1] > tokenizer.vocab_size  # padded
  assert (probs[..., tokenizer.vocab_size:].sum(-1) / probs.sum(-1)).max() < 1e-3
  np.testing.assert_array_equal(batch["input_ids"], logits["input_ids"])
  model = transformers.AutoModelForMaskedLM.from_pretrained(exported).eval()
  with torch.no_grad():
    hf = model(input_ids=torch.from_numpy(batch["input_ids"].astype(np.int64)),
               attention_mask=torch.from_numpy(batch["attention_mask"].astype(np.int64)))
  mask = batch["attention_mask"].astype(bool)
  np.testing.assert_allclose(logits["mlm_logits"][mask], hf.logits.numpy()[mask], atol=1e-4,
                             rtol=1e-4)


def test_learned_words_are_the_domains_most_useful():
  """`num_new_tokens`: a tokenizer of the same kind trained on the domain proposes the
  word-start tokens it emits; those the old tokenizer splits most (occurrences times
  the pieces saved) come first, and each is one token after the extension."""
  general = tok_lib.train_tokenizer(_general_sentences(), "wordpiece", vocab_size=120)
  words = vocab_extension.learn_words(general, CORPUS, 4)
  domain = {w.strip(".;,").lower() for s in CORPUS[:3] for w in s.split()}
  assert len(words) == 4 and set(words) <= domain
  savings = [len(general.tokenize(w)) - 1 for w in words]  # each word: 30 occurrences
  assert savings == sorted(savings, reverse=True) and savings[-1] >= max(
      len(general.tokenize(w)) - 1 for w in domain - set(words)) and savings[-1] >= 1
  extended, added = vocab_extension.extend(general, words)
  assert added == words and all(len(extended.tokenize(w)) == 1 for w in words)


@pytest.mark.slow
def test_sigterm_resume_is_bit_exact_and_never_reloads_the_checkpoint(
    checkpoints, corpus, tmp_path, on_train_batch, monkeypatch):
  """A continued run with a tokens file, stopped by SIGTERM before step 3 and rerun,
  ends with the uninterrupted run's metrics and state bit for bit (the held-out
  metrics of the start, `evals.eval.at_start`, logged once at step 0); the rerun resumes
  from its own checkpoint without reading init_from's weights (read once per run)."""
  reads = []
  load = continued.load_pretrained
  monkeypatch.setattr(continued, "load_pretrained",
                      lambda *a, **k: reads.append(a[0]) or load(*a, **k))
  c = cont_config(checkpoints["wordpiece"], corpus)
  c.vocab_extension.tokens_file = _tokens_file(tmp_path)
  reference, stopped = str(tmp_path / "reference"), str(tmp_path / "stopped")
  pretrain.run(c, reference)
  assert len(reads) == 1
  on_train_batch(lambda n, _: n == 3 and os.kill(os.getpid(), signal.SIGTERM))
  pretrain.run(c, stopped)
  assert int(faults.saved_state(stopped)["step"]) == 3 and len(reads) == 2
  on_train_batch(lambda n, _: None)
  pretrain.run(c, stopped)
  assert len(reads) == 2  # resumed from step 3: init_from not read again
  faults.assert_same_metrics(stopped, reference)  # the start's eval once, at step 0
  assert [r["step"] for r in faults.metrics(reference) if r["split"] == "eval"] == [0, 6]
  faults.assert_same_arrays(faults.saved_state(stopped), faults.saved_state(reference))
  record = json.load(open(os.path.join(stopped, "init_from.json")))
  assert record["rows"] % 64 == 0 and record["init_from"] == c.init_from


def test_a_recorded_run_reopens_without_reading_the_checkpoint(checkpoints, corpus, tmp_path,
                                                                monkeypatch):
  """A new run records its start (WORKDIR/init_from.json: the checkpoint's model, the
  padded rows); reopened, it takes its model section from the record and reads no
  weights of init_from (the trainer then restores its own checkpoint: the SIGTERM
  test)."""
  c = cont_config(checkpoints["wordpiece"], corpus)
  c.vocab_extension.tokens_file = _tokens_file(tmp_path)
  workdir = str(tmp_path / "run")
  start = continued.open_run(c, workdir)
  os.makedirs(workdir)
  first = start.finish(start.new_tokenizer(), workdir)
  monkeypatch.setattr(continued, "load_pretrained", lambda *a, **k: pytest.fail("read"))
  again = continued.open_run(c, workdir)
  assert again.record["rows"] == first.model.vocab_size == again.config.model.vocab_size
  assert again.config.to_dict() == first.to_dict()


def _bad(checkpoints, corpus, tmp_path, case):
  c = cont_config(checkpoints["wordpiece"], corpus)
  if case == "family":
    c.model.family = "modernbert"
  elif case == "vocab":
    c.model.vocab_size = 30522
  elif case == "shape":
    c.model.hidden_size = 64
  elif case == "empty_tokens":
    (tmp_path / "empty.txt").write_text("\n# nothing\n")
    c.vocab_extension.tokens_file = str(tmp_path / "empty.txt")
  elif case == "missing_tokens":
    c.vocab_extension.tokens_file = str(tmp_path / "nope.txt")
  elif case == "both":
    c.vocab_extension.tokens_file, c.vocab_extension.num_new_tokens = "x.txt", 3
  elif case == "no_init_from":
    c.init_from, c.vocab_extension.num_new_tokens = "", 3
  return c


BAD = {"family": (ConfigError, "config.model.family='modernbert' but config.init_from="),
       "vocab": (ConfigError, "config.model.vocab_size=30522 but config.init_from="),
       "shape": (ConfigError, "config.model.hidden_size=64 but config.init_from="),
       "empty_tokens": (DataError, "holds no words"),
       "missing_tokens": (DataError, "nope.txt does not exist"),
       "both": (ConfigError, "both name new tokens"),
       "no_init_from": (ConfigError, "set config.init_from")}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line(case, checkpoints, corpus, tmp_path):
  kind, match = BAD[case]
  with pytest.raises(kind, match=match) as e:
    pretrain.run(_bad(checkpoints, corpus, tmp_path, case), str(tmp_path / "run"))
  assert "\n" not in str(e.value)
  if case in ("vocab", "shape"):  # both values, and what to do
    assert "holds" in str(e.value) or "rows" in str(e.value)
    assert "configs/continued.py" in str(e.value)


def test_a_workdir_of_another_run_is_refused(checkpoints, corpus, tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text("{}")
  with pytest.raises(CheckpointError, match="did not start from config.init_from") as e:
    continued.open_run(cont_config(checkpoints["wordpiece"], corpus), str(workdir))
  assert "\n" not in str(e.value)
  (workdir / "init_from.json").write_text(json.dumps({"init_from": "/elsewhere"}))
  with pytest.raises(BertjaxError, match="continued from /elsewhere"):
    continued.open_run(cont_config(checkpoints["wordpiece"], corpus), str(workdir))


def test_a_checkpoint_holding_none_of_the_trained_networks_is_refused(checkpoints, corpus,
                                                                      tmp_path, monkeypatch):
  """Were nothing of the checkpoint placed in the run's networks, the run would train
  from scratch under a continued run's name: it stops in one line instead (issue 48)."""
  monkeypatch.setattr(objectives_lib.Networks, "placed", lambda self, loaded: {})
  with pytest.raises(CheckpointError, match="holds none of the parameters") as e:
    _start(cont_config(checkpoints["wordpiece"], corpus), str(tmp_path / "run"))
  assert "\n" not in str(e.value) and "encoder, mlm" in str(e.value)


def _flat(tree) -> dict:
  return {tuple(k.key for k in p): np.asarray(v)
          for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def _rtd_config(directory, corpus, **generator):
  """configs/continued.py continuing `directory` by replaced-token detection (rows of
  32), as the command line gives it: --config.objectives="('rtd',)" and `generator`'s
  sizes as --config.generator.* (the flags parsed as bertjax.main parses them)."""
  argv = ["main", f"--config={continued_config.__file__}", "--config.objectives=('rtd',)",
          *(f"--config.generator.{k}={v}" for k, v in generator.items())]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)
  values(argv)
  c = cont_config(directory, corpus, values.config)
  c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 5
  return c


def _hf_rtd_loss(directory, params, networks, data) -> float:
  """The held-out loss of the discriminator `directory` as transformers computes it
  (ElectraForPreTraining's logits, ELECTRA's BCE over the real tokens) on the rows the
  run's evaluation corrupts at step 0 (its generator's samples from `params`)."""
  hf = transformers.ElectraForPreTraining.from_pretrained(directory).eval()
  forward = jax.jit(lambda p, b: networks.forward(p, b, None)["mlm_logits"])
  total = count = 0.0
  for batch in data.eval_batches[:1]:  # config.train.eval_batches
    corrupted, labels = rtd.corrupt(batch, forward(params, batch),
                                    jax.random.key(rtd.EVAL_SEED))
    inputs = {k: torch.from_numpy(np.asarray(v).astype(np.int64)) for k, v in dict(
        input_ids=corrupted, attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"]).items()}
    with torch.no_grad():
      logits = hf(**inputs).logits.numpy()
    real = np.asarray(rtd.real_tokens(batch))
    bce = torch.nn.functional.binary_cross_entropy_with_logits(
        torch.from_numpy(logits), torch.from_numpy(np.asarray(labels, np.float32)),
        reduction="none").numpy()
    total, count = total + float((bce * real).sum()), count + float(real.sum())
  return total / count


@pytest.mark.slow
def test_a_discriminator_continues_with_replaced_token_detection(family_checkpoints, corpus,
                                                                 tmp_path, caplog):
  """transformers' ElectraForPreTraining continued by ('rtd',), the generator's width
  set as --config.generator.* set it: every array of the checkpoint is the
  discriminator's (its 'rtd' head included), the generator starts fresh at those sizes
  and reads the discriminator's tied embeddings, and the discriminator's held-out loss
  at step 0 is the checkpoint's own (transformers' on the same corrupted rows)."""
  directory = family_checkpoints["electra"]  # transformers' ElectraForPreTraining
  c = _rtd_config(directory, corpus, hidden_size=16, num_heads=2, intermediate_size=24)
  caplog.set_level("INFO")
  start, tokenizer, setup, params = _start(c, str(tmp_path / "run"))
  objectives = objectives_lib.from_config(start.config)
  networks = objectives.networks
  theirs = _flat(pretrained_lib.load_pretrained(directory).params)
  disc = _flat(networks.member("discriminator").params(params))
  assert set(disc) == set(theirs)
  for k, v in theirs.items():
    np.testing.assert_array_equal(disc[k], v, err_msg="/".join(k))
  gen = networks.member("generator").config
  assert (gen.hidden_size, gen.num_heads, gen.intermediate_size, gen.num_layers) == (
      16, 2, 24, 2)
  assert "initialised fresh: generator; in the checkpoint but not trained: nothing." in (
      caplog.text)
  data = pipeline.build_pretraining_data(
      start.config.data, tokenizer, batch_size=start.config.train.batch_size,
      seed=start.config.seed, nsp=False, num_steps=start.config.train.num_steps)
  (held_out,) = evaluators.from_config(start.config, setup, data, objectives)
  ours = held_out.run(params, 0)["rtd_loss"]
  np.testing.assert_allclose(ours, _hf_rtd_loss(directory, params, networks, data),
                             rtol=1e-5)


# family -> its generator checkpoint (transformers' MLM class and sizes) beside the
# discriminator checkpoint FAMILY_CHECKPOINTS makes.
GENERATORS = {
    "electra": lambda d: hf_electra(d, "ElectraForMaskedLM", hidden_size=16,
                                    num_attention_heads=2, intermediate_size=24,
                                    initializer_range=0.03),  # tables unlike the pair's
    "deberta": lambda d: hf_deberta(d, num_hidden_layers=1, initializer_range=0.03),
}


@pytest.mark.parametrize("family", list(GENERATORS))
def test_the_generator_starts_from_its_own_checkpoint(family, family_checkpoints, corpus,
                                                      tmp_path, caplog):
  """config.init_generator_from (ELECTRA and DeBERTa-v3 publish a generator beside the
  discriminator): the generator's sizes are its checkpoint's (config.generator's 0s),
  its arrays its checkpoint's but for the embeddings the two share: ELECTRA's tied
  tables are the discriminator's; DeBERTa-v3's word table is the generator's and the
  discriminator still reads its own (the residual the difference). A size given that
  the checkpoint contradicts is a one-line error."""
  directory = family_checkpoints[family]
  generator = GENERATORS[family](str(tmp_path / "generator"))
  c = _rtd_config(directory, corpus)
  c.init_generator_from = generator
  caplog.set_level("INFO")
  start, _, _, params = _start(c, str(tmp_path / "run"))
  networks = objectives_lib.from_config(start.config).networks
  theirs = _flat(pretrained_lib.load_pretrained(generator).params)
  ours = _flat(networks.member("generator").params(params))
  assert set(ours) == set(theirs)
  disc = _flat(pretrained_lib.load_pretrained(directory).params)
  shared = {k for k in ours if k[:2] == ("encoder", "embeddings") and k[2] in (
      rtd.TIED if family == "electra" else ())}
  for k in ours:
    np.testing.assert_array_equal(ours[k], (disc if k in shared else theirs)[k])
  assert start.config.generator.num_layers == (2 if family == "electra" else 1)
  assert f"the generator from {generator}:" in caplog.text
  for k, v in _flat(networks.member("discriminator").params(params)).items():
    if k in disc:  # DeBERTa: the 'rtd' head its Hugging Face class lacks is fresh
      np.testing.assert_allclose(v, disc[k], rtol=1e-6, atol=1e-6, err_msg="/".join(k))
  c.generator.num_heads = 1
  with pytest.raises(ConfigError, match="config.generator.num_heads=1 but the generator "
                     f"of {generator} has num_heads=") as e:
    continued.open_run(c, str(tmp_path / "run2"))
  assert "\n" not in str(e.value)


def test_each_field_the_config_overrides_is_logged(corpus, tmp_path, caplog):
  """A model section written out (not configs/continued.py's) that sets an ELECTRA
  checkpoint's dropouts of 0.3 / 0.2 to 0.0: the run trains with its own, and says so
  in a line each (issue 48); the fields it leaves alone are not mentioned."""
  c = cont_config(hf_electra(str(tmp_path / "hf"), hidden_dropout_prob=0.3,
                             attention_probs_dropout_prob=0.2), corpus)
  c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 5
  c.model.dropout_rate, c.model.attention_dropout_rate = 0.0, 0.0
  caplog.set_level("INFO")
  _, _, setup, _ = _start(c, str(tmp_path / "start"))
  assert (setup.model.config.dropout_rate, setup.model.config.attention_dropout_rate) == (
      0.0, 0.0)
  assert "config.model.dropout_rate=0.0 replaces the 0.3 of config.init_from=" in caplog.text
  assert "config.model.attention_dropout_rate=0.0 replaces the 0.2 of" in caplog.text
  assert "replaces the" not in caplog.text.replace("dropout_rate=0.0 replaces the", "")


@pytest.mark.parametrize("objective", list(objectives_lib.REGISTRY))
@pytest.mark.parametrize("family", list(model_lib.FAMILIES))
def test_every_family_continues_with_every_objective_it_has(family, objective,
                                                            family_checkpoints, corpus,
                                                            tmp_path):
  """The family registry by the objectives registry, each family's tiny checkpoint
  (`family_checkpoints`) continued with (objective,): either every array the checkpoint
  holds for the network it exports is that network's, with its value (what it leaves
  untrained is only heads the objective does not read), or, where the objective reads
  a head of its own the family does not have (BERT's NSP and SBO, ELECTRA's and
  DeBERTa's RTD), the run stops in one line naming the objective, the head and the
  family."""
  directory = family_checkpoints[family]
  if family == "modernbert":
    c = _modernbert_config(corpus, directory)
  else:
    c = cont_config(directory, corpus)
    c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 5
  c.objectives = (objective,)
  if objective == "nsp":  # its head reads the pooler (BertForMaskedLM has none: fresh)
    c.model.pooler = True
  if objective == "sbo":  # its head reads the spans span masking draws
    c.data.masking = "span"
  heads = {"mlm", *(h.name for h in model_lib.FAMILIES[family].heads)}
  if not set(objectives_lib.REGISTRY[objective].heads) <= heads:  # e.g. 'rtd' of BERT
    with pytest.raises(ConfigError, match=f"the '{objective}' objective .* reads the "
                       f"'{objective}' head, which the '{family}' family does not have") as e:
      _start(c, str(tmp_path / "run"))
    assert "\n" not in str(e.value)
    return
  start, _, _, params = _start(c, str(tmp_path / "run"))
  theirs = _flat(start.loaded()[0].params)
  ours = _flat(objectives_lib.from_config(start.config).networks.member().params(params))
  for k in set(theirs) & set(ours):
    np.testing.assert_array_equal(ours[k], theirs[k], err_msg="/".join(k))
  untrained = {k[0] for k in theirs if k not in ours}
  assert untrained <= {"mlm", "nsp", "rtd"} - {objective}, untrained


def _modernbert_config(corpus, directory):
  """configs/continued.py:modernbert's model and masking from a Hugging Face ModernBERT
  (`directory`, made there unless it holds one), tiny."""
  if not os.path.exists(os.path.join(directory, "config.json")):
    hf_modernbert(directory)
  c = cont_config(directory, corpus, num_steps=2, eval_every=2)
  c_mb = continued_config.get_config("modernbert")
  c.model, c.data.masked_lm_prob_phases = c_mb.model, c_mb.data.masked_lm_prob_phases
  c.model.dtype = "float32"
  c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 10
  return c


# family -> (the modules a run of ('mlm',) initialises fresh, those of the checkpoint it
# leaves untrained).
FAMILIES = {
    "modernbert": ("nothing", "nothing"),
    "deberta": ("nothing", "nothing"),
    "electra": ("mlm", "rtd"),  # a discriminator: no MLM head
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_continues_from_its_hugging_face_checkpoint(family, family_checkpoints,
                                                                 corpus, tmp_path, caplog):
  """ModernBERT (configs/continued.py:modernbert: the authors' attention output dropout
  on), DeBERTa-v3 (its checkpoint's 7 unused vocabulary rows kept) and an ELECTRA
  discriminator: the model section is the checkpoint's, its encoder and the MLM head
  where it has one are its weights; what starts fresh and what is left is logged."""
  fresh, left = FAMILIES[family]
  directory = family_checkpoints[family]
  if family == "modernbert":
    c = _modernbert_config(corpus, directory)
  else:
    c = cont_config(directory, corpus)
    c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 5
  caplog.set_level("INFO")
  _, tokenizer, setup, params = _start(c, str(tmp_path / "start"))
  theirs = pretrained_lib.load_pretrained(directory)
  model = setup.model.config
  assert model.family == family and model.hidden_size == theirs.config.hidden_size
  assert model.vocab_size == theirs.config.vocab_size >= tokenizer.vocab_size
  untrained = set(theirs.params) - set(params)
  assert untrained == ({left} if left != "nothing" else set())
  for name in set(theirs.params) - untrained:
    jax.tree.map(np.testing.assert_array_equal, theirs.params[name], params[name])
  assert f"initialised fresh: {fresh}; in the checkpoint but not trained: {left}." in (
      caplog.text)
  if family == "modernbert":
    assert model.attention_output_dropout == 0.1


@pytest.mark.slow
def test_a_replaced_token_detection_workdir_continues_both_networks(family_checkpoints,
                                                                    corpus, tmp_path, caplog):
  """A bertjax RTD run (two steps continuing the DeBERTa-v3 checkpoint) continued in
  turn by ('rtd',) from its workdir: the discriminator and the generator both start
  from the run's trained networks (the generator without config.init_generator_from,
  at its sizes), the GDES residual up to float rounding (ELECTRA's placement:
  test_the_generator_starts_from_its_own_checkpoint)."""
  c = _rtd_config(family_checkpoints["deberta"], corpus, num_layers=1)
  c.train.update(num_steps=2, eval_every=2)
  c.evals.eval.at_start = False
  first = str(tmp_path / "first")
  pretrain.run(c, first)
  trained = faults.saved_state(first)["params"]
  c = _rtd_config(first, corpus)
  caplog.set_level("INFO")
  start, _, _, params = _start(c, str(tmp_path / "second"))
  assert start.generator_from == first and start.config.generator.num_layers == 1
  networks = objectives_lib.from_config(start.config).networks
  for name, member in networks.members.items():
    ours, theirs = _flat(member.params(params)), _flat(member.params(trained))
    assert set(ours) == set(theirs)
    for k, v in theirs.items():
      np.testing.assert_allclose(ours[k], v, rtol=0, atol=1e-6, err_msg=f"{name}/{k}")
  assert "initialised fresh: nothing; in the checkpoint but not trained: nothing." in (
      caplog.text)


@pytest.mark.slow
def test_a_modernbert_and_a_bertjax_workdir_continue(corpus, tmp_path):
  """configs/continued.py:modernbert from a Hugging Face ModernBERT, two steps trained;
  the workdir it leaves continues in turn (init_from a bertjax workdir) from its
  weights."""
  c = _modernbert_config(corpus, str(tmp_path / "hf"))
  first = str(tmp_path / "first")
  pretrain.run(c, first)
  trained = faults.saved_state(first)["params"]
  c.init_from = first
  _, _, _, again = _start(c, str(tmp_path / "second"))
  jax.tree.map(np.testing.assert_array_equal, trained, again)


@pytest.mark.slow
def test_a_hugging_face_loop_continues_the_same_way(checkpoints, corpus, tmp_path):
  """`benchmarks continued_hf`: from a continued run's workdir (vocabulary extended),
  the rebuilt start exported to transformers gives the run's held-out figures at step
  0, and without dropout its AdamW loop on the run's batches ends where the run does."""
  from benchmarks import continued_hf  # pylint: disable=g-import-not-at-top
  c = cont_config(checkpoints["wordpiece"], corpus, num_steps=4, eval_every=4,
                  checkpoint_every=4)
  c.vocab_extension.tokens_file = _tokens_file(tmp_path)
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
  c.data.corpus = f"general:0.5=embedded,domain:0.5={corpus}"
  run = str(tmp_path / "run")
  pretrain.run(c, run)
  config, tokenizer, params, model = continued_hf.rebuild(run)
  start = str(tmp_path / "hf_start")
  convert.save_hf(start, params, model, tokenizer)
  data = pipeline.build_pretraining_data(
      config.data, tokenizer, batch_size=config.train.batch_size, seed=config.seed,
      nsp=False, num_steps=config.train.num_steps)
  _, hf = continued_hf.train_hf(config, start, data, torch)
  ours = continued_hf.bertjax_results(run)
  for k in ("general/mlm_loss", "domain/mlm_loss", "mlm_loss", "mlm_accuracy"):
    np.testing.assert_allclose(hf["start"][k], ours["start"][k], rtol=1e-4, err_msg=k)
    np.testing.assert_allclose(hf["end"][k], ours["end"][k], rtol=2e-3, err_msg=k)
  assert hf["end"]["mlm_loss"] < hf["start"]["mlm_loss"]


def test_prepare_tokenizes_with_the_extended_checkpoint_tokenizer(checkpoints, corpus,
                                                                 tmp_path):
  """`prepare --config` of a continued config tokenizes with the run's tokenizer: the
  checkpoint's, extended by the config's tokens file (the same ids a run makes); the
  run given that prepared tokenizer with the extension still on is a one-line error."""
  c = cont_config(checkpoints["wordpiece"], corpus)
  c.vocab_extension.tokens_file = _tokens_file(tmp_path)
  made = tok_lib.load_tokenizer(prepare._continued_tokenizer(c, None, str(tmp_path)))
  start = continued.open_run(c, str(tmp_path / "run"))
  assert manifest.fingerprint(made) == manifest.fingerprint(start.new_tokenizer())
  assert all(len(made.tokenize(w)) == 1 for w in WORDS)
  c.data.tokenizer.path = str(tmp_path / "tokenizer")
  with pytest.raises(ConfigError, match="already extends config.init_from's tokenizer "
                     r"\(5 more ids.*drop config.vocab_extension") as e:
    continued.open_run(c, str(tmp_path / "run2")).new_tokenizer()
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_a_continued_run_reads_the_corpus_prepared_for_it(checkpoints, corpus, tmp_path):
  """`prepare --config` with init_from and a tokens file, then the run with the flags it
  prints: the run reads the prepared examples with the prepared (extended) tokenizer,
  its vocabulary rows padded past it."""
  c = cont_config(checkpoints["wordpiece"], corpus, num_steps=2, eval_every=2)
  c.vocab_extension.tokens_file = _tokens_file(tmp_path)
  out = str(tmp_path / "prepared")
  lines = list(prepare.prepare_config(c, input_spec=None, tokenizer_path=None,
                                      output=out, workers=1))
  assert lines[-1] == (f"train with --config.data.corpus={out} --config.data.tokenizer.path="
                       f"{out}/tokenizer --config.vocab_extension.tokens_file='' "
                       "--config.vocab_extension.num_new_tokens=0")
  c.data.corpus, c.data.tokenizer.path = out, f"{out}/tokenizer"
  c.vocab_extension.tokens_file = ""
  run = str(tmp_path / "run")
  assert pretrain.run(c, run)["mlm_loss"] > 0
  record = json.load(open(os.path.join(run, "init_from.json")))
  assert record["tokenizer_size"] == tok_lib.load_tokenizer(f"{out}/tokenizer").vocab_size
  assert record["rows"] % 64 == 0 and record["rows"] > record["tokenizer_size"]
