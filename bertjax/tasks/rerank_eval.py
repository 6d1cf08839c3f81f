"""Evaluation of rerankers by reranking each query's candidate list, as
sentence-transformers 6.2.0's `CrossEncoderRerankingEvaluator` does, its measures by
trec_eval (`pytrec_eval`): MAP, MRR@k and nDCG@k (k = 10), each the mean over every
sample (a sample whose reranked list holds no relevant document counts 0).

    samples = read_samples("dev.jsonl")         # or beir_samples(split, first_stage_run)
    metrics = evaluate(samples, score)          # score(pairs) -> [N] scores

A sample is sentence-transformers' dict: `query`, `positive` (texts) and either
`documents` (a first stage's candidates, best first) or `negative` (texts). With
`documents`, `always_rerank_positives` True reranks the positives and the candidates
that are not positives (every positive is scored, retrieved or not), False only the
candidates (a positive the first stage missed is lost: MAP and nDCG count only the
positives among the candidates, as sentence-transformers' do); the first stage's own
figures come beside (`base_map`, `base_mrr@k`, `base_ndcg@k`: the candidates in their
order, the missed positives after them, as sentence-transformers ranks them).

The first stage of a BEIR directory (`beir_samples`): BM25 (`bm25`: the `bm25s`
library, Lucene's BM25 with k1 1.5, b 0.75, English stop words, over title + text), a
TREC run file (query-id Q0 doc-id rank score tag), or an embedding model's exact
search (`bertjax.tasks.retrieval_eval.RetrievalEvaluator.search`); its top `k`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable, Mapping, Sequence

import numpy as np
import pytrec_eval

from bertjax.errors import ConfigError, DataError
from bertjax.tasks import retrieval_eval

AT_K = 10
# The columns a (query, document) row's query and document are found under, in order.
QUERY_COLUMNS = ("query", "anchor", "question")
DOCUMENT_COLUMNS = ("document", "documents", "positive", "answer", "response", "passage",
                    "docs")
Score = Callable[[list[tuple[str, str]]], np.ndarray]


# ---- Samples ----------------------------------------------------------------------


def read_samples(path: str) -> list[dict]:
  """sentence-transformers' reranking samples of a JSON-lines file (module docstring)."""
  if not os.path.isfile(path):
    raise DataError(f"reranking samples {path} do not exist; give JSON lines of query, "
                    "positive and documents (or negative), or a BEIR directory.")
  samples = []
  for n, row in retrieval_eval.json_lines(path):
    if not isinstance(row, dict) or "query" not in row or "positive" not in row:
      raise DataError(f"{path}:{n} lacks \"query\" or \"positive\"; a reranking sample is "
                      "query, positive and documents (or negative).")
    if ("documents" in row) == ("negative" in row):
      raise DataError(f"{path}:{n}: give exactly one of \"documents\" (a first stage's "
                      "candidates) and \"negative\".")
    samples.append(row)
  if not samples:
    raise DataError(f"{path} holds no sample.")
  return samples


def read_run(path: str) -> dict[str, list[str]]:
  """query id -> doc ids, best first, of a TREC run file (ranked by score, then rank)."""
  if not os.path.isfile(path):
    raise DataError(f"run file {path} does not exist; give TREC lines: query-id Q0 doc-id "
                    "rank score tag.")
  rows: dict[str, list[tuple[float, int, str]]] = {}
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      parts = line.split()
      if not parts:
        continue
      if len(parts) < 5:
        raise DataError(f"{path}:{n} has {len(parts)} fields; a run line is query-id Q0 "
                        "doc-id rank score [tag].")
      try:
        rank, score = int(parts[3]), float(parts[4])
      except ValueError as e:
        raise DataError(f"{path}:{n}: rank {parts[3]!r} or score {parts[4]!r} is no "
                        "number.") from e
      rows.setdefault(parts[0], []).append((-score, rank, parts[2]))
  return {q: [d for _, _, d in sorted(r)] for q, r in rows.items()}


