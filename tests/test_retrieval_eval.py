"""Retrieval evaluation and hard-negative mining: the BEIR reader and its errors, exact
top-k against a brute-force sort, trec_eval's measures against hand computation and
against sentence-transformers' evaluators, STS, and the mining rule of
sentence-transformers' `mine_hard_negatives`."""

import hashlib
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from bertjax import mine
from bertjax.errors import ConfigError, DataError
from bertjax.tasks import mining, retrieval_eval as rev

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

CORPUS = [
    {"_id": "d1", "title": "Rivers", "text": "the river bank was muddy after the rain ."},
    {"_id": "d2", "title": "", "text": "she deposited the money at the bank ."},
    {"_id": "d3", "text": "plants grew everywhere in the greenhouse ."},  # no title
    {"_id": 4, "title": "Money", "text": "interest rates at the bank rose ."},  # numeric id
]
QUERIES = [{"_id": "q1", "text": "muddy river bank"},
           {"_id": "q2", "text": "money in the bank"},
           {"_id": "q3", "text": "a query nobody judged"}]
QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq2\t4\t2\nq2\td3\t0\n"


def write_beir(root, corpus=CORPUS, queries=QUERIES, qrels=QRELS, split="test"):
  os.makedirs(root / "qrels", exist_ok=True)
  for name, records in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
    with open(root / name, "w", encoding="utf-8") as f:
      f.writelines(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records)
  (root / "qrels" / f"{split}.tsv").write_text(qrels, encoding="utf-8")
  return str(root)


def one_line(error) -> str:
  message = str(error.value)
  assert "\n" not in message, message
  return message


def bag_of_words(texts, dim=64):
  """A deterministic stand-in encoder: hashed word counts [N, dim] (integer-valued, so
  dot products are exact and ties are real ties)."""
  out = np.zeros((len(texts), dim), np.float32)
  for i, text in enumerate(texts):
    for word in re.findall(r"\w+", text.lower()):
      out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % dim] += 1
  return out


# ---- BEIR reader ------------------------------------------------------------------


def test_read_beir_keeps_judged_queries_and_file_order(tmp_path):
  split = rev.read_beir(write_beir(tmp_path))
  assert list(split.corpus) == ["d1", "d2", "d3", "4"]
  assert split.corpus["d3"] == {"title": "", "text": CORPUS[2]["text"]}
  assert split.queries == {"q1": "muddy river bank", "q2": "money in the bank"}
  assert split.qrels == {"q1": {"d1": 1}, "q2": {"d2": 1, "4": 2, "d3": 0}}


def test_document_text_joins_title_and_text_as_beir():
  assert rev.document_text({"title": "Rivers", "text": "muddy banks "}) == "Rivers muddy banks"
  assert rev.document_text({"title": "", "text": " muddy banks"}) == "muddy banks"
  assert rev.document_text({"text": "muddy banks"}) == "muddy banks"


def _drop(name):
  def apply(root):
    path = root / name
    if path.is_dir():
      for child in path.iterdir():
        child.unlink()
      path.rmdir()
    else:
      path.unlink()
  return apply


BAD_BEIR = {
    "no corpus": (dict(), _drop("corpus.jsonl"), "corpus.jsonl does not exist; a BEIR"),
    "no queries": (dict(), _drop("queries.jsonl"), "queries.jsonl does not exist; a BEIR"),
    "no qrels": (dict(), _drop("qrels"), "qrels does not exist; a BEIR"),
    "not json": (dict(corpus=[CORPUS[0], "{oops\n"]), None, "corpus.jsonl:2 is not JSON"),
    "no id": (dict(queries=[{"text": "x"}]), None, 'queries.jsonl:1 has no "_id"'),
    "no text": (dict(corpus=[{"_id": "d1", "title": "t"}]), None,
                'corpus.jsonl:1 has no "text"'),
    "duplicate id": (dict(corpus=[*CORPUS, {"_id": "d2", "text": "again"}]), None,
                     'corpus.jsonl:5 repeats the _id "d2" of line 2'),
    "unknown query": (dict(qrels=QRELS + "q8\td1\t1\nq9\td1\t1\n"), None,
                      'names 2 query id(s) not in queries.jsonl (the first: "q8")'),
    "unknown doc": (dict(qrels=QRELS + "q1\td7\t1\n"), None,
                    'names 1 document id(s) not in corpus.jsonl (the first: "d7")'),
    "empty corpus": (dict(corpus=[]), None, "corpus.jsonl holds no document"),
    "no judged query": (dict(qrels="query-id\tcorpus-id\tscore\n"), None,
                        "test.tsv judges no query"),
    "short qrels line": (dict(qrels=QRELS + "q1\td1\n"), None,
                         "test.tsv:6 has 2 tab-separated fields"),
    "bad score": (dict(qrels=QRELS + "q1\td1\thigh\n"), None,
                  "test.tsv:6: the score 'high' is not an integer"),
}


