"""ModernBERT through fine-tuning: the task heads against transformers' ModernBertFor*
on the same weights (pooling 'cls' / 'mean', the head's transform, its initialisation),
packed rows predicting as full rows, the task families fine-tuned from a bertjax
workdir and from a Hugging Face directory (`config.init_from`) with bucketed, full or
packed batches, `predict`, the export to ModernBertFor* (equal outputs, labels), and
the one-line errors of what the family or the run cannot do."""

import json
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from bertjax import convert as convert_cli  # pylint: disable=wrong-import-position
from bertjax.errors import CheckpointError, ConfigError  # pylint: disable=wrong-import-position
from bertjax.hf import files, modernbert as hf_modernbert_table  # pylint: disable=wrong-import-position
from bertjax.model import modernbert as mb  # pylint: disable=wrong-import-position
from bertjax.tasks import base, finetune, get_task  # pylint: disable=wrong-import-position
from bertjax.tasks.finetuned import load_finetuned  # pylint: disable=wrong-import-position
from configs.finetune import glue, ner, span_ner, swag  # pylint: disable=wrong-import-position
from tests.helpers import hf_outputs, load_hf  # pylint: disable=wrong-import-position
from tests.modernbert_helpers import (SIZES, hf_config, hf_modernbert, model_section,  # pylint: disable=wrong-import-position
                                      modernbert_tokenizer)
from tests.tasks_helpers import export_matches, fine_tune_and_predict, fixture, shorten  # pylint: disable=wrong-import-position

T = 20  # > the window's 9 keys: the local blocks attend within it


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  return hf_modernbert(str(tmp_path_factory.mktemp("hf")))


@pytest.fixture(scope="module")
def hf_mean(hf_dir, tmp_path_factory):
  """The same weights with `classifier_pooling: mean` (as HF's from_pretrained(...,
  classifier_pooling='mean') saves it)."""
  out = tmp_path_factory.mktemp("hf_mean") / "d"
  shutil.copytree(hf_dir, out)
  with open(out / "config.json") as f:
    hf = json.load(f)
  with open(out / "config.json", "w") as f:
    json.dump(dict(hf, classifier_pooling="mean"), f)
  return str(out)


@pytest.fixture(scope="module")
def workdir(hf_dir, tmp_path_factory):
  """`python -m bertjax.convert --to=bertjax` of the Hugging Face directory."""
  out = str(tmp_path_factory.mktemp("converted") / "wd")
  convert_cli.main(["--to=bertjax", f"--src={hf_dir}", f"--dst={out}"])
  return out


# ---- The heads against transformers ------------------------------------------------

# case -> (task config, bertjax task, Hugging Face class, pooling): the pooling by the
# mean, ModernBERT's own (every head with the [CLS] pooling of every family's tiny
# config against transformers: tests/test_family_conformance.py).
HEADS = {
    "classification_mean": (glue.get_config("mnli").task, "ModernBertForSequenceClassification", "mean"),
    "multiple_choice_mean": (swag.get_config().task, "ModernBertForMultipleChoice", "mean"),
}


def _truncated_normal_std(x: np.ndarray, std: float, cut: float) -> None:
  """`x` drawn from a normal of `std` cut at +-`cut` std (the truncated draw's own std
  is 0.77 std at a cut of 2)."""
  assert np.abs(x).max() <= cut * std * (1 + 1e-6)
  assert 0.6 * std < x.std() < 1.0 * std


