"""ModernBERT through pretraining: `python -m bertjax.data.prepare` (both stages) with a
ModernBERT config, training from the prepared directory (packed rows, documents
isolated), a resume bit for bit after four SIGTERMs, a resume refused with another
family's config, the pretrained workdir exported to transformers' ModernBertForMaskedLM
(equal logits) and fine-tuned."""

import json
import os
import signal

import numpy as np
import pytest

from bertjax.data import pipeline, prepare
from bertjax.data.tokenizer import load_tokenizer
from bertjax.errors import CheckpointError, ConfigError
from bertjax.tasks import finetune
from bertjax.train import pretrain
from configs.finetune import glue
from tests import faults
from tests.helpers import hf_outputs, load_hf, tiny_config
from tests.modernbert_helpers import (TEXTS, modernbert_tokenizer, pretrain_config)  # pylint: disable=wrong-import-position
from tests.tasks_helpers import fixture

pytestmark = pytest.mark.usefixtures("shared_trainers")  # reruns share one step
STEPS = 20


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  """The embedded corpus tokenized (stage 1) and built into the recipe's packed rows
  (stage 2) by `prepare --config`, as the program runs them."""
  root = tmp_path_factory.mktemp("prepared")
  tokenizer = modernbert_tokenizer(str(root / "tokenizer"))
  out = str(root / "examples")
  lines = list(prepare.prepare_config(pretrain_config(tokenizer), input_spec="embedded",
                                      tokenizer_path=tokenizer, output=out, workers=1))
  assert lines[-1] == (f"train with --config.data.corpus={out} "
                       f"--config.data.tokenizer.path={out}/tokenizer")
  return out


def config_of(prepared):
  c = pretrain_config(os.path.join(prepared, "tokenizer"))
  c.data.corpus = prepared
  return c