@pytest.mark.parametrize("case", BAD_BEIR)
def test_read_beir_errors_are_one_line(tmp_path, case):
  kwargs, damage, expected = BAD_BEIR[case]
  root = write_beir(tmp_path, **kwargs)
  if damage:
    damage(tmp_path)
  with pytest.raises(DataError) as e:
    rev.read_beir(root)
  assert expected in one_line(e)


def test_read_beir_missing_split_lists_the_splits(tmp_path):
  write_beir(tmp_path)
  write_beir(tmp_path, split="dev")
  with pytest.raises(DataError) as e:
    rev.read_beir(str(tmp_path), "train")
  assert "train.tsv does not exist; the splits present are: dev, test." in one_line(e)


# ---- Exact search -----------------------------------------------------------------


def brute_force(queries, docs, k):
  """Indices of the k best documents per query by a full sort: score descending,
  then index ascending."""
  scores = queries.astype(np.float64) @ docs.T.astype(np.float64)
  index = np.arange(len(docs))
  return np.array([np.lexsort((index, -row))[:k] for row in scores]), scores


@pytest.mark.parametrize("k, block, query_block", [(7, 16, 8), (20, 16, 64), (1, 103, 5),
                                                   (103, 40, 37)])
def test_top_k_matches_a_full_sort_across_blocks(k, block, query_block):
  rng = np.random.default_rng(0)
  # Small integers: exact dot products with many ties, broken by document index.
  queries = rng.integers(-2, 3, (37, 5)).astype(np.float32)
  docs = rng.integers(-2, 3, (103, 5)).astype(np.float32)
  scores, indices = rev.top_k(queries, docs, k, block=block, query_block=query_block)
  expected, full = brute_force(queries, docs, k)
  assert scores.shape == indices.shape == (37, k) and indices.dtype == np.int64
  np.testing.assert_array_equal(indices, expected)
  np.testing.assert_array_equal(scores, np.take_along_axis(full, expected, 1))


def test_running_top_k_over_pieces_equals_one_search():
  rng = np.random.default_rng(1)
  queries = rng.standard_normal((9, 16)).astype(np.float32)
  docs = rng.standard_normal((250, 16)).astype(np.float32)
  search = rev.RunningTopK(queries, 10, block=32, query_block=4)
  for piece in np.split(docs, [3, 100, 101, 180]):
    search.add(piece)
  scores, indices = search.result()
  np.testing.assert_array_equal(indices, brute_force(queries, docs, 10)[0])
  np.testing.assert_allclose(scores, np.take_along_axis(queries @ docs.T, indices, 1),
                             rtol=1e-6)


def test_top_k_errors_are_one_line():
  docs = np.eye(4, dtype=np.float32)
  with pytest.raises(ConfigError) as e:
    rev.top_k(docs, docs, 5)
  assert "k=5 is more than the 4 documents" in one_line(e)
  with pytest.raises(DataError) as e:
    rev.top_k(docs, np.ones((4, 3), np.float32), 2)
  assert "3 dimensions, the query embeddings 4" in one_line(e)
  with pytest.raises(DataError) as e:
    rev.top_k(docs, docs * np.nan, 2)
  assert "NaN" in one_line(e)


# ---- Measures ---------------------------------------------------------------------

