"""DeBERTa-v2 / v3 through the tools: DeBERTa's spm.model read (and a trained one in its
layout written back) as transformers' DebertaV2Tokenizer reads it; `python -m
bertjax.convert` both ways (a DebertaV2ForMaskedLM directory -> a bertjax workdir with
transformers' logits -> a directory transformers loads with the same logits, for v3's
`lm_predictions` head and v2's legacy `cls` head); fine-tuning the deberta_tiny recipe's
model and a converted checkpoint through `bertjax.tasks` (classification on packed rows,
tagging, span QA, multiple choice), `predict`, and the export to DebertaV2For<Task>
that transformers loads and that predicts as bertjax does; a converted workdir going on
pretraining (MLM, packed rows)."""

import json
import math
import os
import shutil

import jax

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bertjax import api, convert as convert_cli  # pylint: disable=wrong-import-position
from bertjax.data.tokenizer import load_tokenizer, train_tokenizer  # pylint: disable=wrong-import-position
from bertjax.hf import deberta as hf_deberta_table, files  # pylint: disable=wrong-import-position
from bertjax.model import deberta as db  # pylint: disable=wrong-import-position
from bertjax.tasks.finetuned import load_finetuned  # pylint: disable=wrong-import-position
from bertjax.errors import CheckpointError  # pylint: disable=wrong-import-position
from bertjax.train import pretrain  # pylint: disable=wrong-import-position
from tests import faults  # pylint: disable=wrong-import-position
from configs import deberta_tiny  # pylint: disable=wrong-import-position
from configs.finetune import glue, ner, squad, swag  # pylint: disable=wrong-import-position
from tests.helpers import hf_outputs, load_hf  # pylint: disable=wrong-import-position
from tests.deberta_helpers import (CLS, MASK, PAD, SEP, TEXTS, UNK, VOCAB,  # pylint: disable=wrong-import-position
                                   config_json, deberta_tokenizer, hf_deberta, hf_model,
                                   pretrain_config, state as hf_state)
from tests.tasks_helpers import export_matches, fine_tune_and_predict, fixture, shorten  # pylint: disable=wrong-import-position

# Every test here converts, fine-tunes or pretrains (tens of seconds to minutes).
pytestmark = pytest.mark.slow
PAIRS = (["the cat sat on the mat", "a dog"], ["while the dog ran", "in the old garden"])


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  return hf_deberta(str(tmp_path_factory.mktemp("hf")))


@pytest.fixture(scope="module")
def workdir(hf_dir, tmp_path_factory):
  """`python -m bertjax.convert --to=bertjax` of the Hugging Face directory."""
  out = str(tmp_path_factory.mktemp("converted") / "wd")
  convert_cli.main(["--to=bertjax", f"--src={hf_dir}", f"--dst={out}"])
  return out


def _max_diff(ours, theirs, mask):
  return float(np.abs(np.asarray(ours) - np.asarray(theirs))[mask.astype(bool)].max())


# ---- Tokenizer -------------------------------------------------------------------

def _same_ids(ours, theirs):
  texts = TEXTS + ["please turn [MASK] homework in ."]
  for args in ((texts,), PAIRS):
    got, want = ours(*args), theirs(*args, padding=True)
    for key in ("input_ids", "token_type_ids", "attention_mask"):
      np.testing.assert_array_equal(got[key], want[key])


def test_spm_model_is_read_as_transformers_reads_it(hf_dir, tmp_path):
  """DeBERTa's spm.model ([PAD] [CLS] [SEP] [UNK] as pieces, [MASK] after them): the
  special ids and the ids, token types and masks of DebertaV2Tokenizer for texts, pairs
  and a [MASK]; a tokenizer trained here in that layout (`sentencepiece_bert`),
  exported as spm.model, gives transformers the ids bertjax builds."""
  ours = load_tokenizer(hf_dir)
  theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)
  assert ours.style == "bert" and ours.vocab_size == VOCAB
  assert (ours.unk_id, ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id) == (
      UNK, CLS, SEP, PAD, MASK) == (theirs.unk_token_id, theirs.cls_token_id,
                                    theirs.sep_token_id, theirs.pad_token_id,
                                    theirs.mask_token_id)
  _same_ids(ours, theirs)
  trained = train_tokenizer(TEXTS * 20 + [" ".join(PAIRS[0] + PAIRS[1])] * 5,
                            "sentencepiece_bert", vocab_size=60, lowercase=False)
  assert (trained.pad_id, trained.cls_id, trained.sep_id, trained.unk_id) == (0, 1, 2, 3)
  out = str(tmp_path / "out")
  assert files.save_hf_tokenizer(out, trained, 64) == "spm"
  with open(os.path.join(out, "config.json"), "w") as f:
    json.dump({"model_type": "deberta-v2"}, f)
  theirs = transformers.AutoTokenizer.from_pretrained(out)
  assert theirs.mask_token_id == trained.mask_id and theirs.model_max_length == 64
  _same_ids(trained, theirs)


