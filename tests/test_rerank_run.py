"""Reranker runs on the one trainer (issue 57): `python -m bertjax.finetune` with
configs/finetune/rerank.py from a published cross-encoder folder (its head kept) and
from a bare encoder (a fresh head), scored on dev by reranking, exported by `convert
--to=hf` to a folder sentence-transformers' CrossEncoder loads and scores as bertjax
does (within 1e-5)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from bertjax import convert
from bertjax.tasks import finetune, rerank, reranker as reranker_lib
from configs.finetune import rerank as rerank_config
from tests.test_rerank import DOCS, QUERIES, _cross_encoder, _pairs, _samples, _write

sentence_transformers = pytest.importorskip("sentence_transformers")
from sentence_transformers.cross_encoder import CrossEncoder  # noqa: E402
from sentence_transformers.cross_encoder.evaluation import (  # noqa: E402
    CrossEncoderRerankingEvaluator)


def _config(init_from, train, dev, **task):
  c = rerank_config.get_config()
  c.init_from = init_from
  c.data.train, c.data.dev = train, dev
  c.task.max_seq_length = 32
  c.task.update(task)
  c.train.batch_size = 8
  c.train.eval_batch_size = 8
  c.train.log_every = 1
  c.compilation_cache_dir = ""
  return c


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("rerank_data")
  rng = np.random.default_rng(0)
  rows = [{"query": q, "document": doc, "label": int(j == i % len(DOCS))}
          for i, q in enumerate(QUERIES) for j, doc in enumerate(DOCS)]
  lists = [{"query": q, "documents": DOCS[:3 + i % 3], "labels": [1] + [0] * (2 + i % 3)}
           for i, q in enumerate(QUERIES * 2)]
  return {"pairs": _write(d / "pairs.jsonl", rows), "lists": _write(d / "lists.jsonl", lists),
          "dev": _write(d / "dev.jsonl", _samples(rng)), "samples": _samples(
              np.random.default_rng(0))}


@pytest.mark.slow
def test_from_a_cross_encoder_folder_and_back(tmp_path, minilm_dir, data):
  """Learning rate 1e-12: the run keeps the folder's head, its dev figures are
  CrossEncoderRerankingEvaluator's of the folder, and its export scores as the folder."""
  ce = _cross_encoder(tmp_path / "published", minilm_dir, max_length=32)
  config = _config(str(tmp_path / "published"), data["pairs"], data["dev"])
  config.train.learning_rate, config.train.weight_decay = 1e-12, 0.0
  results = finetune.run(config, str(tmp_path / "run"))
  want = CrossEncoderRerankingEvaluator(data["samples"])(ce)
  for k in want:
    assert abs(results[k] - want[k]) <= 1e-6, k
  with open(tmp_path / "run" / "dev_results.json") as f:
    assert json.load(f)["ndcg@10"] == results["ndcg@10"]
  kind = convert.convert_checkpoint("hf", str(tmp_path / "run"), str(tmp_path / "ce"))
  assert kind == "CrossEncoder (BertForSequenceClassification)"
  exported = CrossEncoder(str(tmp_path / "ce"))
  assert exported.max_seq_length == 32 and exported.num_labels == 1
  ours = reranker_lib.load_reranker(str(tmp_path / "run"))
  np.testing.assert_allclose(exported.predict(_pairs()), ours.predict(_pairs()), atol=1e-5)
  np.testing.assert_allclose(exported.predict(_pairs()), ce.predict(_pairs()), atol=1e-5)


@pytest.mark.slow
def test_lambda_loss_on_lists_from_a_bare_encoder(tmp_path, tiny_hf_bert, data):
  """A fresh head, LambdaLoss on labeled lists padded to groups of 5; the run learns
  (its loss falls) and its export scores as bertjax does."""
  config = _config(tiny_hf_bert, data["lists"], data["dev"], loss="lambda")
  config.train.num_epochs = 6
  config.train.learning_rate = 1e-3
  finetune.run(config, str(tmp_path / "run"))
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    losses = [r["loss"] for r in map(json.loads, f) if "loss" in r]
  assert losses[-1] < losses[0]
  convert.convert_checkpoint("hf", str(tmp_path / "run"), str(tmp_path / "ce"))
  exported = CrossEncoder(str(tmp_path / "ce"))
  ours = reranker_lib.load_reranker(str(tmp_path / "run"))
  np.testing.assert_allclose(exported.predict(_pairs()), ours.predict(_pairs()), atol=1e-5)


@pytest.mark.slow
def test_packed_pairs_train_as_pairs_a_row(tmp_path, minilm_dir, data):
  """Labeled pairs pack several to a row ('auto' is 'pack' for them, each pair isolated
  by its segment), in fewer rows; without dropout the packed run's loss at every step
  and its dev figures are those of the same run with a pair a row ('bucket')."""
  _cross_encoder(tmp_path / "published", minilm_dir, max_length=64)
  config = _config(str(tmp_path / "published"), data["pairs"], data["dev"],
                   max_seq_length=64)
  start = finetune.load_start(config)
  task = rerank.Rerank(config.task, start.tokenizer, 64)
  features = task.featurize(task.read(data["pairs"], "train"), train=True)
  batches = finetune.batcher(task, features, start.model)
  idx = np.arange(8)
  assert batches.mode == "pack"
  assert batches.batch(idx, idx >= 0, slice(0, 8))["input_ids"].shape[0] < 8
  runs = {}
  # And packed rows read 2 at a time under GradCache (task.mini_batch_size).
  for mode, mini in (("auto", 0), ("bucket", 0), ("auto", 2)):
    config = _config(str(tmp_path / "published"), data["pairs"], data["dev"],
                     batching=mode, max_seq_length=64, mini_batch_size=mini)
    config.train.learning_rate = 1e-3
    workdir = tmp_path / f"{mode}{mini}"
    runs[mode, mini] = finetune.run(config, str(workdir))
    with open(workdir / "metrics.jsonl") as f:
      runs[mode, mini]["losses"] = [r["loss"] for r in map(json.loads, f) if "loss" in r]
  rows = runs["bucket", 0]
  for packed in (runs["auto", 0], runs["auto", 2]):
    assert len(packed["losses"]) == len(rows["losses"]) > 2
    np.testing.assert_allclose(packed["losses"], rows["losses"], rtol=1e-4)
    for k in ("map", "mrr@10", "ndcg@10"):
      assert abs(packed[k] - rows[k]) <= 1e-6, k