# q1's ranking: d2 (0), d1 (1), d4 (0), d3 (1). q2's: d1 and d4 tie at 0.5, the lower id
# first: d1 (0), d4 (1), d2 (2). q3 has no relevant document (not judged); q4 is judged
# but absent from the run (0 everywhere).
RUN = {"q1": {"d1": 0.8, "d2": 0.9, "d3": 0.6, "d4": 0.7},
       "q2": {"d4": 0.5, "d1": 0.5, "d2": 0.1},
       "q3": {"d1": 1.0}}
HAND_QRELS = {"q1": {"d1": 1, "d3": 1}, "q2": {"d2": 2, "d4": 1}, "q3": {"d5": 0},
              "q4": {"d1": 1}}


def test_measures_against_hand_computation():
  got = rev.evaluate(RUN, HAND_QRELS, k_values=(1, 3))
  dcg = lambda gains: sum(g / math.log2(r + 2) for r, g in enumerate(gains))
  ndcg3 = [dcg([0, 1, 0]) / dcg([1, 1]), dcg([0, 1, 2]) / dcg([2, 1]), 0.0]
  expected = {
      "ndcg@1": 0.0, "ndcg@3": sum(ndcg3) / 3,
      "recall@1": 0.0, "recall@3": (1 / 2 + 2 / 2 + 0) / 3,
      # map_cut: precision at each relevant document in the top k, over all relevant.
      "map@1": 0.0, "map@3": ((1 / 2) / 2 + (1 / 2 + 2 / 3) / 2 + 0) / 3,
      "mrr@10": (1 / 2 + 1 / 2 + 0) / 3,
  }
  assert got.keys() == expected.keys()
  for name, value in expected.items():
    assert got[name] == pytest.approx(value, abs=1e-12), name


def test_mrr_counts_only_the_first_ten():
  run = {"q": {f"d{i:02d}": 100.0 - i for i in range(20)}}
  assert rev.evaluate(run, {"q": {"d10": 1}}, k_values=(100,))["mrr@10"] == 0.0
  assert rev.evaluate(run, {"q": {"d09": 1}}, k_values=(100,))["mrr@10"] == 0.1


def test_evaluate_errors_are_one_line():
  with pytest.raises(DataError) as e:
    rev.evaluate(RUN, {"q3": {"d5": 0}})
  assert "no relevant document" in one_line(e)
  with pytest.raises(ConfigError) as e:
    rev.evaluate(RUN, HAND_QRELS, k_values=(0, 10))
  assert "positive integers" in one_line(e)


def test_evaluator_end_to_end_and_its_run_file(tmp_path):
  split = rev.read_beir(write_beir(tmp_path / "beir"))
  encoded = []

  def encode_documents(texts):
    encoded.append(list(texts))
    return bag_of_words(texts)

  evaluator = rev.RetrievalEvaluator(split, bag_of_words, encode_documents,
                                     corpus_chunk_size=3, block=2)
  metrics = evaluator.evaluate(run_path=str(tmp_path / "run.txt"))
  # Documents embedded once, in id order, as document_text, in chunks of 3.
  texts = [rev.document_text(split.corpus[d]) for d in sorted(split.corpus)]
  assert encoded == [texts[:3], texts[3:]]
  run = evaluator.search()
  assert all(len(docs) == 4 for docs in run.values())  # max(k_values) capped at D
  assert metrics == rev.evaluate(run, split.qrels)
  assert 0 < metrics["ndcg@10"] <= 1 and metrics["recall@100"] == 1.0
  lines = (tmp_path / "run.txt").read_text().splitlines()
  assert len(lines) == 8 and lines[0].split()[:4] == ["q1", "Q0", "d1", "1"]