@pytest.fixture(scope="module")
def reference(prepared, tmp_path_factory):
  """One uninterrupted run from the prepared rows."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  pretrain.run(config_of(prepared), workdir)
  return workdir


@pytest.mark.slow
def test_prepared_rows_are_packed_documents_and_train(prepared, reference):
  """The manifest holds the recipe's packed 64-token rows; the training batches read
  from them carry the documents' segment ids (a row crossing a document's end holds
  two, isolated), no NSP; the loss falls."""
  with open(os.path.join(prepared, "manifest.json")) as f:
    manifest = json.load(f)
  assert manifest["builder"] == "full_sentences" and manifest["tokenizer"]["style"] == "bert"
  assert manifest["splits"]["train-64"]["length"] == 64 and "eval-64" in manifest["splits"]
  config = config_of(prepared)
  data = pipeline.build_pretraining_data(
      config.data, load_tokenizer(os.path.join(prepared, "tokenizer")), batch_size=8,
      seed=0, nsp=False, num_steps=STEPS)
  assert data.stats["prepared"]
  stream = iter(data.train)
  batches = [next(stream) for _ in range(5)]
  assert batches[0]["input_ids"].shape == (8, 64)
  assert "next_sentence_labels" not in batches[0]
  segments = np.concatenate([b["segment_ids"] for b in batches])
  assert segments.min(-1).min() == 1 and segments.max() > 1
  losses = faults.losses(reference)
  assert sorted(losses) == [3, 6, 9, 12, 15, 18, 20]
  assert losses[20] < losses[3]


@pytest.mark.slow
def test_sigterm_four_times_resumes_bit_for_bit(prepared, reference, on_train_batch,
                                                tmp_path):
  """SIGTERM before 4 random steps; each time the loop saves and returns, and the
  next call resumes from the prepared rows: the metrics and the final state (params,
  StableAdamW's moments, the data position) equal the uninterrupted run's bit for
  bit."""
  kill_at = sorted(np.random.default_rng(3).choice(np.arange(1, STEPS), 4, replace=False))
  workdir, stops, done = str(tmp_path / "preempted"), [], 0
  for _ in range(len(kill_at) + 1):
    pending = [s - done for s in kill_at if s > done]
    on_train_batch(lambda n, _, first=pending[:1]: n in first and os.kill(os.getpid(),
                                                                          signal.SIGTERM))
    pretrain.run(config_of(prepared), workdir)
    done = int(faults.saved_state(workdir)["step"])
    stops.append(done)
  assert stops == [*kill_at, STEPS]
  faults.assert_same_metrics(workdir, reference)
  faults.assert_same_arrays(faults.saved_state(workdir), faults.saved_state(reference))


@pytest.mark.slow
def test_resuming_with_another_familys_config_is_one_line(prepared, reference, tmp_path):
  """A BERT config on the ModernBERT run's workdir, or the run's config with
  `family=bert`: one line each naming the families and the fix; nothing is written."""
  before = sorted(os.listdir(reference))
  bert = tiny_config()
  with pytest.raises(CheckpointError, match=r"holds a run of the 'modernbert' model "
                     r"family but config.model.family='bert': resume with the run's "
                     r"config") as e:
    pretrain.run(bert, reference)
  assert "\n" not in str(e.value)
  config = config_of(prepared)
  config.model.family = "bert"
  with pytest.raises(ConfigError, match=r"config.model.family='bert' but config.model has "
                     r"the 'modernbert' family's fields \(.*\): set "
                     r"--config.model.family=modernbert") as e:
    pretrain.run(config, reference)
  assert "\n" not in str(e.value)
  config = config_of(prepared)
  config.model.sbo = True
  with pytest.raises(ConfigError, match=r"config.model.sbo=True: the 'modernbert' family "
                     r"has no span-boundary objective \(SBO\) head") as e:
    pretrain.run(config, str(tmp_path))
  assert sorted(os.listdir(reference)) == before


@pytest.mark.slow
def test_span_masking_trains_without_an_sbo_head(prepared, tmp_path):
  """SpanBERT's span masking on ModernBERT: the rows carry span targets, which only an
  SBO head reads; the run trains (no error, finite loss)."""
  config = config_of(prepared)
  config.data.corpus = "embedded"  # span masking is drawn on the fly
  config.data.masking = "span"
  config.train.num_steps, config.train.log_every = 3, 1
  config.train.warmup_steps = 1
  pretrain.run(config, str(tmp_path))
  assert all(np.isfinite(v) for v in faults.losses(str(tmp_path)).values())


@pytest.mark.slow
def test_pretrained_workdir_exports_to_transformers(reference, tmp_path):
  """The pretrained workdir -> `python -m bertjax.convert --to=hf`: transformers'
  AutoModelForMaskedLM and AutoTokenizer read it with bertjax's ids and logits."""
  import transformers  # pylint: disable=g-import-not-at-top
  from bertjax import api, convert  # pylint: disable=g-import-not-at-top
  exported = str(tmp_path / "hf")
  convert.main(["--to=hf", f"--src={reference}", f"--dst={exported}"])
  ours = api.load_pretrained(reference).logits(TEXTS)
  tokens = transformers.AutoTokenizer.from_pretrained(exported)(TEXTS, padding=True)
  np.testing.assert_array_equal(tokens["input_ids"], ours["input_ids"])
  ref = hf_outputs(load_hf(exported), ours["input_ids"], ours["attention_mask"]).logits
  real = ours["attention_mask"].astype(bool)
  assert np.abs(ours["mlm_logits"] - ref.numpy())[real].max() < 1e-5


@pytest.mark.slow
def test_pretrained_workdir_fine_tunes(reference, tmp_path):
  """The pretrained workdir as config.init_from (SST-2, one epoch, rows at full
  length): the fine-tuning run's encoder is the workdir's, whole."""
  c = glue.get_config("sst2")
  c.init_from = reference
  c.data.train, c.data.dev = fixture("sst2_train.tsv"), fixture("sst2_dev.tsv")
  c.task.max_seq_length, c.task.batching = 32, "max"
  c.train.num_epochs, c.train.batch_size, c.train.eval_batch_size = 1, 8, 8
  scores = finetune.run(c, str(tmp_path / "sst2"))
  assert set(scores) == {"accuracy", "loss"} and np.isfinite(scores["loss"])
  with open(tmp_path / "sst2" / "config.json") as f, open(
      os.path.join(reference, "config.json")) as g:
    assert json.load(f)["model"] == json.load(g)["model"]  # the encoder's, whole
