"""Sequence labelling: first-subword tags, first-subword decoding, seqeval agreement, and a
short CoNLL fine-tuning run with a dev tag never seen in training."""

import json
import os

import numpy as np
import pytest
from seqeval import metrics as seqeval

from bertjax.tasks import metrics
from bertjax.data.tokenizer import load_tokenizer
from bertjax.tasks import finetune
from bertjax.tasks.tagging import Tagging
from configs.finetune import ner
from tests.tasks_helpers import fixture, fixture_tokenizer, tiny_finetune


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return fixture_tokenizer(str(tmp_path_factory.mktemp("vocab")))


@pytest.fixture(scope="module")
def task(vocab):
  t = Tagging(ner.get_config().task, load_tokenizer(vocab), 32)
  t.labels = t.fit_labels(t.read(fixture("conll_train.txt"), "train"))
  return t


def test_a_word_of_many_subwords_is_trained_and_decoded_as_one(task):
  dev = task.read(fixture("conll_dev.txt"), "dev")
  sentence = dev[1]
  long_word = sentence["words"].index("Unbelievablecorporationworks")
  features = task.featurize([sentence], train=False)
  word_of = features.meta[0]
  positions = np.flatnonzero(word_of == long_word)
  assert len(positions) >= 3  # Many subwords ...
  labels = features.arrays["labels"][0]
  org = task.labels.index("B-ORG")
  assert labels[positions[0]] == org  # ... the first trained with the word's tag,
  assert (labels[positions[1:]] == -1).all()  # the others not (BERT, run_ner.py) ...
  task.all_subwords = True
  every = task.featurize([sentence], train=False).arrays["labels"][0]
  task.all_subwords = False
  assert (every[positions] == org).all()  # ... unless each is (label_all_subwords).
  assert labels[0] == -1 and task.labels == sorted(task.labels)
  assert "B-MISC" not in task.labels  # Never seen in training: not trained on.
  assert labels[word_of == sentence["words"].index("Rome")][0] == -1
  # Decoding reads the first subword only; the later ones may say anything.
  tags = np.full((1, 32), task.labels.index("O"))
  for w in range(len(sentence["words"])):
    first = np.flatnonzero(word_of == w)[0]
    gold = sentence["tags"][w]
    tags[0, first] = task.labels.index(gold if gold in task.labels else "O")
  tags[0, positions[1:]] = task.labels.index("I-PER")
  decoded = task.decode({"tags": tags}, features, [sentence])[0]
  assert decoded == ["B-PER", "I-PER", "O", "B-ORG", "O", "O", "O"]
  scores = task.score([decoded], [sentence])
  assert scores["precision"] == 1.0 and scores["recall"] == pytest.approx(2 / 3)


SEQUENCES = [
    (["B-PER", "I-PER", "O", "B-LOC"], ["B-PER", "I-PER", "O", "B-LOC"]),
    (["I-PER", "I-PER", "O", "B-LOC", "I-ORG"], ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"]),
    (["O", "B-MISC", "I-MISC", "B-MISC"], ["O", "B-MISC", "I-MISC", "I-MISC"]),
    (["B-ORG", "O", "I-ORG", "I-ORG"], ["B-ORG", "I-ORG", "I-ORG", "O"]),
    (["O", "O"], ["B-LOC", "O"]),
]


def test_entity_f1_agrees_with_seqeval():
  pred, gold = [p for p, _ in SEQUENCES], [g for _, g in SEQUENCES]
  ours = metrics.entity_prf(pred, gold)
  assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, pred))
  assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, pred))
  assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, pred))
  assert 0 < ours["f1"] < 1
  for p, g in SEQUENCES:
    from seqeval.metrics.sequence_labeling import get_entities
    assert sorted(metrics.tag_spans(p)) == sorted(get_entities(p))


@pytest.mark.slow
def test_conll_finetuning_run(vocab, tmp_path):
  c = tiny_finetune(ner.get_config(), vocab, num_epochs=30, batch_size=8)
  c.data.train, c.data.dev = fixture("conll_train.txt"), fixture("conll_dev.txt")
  scores = finetune.run(c, str(tmp_path))
  assert {"f1", "precision", "recall", "accuracy", "loss"} == set(scores)
  with open(os.path.join(tmp_path, "dev_predictions.json")) as f:
    predictions = json.load(f)
  assert [len(p) for p in predictions] == [4, 7]
  assert scores["accuracy"] > 0.5 and scores["recall"] < 1.0  # B-MISC is unlearnable.