def test_evaluator_scores_by_the_models_similarity(tmp_path):
  """Unnormalised embeddings whose dot products and cosines rank differently (d3, judged
  0 for q2 and sharing 'in the' with it, made 100 times longer): 'cosine' (the default,
  sentence-transformers') gives the figures of the normalised vectors, 'dot' those of
  the raw ones, where d3 comes first for q2; an unknown similarity is refused in one
  line. The STS correlation alike (`test_sts_spearman_matches_sentence_transformers`
  checks both against sentence-transformers)."""
  split = rev.read_beir(write_beir(tmp_path))

  def long_d3(texts):
    scale = [[100.0 if "greenhouse" in t else 1.0] for t in texts]
    return bag_of_words(texts) * np.asarray(scale, np.float32)

  def unit(encode):  # `encode`'s vectors, normalised
    def normalised(texts):
      x = encode(texts)
      return x / np.linalg.norm(x, axis=1, keepdims=True)
    return normalised

  cosine = rev.RetrievalEvaluator(split, bag_of_words, long_d3).evaluate()
  assert cosine == rev.RetrievalEvaluator(split, unit(bag_of_words), unit(long_d3),
                                          similarity="dot").evaluate()
  dot = rev.RetrievalEvaluator(split, bag_of_words, long_d3, similarity="dot")
  assert next(iter(dot.search()["q2"])) == "d3"
  assert dot.evaluate()["ndcg@1"] < cosine["ndcg@1"]
  with pytest.raises(ConfigError) as e:
    rev.RetrievalEvaluator(split, bag_of_words, long_d3, similarity="euclidean")
  assert "use one of ('cosine', 'dot')" in one_line(e)
  rng = np.random.default_rng(5)
  a, b = rng.standard_normal((2, 30, 4))
  gold, scaled = rng.random(30), a * rng.uniform(0.1, 10, (30, 1))
  assert rev.sts_spearman(scaled, b, gold) == pytest.approx(rev.sts_spearman(a, b, gold))
  assert rev.sts_spearman(scaled, b, gold, "dot") != pytest.approx(
      rev.sts_spearman(scaled, b, gold))
  with pytest.raises(ConfigError):
    rev.sts_spearman(a, b, gold, "manhattan")


@pytest.fixture(scope="module")
def st_evaluation():
  from sentence_transformers.sentence_transformer import evaluation
  return evaluation


@pytest.mark.slow  # importing sentence-transformers (torch, transformers): ~8 s
def test_measures_match_sentence_transformers(st_evaluation):
  rng = np.random.default_rng(2)
  docs = [f"d{i:03d}" for i in range(150)]
  qrels = {f"q{q}": {str(d): 1 for d in rng.choice(docs, rng.integers(1, 6), replace=False)}
           for q in range(25)}
  # Scores rounded to 2 decimals: many ties, which both break by ascending id.
  run = {q: {d: float(s) for d, s in zip(docs, np.round(rng.random(len(docs)), 2))}
         for q in qrels}
  ks = [1, 3, 5, 10, 100]
  evaluator = st_evaluation.InformationRetrievalEvaluator(
      queries={q: q for q in qrels}, corpus={d: d for d in docs},
      relevant_docs={q: set(r) for q, r in qrels.items()}, mrr_at_k=[10], ndcg_at_k=ks,
      precision_recall_at_k=ks, accuracy_at_k=[1], map_at_k=[100])
  hits = [[{"corpus_id": d, "score": s} for d, s in sorted(run[q].items(),
                                                          key=lambda x: (-x[1], x[0]))[:100]]
          for q in evaluator.queries_ids]
  expected = evaluator.compute_metrics(hits)
  got = rev.evaluate({q: dict((h["corpus_id"], h["score"]) for h in hs)
                      for q, hs in zip(evaluator.queries_ids, hits)}, qrels)
  for k in ks:
    assert got[f"ndcg@{k}"] == pytest.approx(expected["ndcg@k"][k], abs=1e-6)
    assert got[f"recall@{k}"] == pytest.approx(expected["recall@k"][k], abs=1e-6)
  assert got["mrr@10"] == pytest.approx(expected["mrr@k"][10], abs=1e-6)
  # Its MAP@100 divides by min(100, relevant), trec_eval by all relevant: equal here.
  assert got["map@100"] == pytest.approx(expected["map@k"][100], abs=1e-6)


