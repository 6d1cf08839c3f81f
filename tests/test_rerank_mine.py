"""`python -m bertjax.mine`'s reranker outputs (issue 57, item 3): labeled pairs and
labeled lists as sentence-transformers 6.2.0's `mine_hard_negatives(output_format=
'labeled-pair' / 'labeled-list')` writes them (its rows, in its order, worked out from
its code: util/hard_negatives.py), read back by the rerank task as groups."""

from __future__ import annotations

import json

import pytest

from bertjax.errors import ConfigError
from bertjax.tasks import mining, rerank, reranker
from tests.test_retrieval_eval import angle_encoder

COSINES = {"p1": 0.9, "p2": 0.6, "n1": 0.5, "n2": 0.4, "n3": 0.3}
ANCHORS, POSITIVES = ["a", "a", "b", "a"], ["p1", "p2", "n1", "p1"]


def _mine(fmt, **kw):
  return mining.mine_hard_negatives(ANCHORS, POSITIVES, angle_encoder(COSINES),
                                    ["n2", "n3"], num_negatives=2, relative_margin=0.3,
                                    output_format=fmt, **kw)


def test_labeled_pairs():
  """An anchor's positives (label 1), then its negatives (label 0), anchor by anchor:
  "b" keeps the one negative it found (n3)."""
  rows, counts = _mine("labeled-pair", anchor_column="query", positive_column="answer")
  assert [(r["query"], r["answer"], r["label"]) for r in rows] == [
      ("a", "p1", 1), ("a", "p2", 1), ("a", "n2", 0), ("a", "n3", 0),
      ("b", "n1", 1), ("b", "n3", 0)]
  assert counts["rows"] == 6


def test_labeled_lists():
  """A row a pair: its positive first, the negatives found (a shorter list for "b")."""
  rows, _ = _mine("labeled-list")
  assert rows == [
      {"anchor": "a", "positive": ["p1", "n2", "n3"], "labels": [1, 0, 0]},
      {"anchor": "a", "positive": ["p2", "n2", "n3"], "labels": [1, 0, 0]},
      {"anchor": "b", "positive": ["n1", "n3"], "labels": [1, 0]}]


def test_mined_lists_train_a_reranker(tmp_path):
  out = tmp_path / "lists.jsonl"
  mining.mine_file(_pairs(tmp_path), str(out), angle_encoder(COSINES),
                   str(tmp_path / "corpus.txt"), num_negatives=2, relative_margin=0.3, output_format="labeled-list")
  task = rerank.Rerank(reranker.task_config(query_column="", document_column="",
                                            label_column="", loss="lambda"), None, 32)
  groups = task.read(str(out), "train")
  assert [(g["query"], g["documents"], g["labels"]) for g in groups] == [
      ("a", ["p1", "n2", "n3"], [1, 0, 0]), ("a", ["p2", "n2", "n3"], [1, 0, 0]),
      ("b", ["n1", "n3"], [1, 0])]


def _pairs(tmp_path):
  path = tmp_path / "pairs.jsonl"
  path.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n"
                          for a, p in zip(ANCHORS, POSITIVES)))
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("n2\nn3\n")
  return str(path)


def test_an_unknown_format_is_one_line():
  with pytest.raises(ConfigError, match="output_format='labeled-triplet'"):
    _mine("labeled-triplet")
