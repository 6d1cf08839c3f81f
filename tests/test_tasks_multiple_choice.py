"""Multiple choice (SWAG CSV through the reader): one sequence per choice, a score per
choice with a softmax over them, and a short fine-tuning run."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.data.tokenizer import load_tokenizer
from bertjax.errors import DataError
from bertjax.model import ModelConfig
from bertjax.tasks import base, finetune
from bertjax.tasks.multiple_choice import MultipleChoice
from configs.finetune import swag
from tests.helpers import tiny_config
from tests.tasks_helpers import fixture, fixture_tokenizer, tiny_finetune


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return fixture_tokenizer(str(tmp_path_factory.mktemp("vocab")))


@pytest.mark.slow
def test_one_sequence_per_choice_and_softmax_over_choices(vocab, tmp_path):
  task = MultipleChoice(swag.get_config().task, load_tokenizer(vocab), 32)
  dev = task.read(fixture("swag_dev.csv"), "dev")
  assert len(dev) == 8 and dev[0]["label"] == 1 and len(dev[0]["endings"]) == 4
  f = task.featurize(dev, train=False)
  ids = f.arrays["input_ids"]
  assert ids.shape == (8, 4, 32) and f.arrays["labels"].tolist() == [e["label"] for e in dev]
  tok = task.tokenizer
  for c in range(4):  # [CLS] context [SEP] start + ending [SEP], segments 0 then 1.
    assert tok.decode(ids[0, c]) == f"{dev[0]['context']} {dev[0]['start']} " \
        f"{dev[0]['endings'][c]}".lower().replace(" .", ".")
    seg = f.arrays["token_type_ids"][0, c][f.arrays["attention_mask"][0, c] > 0]
    assert seg[0] == 0 and seg[-1] == 1
  # The model scores each choice on its own and the loss is softmax over the choices.
  cfg = ModelConfig.from_config(tiny_config().model)
  cfg = ModelConfig(**{**cfg.__dict__, "vocab_size": tok.vocab_size})
  model = base.FinetuneModel(cfg, task.head(cfg))
  batch = {k: jnp.asarray(v[:2]) for k, v in f.arrays.items()}
  batch["example_weights"] = jnp.ones((2,))
  params = model.init(jax.random.key(0), batch)["params"]
  logits = model.apply({"params": params}, batch)["logits"]
  assert logits.shape == (2, 4)
  alone = {k: v[:, 2:3] if v.ndim == 3 else v for k, v in batch.items()}
  np.testing.assert_allclose(model.apply({"params": params}, alone)["logits"][:, 0],
                             logits[:, 2], rtol=1e-5, atol=1e-5)
  total, count = task.loss({"logits": logits}, batch)
  want = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).sum()
  assert count == 2 and total == pytest.approx(float(want), rel=1e-5)
  gold = [e["label"] for e in dev]
  logits = np.eye(4)[[(g + 1) % 4 if n < 2 else g for n, g in enumerate(gold)]]
  assert task.score(task.decode({"logits": logits}, f, dev), dev) == {"accuracy": 0.75}
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"context": "a", "endings": ["b", "c"], "label": 0}\n'
                 '{"context": "a", "endings": ["b", "c", "d"], "label": 0}\n')
  with pytest.raises(DataError, match="same number"):
    task.read(str(bad), "dev")


@pytest.mark.slow
def test_swag_finetuning_run(vocab, tmp_path):
  c = tiny_finetune(swag.get_config(), vocab, num_epochs=12)
  c.data.train, c.data.dev = fixture("swag_train.csv"), fixture("swag_dev.csv")
  scores = finetune.run(c, str(tmp_path))
  assert set(scores) == {"accuracy", "loss"}
  with open(os.path.join(tmp_path, "dev_predictions.json")) as f:
    predictions = json.load(f)
  assert len(predictions) == 8 and set(predictions) <= {0, 1, 2, 3}
  assert scores["accuracy"] >= 0.75  # The plausible endings are learnable; chance is 0.25.