@pytest.mark.slow  # importing sentence-transformers
def test_evaluator_matches_sentence_transformers_search(st_evaluation, tmp_path):
  """The whole path (embedding, exact search, ties at the cut, measures) against
  InformationRetrievalEvaluator with the same stand-in encoder (unnormalised) and each
  similarity: dot products, and cosines, which rank otherwise here."""
  import torch
  from sentence_transformers.util import cos_sim, dot_score

  rng = np.random.default_rng(3)
  words = "bank river money rain plant green house rate loan muddy water tree".split()
  corpus = [{"_id": f"d{i:02d}", "title": str(rng.choice(words)),
             "text": " ".join(rng.choice(words, 4))} for i in range(60)]
  queries = [{"_id": f"q{i}", "text": " ".join(rng.choice(words, 2))} for i in range(12)]
  qrels = "query-id\tcorpus-id\tscore\n" + "".join(
      f"q{q}\t{d}\t1\n" for q in range(12)
      for d in rng.choice([c["_id"] for c in corpus], 3, replace=False))
  split = rev.read_beir(write_beir(tmp_path, corpus, queries, qrels))
  ks = [1, 3, 5, 10]
  got = {similarity: rev.RetrievalEvaluator(split, bag_of_words, bag_of_words, k_values=ks,
                                            block=16, similarity=similarity).evaluate()
         for similarity in ("dot", "cosine")}
  assert got["dot"]["ndcg@10"] != pytest.approx(got["cosine"]["ndcg@10"], abs=1e-3)

  class Model:  # What compute_all_metrics calls of a SentenceTransformer.
    def encode_query(self, texts, **kwargs):
      return torch.from_numpy(bag_of_words(texts))
    encode_document = encode_query

  evaluator = st_evaluation.InformationRetrievalEvaluator(
      queries=split.queries, corpus={d: rev.document_text(doc) for d, doc in
                                     split.corpus.items()},
      relevant_docs={q: set(r) for q, r in split.qrels.items()}, corpus_chunk_size=7,
      mrr_at_k=[10], ndcg_at_k=ks, precision_recall_at_k=ks, accuracy_at_k=[1],
      map_at_k=[10], score_functions={"dot": dot_score, "cosine": cos_sim})
  all_expected = evaluator.compute_all_metrics(Model())
  assert set(all_expected) == set(got)
  for similarity, expected in all_expected.items():
    ours = got[similarity]
    for k in ks:
      assert ours[f"ndcg@{k}"] == pytest.approx(expected["ndcg@k"][k], abs=1e-6)
      assert ours[f"recall@{k}"] == pytest.approx(expected["recall@k"][k], abs=1e-6)
    assert ours["mrr@10"] == pytest.approx(expected["mrr@k"][10], abs=1e-6)
    assert ours["map@10"] == pytest.approx(expected["map@k"][10], abs=1e-6)  # 3 relevant <= 10


# ---- STS --------------------------------------------------------------------------


def test_sts_spearman_against_hand_computation():
  angles = np.array([1.2, 0.9, 0.5, 0.1])  # cosines increase: ranks 1, 2, 3, 4
  emb1 = np.tile([1.0, 0.0], (4, 1)) * np.array([[1], [2], [3], [0.5]])  # norms differ
  emb2 = np.stack([np.cos(angles), np.sin(angles)], axis=1)
  # Gold ranks 1, 2, 4, 3: sum of squared rank differences 2, rho = 1 - 6 x 2 / (4 x 15).
  assert rev.sts_spearman(emb1, emb2, [0.0, 1.0, 5.0, 4.0]) == pytest.approx(0.8)
  assert rev.sts_spearman(emb1, emb2, [3.0, 2.0, 1.0, 0.0]) == pytest.approx(-1.0)


def test_read_sts_formats(tmp_path):
  s1, s2, scores = rev.read_sts(os.path.join(FIXTURES, "stsb_dev.tsv"))
  assert s1[0] == "a man rides a horse ." and s2[0] == "a person is riding a horse ."
  assert scores[:2].tolist() == [4.6, 0.9] and len(s1) == len(s2) == len(scores)
  (tmp_path / "sts.jsonl").write_text(
      '{"a": "one", "b": "two", "label": 1}\n\n{"a": "x", "b": "y", "label": 0.5}\n')
  s1, s2, scores = rev.read_sts(str(tmp_path / "sts.jsonl"), "a", "b", "label")
  assert (s1, s2, scores.tolist()) == (["one", "x"], ["two", "y"], [1.0, 0.5])
  (tmp_path / "sts.csv").write_text('sentence1,sentence2,score\n"a, b",c,1\nd,e,2\n')
  s1, _, scores = rev.read_sts(str(tmp_path / "sts.csv"))
  assert s1 == ["a, b", "d"] and scores.tolist() == [1.0, 2.0]
  with pytest.raises(DataError) as e:
    rev.read_sts(str(tmp_path / "sts.jsonl"))
  assert 'sts.jsonl:1 has no "sentence1"' in one_line(e)
  (tmp_path / "bad.csv").write_text("sentence1,sentence2,score\na,b,high\nc,d,1\n")
  with pytest.raises(DataError) as e:
    rev.read_sts(str(tmp_path / "bad.csv"))
  assert "bad.csv:2: the score 'high' is not a number" in one_line(e)


