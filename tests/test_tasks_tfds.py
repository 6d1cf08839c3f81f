"""Fine-tuning inputs from TFDS datasets built here (ArrayRecord, no download, no
TensorFlow) with GLUE's, CoNLL-2003's and SQuAD's features: ClassLabel ints become the
label names (or 0/1 where the config takes those), and a label outside the config's
labels is a one-line error rather than a silent weight of 0."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from bertjax.data.tokenizer import load_tokenizer
from bertjax.errors import DataError
from bertjax.tasks import get_task
from configs.finetune import glue, ner, span_ner, squad
from tests.tasks_helpers import fixture_tokenizer

NLI = ["entailment", "not_entailment"]
NER_TAGS = ["O", "B-PER", "I-PER", "B-LOC"]


class TinyGlueConfig(tfds.core.BuilderConfig):
  pass


class TinyGlue(tfds.core.GeneratorBasedBuilder):
  """GLUE's features for RTE and SST-2 (tensorflow_datasets/text/glue.py): texts, a
  ClassLabel `label` (-1 in the test split) and the row index `idx`."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [TinyGlueConfig(name="rte"), TinyGlueConfig(name="sst2")]

  def _info(self):
    if self.builder_config.name == "rte":
      texts, names = {"sentence1": tfds.features.Text(), "sentence2": tfds.features.Text()}, NLI
    else:
      texts, names = {"sentence": tfds.features.Text()}, ["negative", "positive"]
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {**texts, "label": tfds.features.ClassLabel(names=names), "idx": np.int32}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(True),
            "validation": self._generate_examples(True),
            "test": self._generate_examples(False)}

  def _generate_examples(self, labelled):
    for i in range(6):
      texts = ({"sentence1": f"a man sleeps {i}", "sentence2": "a man rests"}
               if self.builder_config.name == "rte" else {"sentence": f"great film {i}"})
      yield i, {**texts, "label": i % 2 if labelled else -1, "idx": i}


class TinyConll(tfds.core.GeneratorBasedBuilder):
  """CoNLL-2003's features (tokens and ClassLabel sequences), splits train / dev."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "tokens": tfds.features.Sequence(tfds.features.Text()),
        "pos": tfds.features.Sequence(tfds.features.ClassLabel(names=["NNP", "VBD"])),
        "ner": tfds.features.Sequence(tfds.features.ClassLabel(names=NER_TAGS))}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(), "dev": self._generate_examples()}

  def _generate_examples(self):
    yield 0, {"tokens": ["John", "Smith", "visited", "Rome"], "pos": [0, 0, 1, 0],
              "ner": [1, 2, 0, 3]}


class TinySquad(tfds.core.GeneratorBasedBuilder):
  """SQuAD's features: answers as a sequence of {text, answer_start}."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "id": np.str_, "title": tfds.features.Text(), "context": tfds.features.Text(),
        "question": tfds.features.Text(), "answers": tfds.features.Sequence({
            "text": tfds.features.Text(), "answer_start": np.int32})}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"validation": self._generate_examples()}

  def _generate_examples(self):
    yield "q1", {"id": "q1", "title": "t", "context": "The Broncos won in Denver.",
                 "question": "Who won?", "answers": {"text": ["The Broncos", "Broncos"],
                                                     "answer_start": [0, 4]}}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("tfds"))
  for cls, configs in ((TinyGlue, ("rte", "sst2")), (TinyConll, (None,)), (TinySquad, (None,))):
    for config in configs:
      cls(config=config, data_dir=d, file_format="array_record").download_and_prepare()
  return d


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return load_tokenizer(fixture_tokenizer(str(tmp_path_factory.mktemp("vocab"))))


def _task(config, tokenizer):
  return get_task(config.task.name)(config.task, tokenizer, config.task.max_seq_length)