# ---- Convert ---------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["v3", "v2"])
def test_convert_both_ways_keeps_the_logits(variant, hf_dir, workdir, tmp_path):
  """HF dir -> bertjax workdir: its MLM logits equal transformers' on padded rows; ->
  HF dir again: AutoModelForMaskedLM reads it (the MLM head in the style it came in:
  v3's lm_predictions, v2's legacy cls with its narrower embedding) with the same
  logits, config.json naming the tokenizer's special ids."""
  if variant == "v3":
    source, converted = hf_dir, workdir
  else:
    source = hf_deberta(str(tmp_path / "hf_v2"), variant="v2")
    converted = str(tmp_path / "wd_v2")
    convert_cli.main(["--to=bertjax", f"--src={source}", f"--dst={converted}"])
  reference = load_hf(source)
  ours = api.load_pretrained(converted).logits(TEXTS)
  ids, mask = ours["input_ids"], ours["attention_mask"]
  assert mask.min() == 0 and ids.shape[1] > 8  # padding, and past the buckets
  ref = hf_outputs(reference, ids, mask).logits.numpy()
  assert _max_diff(ours["mlm_logits"], ref, mask) < 1e-5
  exported = str(tmp_path / "exported")
  convert_cli.main(["--to=hf", f"--src={converted}", f"--dst={exported}"])
  with open(os.path.join(exported, "config.json")) as f:
    written = json.load(f)
  assert written["architectures"] == ["DebertaV2ForMaskedLM"]
  assert written["legacy"] == (variant == "v2")
  assert (written["bos_token_id"], written["eos_token_id"], written["pad_token_id"]) == (
      CLS, SEP, PAD)
  back = load_hf(exported)
  assert _max_diff(hf_outputs(back, ids, mask).logits.numpy(), ref, mask) < 1e-5
  assert transformers.AutoTokenizer.from_pretrained(exported).mask_token_id == MASK


def test_converted_workdir_is_continued_never_trained_in(workdir, tmp_path):
  """Continued pretraining starts from the converted workdir (config.init_from) (MLM on packed rows
  of the embedded corpus, documents isolated) and
  three steps move its weights a little, not to a random initialisation's; the workdir
  itself, a conversion's, is refused as a pretraining run's, before anything is written."""
  config = pretrain_config(os.path.join(workdir, "tokenizer"), num_steps=3, warmup_steps=1,
                           log_every=1, checkpoint_every=3, learning_rate=1e-4)
  with open(os.path.join(workdir, "config.json")) as f:
    config.model.update(json.load(f)["model"])
  before = faults.tree(workdir)
  with pytest.raises(CheckpointError, match="holds a checkpoint converted by"):
    pretrain.run(config, workdir)
  assert faults.tree(workdir) == before
  run = str(tmp_path / "run")
  config.init_from = workdir
  pretrain.run(config, run)
  assert sorted(faults.losses(run)) == [1, 2, 3]
  start, end = api.load_pretrained(workdir).params, faults.saved_state(run, 3)["params"]
  moved = max(float(np.abs(a - b).max()) for a, b in zip(
      *(jax.tree.leaves(p["encoder"]) for p in (start, end))))
  assert 0 < moved < 0.01



def test_the_recipes_pair_trains_and_exports_both_networks(workdir, tmp_path):
  """deberta_tiny's objective at the tiny shape: 'rtd' with a generator of half the
  depth and GDES (lambda 10, as configs/deberta_v3_base.py): a few steps on packed rows
  log the pair's metrics; `convert --to=hf` writes the discriminator's trunk
  (DebertaV2Model: transformers has no detection head) in DST and the generator
  (DebertaV2ForMaskedLM) in DST/generator, whose outputs equal bertjax's."""
  recipe = deberta_tiny.get_config()
  assert recipe.objectives == ("rtd",) and recipe.rtd.discriminator_weight == 10.0
  config = pretrain_config(os.path.join(workdir, "tokenizer"), num_steps=6, warmup_steps=1,
                           log_every=3, checkpoint_every=6, eval_every=6)
  config.objectives, config.rtd = recipe.objectives, recipe.rtd
  config.generator = recipe.generator
  config.generator.num_layers = config.model.num_layers // 2
  run = str(tmp_path / "run")
  pretrain.run(config, run)
  rows = faults.train_rows(run)
  assert sorted(rows) == [3, 6]
  for name in ("generator_loss", "rtd_loss", "rtd_recall", "replaced_fraction"):
    assert np.isfinite(rows[6][name]), name
  dst = tmp_path / "hf"
  convert_cli.main(["--to=hf", f"--src={run}", f"--dst={dst}"])
  texts = TEXTS + ["please turn [MASK] homework in ."]
  for name, directory, cls in (("discriminator", dst, "DebertaV2Model"),
                               ("generator", dst / "generator", "DebertaV2ForMaskedLM")):
    ours = api.load_pretrained(run, network=name)
    got = ours.logits(texts) if name == "generator" else ours.encode(texts)
    model = getattr(transformers, cls).from_pretrained(directory).eval()
    with torch.no_grad():
      out = model(torch.as_tensor(got["input_ids"], dtype=torch.long),
                  attention_mask=torch.as_tensor(got["attention_mask"]))
    if name == "generator":
      diff = _max_diff(got["mlm_logits"], out.logits.numpy(), got["attention_mask"])
    else:
      diff = _max_diff(got["hidden_states"][-1], out.last_hidden_state.numpy(),
                       got["attention_mask"])
    assert diff < 1e-5, (name, diff)

