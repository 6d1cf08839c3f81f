"""SQuAD: doc-stride windows, an answer crossing a window boundary, n-best decoding
back to the original text, the v2 null answer, and the official EM / F1 semantics."""

import numpy as np
import pytest

from bertjax.tasks import metrics
from bertjax.data.tokenizer import load_tokenizer
from bertjax.tasks.squad import SquadQA
from configs.finetune import squad
from tests.tasks_helpers import fixture, fixture_tokenizer


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  c = squad.get_config("v2")
  c.task.doc_stride = 4
  c.task.max_answer_length = 5
  tok = load_tokenizer(fixture_tokenizer(str(tmp_path_factory.mktemp("vocab"))))
  return SquadQA(c.task, tok, 20)


def test_windows_and_an_answer_crossing_a_window_boundary(task):
  examples = task.read(fixture("squad_v2.json"), "dev")
  features = task.featurize(examples, train=True)
  rows = np.flatnonzero(features.example_index == 1)  # "Who was the coach?" -> John Elway
  assert len(rows) > 3  # A long passage in 20-token rows: many windows.
  ids = features.arrays["input_ids"]
  starts, ends = features.arrays["start_positions"], features.arrays["end_positions"]
  whole = [r for r in rows if starts[r] > 0]
  assert whole
  for r in whole:
    assert task.tokenizer.decode(ids[r, starts[r]:ends[r] + 1]) == "john elway"
  # Windows holding only part of the answer (it crosses their boundary) point at [CLS].
  partial = [r for r in rows if starts[r] == 0 and any(
      task.tokenizer.id_to_token(i) in ("john", "elway", "##way") for i in ids[r])]
  assert partial
  impossible = np.flatnonzero(features.example_index == 2)
  assert (starts[impossible] == 0).all() and (ends[impossible] == 0).all()


def _logits_for(features, row, i, j, null=0.0):
  shape = features.arrays["input_ids"].shape
  st, en = np.full(shape, -5.0), np.full(shape, -5.0)
  st[:, 0] = en[:, 0] = null / 2
  st[row, i], en[row, j] = 5.0, 5.0
  return {"start_logits": st, "end_logits": en}


def test_decoding_maps_back_to_the_original_text_and_null_answers(task):
  examples = task.read(fixture("squad_v2.json"), "dev")
  features = task.featurize(examples, train=False)
  train = task.featurize(examples, train=True)
  def answer_row(n):  # A window holding the answer as its max-context window.
    return next(r for r in np.flatnonzero(features.example_index == n)
                if train.arrays["start_positions"][r] > 0
                and features.meta[r].max_context[train.arrays["start_positions"][r]])

  r = answer_row(1)
  i, j = train.arrays["start_positions"][r], train.arrays["end_positions"][r]
  answers = task.decode(_logits_for(features, r, i, j), features, examples)
  assert answers["q2"] == "John Elway"  # The passage's casing, not the vocabulary's.
  # 'Denver.' is one whitespace word; the answer ends before its period.
  r0 = answer_row(0)
  d = train.arrays["start_positions"][r0]
  answers = task.decode(_logits_for(features, r0, d, d), features, examples)
  assert answers["q1"] == "Denver"
  # end < start and too-long spans are never chosen; the null score wins in v2.
  answers = task.decode(_logits_for(features, r, j, i, null=20.0), features, examples)
  assert answers["q3"] == "" and answers["q2"] == ""
  scores = task.score(answers, examples)
  assert scores["NoAns_exact"] == 100.0 and scores["HasAns_exact"] == 0.0


def test_official_squad_semantics():
  golds = {"a": ["Denver Broncos", "the Broncos"], "b": ["John Elway"], "c": []}
  # Normalisation: case, punctuation, articles, whitespace; max over gold answers.
  s = metrics.squad_scores({"a": "Broncos!", "b": "Elway", "c": ""}, golds)
  assert s["exact"] == pytest.approx(100 * 2 / 3)
  assert s["f1"] == pytest.approx(100 * (1 + 2 * 0.5 * 1 / 1.5 + 1) / 3)
  assert s["NoAns_f1"] == 100.0
  s = metrics.squad_scores({"a": "the   DENVER broncos.", "b": "", "c": "Elway"}, golds)
  assert s["exact"] == pytest.approx(100 / 3) and s["f1"] == pytest.approx(100 / 3)
  assert metrics.squad_scores({}, {"x": ["y"]}) == {"exact": 0.0, "f1": 0.0}