def bm25_run(split: retrieval_eval.BeirSplit, k: int) -> dict[str, list[str]]:
  """query id -> the best `k` doc ids by BM25 (`bm25s`, module docstring)."""
  import bm25s  # pylint: disable=g-import-not-at-top
  ids = list(split.corpus)
  texts = [retrieval_eval.document_text(split.corpus[d]) for d in ids]
  retriever = bm25s.BM25()
  retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False),
                  show_progress=False)
  queries = list(split.queries)
  found, _ = retriever.retrieve(
      bm25s.tokenize([split.queries[q] for q in queries], stopwords="en",
                     show_progress=False),
      k=min(k, len(ids)), show_progress=False, backend_selection="numpy")
  return {q: [ids[i] for i in row] for q, row in zip(queries, np.asarray(found))}


def embedding_run(split: retrieval_eval.BeirSplit, model: str, k: int
                  ) -> dict[str, list[str]]:
  """query id -> the best `k` doc ids of an embedding model's exact search."""
  from bertjax.tasks.embedding import load_encoder  # pylint: disable=g-import-not-at-top
  encoder = load_encoder(model)
  search = retrieval_eval.RetrievalEvaluator(
      split, lambda t: encoder.encode(t, "query"), lambda t: encoder.encode(t, "document"),
      k_values=(k,), mrr_at=1, similarity=encoder.settings.similarity).search()
  return {q: sorted(docs, key=lambda d: (-docs[d], d)) for q, docs in search.items()}


def first_stage(split: retrieval_eval.BeirSplit, name: str, k: int, path: str = ""
                ) -> dict[str, list[str]]:
  """The candidate lists of 'bm25', a run file or an embedding model directory."""
  if not name:
    raise ConfigError(f"{path or 'the BEIR directory'}: name its first stage "
                      "(config.task.first_stage / --first_stage): 'bm25', a TREC run file "
                      "or an embedding model directory.")
  if name == "bm25":
    return bm25_run(split, k)
  if os.path.isfile(name):
    run = read_run(name)
    return {q: docs[:k] for q, docs in run.items()}
  if os.path.isdir(name):
    return embedding_run(split, name, k)
  raise ConfigError(f"first stage {name!r} is neither 'bm25', a run file nor a model "
                    "directory.")


def beir_samples(split: retrieval_eval.BeirSplit, run: Mapping[str, Sequence[str]],
                 source: str = "the run") -> list[dict]:
  """A sample a judged query (a grade > 0): its text, the texts of its relevant
  documents (`positive`) and of its candidates in the run's order (`documents`); a
  candidate the corpus lacks is a one-line DataError."""
  samples = []
  for q, grades in split.qrels.items():
    relevant = [d for d, g in grades.items() if g > 0]
    if not relevant or q not in split.queries:
      continue
    candidates = list(run.get(q, []))
    missing = [d for d in candidates if d not in split.corpus]
    if missing:
      raise DataError(f"{source} names document {missing[0]!r} for query {q!r} (and "
                      f"{len(missing) - 1} more) that the corpus lacks; rerank a run of "
                      "the same corpus.")
    text = lambda d: retrieval_eval.document_text(split.corpus[d])
    samples.append({"query": split.queries[q], "positive": [text(d) for d in relevant],
                    "documents": [text(d) for d in candidates], "query_id": q})
  if not samples:
    raise DataError(f"{source}: no query of the qrels has a relevant document.")
  return samples


# ---- Pairs and measures -----------------------------------------------------------


@dataclasses.dataclass
class Plan:
  """What a list of samples reranks: `pairs` (query, document) in order; per sample,
  `relevant` (its pairs' 0/1 relevance, None: nothing to rerank, it counts 0) and
  `base` (the first stage's relevance in its order, missed positives after; None
  without documents)."""

  pairs: list[tuple[str, str]]
  relevant: list[list[int] | None]
  base: list[list[int] | None]


def plan(samples: Sequence[dict], always_rerank_positives: bool = True) -> Plan:
  """sentence-transformers' reranking lists of `samples` (module docstring)."""
  pairs, relevant, base = [], [], []
  for s in samples:
    positive = [s["positive"]] if isinstance(s["positive"], str) else list(s["positive"])
    documents = s.get("documents")
    if documents is not None:
      hit = [int(d in positive) for d in documents]
      base.append(hit + [1] * (len(positive) - sum(hit)) if sum(hit) else [])
      if always_rerank_positives:
        docs = positive + [d for d in documents if d not in positive]
        rel = [1] * len(positive) + [0] * (len(docs) - len(positive))
      else:
        docs, rel = list(documents), hit
    else:
      base.append(None)
      docs = positive + list(s["negative"])
      rel = [1] * len(positive) + [0] * len(s["negative"])
    if not sum(rel):
      relevant.append(None)
      continue
    relevant.append(rel)
    pairs += [(s["query"], d) for d in docs]
  return Plan(pairs, relevant, base)