@pytest.mark.slow  # importing sentence-transformers
def test_sts_spearman_matches_sentence_transformers(st_evaluation):
  rng = np.random.default_rng(4)
  emb1, emb2 = rng.standard_normal((2, 40, 8)).astype(np.float32)
  gold = np.round(rng.random(40) * 5, 1)  # Ties in the gold scores, as in STS-B.
  table = {f"a{i}": emb1[i] for i in range(40)} | {f"b{i}": emb2[i] for i in range(40)}

  class Model:  # What EmbeddingSimilarityEvaluator calls of a SentenceTransformer.
    similarity_fn_name = "cosine"
    model_card_data = type("Card", (), {"set_evaluation_metrics": lambda *a: None})()

    def encode(self, texts, **kwargs):
      return np.stack([table[t] for t in texts])

  evaluator = st_evaluation.EmbeddingSimilarityEvaluator(
      [f"a{i}" for i in range(40)], [f"b{i}" for i in range(40)], gold.tolist(),
      similarity_fn_names=["cosine", "dot"], write_csv=False)
  expected = evaluator(Model())
  for similarity in ("cosine", "dot"):
    assert rev.sts_spearman(emb1, emb2, gold, similarity) == pytest.approx(
        expected[f"spearman_{similarity}"], abs=1e-6)
  assert expected["spearman_cosine"] != pytest.approx(expected["spearman_dot"], abs=1e-3)


# ---- Mining -----------------------------------------------------------------------


def angle_encoder(cosines):
  """Unit vectors in 2-D: every query is (1, 0), a document with cosine c is
  (c, sqrt(1 - c^2)), so its score for any query is c."""
  def encode(texts, kind):
    if kind == "query":
      return np.tile([1.0, 0.0], (len(texts), 1))
    c = np.array([cosines[t] for t in texts])
    return np.stack([c, np.sqrt(1 - c ** 2)], axis=1)
  return encode


COSINES = {"pos": 0.8, "false negative": 0.79, "hard": 0.7, "easy": 0.1}


def test_relative_margin_drops_the_false_negative():
  encode = angle_encoder(COSINES)
  corpus = ["easy", "false negative", "hard"]
  rows, counts = mining.mine_hard_negatives(["query"], ["pos"], encode, corpus)
  assert rows == [{"anchor": "query", "positive": "pos", "negative": "false negative"}]
  # NV-Retriever's TopK-PercPos 95%: keep scores <= 0.8 - 0.05 x 0.8 = 0.76.
  rows, counts = mining.mine_hard_negatives(["query"], ["pos"], encode, corpus,
                                            relative_margin=0.05)
  assert rows == [{"anchor": "query", "positive": "pos", "negative": "hard"}]
  assert counts["skipped_relative_margin"] == 1 and counts["short"] == 0
  # absolute_margin: dropped when score + 0.05 > 0.8.
  rows, counts = mining.mine_hard_negatives(["query"], ["pos"], encode, corpus,
                                            absolute_margin=0.05)
  assert rows[0]["negative"] == "hard" and counts["skipped_absolute_margin"] == 1


def test_relative_margin_of_a_negative_positive_score():
  """The threshold is positive - |positive| x margin (sentence-transformers #3819):
  with a positive at -0.5 and margin 0.1 it is -0.55, so -0.52 is dropped (it would
  pass positive x (1 - margin) = -0.45) and -0.6 kept."""
  encode = angle_encoder({"pos": -0.5, "close": -0.52, "far": -0.6})
  rows, _ = mining.mine_hard_negatives(["q"], ["pos"], encode, ["close", "far"],
                                       relative_margin=0.1)
  assert rows[0]["negative"] == "far"


