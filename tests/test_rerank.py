"""Rerankers (issue 57): a published cross-encoder folder scored by bertjax as
sentence-transformers' CrossEncoder scores it (its head, activation and truncation),
the reranking evaluator equal to CrossEncoderRerankingEvaluator in both of its modes,
the training data in sentence-transformers' shapes, and the one-line errors."""

from __future__ import annotations

import json
import os
import shutil

import ml_collections
import numpy as np
import pytest

from bertjax.errors import ConfigError, DataError
from bertjax.tasks import rerank, rerank_eval, reranker as reranker_lib, retrieval_eval

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")
from sentence_transformers.cross_encoder import CrossEncoder  # noqa: E402
from sentence_transformers.cross_encoder.evaluation import (  # noqa: E402
    CrossEncoderRerankingEvaluator)

QUERIES = ["what is a tuple", "homework on monday", "where does the fox jump",
           "which dog is lazy"]
DOCS = ["A tuple is an immutable sequence; a list can change.",
        "Please turn your homework in on Monday, or else!",
        "The quick brown fox jumps over the lazy dog. " * 6,
        "Embedding models map a query and its documents to nearby vectors.",
        "The lazy dog sleeps all day long.", "x"]


def _cross_encoder(directory, minilm_dir, num_labels=1, max_length=40, activation=None):
  """A random 2-layer BertForSequenceClassification with MiniLM's vocabulary, as a
  sentence-transformers CrossEncoder saves it."""
  torch.manual_seed(0)
  model = transformers.BertForSequenceClassification(transformers.BertConfig(
      vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
      intermediate_size=64, max_position_embeddings=64, num_labels=num_labels,
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
  for p in model.parameters():  # Away from the init's zeros: a dropped weight shows.
    p.data.add_(torch.randn_like(p) * 0.05)
  tmp = str(directory) + "_hf"
  model.save_pretrained(tmp)
  shutil.copy(os.path.join(minilm_dir, "vocab.txt"), os.path.join(tmp, "vocab.txt"))
  transformers.BertTokenizerFast(os.path.join(tmp, "vocab.txt")).save_pretrained(tmp)
  kw = {} if activation is None else {"activation_fn": activation}
  ce = CrossEncoder(tmp, max_length=max_length, **kw)
  ce.save(str(directory))
  return CrossEncoder(str(directory))


@pytest.fixture(scope="module")
def published(tmp_path_factory, minilm_dir):
  directory = tmp_path_factory.mktemp("cross_encoder")
  return str(directory), _cross_encoder(directory, minilm_dir)


def _pairs():
  return [(q, d) for q in QUERIES for d in DOCS]


def test_published_folder_scores_as_cross_encoder(published):
  """Its head, Sigmoid and length (40: the long document is cut, longest first)."""
  directory, ce = published
  ours = reranker_lib.load_reranker(directory)
  assert ours.max_seq_length == ce.max_seq_length == 40
  assert ours.task.activation == "sigmoid"
  want = ce.predict(_pairs())
  got = ours.predict(_pairs(), batch_size=8)
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert np.ptp(want) > 1e-3  # The pairs score apart.


def test_several_labels_and_an_identity_activation(tmp_path, minilm_dir):
  ce = _cross_encoder(tmp_path / "ce3", minilm_dir, num_labels=3, max_length=24)
  ours = reranker_lib.load_reranker(str(tmp_path / "ce3"))
  assert ours.task.activation == "identity" and ours.task.cfg.num_labels == 3
  np.testing.assert_allclose(ours.predict(_pairs()[:9]), ce.predict(_pairs()[:9]), atol=1e-5)


def _samples(rng, with_documents=True):
  """Reranking samples over DOCS-like texts: some positives retrieved, some missed,
  one query with none."""
  texts = [f"document {i} " + DOCS[i % len(DOCS)] for i in range(14)]
  samples = []
  for i, q in enumerate(QUERIES + ["a query with no positive"]):
    positive = [texts[j] for j in rng.choice(14, 2, replace=False)] if i < 4 else ["unseen"]
    if with_documents:
      docs = list(rng.permutation(texts)[:7 + i])
      samples.append({"query": q, "positive": positive, "documents": docs})
    else:
      negative = [t for t in texts if t not in positive][:5]
      samples.append({"query": q, "positive": positive, "negative": negative})
  return samples


@pytest.mark.parametrize("always", [True, False])
@pytest.mark.parametrize("with_documents", [True, False])
def test_evaluator_equals_sentence_transformers(published, always, with_documents):
  _, ce = published
  samples = _samples(np.random.default_rng(0), with_documents)
  want = CrossEncoderRerankingEvaluator(samples, always_rerank_positives=always)(ce)
  got = rerank_eval.evaluate(samples, lambda pairs: ce.predict(pairs), 10, always)
  assert set(got) == set(want)
  for k in want:
    assert abs(got[k] - want[k]) <= 1e-6, (k, got[k], want[k])
  assert 0 < got["ndcg@10"] < 1


def test_bertjax_scores_give_sentence_transformers_figures(published):
  directory, ce = published
  samples = _samples(np.random.default_rng(1))
  want = CrossEncoderRerankingEvaluator(samples, at_k=5)(ce)
  ours = reranker_lib.load_reranker(directory)
  got = rerank_eval.evaluate(samples, ours.predict, 5)
  for k in want:
    assert abs(got[k] - want[k]) <= 1e-6, k


def _beir(directory, extra_run_doc=None):
  os.makedirs(os.path.join(directory, "qrels"), exist_ok=True)
  corpus = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(DOCS)]
  with open(os.path.join(directory, "corpus.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in corpus)
  with open(os.path.join(directory, "queries.jsonl"), "w") as f:
    f.writelines(json.dumps({"_id": f"q{i}", "text": q}) + "\n" for i, q in enumerate(QUERIES))
  with open(os.path.join(directory, "qrels", "test.tsv"), "w") as f:
    f.write("query-id\tcorpus-id\tscore\n")
    for i, j in ((0, 0), (1, 1), (2, 2), (3, 4)):
      f.write(f"q{i}\td{j}\t1\n")
  run = os.path.join(directory, "run.trec")
  with open(run, "w") as f:
    for i in range(len(QUERIES)):
      docs = [f"d{(i + r) % len(DOCS)}" for r in range(3)] + ([extra_run_doc] if extra_run_doc else [])
      f.writelines(f"q{i} Q0 {d} {r + 1} {10 - r} test\n" for r, d in enumerate(docs))
  return run


def test_beir_with_bm25_and_a_run_file(tmp_path):
  run = _beir(str(tmp_path))
  split = retrieval_eval.read_beir(str(tmp_path))
  bm25 = rerank_eval.first_stage(split, "bm25", 3)
  assert bm25["q0"][0] == "d0" and bm25["q1"][0] == "d1"  # Lexical overlap wins.
  samples = rerank_eval.beir_samples(split, rerank_eval.first_stage(split, run, 100))
  assert samples[0]["documents"][0] == DOCS[0] and samples[0]["positive"] == [DOCS[0]]
  figures = rerank_eval.evaluate(samples, lambda pairs: np.zeros(len(pairs)) + [
      len(d) for _, d in pairs], 10, False)
  assert "base_ndcg@10" in figures


def test_a_run_naming_documents_the_corpus_lacks(tmp_path):
  run = _beir(str(tmp_path), extra_run_doc="d99")
  split = retrieval_eval.read_beir(str(tmp_path))
  with pytest.raises(DataError, match="'d99'.*the corpus lacks"):
    rerank_eval.beir_samples(split, rerank_eval.first_stage(split, run, 100), run)


def _task_cfg(**kw):
  return reranker_lib.task_config(**{"query_column": "", "document_column": "",
                                     "label_column": "", **kw})


def _write(path, rows):
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return str(path)


def test_training_data_shapes(tmp_path, published):
  directory, _ = published
  tok = reranker_lib.load_reranker(directory).tokenizer
  pairs = _write(tmp_path / "p.jsonl", [{"query": q, "document": d, "label": i % 2}
                                        for i, (q, d) in enumerate(_pairs()[:5])])
  lists = _write(tmp_path / "l.jsonl", [{"query": q, "documents": DOCS[:n], "labels":
                                         [1] + [0] * (n - 1)} for q, n in zip(QUERIES, (2, 4, 3, 1))])
  tuples = _write(tmp_path / "t.jsonl", [{"anchor": q, "positive": DOCS[i], "negative_1":
                                          DOCS[i + 1], "negative_2": DOCS[i + 2]}
                                         for i, q in enumerate(QUERIES)])
  # Labeled pairs are pairs, [N, T] (packed in training: 'cls' slots); lists and
  # tuples groups [N, G, T].
  for path, shape, labels in ((pairs, (5, 32), [0, 1]),
                              (lists, (4, 4, 32), [[1, 0, 0, 0], [1, 0, 0, 0]]),
                              (tuples, (4, 3, 32), [[1, 0, 0], [1, 0, 0]])):
    task = rerank.Rerank(_task_cfg(max_seq_length=32), tok, 32)
    examples = task.read(path, "train")
    f = task.featurize(examples, train=True)
    assert f.arrays["input_ids"].shape == shape
    assert task.packing == ("cls" if len(shape) == 2 else "")
    np.testing.assert_array_equal(f.arrays["labels"][:2], labels)
  assert f.arrays["pair_mask"].sum() == 12
  lists_f = rerank.Rerank(_task_cfg(max_seq_length=32), tok, 32)
  f = lists_f.featurize(lists_f.read(lists, "train"), train=True)
  np.testing.assert_array_equal(f.arrays["pair_mask"].sum(1), [2, 4, 3, 1])
  # The pair layout: [CLS] query [SEP] document [SEP], as the tokenizer lays out pairs.
  hf = transformers.AutoTokenizer.from_pretrained(directory)
  want = hf(QUERIES[0], DOCS[0], truncation="longest_first", max_length=32)["input_ids"]
  assert list(f.arrays["input_ids"][0, 0, :len(want)]) == want
  # MNRL: the positive, 2 documents of other examples, the hard negatives.
  mnrl = rerank.Rerank(_task_cfg(loss="mnrl", num_negatives=2), tok, 32)
  groups = mnrl.read(tuples, "train")
  assert [len(g["documents"]) for g in groups] == [5] * 4
  assert all(g["documents"][0] == DOCS[i] and g["labels"] == [1, 0, 0, 0, 0]
             for i, g in enumerate(groups))


def test_one_line_errors(tmp_path, published):
  directory, _ = published
  tok = reranker_lib.load_reranker(directory).tokenizer
  task = rerank.Rerank(_task_cfg(group_size=2), tok, 32)
  no_label = _write(tmp_path / "n.jsonl", [{"query": "q", "document": "d"}])
  with pytest.raises(DataError, match="need a label column"):
    task.read(no_label, "train")
  lists = _write(tmp_path / "l.jsonl", [{"query": "q", "documents": ["a", "b", "c"],
                                         "labels": [1, 0, 0]}])
  with pytest.raises(DataError, match="more than config.task.group_size=2"):
    task.read(lists, "train")
  unequal = _write(tmp_path / "u.jsonl", [{"query": "q", "documents": ["a", "b"],
                                           "labels": [1]}])
  with pytest.raises(DataError, match="2 documents but 1 labels"):
    task.read(unequal, "train")
  with pytest.raises(ConfigError, match="activation"):
    rerank.Rerank(_task_cfg(activation="softmax"), tok, 32)
  # A tokenizer whose template has no pair (a family without a pair layout).
  from tests import test_tokenizer_template as tt  # pylint: disable=g-import-not-at-top
  single_only = tt._from_state(tt._state(tt.llama3_library(pair=None)),  # pylint: disable=protected-access
                               {"pad_token": tt.EOS})
  with pytest.raises(DataError, match="pair template") as e:
    rerank.tokenized_pairs(single_only, ["a query"], ["a document"], 16)
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_rerank_program_scores_pairs_and_reranks_a_run(published, tmp_path):
  """`python -m bertjax.rerank` on a cross-encoder folder: scored pairs (CrossEncoder's
  scores) and a reranked run whose printed figures are CrossEncoderRerankingEvaluator's
  (always_rerank_positives false) over the run's candidates."""
  import subprocess, sys  # pylint: disable=g-import-not-at-top,multiple-imports
  directory, ce = published
  pairs = _write(tmp_path / "pairs.jsonl", [{"query": q, "document": d, "id": i}
                                            for i, (q, d) in enumerate(_pairs())])
  run = _beir(str(tmp_path / "beir"))
  out, reranked = tmp_path / "scores.jsonl", tmp_path / "reranked.trec"
  prog = lambda *a: subprocess.run([sys.executable, "-m", "bertjax.rerank",
                                    f"--model={directory}", *a], capture_output=True,
                                   text=True, timeout=300, cwd=os.path.dirname(
                                       os.path.dirname(__file__)))
  done = prog(f"--pairs={pairs}", f"--out={out}")
  assert done.returncode == 0, done.stderr
  rows = [json.loads(l) for l in out.read_text().splitlines()]
  assert [r["id"] for r in rows] == list(range(len(_pairs())))
  np.testing.assert_allclose([r["score"] for r in rows], ce.predict(_pairs()), atol=1e-5)
  done = prog(f"--beir={tmp_path / 'beir'}", f"--run={run}", f"--out={reranked}")
  assert done.returncode == 0, done.stderr
  split = retrieval_eval.read_beir(str(tmp_path / "beir"))
  samples = rerank_eval.beir_samples(split, rerank_eval.read_run(run))
  want = CrossEncoderRerankingEvaluator(samples, always_rerank_positives=False)(ce)
  for k in ("map", "mrr@10", "ndcg@10"):
    line = next(l for l in done.stdout.splitlines() if l.startswith(k + " "))
    base, ours = map(float, line.split()[1:])
    assert abs(ours - want[k]) < 1e-4 and abs(base - want["base_" + k]) < 1e-4, k
  assert len(reranked.read_text().splitlines()) == 3 * len(QUERIES)
  again = prog(f"--pairs={pairs}", f"--out={out}")
  assert again.returncode == 2 and "exists" in again.stderr.splitlines()[-1]
