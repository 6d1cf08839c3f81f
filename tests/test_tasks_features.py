"""Feature-based NER (BERT paper section 5.4): the encoder stays exactly as it was and
has no optimizer state, the scalar mix and the BiLSTM train, the train step skips the
encoder's backward pass, and an interrupted run resumes bit for bit."""

import os
import signal

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import api
from bertjax.hf import convert
from bertjax.data.tokenizer import load_tokenizer
from bertjax.errors import CheckpointError, ConfigError
from bertjax.model import ModelConfig
from bertjax.tasks import base, features, finetune
from bertjax.tasks.tagging import Tagging
from configs.finetune import ner
from tests import faults
from tests.tasks_helpers import FIXTURES, fixture, tiny_finetune

TOKENIZER = os.path.join(FIXTURES, "tokenizer")
STEPS = 6  # 4 sentences, batch 8: one step an epoch


def feature_config(feats="scalar_mix", tagger="bilstm", num_layers=2):
  c = tiny_finetune(ner.get_config("features"), TOKENIZER, num_epochs=STEPS,
                    checkpoint_every=2, max_to_keep=3, learning_rate=1e-2)
  c.model.num_layers = num_layers
  c.task.features, c.task.tagger = feats, tagger
  c.task.lstm_size, c.task.lstm_layers = 8, 1
  c.data.train, c.data.dev = fixture("conll_train.txt"), fixture("conll_dev.txt")
  return c


def setup_of(c):
  """The run's Setup (model, optimizer, abstract state) and a training batch."""
  task = Tagging(c.task, load_tokenizer(TOKENIZER), c.task.max_seq_length)
  task.labels = task.fit_labels(task.read(c.data.train, "train"))
  train = task.featurize(task.read(c.data.train, "train"), train=True)
  setup = finetune.build(c, task, ModelConfig.from_config(c.model), finetune.example_batch(train),
                     STEPS)
  return setup, finetune.rows(train, np.arange(8) % len(train), np.ones(8, bool))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("features"))
  return workdir, finetune.run(feature_config(), workdir)


@pytest.mark.slow
def test_the_encoder_is_unchanged_and_without_optimizer_state(reference):
  workdir, scores = reference
  assert {"f1", "accuracy", "loss"} <= set(scores)
  c = feature_config()
  setup, _ = setup_of(c)
  initial = jax.device_get(setup.init_params(c))  # The encoder drawn from c.seed.
  saved = faults.saved_state(workdir)
  assert int(saved["step"]) == STEPS
  faults.assert_same_arrays(saved["params"]["encoder"], initial["encoder"])
  head, start = saved["params"]["head"], initial["head"]
  mix = head["scalar_mix"]
  assert not np.allclose(mix["weights"], 0.0) and mix["gamma"] != 1.0  # The mix trains,
  assert not np.allclose(head["lstm_0_backward"]["ii"]["kernel"],
                         start["lstm_0_backward"]["ii"]["kernel"])  # the LSTM,
  assert not np.allclose(head["tagger"]["kernel"], start["tagger"]["kernel"])  # the output.
  # Adam's two moments for the head's parameters alone: none for the encoder.
  sizes = lambda tree: sum(np.size(x) for x in jax.tree.leaves(tree))
  moments = sum(np.size(x) for x in jax.tree.leaves(setup.abstract.opt_state)
                if np.issubdtype(x.dtype, np.floating))
  assert moments == 2 * sizes(start) and sizes(initial["encoder"]) > sizes(start)
  assert sizes(saved["opt_state"]) < sizes(initial["encoder"])


@pytest.mark.slow
def test_it_loads_and_export_to_hugging_face_refuses_in_one_line(reference, tmp_path):
  workdir, _ = reference
  finetuned = api.load_finetuned(workdir)
  assert finetuned.task.feature_based
  with pytest.raises(CheckpointError, match="feature-based tagger .* no Hugging Face class"):
    convert.save_hf_finetuned(str(tmp_path / "hf"), finetuned)