@pytest.mark.slow
@pytest.mark.parametrize("case", HEADS)
def test_task_heads_equal_transformers_on_the_same_weights(case, tmp_path):
  """The encoder + head of each task (random init, with padding, rows longer than the
  window) exported with the family's table: transformers' ModernBertFor<Task> gives
  the same outputs. The head initialises as transformers' does: `transform` with std
  initializer_range / sqrt(2 L), the classifier with hidden_size^-0.5, both cut at
  2 std, biases zero."""
  task_cfg, cls, pooling = HEADS[case]
  cfg = hf_modernbert_table.model_config_from_hf(
      hf_config(classifier_pooling=pooling).to_dict())
  task = get_task(task_cfg.name)(task_cfg, None, T)
  task.labels = ["a", "b", "c"] if task.name in ("classification", "tagging") else []
  model = base.FinetuneModel(cfg, task.head(cfg))
  rng = np.random.default_rng(0)
  shape = (2, 4, T) if task.name == "multiple_choice" else (3, T)
  lengths = rng.integers(T // 2, T + 1, shape[:-1])
  lengths.flat[0] = T
  mask = (np.arange(T) < lengths[..., None]).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(0, 600, shape), cfg.pad_token_id).astype(np.int32)
  batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
  params = jax.tree.map(np.asarray, nn.unbox(jax.device_get(
      jax.jit(model.init)(jax.random.key(0), batch)["params"])))
  head = params["head"]
  _truncated_normal_std(head["transform"]["dense"]["kernel"],
                        0.02 / np.sqrt(2 * SIZES["num_layers"]), 2.0)
  name = hf_modernbert_table.TASK_CLASSES[task.name][1]
  _truncated_normal_std(head[name]["kernel"], SIZES["hidden_size"] ** -0.5, 2.0)
  assert not head[name]["bias"].any()
  out = model.apply({"params": params}, batch)
  ours = (np.stack([out["start_logits"], out["end_logits"]], -1) if task.name == "squad"
          else np.asarray(out["logits"]))
  hf, state = hf_modernbert_table.export(params, cfg, task.name, task.labels or None)
  files.write(str(tmp_path), hf, state)
  assert hf["architectures"] == [cls] and hf["classifier_pooling"] == pooling
  theirs = hf_outputs(load_hf(str(tmp_path)), ids, mask)
  ref = (np.stack([theirs.start_logits.numpy(), theirs.end_logits.numpy()], -1)
         if task.name == "squad" else theirs.logits.numpy())
  if task.name in ("tagging", "squad"):  # per token: the real ones
    ours, ref = ours[mask.astype(bool)], ref[mask.astype(bool)]
  assert np.abs(ours - ref).max() < 1e-5


@pytest.mark.slow
def test_head_dropout_is_classifier_dropout():
  """In training the head drops out its transformed features at `classifier_dropout`
  (Hugging Face's `drop` after `head`), and nothing else drops out when the encoder's
  rates are 0."""
  task = get_task("classification")(glue.get_config("sst2").task, None, T)
  task.labels = ["0", "1"]
  ids = np.random.default_rng(0).integers(0, 600, (4, T)).astype(np.int32)
  batch = {"input_ids": ids, "attention_mask": np.ones_like(ids),
           "token_type_ids": np.zeros_like(ids)}

  def logits(dropout, deterministic):
    cfg = hf_modernbert_table.model_config_from_hf(
        hf_config(classifier_dropout=dropout).to_dict())
    model = base.FinetuneModel(cfg, task.head(cfg))
    params = model.init(jax.random.key(0), batch)["params"]
    return np.asarray(model.apply({"params": params}, batch, deterministic=deterministic,
                                  rngs={"dropout": jax.random.key(1)})["logits"])

  np.testing.assert_array_equal(logits(0.0, False), logits(0.0, True))
  assert np.abs(logits(0.5, False) - logits(0.5, True)).max() > 1e-3
  np.testing.assert_array_equal(logits(0.5, True), logits(0.0, True))


