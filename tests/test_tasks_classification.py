"""Sequence classification (SST-2), pairs with regression (STS-B, with a profile),
unseen labels, freezing. Fine-tuning's faults and exact resume:
test_reliability_finetune.py."""

import glob
import json
import os

import numpy as np
import pytest

from bertjax.parallel import mesh as mesh_lib
from bertjax.tasks import finetune
from configs.finetune import glue
from tests.tasks_helpers import fixture, fixture_tokenizer, tiny_finetune


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return fixture_tokenizer(str(tmp_path_factory.mktemp("vocab")))


def _sst2(vocab, **train):
  c = tiny_finetune(glue.get_config("sst2"), vocab, **train)
  c.data.train, c.data.dev = fixture("sst2_train.tsv"), fixture("sst2_dev.tsv")
  return c


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


@pytest.fixture(scope="module")
def sst2_run(vocab, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("sst2"))
  config = _sst2(vocab, num_epochs=8, learning_rate=2e-3)
  return config, workdir, finetune.run(config, workdir)


@pytest.mark.slow
def test_sst2_learns_the_training_words(sst2_run):
  config, workdir, scores = sst2_run
  losses = _losses(workdir)
  assert sorted(losses) == list(range(1, 49))  # 48 rows / batch 8 x 8 epochs
  assert np.mean([losses[s] for s in range(43, 49)]) < 0.75 * np.mean(
      [losses[s] for s in range(1, 7)])
  with open(os.path.join(workdir, "dev_results.json")) as f:
    assert json.load(f) == scores
  assert set(scores) == {"accuracy", "loss"}
  with open(os.path.join(workdir, "dev_predictions.json")) as f:
    predictions = json.load(f)
  assert len(predictions) == 24 and set(predictions) <= {"0", "1"}


def profile_files(workdir) -> list[str]:
  return glob.glob(os.path.join(workdir, "tensorboard", "plugins", "profile", "*", "*"))


@pytest.mark.slow
def test_stsb_pair_regression_with_a_profile_of_steps_2_to_3(vocab, tmp_path, sst2_run):
  """Also `config.train.profile_steps`: a jax.profiler trace of the train step in
  WORKDIR/tensorboard, for TensorBoard's profile tab (the sst2 run asked for none)."""
  c = tiny_finetune(glue.get_config("stsb"), vocab, num_epochs=3)
  c.data.train, c.data.dev = fixture("stsb_train.tsv"), fixture("stsb_dev.tsv")
  c.train.profile_steps = (2, 3)
  scores = finetune.run(c, str(tmp_path))
  assert set(scores) == {"pearson", "spearman", "loss"}
  assert all(np.isfinite(v) for v in scores.values())
  with open(os.path.join(tmp_path, "dev_predictions.json")) as f:
    assert all(isinstance(p, float) for p in json.load(f))
  (trace,) = [p for p in profile_files(tmp_path) if p.endswith(".xplane.pb")]
  with open(trace, "rb") as f:
    assert b"train_step" in f.read()
  assert not profile_files(sst2_run[1])


def test_a_dev_label_never_seen_in_training(vocab, tmp_path):
  from bertjax.data.tokenizer import load_tokenizer
  from bertjax.tasks.classification import Classification
  c = glue.get_config("rte")
  c.task.labels = ()
  task = Classification(c.task, load_tokenizer(vocab), 32)
  train = [{"text_a": "a", "text_b": "b", "label": "yes"},
           {"text_a": "c", "text_b": "d", "label": "no"}]
  dev = train + [{"text_a": "e", "text_b": "f", "label": "maybe"}]
  task.labels = task.fit_labels(train)
  assert task.labels == ["no", "yes"]
  features = task.featurize(dev, train=False)
  np.testing.assert_array_equal(features.arrays["labels"], [1, 0, -1])
  np.testing.assert_array_equal(features.arrays["label_weights"], [1, 1, 0])
  # A perfect model on the known labels still misses the unseen one.
  assert task.score(["yes", "no", "no"], dev) == {"accuracy": 2 / 3}


@pytest.mark.slow
def test_freeze_all_but_the_top_layer(vocab, tmp_path):
  import jax
  c = _sst2(vocab, num_epochs=1)
  c.model.num_layers = 2
  c.freeze.top_k_layers = 1
  start = finetune.load_start(c)
  from bertjax.tasks.classification import Classification
  task = Classification(c.task, start.tokenizer, 32)
  task.labels = ["0", "1"]
  features = task.featurize(task.read(c.data.train, "train"), train=True)
  setup = finetune.build(c, task, start.model, finetune.example_batch(features), 6)
  state = setup.init_state(c)
  before = jax.device_get(state.params)
  with jax.set_mesh(setup.mesh):
    state, _ = setup.train_step(state, mesh_lib.put_batch(finetune.rows(
        features, np.arange(8), np.ones(8, bool)), setup.batch_sharding))
  after = jax.device_get(state.params)
  changed = lambda a, b: not np.array_equal(a, b)
  enc_b, enc_a = before["encoder"], after["encoder"]
  assert not any(jax.tree.leaves(jax.tree.map(changed, enc_b["embeddings"], enc_a["embeddings"])))
  assert not any(jax.tree.leaves(jax.tree.map(changed, enc_b["layer_0"], enc_a["layer_0"])))
  assert all(jax.tree.leaves(jax.tree.map(changed, enc_b["layer_1"], enc_a["layer_1"])))
  assert all(jax.tree.leaves(jax.tree.map(changed, before["head"], after["head"])))