def test_glue_class_labels_become_the_configs_labels(data_dir, tokenizer, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", data_dir)
  rte = _task(glue.get_config("rte"), tokenizer)
  train = rte.read("tfds:tiny_glue/rte", "train")
  assert sorted(e["label"] for e in train) == sorted(NLI * 3)  # Names, not '0' / '1'.
  assert {e["text_b"] for e in train} == {"a man rests"}  # tfds' own feature names.
  rte.labels = rte.fit_labels(train)
  assert (rte.featurize(train, train=True).arrays["label_weights"] == 1).all()
  assert len(rte.read("tfds:tiny_glue/rte", "dev")) == 6  # 'dev' reads 'validation'.
  test = rte.read("tfds:tiny_glue/rte:test", "train")  # An explicit split wins.
  assert {e["label"] for e in test} == {""}  # TFDS's -1: no gold label.
  assert sorted(e["index"] for e in test) == list(range(6))  # GLUE's row index (idx).
  # SST-2's config takes GLUE's 0/1, in TFDS's class order (negative, positive) ...
  sst2 = _task(glue.get_config("sst2"), tokenizer)
  labels = {e["text_a"]: e["label"] for e in sst2.read("tfds:tiny_glue/sst2", "train")}
  assert labels["great film 0"] == "0" and labels["great film 1"] == "1"
  # ... and without configured labels the class names are the labels.
  config = glue.get_config("sst2")
  config.task.labels = ()
  names = _task(config, tokenizer).read("tfds:tiny_glue/sst2", "train")
  assert {e["label"] for e in names} == {"negative", "positive"}


def test_a_label_outside_the_configs_labels_is_an_error(data_dir, tokenizer, monkeypatch,
                                                       tmp_path):
  monkeypatch.setenv("TFDS_DATA_DIR", data_dir)
  config = glue.get_config("rte")
  config.task.labels = ("yes", "no")
  with pytest.raises(DataError) as e:
    _task(config, tokenizer).read("tfds:tiny_glue/rte", "train")
  assert "\n" not in str(e.value)
  assert "'entailment' (and 1 more) is none of config.task.labels ['yes', 'no']" in str(e.value)
  tsv = tmp_path / "qnli.tsv"
  tsv.write_text("index\tquestion\tsentence\tlabel\n0\tq\ts\tentailment\n1\tq\ts\t1\n")
  with pytest.raises(DataError, match=r"qnli.tsv: label '1' is none of config.task.labels "
                     r"\['entailment', 'not_entailment'\]"):
    _task(glue.get_config("qnli"), tokenizer).read(str(tsv), "dev")
  stsb = tmp_path / "stsb.tsv"
  stsb.write_text("sentence1\tsentence2\tscore\na\tb\thigh\n")
  with pytest.raises(DataError, match="regression target 'high' is not a number"):
    _task(glue.get_config("stsb"), tokenizer).read(str(stsb), "dev")


def test_conll_and_squad_features(data_dir, tokenizer, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", data_dir)
  (sentence,) = _task(ner.get_config(), tokenizer).read("tfds:tiny_conll", "dev")
  assert sentence == {"words": ["John", "Smith", "visited", "Rome"],
                      "tags": ["B-PER", "I-PER", "O", "B-LOC"]}
  (pos,) = _task(ner.get_config("pos"), tokenizer).read("tfds:tiny_conll", "train")
  assert pos["tags"] == ["NNP", "NNP", "VBD", "NNP"]
  (spans,) = _task(span_ner.get_config(), tokenizer).read("tfds:tiny_conll", "train")
  assert spans["entities"] == [{"start": 0, "end": 1, "label": "PER"},
                               {"start": 3, "end": 3, "label": "LOC"}]
  tagged = ner.get_config()
  tagged.task.labels = ("O", "B-PER", "I-PER")
  with pytest.raises(DataError, match="tag 'B-LOC' is none of config.task.labels"):
    _task(tagged, tokenizer).read("tfds:tiny_conll", "train")
  (qa,) = _task(squad.get_config(), tokenizer).read("tfds:tiny_squad", "dev")
  assert qa["answers"] == [{"text": "The Broncos", "answer_start": 0},
                           {"text": "Broncos", "answer_start": 4}]
  assert qa["context"][4:11] == "Broncos" and not qa["is_impossible"]