# ---- Packed rows -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("case", ["sst2_cls", "sst2_mean", "ner"])
def test_packed_rows_predict_as_full_rows(case, tmp_path):
  """A random ModernBERT fine-tuned from scratch (config.model of the family): each
  example's outputs from its full-length row, from bucketed rows and from packed rows
  (several examples a row: documents isolated, rotary positions restarting, the
  example's pooled vector from the encoder's `slots`, 'cls' or 'mean') are equal."""
  name, _, pooling = case.partition("_")
  c = glue.get_config("sst2") if name == "sst2" else ner.get_config()
  c.tokenizer = modernbert_tokenizer(str(tmp_path / "tok"))
  c.model = model_section(classifier_pooling=pooling or "cls")
  c.task.max_seq_length = 64
  train = fixture("sst2_train.tsv" if name == "sst2" else "conll_train.txt")
  start = finetune.load_start(c)
  task = get_task(c.task.name)(c.task, start.tokenizer, c.task.max_seq_length)
  examples = task.read(train, "train")
  task.labels = task.fit_labels(examples)
  features = task.featurize(examples[:8], train=True)
  model = base.FinetuneModel(start.model, task.head(start.model))
  params = jax.jit(model.init)(jax.random.key(0), finetune.example_batch(features))["params"]
  apply = jax.jit(lambda p, b: model.apply({"params": p}, b)["logits"])
  n = len(features)
  idx, valid = np.arange(n), np.ones(n, bool)
  full = np.asarray(apply(params, finetune.rows(features, idx, valid)))
  c.task.batching = "bucket"
  bucketed = finetune.batcher(task, features, start.model).batch(idx, valid, slice(0, n))
  got = np.asarray(apply(params, bucketed))
  c.task.batching = "pack"
  packed = finetune.batcher(task, features, start.model).batch(idx, valid, slice(0, n))
  assert packed["input_ids"].shape[0] < n
  out = np.asarray(apply(params, packed))
  ids, lengths = features.arrays["input_ids"], features.arrays["attention_mask"].sum(-1)
  if name == "sst2":
    np.testing.assert_allclose(got, full, atol=2e-5)
  else:  # at the real tokens (a padding query's output depends on the row's length)
    real = bucketed["attention_mask"].astype(bool)
    np.testing.assert_allclose(got[real], full[:, :got.shape[1]][real], atol=2e-5)
  seen = []
  for r in range(packed["input_ids"].shape[0]):
    for k in range(packed["segment_ids"][r].max()):  # slot k: segment id k + 1
      at = np.flatnonzero(packed["segment_ids"][r] == k + 1)
      (i,) = [j for j in range(n) if j not in seen and lengths[j] == len(at)
              and np.array_equal(ids[j, :len(at)], packed["input_ids"][r, at])][:1]
      seen.append(i)
      if name == "sst2":
        np.testing.assert_allclose(out[r, k], full[i], atol=2e-5)
      else:
        np.testing.assert_allclose(out[r, at], full[i, :len(at)], atol=2e-5)
  assert sorted(seen) == list(range(n))


# ---- Every task family, fine-tuned -------------------------------------------------