@pytest.mark.slow
def test_the_step_skips_the_encoders_backward_pass():
  """Same encoder (3 layers), a linear tagger over the last 4 layers vs fine-tuning
  with a linear tagger: the compiled step does well under half the FLOPs."""
  cost = {}
  for name in ("features", "finetune"):
    c = feature_config("concat_last4", "linear", num_layers=3)
    c.task.features = "concat_last4" if name == "features" else ""
    setup, batch = setup_of(c)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
      compiled = setup.train_step.lower(setup.abstract, batch).compile()
    cost[name] = compiled.cost_analysis()["flops"]
  assert cost["features"] < 0.5 * cost["finetune"], cost


@pytest.mark.slow
def test_interrupted_run_resumes_bit_for_bit(reference, tmp_path, on_train_batch):
  workdir = str(tmp_path / "interrupted")
  on_train_batch(lambda n, _: n == 3 and os.kill(os.getpid(), signal.SIGTERM))
  assert finetune.run(feature_config(), workdir) == {}
  assert int(faults.saved_state(workdir)["step"]) == 3
  on_train_batch(lambda n, _: None)
  assert finetune.run(feature_config(), workdir) == reference[1]
  faults.assert_same_arrays(faults.saved_state(workdir), faults.saved_state(reference[0]))


@pytest.mark.slow
def test_feature_shapes_and_the_scalar_mix():
  cfg = ModelConfig(vocab_size=50, hidden_size=8, num_layers=3, num_heads=2,
                    intermediate_size=16, max_position_embeddings=16)
  batch = {k: np.ones((2, 5), np.int32) for k in base.TOKEN_KEYS}
  batch["attention_mask"][1, 3:] = 0
  for feats, tagger, params_of in (
      ("concat_last4", "linear", {"tagger": (32, 4)}),
      ("scalar_mix", "bilstm", {"scalar_mix": (3,), "tagger": (2 * 6, 4)})):
    head = features.FeatureTaggingHead(cfg, 4, feats, tagger, 6, 2)
    model = base.FinetuneModel(cfg, head)
    variables = model.init(jax.random.key(0), batch)
    out = model.apply(variables, batch)
    assert out["logits"].shape == (2, 5, 4)
    p = nn.unbox(variables["params"]["head"])
    assert ("lstm_1_forward" in p and "lstm_1_backward" in p) == (tagger == "bilstm")
    for name, shape in params_of.items():
      leaf = p[name]["weights"] if name == "scalar_mix" else p[name]["kernel"]
      assert leaf.shape == shape
  # The mix: softmax weights times gamma over the layers.
  layers = np.random.default_rng(0).standard_normal((3, 2, 5, 8)).astype(np.float32)
  mixed = features.ScalarMix().apply({"params": {"weights": np.array([0.0, np.log(3.0), 0.0]),
                                                 "gamma": np.float32(2.0)}}, layers)
  np.testing.assert_allclose(mixed, 2.0 * (0.2 * layers[0] + 0.6 * layers[1] + 0.2 * layers[2]),
                             rtol=1e-5, atol=1e-6)


def test_bad_feature_options_are_one_line_errors():
  c = ner.get_config("features")
  assert (c.task.features, c.task.tagger, c.task.lstm_layers, c.task.lstm_size) == (
      "concat_last4", "bilstm", 2, 768)
  assert ner.get_config().task.features == ""  # Fine-tuning stays the default.
  for field, value, match in (("features", "last4", "config.task.features='last4'"),
                              ("tagger", "crf", "config.task.tagger='crf'")):
    c = ner.get_config("features")
    c.task[field] = value
    with pytest.raises(ConfigError, match=match):
      Tagging(c.task, None, 32)
  c = ner.get_config("features")
  with pytest.raises(ConfigError, match="needs 4 hidden states"):
    Tagging(c.task, None, 32).head(ModelConfig(num_layers=2))