def measures(lists: Sequence[tuple[list[int], Sequence[float]] | None], at_k: int = AT_K
             ) -> dict[str, float]:
  """pytrec_eval's MAP, MRR@k (recip_rank of the best k) and nDCG@k (ndcg_cut) of
  (relevance, scores) lists, each the mean over every list (None counts 0)."""
  qrels, run, head = {}, {}, {}
  for i, item in enumerate(lists):
    if item is None or not sum(item[0]):
      continue
    rel, scores = item
    key = f"s{i}"
    qrels[key] = {f"d{j}": int(r) for j, r in enumerate(rel)}
    run[key] = {f"d{j}": float(x) for j, x in enumerate(scores)}
    best = sorted(run[key], key=lambda d: -run[key][d])[:at_k]
    head[key] = {d: run[key][d] for d in best}
  out = {"map": 0.0, f"mrr@{at_k}": 0.0, f"ndcg@{at_k}": 0.0}
  if not lists:
    return out
  if qrels:
    full = pytrec_eval.RelevanceEvaluator(qrels, {"map", f"ndcg_cut.{at_k}"}).evaluate(run)
    top = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(head)
    out["map"] = math.fsum(r["map"] for r in full.values()) / len(lists)
    out[f"ndcg@{at_k}"] = math.fsum(r[f"ndcg_cut_{at_k}"] for r in full.values()) / len(lists)
    out[f"mrr@{at_k}"] = math.fsum(r["recip_rank"] for r in top.values()) / len(lists)
  return out


def scored(p: Plan, scores: Sequence[float], at_k: int = AT_K) -> dict[str, float]:
  """The measures of plan `p` whose pairs got `scores`, the first stage's beside them
  (base_*) when the samples have documents."""
  scores = np.asarray(scores, np.float64).reshape(-1)
  if len(scores) != len(p.pairs):
    raise DataError(f"{len(scores)} scores for {len(p.pairs)} pairs.")
  lists, offset = [], 0
  for rel in p.relevant:
    if rel is None:
      lists.append(None)
      continue
    lists.append((rel, scores[offset:offset + len(rel)]))
    offset += len(rel)
  out = measures(lists, at_k)
  if any(b is not None for b in p.base):
    base = measures([(b, list(range(len(b), 0, -1))) if b else None for b in p.base], at_k)
    out.update({f"base_{k}": v for k, v in base.items()})
  return out


def evaluate(samples: Sequence[dict], score: Score, at_k: int = AT_K,
             always_rerank_positives: bool = True) -> dict[str, float]:
  """`CrossEncoderRerankingEvaluator(samples, at_k, always_rerank_positives)`'s figures
  of the model whose `score(pairs)` gives each (query, document) pair's score."""
  p = plan(samples, always_rerank_positives)
  values = np.asarray(score(p.pairs)) if p.pairs else np.zeros(0)
  return scored(p, values, at_k)


# ---- The task's dev set -----------------------------------------------------------


def dev_samples(path: str, task_cfg) -> list[dict]:
  """The samples of `config.data.dev`: a JSON-lines file of samples, or a BEIR
  directory with `task_cfg.first_stage`'s top `task_cfg.first_stage_k`."""
  if os.path.isdir(path):
    split = retrieval_eval.read_beir(path, task_cfg.qrels_split)
    run = first_stage(split, task_cfg.first_stage, task_cfg.first_stage_k, path)
    return beir_samples(split, run, task_cfg.first_stage)
  return read_samples(path)


def read_dev(path: str, task_cfg) -> list[dict]:
  """The dev pairs of `path` (`dev_samples`), one example each: query, document,
  label (0/1) and the `Plan` they belong to (`score_pairs` reads it)."""
  p = plan(dev_samples(path, task_cfg), task_cfg.always_rerank_positives)
  if not p.pairs:
    raise DataError(f"{path}: no sample has a relevant document to rerank.")
  labels = [r for rel in p.relevant if rel is not None for r in rel]
  return [{"query": q, "document": d, "label": float(l), "plan": p}
          for (q, d), l in zip(p.pairs, labels)]


