"""Continued pretraining (`config.init_from`, bertjax/train/continued.py) and vocabulary
extension (bertjax/data/vocab_extension.py, bertjax/checkpoint/vocab_rows.py), on tiny
Hugging Face checkpoints of each tokenizer kind: what is loaded and what starts fresh,
the model section from the checkpoint, one-line errors, new rows from their pieces,
padding rows, the export transformers reads back, and a SIGTERM resume."""

import json
import os
import signal

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bertjax.checkpoint import pretrained as pretrained_lib  # pylint: disable=wrong-import-position
from bertjax.checkpoint import vocab_rows
from bertjax.data import manifest, pipeline, prepare, sources, tokenizer as tok_lib, vocab_extension
from bertjax.errors import BertjaxError, CheckpointError, ConfigError, DataError
from bertjax.hf import convert, files
from bertjax.train import continued, pretrain, state as state_lib
from configs import continued as continued_config
from configs import electra_tiny as electra_tiny_config
from tests import faults
from tests.deberta_helpers import hf_deberta
from tests.electra_helpers import hf_electra
from tests.helpers import perturb
from tests.modernbert_helpers import hf_modernbert

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


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  path = tmp_path_factory.mktemp("corpus") / "domain.txt"
  path.write_text("\n\n".join(CORPUS) + "\n")
  return str(path)


def cont_config(init_from: str, corpus: str, **train):
  """configs/continued.py, tiny: 16-token rows of the corpus, batch 8."""
  c = continued_config.get_config()
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
  """A new run's start as `pretrain.run` makes it, up to the initial parameters."""
  start = continued.open_run(config, workdir)
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


def test_a_checkpoint_holding_none_of_the_trained_networks_is_refused(corpus, tmp_path):
  """An ELECTRA discriminator continued by replaced-token detection: the run's networks
  (generator, discriminator) are none of the checkpoint's (encoder, rtd), so nothing
  would load; it stops in one line instead of training from scratch (issue 48)."""
  c = cont_config(hf_electra(str(tmp_path / "hf")), corpus)
  c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 5
  c.objectives = ("rtd",)
  c.generator = electra_tiny_config.get_config().generator
  c.generator.update(hidden_size=16, num_heads=1, intermediate_size=24, num_layers=1)
  with pytest.raises(CheckpointError, match="holds none of the parameters") as e:
    pretrain.run(c, str(tmp_path / "run"))
  assert "\n" not in str(e.value) and "generator" in str(e.value)


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


def _modernbert_config(corpus, directory):
  """configs/continued.py:modernbert's model and masking from a Hugging Face ModernBERT,
  tiny."""
  c = cont_config(hf_modernbert(directory), corpus, num_steps=2, eval_every=2)
  c_mb = continued_config.get_config("modernbert")
  c.model, c.data.masked_lm_prob_phases = c_mb.model, c_mb.data.masked_lm_prob_phases
  c.model.dtype = "float32"
  c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 10
  return c


# family -> (a tiny Hugging Face checkpoint of it in a directory, the modules a run of
# ('mlm',) initialises fresh, those of the checkpoint it leaves untrained).
FAMILIES = {
    "modernbert": (hf_modernbert, "nothing", "nothing"),
    "deberta": (hf_deberta, "nothing", "nothing"),
    "electra": (hf_electra, "mlm", "rtd"),  # a discriminator: no MLM head
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_continues_from_its_hugging_face_checkpoint(family, corpus, tmp_path,
                                                                 caplog):
  """ModernBERT (configs/continued.py:modernbert: the authors' attention output dropout
  on), DeBERTa-v3 (its checkpoint's 7 unused vocabulary rows kept) and an ELECTRA
  discriminator: the model section is the checkpoint's, its encoder and the MLM head
  where it has one are its weights; what starts fresh and what is left is logged."""
  make, fresh, left = FAMILIES[family]
  directory = make(str(tmp_path / "hf"))
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
  for name in theirs.params:
    if name in params:
      jax.tree.map(np.testing.assert_array_equal, theirs.params[name], params[name])
  assert f"initialised fresh: {fresh}; in the checkpoint but not trained: {left}." in (
      caplog.text)
  if family == "modernbert":
    assert model.attention_output_dropout == 0.1


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
  """`benchmark continued_hf`: from a continued run's workdir (vocabulary extended),
  the rebuilt start exported to transformers gives the run's held-out figures at step
  0, and without dropout its AdamW loop on the run's batches ends where the run does."""
  from bertjax.benchmarks import continued_hf  # pylint: disable=g-import-not-at-top
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
