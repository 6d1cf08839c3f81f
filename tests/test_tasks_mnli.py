"""MNLI: the matched and mismatched dev sets both scored after one fine-tuning run,
under distinct metric names; TFDS's MNLI splits picked for each."""

import json
import os
import types

import pytest

from bertjax.tasks import finetune, readers
from configs.finetune import glue
from tests.tasks_helpers import fixture_tokenizer, tiny_finetune


@pytest.mark.slow
def test_matched_and_mismatched_dev_sets_are_both_reported(mnli_tsvs, tmp_path):
  c = tiny_finetune(glue.get_config("mnli"), fixture_tokenizer(str(tmp_path / "vocab")),
                    num_epochs=2)
  c.data.train, c.data.dev = mnli_tsvs["train"], mnli_tsvs["dev_matched"]
  c.data.dev_mismatched = mnli_tsvs["dev_mismatched"]
  workdir = str(tmp_path / "run")
  scores = finetune.run(c, workdir)
  assert set(scores) == {"accuracy", "loss", "accuracy_mm", "loss_mm"}
  with open(os.path.join(workdir, "dev_results.json")) as f:
    assert json.load(f) == scores
  for suffix, name in (("", "dev_matched"), ("_mm", "dev_mismatched")):
    with open(os.path.join(workdir, f"dev_predictions{suffix}.json")) as f:
      predictions = json.load(f)
    with open(mnli_tsvs[name]) as f:
      gold = [line.rstrip("\n").split("\t")[-1] for line in f][1:]
    assert len(predictions) == len(gold)  # 8 matched, 6 mismatched
    assert set(predictions) <= {"contradiction", "entailment", "neutral"}
    correct = sum(p == g for p, g in zip(predictions, gold))
    assert scores["accuracy" + suffix] == pytest.approx(correct / len(gold))
  assert scores["loss"] != scores["loss_mm"]


def test_every_task_has_an_empty_mismatched_set_to_fill():
  """The field is the base config's (a second dev set is read only when given)."""
  assert glue.get_config("mnli").data.dev_mismatched == ""
  assert glue.get_config("rte").data.dev_mismatched == ""


def test_tfds_mnli_splits(monkeypatch):
  """`tfds:glue/mnli` as dev reads validation_matched (after trying dev, validation),
  as dev_mismatched validation_mismatched; a named split is read as named."""
  import tensorflow_datasets as tfds
  tried = []

  class Source(list):
    dataset_info = types.SimpleNamespace(features={})

  def data_source(name, split, **_):
    tried.append(split)
    if split not in ("validation_matched", "validation_mismatched", "train"):
      raise ValueError(f"no split {split}")
    return Source([{"premise": b"a", "hypothesis": b"b", "label": 1}])

  monkeypatch.setattr(tfds, "data_source", data_source)
  read = lambda spec, split: readers.read_tfds(spec, split, ())
  assert read("tfds:glue/mnli", "dev")[0]["premise"] == "a"
  assert tried == ["dev", "validation", "validation_matched"]
  tried.clear()
  read("tfds:glue/mnli", "dev_mismatched")
  read("tfds:glue/mnli:train", "dev_mismatched")
  assert tried == ["validation_mismatched", "train"]