# ---- Fine-tuning -----------------------------------------------------------------

# case -> (config, train file, dev file, start, batching); start 'recipe' is the
# deberta_tiny recipe's model from scratch (its tokenizer the spm.model of hf_dir).
RUNS = {
    "sst2": (lambda: glue.get_config("sst2"), "sst2_train.tsv", "sst2_dev.tsv", "recipe",
             "pack"),
    "ner": (ner.get_config, "conll_train.txt", "conll_dev.txt", "hf_dir", "pack"),
    "squad": (lambda: squad.get_config("v2"), "squad_v2.json", "squad_v2.json", "workdir",
              "bucket"),
    "swag": (swag.get_config, "swag_train.csv", "swag_dev.csv", "hf_dir", "bucket"),
}


@pytest.mark.parametrize("case", RUNS)
def test_fine_tunes_predicts_and_exports(case, request, tmp_path):
  """A few steps (one epoch of the fixture) of each task family on the DeBERTa trunk
  (ContextPooler heads for sequences); `predict` gives the dev predictions again;
  `convert --to=hf` writes the DebertaV2For<Task> with the labels, which transformers
  loads with outputs equal to the fine-tuned model's on dev rows."""
  make, train, dev, start, batching = RUNS[case]
  c = shorten(make(), train, dev, batching)
  if start == "recipe":
    c.model = deberta_tiny.get_config().model
    c.model.vocab_size = VOCAB
    c.model.dtype = "float32"
    c.tokenizer = deberta_tokenizer(str(tmp_path / "tok"))
  else:
    c.init_from = request.getfixturevalue(start)
  workdir = str(tmp_path / "run")
  fine_tune_and_predict(c, workdir)
  assert isinstance(load_finetuned(workdir).model, db.DebertaConfig)
  export_matches(workdir, str(tmp_path / "hf"), fixture(dev), hf_deberta_table.TASK_CLASSES)



def test_a_released_discriminators_detector_is_read_and_written_back():
  """A released DeBERTa-v3 holds its replaced-token detector as `mask_predictions.*`
  (microsoft/DeBERTa's LMMaskPredictionHead, unused by transformers): it loads as the
  'rtd' head (`config.rtd`), whose logits are that head's computed from the state dict
  by hand (LayerNorm of each token plus [CLS], dense, GELU, classifier), and an export
  writes the same keys back."""
  model = hf_model()
  state = hf_state(model)
  rng = np.random.default_rng(0)
  E = model.config.hidden_size
  head = {"LayerNorm.weight": 1 + 0.1 * rng.standard_normal(E),
          "LayerNorm.bias": 0.1 * rng.standard_normal(E),
          "dense.weight": 0.2 * rng.standard_normal((E, E)),
          "dense.bias": 0.1 * rng.standard_normal(E),
          "classifier.weight": 0.2 * rng.standard_normal((1, E)),
          "classifier.bias": 0.1 * rng.standard_normal(1)}
  state.update({f"mask_predictions.{k}": v.astype(np.float32) for k, v in head.items()})
  config, params, task = hf_deberta_table.load(config_json(model), state)
  assert config.rtd and task is None
  ids = np.asarray([[CLS, 5, 17, 40, SEP, PAD]], np.int32)
  family = db.FAMILY
  out = family.pretraining(config, ("rtd",)).apply({"params": params}, ids)["rtd_logits"]
  with torch.no_grad():
    h = model.deberta(torch.as_tensor(ids), attention_mask=torch.as_tensor(ids != PAD)
                      ).last_hidden_state.numpy()[0]
  x = h[:1] + h
  x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True)
                                                + model.config.layer_norm_eps)
  x = x * head["LayerNorm.weight"] + head["LayerNorm.bias"]
  x = x @ head["dense.weight"].T + head["dense.bias"]
  x = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
  want = (x @ head["classifier.weight"].T + head["classifier.bias"])[:, 0]
  real = ids[0] != PAD
  np.testing.assert_allclose(np.asarray(out)[0][real], want[real], atol=1e-4)
  back = hf_deberta_table.params_to_hf(params, config)
  for k, v in head.items():
    np.testing.assert_array_equal(back[f"mask_predictions.{k}"], v.astype(np.float32))