def test_several_negatives_columns_and_shared_anchors():
  cosines = {"p1": 0.9, "p2": 0.6, "n1": 0.5, "n2": 0.4, "n3": 0.3}
  encode = angle_encoder(cosines)
  anchors, positives = ["a", "a", "b", "a"], ["p1", "p2", "n1", "p1"]
  rows, counts = mining.mine_hard_negatives(
      anchors, positives, encode, ["n2", "n3"], num_negatives=2, anchor_column="query",
      positive_column="answer")
  # "a" has two positives (p1, p2; the repeated pair once): both are excluded for it,
  # and each of its pairs gets the same negatives. "b"'s positive n1 is a candidate for
  # "a"; p1 and p2 are candidates for "b".
  assert rows == [
      {"query": "a", "answer": "p1", "negative_1": "n1", "negative_2": "n2"},
      {"query": "a", "answer": "p2", "negative_1": "n1", "negative_2": "n2"},
      {"query": "b", "answer": "n1", "negative_1": "p1", "negative_2": "p2"},
  ]
  assert counts == {"pairs": 4, "anchors": 2, "corpus": 5, "rows": 3, "short": 0}
  # The margin uses an anchor's hardest positive: for "a" p2 (0.6), so scores up to
  # 0.6 - 0.3 x 0.6 = 0.42 remain (n2, n3); for "b" up to 0.5 - 0.15 = 0.35 (n3 alone:
  # one negative short of two, so "b" gets no row).
  rows, counts = mining.mine_hard_negatives(anchors, positives, encode, ["n2", "n3"],
                                            num_negatives=2, relative_margin=0.3)
  assert [(r["positive"], r["negative_1"], r["negative_2"]) for r in rows] == [
      ("p1", "n2", "n3"), ("p2", "n2", "n3")]
  assert counts["rows"] == 2 and counts["short"] == 1
  assert counts["skipped_relative_margin"] == 1 + 3  # n1 for "a"; p1, p2, n2 for "b"


def test_range_min_and_short_pairs():
  encode = angle_encoder(COSINES)
  rows, _ = mining.mine_hard_negatives(["q"], ["pos"], encode, ["easy", "hard",
                                                               "false negative"],
                                       range_min=1, range_max=3)
  assert rows[0]["negative"] == "hard"
  with pytest.raises(DataError) as e:  # Every candidate within the margin.
    mining.mine_hard_negatives(["q"], ["pos"], encode, ["false negative"],
                               relative_margin=0.05)
  assert "no pair found 1 negative(s)" in one_line(e)


def test_mining_errors_are_one_line(tmp_path):
  encode = angle_encoder(COSINES)
  with pytest.raises(ConfigError) as e:
    mining.mine_hard_negatives(["q"], ["pos"], encode, ["hard"], num_negatives=11)
  assert "num_negatives=11 is more than the 10 candidates" in one_line(e)
  with pytest.raises(DataError) as e:
    mining.mine_hard_negatives(["q"], ["pos"], encode, ["hard"], num_negatives=2)
  assert "holds 2 distinct documents, too few for a positive and 2" in one_line(e)
  with pytest.raises(DataError) as e:
    mining.mine_hard_negatives(["q", " "], ["pos", "hard"], encode)
  assert "anchor 1 is empty" in one_line(e)
  pairs = tmp_path / "pairs.jsonl"
  pairs.write_text('{"query": "q", "positive": "pos"}\n')
  with pytest.raises(DataError) as e:
    mining.read_pairs(str(pairs))
  assert 'pairs.jsonl:1 has no column "anchor" (it has: query, positive)' in one_line(e)
  pairs.write_text('{"anchor": "q", "positive": ""}\n')
  with pytest.raises(DataError) as e:
    mining.read_pairs(str(pairs))
  assert 'pairs.jsonl:1: the "positive" text is empty' in one_line(e)


