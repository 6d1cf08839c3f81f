"""Span-based NER: span enumeration with nested gold entities, the head's pooling
(mean by hand, attention within the span only), greedy flat decoding, span F1, and a
short fine-tuning run on the JSONL fixture (a dev label never seen in training)."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.tasks import metrics
from bertjax.data.tokenizer import load_tokenizer
from bertjax.errors import ConfigError
from bertjax.model import ModelConfig
from bertjax.tasks import finetune
from bertjax.tasks.span_ner import NULL, SpanHead, SpanNER
from configs.finetune import span_ner
from tests.helpers import tiny_config
from tests.tasks_helpers import fixture, fixture_tokenizer, tiny_finetune


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return fixture_tokenizer(str(tmp_path_factory.mktemp("vocab")))


@pytest.fixture(scope="module")
def task(vocab):
  c = span_ner.get_config()
  c.task.max_span_length = 3
  t = SpanNER(c.task, load_tokenizer(vocab), 32)
  t.labels = t.fit_labels(t.read(fixture("span_ner_train.jsonl"), "train"))
  return t


def test_spans_enumerated_with_nested_gold_labels(task):
  assert task.labels == [NULL, "LOC", "ORG", "PER"]
  dev = task.read(fixture("span_ner_dev.jsonl"), "dev")
  f = task.featurize(dev, train=False)
  spans, labels = f.meta[0], f.arrays["span_labels"][0]
  words = dev[0]["words"]  # Mary joined the University of Rome .
  assert len(spans) == 7 + 6 + 5 and (labels[len(spans):] == -1).all()
  assert all(j - i < 3 for i, j in spans)
  label_of = dict(zip(spans, labels))
  assert label_of[(3, 5)] == task.labels.index("ORG")  # Nested: ORG contains LOC.
  assert label_of[(5, 5)] == task.labels.index("LOC")
  assert label_of[(0, 0)] == task.labels.index("PER") and label_of[(4, 5)] == 0
  # Token positions: a span starts at its first word's first subword, ends at the last
  # word's last subword.
  ids = f.arrays["input_ids"][0]
  k = spans.index((3, 5))
  text = task.tokenizer.decode(ids[f.arrays["span_start"][0, k]:f.arrays["span_end"][0, k] + 1])
  assert text == " ".join(words[3:6]).lower()
  # 'Acme News' is MISC, never seen in training: no target, but still gold when scored.
  misc = f.meta[2].index((2, 3))
  assert f.arrays["span_labels"][2, misc] == -1


@pytest.mark.slow
def test_head_pools_within_the_span():
  cfg = ModelConfig.from_config(tiny_config().model)
  B, T, E = 1, 6, cfg.hidden_size
  h = jax.random.normal(jax.random.key(0), (B, T, E))
  batch = {"span_start": jnp.array([[1, 2]]), "span_end": jnp.array([[3, 2]])}
  out = {"last_hidden_state": h}
  for pooling in ("mean", "attention"):
    head = SpanHead(cfg, 4, pooling)
    params = head.init(jax.random.key(1), out, batch, True)["params"]
    logits = head.apply({"params": params}, out, batch, True)["logits"]
    assert logits.shape == (1, 2, 4)
    # Changing a token outside every span changes nothing; inside span 0 it does.
    moved = head.apply({"params": params}, {"last_hidden_state": h.at[:, 5].add(3.0)},
                       batch, True)["logits"]
    np.testing.assert_allclose(moved, logits, atol=1e-6)
    moved = head.apply({"params": params}, {"last_hidden_state": h.at[:, 3].add(3.0)},
                       batch, True)["logits"]
    assert not np.allclose(moved[0, 0], logits[0, 0]) and np.allclose(moved[0, 1], logits[0, 1])
  # Mean pooling by hand: the FFN input of span [1, 3] is [s; e; mean of tokens 1..3].
  head = SpanHead(cfg, 4, "mean")
  params = nn.unbox(head.init(jax.random.key(1), out, batch, True))["params"]
  _, state = head.apply({"params": params}, out, batch, True, capture_intermediates=True)
  got = state["intermediates"]["span_ffn"]["__call__"][0][0, 0]
  ffn = lambda name, x: nn.gelu(x @ params[name]["kernel"] + params[name]["bias"])
  x = jnp.concatenate([ffn("start_ffn", h[0, 1]), ffn("end_ffn", h[0, 3]), h[0, 1:4].mean(0)])
  want = x @ params["span_ffn"]["kernel"] + params["span_ffn"]["bias"]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_decoding_nested_and_greedy_flat(task):
  dev = task.read(fixture("span_ner_dev.jsonl"), "dev")[:1]
  f = task.featurize(dev, train=False)
  spans = f.meta[0]
  labels, probs = np.zeros((1, task.num_spans), int), np.zeros((1, task.num_spans))
  for (i, j), kind, p in (((3, 5), "ORG", 0.9), ((5, 5), "LOC", 0.8), ((0, 0), "PER", 0.7),
                          ((4, 5), "LOC", 0.6)):
    labels[0, spans.index((i, j))] = task.labels.index(kind)
    probs[0, spans.index((i, j))] = p
  nested = task.decode({"labels": labels, "probs": probs}, f, dev)[0]
  assert [(x["label"], x["start"], x["end"]) for x in nested] == [
      ("PER", 0, 0), ("ORG", 3, 5), ("LOC", 4, 5), ("LOC", 5, 5)]
  assert nested[1]["text"] == "University of Rome"
  scores = task.score([nested], dev)
  assert scores["recall"] == 1.0 and scores["precision"] == pytest.approx(0.75)
  task.cfg.allow_nested = False
  try:
    flat = task.decode({"labels": labels, "probs": probs}, f, dev)[0]
  finally:
    task.cfg.allow_nested = True
  assert [(x["label"], x["start"], x["end"]) for x in flat] == [("PER", 0, 0), ("ORG", 3, 5)]
  s = metrics.span_prf([{("ORG", 3, 5), ("PER", 0, 0)}], [{("ORG", 3, 5), ("LOC", 5, 5)}])
  assert s == {"precision": 0.5, "recall": 0.5, "f1": 0.5}


def test_bad_pooling_is_a_config_error(vocab):
  c = span_ner.get_config("max")
  with pytest.raises(ConfigError, match="pooling"):
    SpanNER(c.task, load_tokenizer(vocab), 32)


@pytest.mark.slow
def test_span_ner_finetuning_run_learns_nested_entities(vocab, tmp_path):
  c = tiny_finetune(span_ner.get_config("attention"), vocab, num_epochs=30)
  c.task.max_span_length = 3
  c.data.train, c.data.dev = fixture("span_ner_train.jsonl"), fixture("span_ner_dev.jsonl")
  scores = finetune.run(c, str(tmp_path))
  assert set(scores) == {"f1", "precision", "recall", "loss"}
  # MISC is unlearnable (never in training): recall stays below 1; the rest is learnt.
  assert 0.5 < scores["f1"] and scores["recall"] < 1.0
  with open(os.path.join(tmp_path, "dev_predictions.json")) as f:
    first = {(x["label"], x["start"], x["end"]) for x in json.load(f)[0]}
  assert {("ORG", 3, 5), ("LOC", 5, 5)} <= first  # Both of the nested pair.


def test_conll_bio_files_become_entity_spans(task):
  first = task.read(fixture("conll_train.txt"), "train")[0]  # John Smith lives in Paris .
  assert first["words"][:2] == ["John", "Smith"]
  assert first["entities"] == [{"start": 0, "end": 1, "label": "PER"},
                               {"start": 4, "end": 4, "label": "LOC"}]