# case -> (config, train file, dev file, init_from fixture, batching). Each init source,
# batching mode and pooling, a pooled and a per-token head, the feature-based tagger
# and the no-class errors once; every head's export (SQuAD's and mean pooling's
# included) is test_task_heads_equal_transformers', and regression and SQuAD through
# the loop are the task tests' (test_tasks_*) and DeBERTa's (test_deberta_tools).
RUNS = {
    "sst2": (lambda: glue.get_config("sst2"), "sst2_train.tsv", "sst2_dev.tsv", "workdir", "pack"),
    "ner": (ner.get_config, "conll_train.txt", "conll_dev.txt", "hf_dir", "pack"),
    "ner_features": (lambda: ner.get_config("features"), "conll_train.txt", "conll_dev.txt", "workdir", "max"),
    "span_ner": (span_ner.get_config, "span_ner_train.jsonl", "span_ner_dev.jsonl", "hf_dir", "max"),
    "swag": (swag.get_config, "swag_train.csv", "swag_dev.csv", "hf_mean", "bucket"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", RUNS)
def test_fine_tunes_predicts_and_exports(case, request, tmp_path, capsys):
  """One epoch of each case of RUNS from the workdir or a Hugging Face directory;
  `predict` gives the dev predictions again; `convert --to=hf` writes the
  ModernBertFor<Task> with the labels, whose outputs equal the fine-tuned model's on
  dev rows (span NER and the feature-based tagger: one line saying why not)."""
  make, train, dev, source, batching = RUNS[case]
  c = shorten(make(), train, dev, batching)
  c.init_from = request.getfixturevalue(source)
  feature_based = c.task.name == "tagging" and c.task.features
  if feature_based:
    c.task.tagger = "linear"
  workdir = str(tmp_path / "run")
  fine_tune_and_predict(c, workdir)
  exported = str(tmp_path / "hf")
  if c.task.name == "span_ner" or feature_based:
    with pytest.raises(SystemExit):
      convert_cli.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
    err = capsys.readouterr().err.strip()
    assert "has no Hugging Face class" in err and "python -m bertjax.predict" in err
    assert "\n" not in err
    return
  hf = export_matches(workdir, exported, fixture(dev), hf_modernbert_table.TASK_CLASSES,
                      token_types=False)
  assert hf["classifier_pooling"] == load_finetuned(workdir).model.classifier_pooling


# ---- One-line errors -----------------------------------------------------------------

def _bert_checkpoint(directory) -> str:
  """A directory whose config.json says BERT (what the family checks read)."""
  os.makedirs(directory)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({"model_type": "bert", "vocab_size": 605}, f)
  return str(directory)


def test_resuming_with_an_init_from_of_another_family_is_one_line(workdir, tmp_path):
  """A ModernBERT fine-tuning run resumed with config.init_from a BERT checkpoint:
  one line naming both families and the fix, before anything is read or written."""
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  with open(run / "task.json", "w") as f:  # a fine-tuning run's record, its files
    json.dump({"name": "classification", "labels": ["0", "1"], "num_steps": 6}, f)
  with open(run / "run.json", "w") as f:
    json.dump({"kind": "finetuning", "task": "classification"}, f)
  c = glue.get_config("sst2")
  c.init_from = _bert_checkpoint(tmp_path / "bert")
  c.data.train, c.data.dev = fixture("sst2_train.tsv"), fixture("sst2_dev.tsv")
  before = sorted(os.listdir(run))
  with pytest.raises(CheckpointError, match=r"holds a fine-tuning run of a 'modernbert' "
                     r"model but config.init_from=.* is a 'bert' checkpoint: use a new "
                     r"--workdir") as e:
    finetune.run(c, str(run))
  assert "\n" not in str(e.value)
  assert sorted(os.listdir(run)) == before


def test_freezing_blocks_of_scanned_layers_is_one_line(workdir, tmp_path):
  """`freeze.top_k_layers` needs unscanned blocks: from scratch with
  `model.scan_layers=True`, or from a checkpoint whose layers are scanned, one line
  each with the fix."""
  c = glue.get_config("sst2")
  c.data.train, c.data.dev = fixture("sst2_train.tsv"), fixture("sst2_dev.tsv")
  c.freeze.top_k_layers = 1
  c.tokenizer = modernbert_tokenizer(str(tmp_path / "tok"))
  c.model = model_section(scan_layers=True)
  with pytest.raises(ConfigError, match=r"config.freeze.top_k_layers=1 freezes whole "
                     r"blocks, but the encoder's are scanned .*: set "
                     r"config.model.scan_layers=False") as e:
    finetune.run(c, str(tmp_path / "a"))
  assert "\n" not in str(e.value)
  scanned = tmp_path / "scanned"
  shutil.copytree(workdir, scanned)
  with open(scanned / "config.json") as f:
    saved = json.load(f)
  saved["model"]["scan_layers"] = True
  with open(scanned / "config.json", "w") as f:
    json.dump(saved, f)
  c.tokenizer, c.init_from = "", str(scanned)
  with pytest.raises(ConfigError, match=r"config.init_from=.* has scan_layers=True; "
                     r"start from an unscanned export of it") as e:
    finetune.run(c, str(tmp_path / "b"))
  assert "\n" not in str(e.value)


def test_top_k_layers_freeze_the_blocks_below_and_the_final_norm_at_zero():
  """ModernBERT's blocks freeze as BERT's; its final norm (above the blocks) trains
  with the top block and freezes with `top_k_layers=0`."""
  cfg = mb.ModernBertConfig(vocab_size=64, hidden_size=32, num_layers=4, num_heads=2,
                            intermediate_size=48, pad_token_id=0, local_attention=8)
  params = jax.eval_shape(mb.FAMILY.pretraining(cfg).init_params, jax.random.key(0))
  c = glue.get_config("sst2")
  for k, frozen in ((1, {"embeddings", "layer_0", "layer_1", "layer_2"}),
                    (0, {"embeddings", "layer_0", "layer_1", "layer_2", "layer_3",
                         "final_norm"})):
    c.freeze.top_k_layers = k
    labels = finetune.freeze_labels({"encoder": params["encoder"]}, cfg, c.freeze)
    got = {name for name, sub in labels["encoder"].items()
           if set(jax.tree.leaves(sub)) == {"frozen"}}
    assert got == frozen