def test_mine_file_with_a_beir_corpus(tmp_path):
  """`bertjax.mine`'s work in-process, the stand-in encoder for the model."""
  pairs = [{"question": "muddy river bank", "passage": "the river bank was muddy ."},
           {"question": "money at the bank", "passage": "she deposited money ."}]
  (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
  write_beir(tmp_path)
  kinds = []

  def encode(texts, kind):
    kinds.append(kind)
    return bag_of_words(texts)

  counts = mining.mine_file(str(tmp_path / "pairs.jsonl"), str(tmp_path / "out.jsonl"),
                            encode, str(tmp_path / "corpus.jsonl"), "question", "passage",
                            num_negatives=2)
  rows = [json.loads(line) for line in open(tmp_path / "out.jsonl", encoding="utf-8")]
  assert kinds == ["document", "query"] and counts["corpus"] == 6
  assert counts["rows"] == len(rows) == 2
  assert all(list(r) == ["question", "passage", "negative_1", "negative_2"] for r in rows)
  assert rows[0]["negative_1"] == "Rivers the river bank was muddy after the rain ."
  assert "6 candidate documents" in mine.summary(counts, "out.jsonl")


# `python -m bertjax.mine` with a stand-in for the model's loader (the hashed bag of
# words above), so the program runs whole: flags, reading, mining, writing, errors.
MINE = """
import hashlib, re, sys, types
import numpy as np

def load_encoder(path):
  def encode(texts, kind):
    out = np.zeros((len(texts), 64), np.float32)
    for i, text in enumerate(texts):
      for word in re.findall(r"\\w+", text.lower()):
        out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1
    return out
  return types.SimpleNamespace(encode=encode)

sys.modules["bertjax.tasks.embedding"] = types.SimpleNamespace(load_encoder=load_encoder)
from bertjax import mine
from bertjax.console import cli
mine.define_flags()
cli.run(mine.main, argv=sys.argv)
"""


@pytest.mark.slow  # two processes that import jax: ~8 s
def test_mine_program(tmp_path):
  pairs = tmp_path / "pairs.jsonl"
  pairs.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in [
      ("muddy river bank", "the river bank was muddy ."),
      ("money at the bank", "she deposited money at the bank ."),
      ("green plants", "plants grew in the greenhouse .")]))
  run = lambda *flags: subprocess.run([sys.executable, "-c", MINE, "--model=m", *flags],
                                      capture_output=True, text=True, timeout=120)
  out = tmp_path / "out.jsonl"
  done = run(f"--pairs={pairs}", f"--out={out}", f"--corpus={write_beir(tmp_path)}"
             "/corpus.jsonl", "--num_negatives=2")
  assert done.returncode == 0, done.stderr
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert len(rows) == 3 and list(rows[0]) == ["anchor", "positive", "negative_1",
                                              "negative_2"]
  assert f"3 rows -> {out} (3 pairs, 3 distinct anchors, 7 candidate" in done.stdout
  mined = out.read_bytes()
  failed = run(f"--pairs={pairs}", f"--out={out}", "--anchor_column=query", "--overwrite")
  assert failed.returncode == 2
  assert failed.stderr.strip().splitlines()[-1] == (
      f'error: {pairs}:1 has no column "query" (it has: anchor, positive); name the '
      "columns with --anchor_column and --positive_column.")
  assert out.read_bytes() == mined  # The failed run's output went nowhere.


def test_search_benchmark_agreement_and_table():
  from benchmarks import search
  scores = np.array([[0.9, 0.8] + [0.1] * 9, [0.7, 0.6] + [0.1] * 9], np.float32)
  ours = (scores, np.tile(np.arange(11), (2, 1)))
  swapped = ours[1].copy()
  swapped[1, :2] = [1, 0]  # the second query's first two swapped: same set, not order
  assert search.agreement(ours, (scores + 0.125, swapped)) == {
      "same_top10_order": 0.5, "same_top10_set": 1.0,
      "max_score_diff": pytest.approx(0.125, abs=1e-6)}
  table = search.format_table({"k": 100, "docs": 1000, "dim": 8, "repeats": 1,
                               "device": "cpu", "rows": [
                                   {"queries": 10, "top_k_s": {"min": 1.0, "median": 2.0}}]})
  assert "not installed" in table.splitlines()[-1]