def score_pairs(predictions: Sequence[float], examples: Sequence[dict], at_k: int = AT_K
                ) -> dict[str, float]:
  """The reranking measures of the dev pairs' `predictions` (`read_dev`'s examples)."""
  first = [float(x) if np.ndim(x) == 0 else float(np.asarray(x)[-1]) for x in predictions]
  return scored(examples[0]["plan"], first, at_k)


# ---- The scoring command (python -m bertjax.rerank) -------------------------------


def read_pairs(path: str, query_column: str = "", document_column: str = ""
               ) -> list[dict]:
  """The rows of a JSON-lines file of (query, document) pairs (columns: query / anchor
  / question and document / positive / answer / ..., or those named)."""
  if not os.path.isfile(path):
    raise DataError(f"pairs file {path} does not exist; give JSON lines of query and "
                    "document.")
  rows = [r for _, r in retrieval_eval.json_lines(path)]
  if not rows or not all(isinstance(r, dict) for r in rows):
    raise DataError(f"{path} holds no pair (JSON objects, a pair a line).")
  names = list(rows[0])
  q = query_column or next((c for c in QUERY_COLUMNS if c in names), "")
  d = document_column or next((c for c in DOCUMENT_COLUMNS if c in names and c != q),
                              "")
  for n, r in enumerate(rows, 1):
    for column in (q, d):
      if not column or not isinstance(r.get(column), str) or not r[column].strip():
        raise DataError(f"{path}:{n} has no text in column {column or 'query/document'!r} "
                        f"(it has: {', '.join(map(str, r))}); name the columns with "
                        "--query_column and --document_column.")
  return [{"query": r[q], "document": r[d], "row": r} for r in rows]


def score_file(pairs_path: str, out_path: str, score: Score, overwrite: bool = False,
               model_path: str = "", query_column: str = "", document_column: str = ""
               ) -> int:
  """Each pair of `pairs_path` with its `score` added, as JSON lines to `out_path`
  (`bertjax.writes.output_file`); returns the number of pairs."""
  from bertjax import writes  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  with writes.output_file(out_path, overwrite, {"--pairs": pairs_path,
                                                "--model": model_path}) as tmp:
    rows = read_pairs(pairs_path, query_column, document_column)
    scores = np.asarray(score([(r["query"], r["document"]) for r in rows]))
    with open(tmp, "w", encoding="utf-8") as f:
      for r, s in zip(rows, scores):
        value = float(s) if np.ndim(s) == 0 else [float(x) for x in s]
        f.write(json.dumps({**r["row"], "score": value}, ensure_ascii=False) + "\n")
  return len(rows)


def rerank_run(beir: str, run_path: str, out_path: str, score: Score, top_k: int = 100,
               split: str = "test", overwrite: bool = False, model_path: str = "",
               at_k: int = AT_K) -> dict[str, float]:
  """Reranks each judged query's best `top_k` candidates of `run_path` (a TREC run, or
  'bm25' for bm25s' over the corpus) in the BEIR directory `beir`; writes the reranked
  run (TREC lines, the candidates by the reranker's score) to `out_path`; returns
  the reranked figures and the first stage's (base_*), `CrossEncoderRerankingEvaluator`
  with always_rerank_positives=False (only the candidates are scored)."""
  from bertjax import writes  # pylint: disable=g-import-not-at-top
  with writes.output_file(out_path, overwrite, {"--run": run_path, "--beir": beir,
                                                "--model": model_path}) as tmp:
    split_data = retrieval_eval.read_beir(beir, split)
    run = first_stage(split_data, run_path, top_k, beir)
    samples = beir_samples(split_data, run, run_path)
    judged = [s["query_id"] for s in samples]
    pairs = [(split_data.queries[q], retrieval_eval.document_text(split_data.corpus[d]))
             for q in judged for d in run.get(q, [])]
    scores = np.asarray(score(pairs), np.float64).reshape(len(pairs), -1)[:, -1]
    reranked, offset = {}, 0
    for q in judged:
      docs = run.get(q, [])
      reranked[q] = {d: float(s) for d, s in zip(docs, scores[offset:offset + len(docs)])}
      offset += len(docs)
    retrieval_eval.write_run(reranked, tmp, tag="bertjax-rerank")
    p = plan(samples, always_rerank_positives=False)
    by_pair = dict(zip(pairs, scores))
    return scored(p, [by_pair[pair] for pair in p.pairs], at_k)
