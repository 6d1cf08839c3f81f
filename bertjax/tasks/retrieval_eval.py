"""Evaluation of sentence-embedding models: BEIR retrieval and STS correlation.

  split = read_beir("scifact")                  # corpus.jsonl, queries.jsonl, qrels/test.tsv
  evaluator = RetrievalEvaluator(split, lambda t: encoder.encode(t, "query"),
                                 lambda t: encoder.encode(t, "document"))
  metrics = evaluator.evaluate()     # metrics["ndcg@10"], ["recall@100"], ["mrr@10"]

Retrieval is exact: every query against every document by the model's similarity
(cosine: both sides normalised first, whether or not the encoder normalises; dot: as
they are), the corpus in blocks with a running top-k of dot products (`top_k`) so
memory is bounded by the block, not the corpus. The measures are trec_eval's
(`pytrec_eval`, as BEIR computes them): nDCG@k with the qrels' graded gains, Recall@k,
MAP@k (trec_eval's `map_cut`), and MRR@10 (`recip_rank` of each query's first 10
results), each the mean over the judged queries. Ties between equal scores are broken
by ascending document id, as sentence-transformers' `InformationRetrievalEvaluator`
breaks them (trec_eval would break them by descending id): `evaluate` hands
pytrec_eval scores that encode that rank.

STS: `read_sts` reads (sentence1, sentence2, score) rows, and `sts_spearman` is the
Spearman correlation of the pairs' similarities (the model's: cosine or dot) with the
gold scores, in [-1, 1], as sentence-transformers' `EmbeddingSimilarityEvaluator`
reports `spearman_cosine` (`spearman_dot`).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
from typing import Callable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pytrec_eval

from bertjax.errors import ConfigError, DataError
from bertjax.tasks import contrastive, readers
from bertjax.tasks import metrics as task_metrics

LAYOUT = ("a BEIR dataset directory holds corpus.jsonl (_id, title, text), queries.jsonl "
          "(_id, text) and qrels/<split>.tsv (query-id, corpus-id, score)")
K_VALUES = (1, 3, 5, 10, 100)
MRR_AT = 10  # MS MARCO's MRR@10
# Documents scored per matmul: [query_block, block] float32 scores (64 MiB at the
# defaults) bound the memory, whatever the corpus size.
BLOCK = 16384
QUERY_BLOCK = 1024

Encode = Callable[[list[str]], np.ndarray]


# ---- BEIR -------------------------------------------------------------------------


@dataclasses.dataclass
class BeirSplit:
  """One split of a BEIR dataset.

  corpus: doc id -> {"title": str, "text": str}, in corpus.jsonl's order.
  queries: query id -> text, only those the qrels name, in queries.jsonl's order.
  qrels: query id -> doc id -> graded relevance (0 = judged not relevant).
  """
  corpus: dict[str, dict[str, str]]
  queries: dict[str, str]
  qrels: dict[str, dict[str, int]]


def json_lines(path: str) -> Iterator[tuple[int, object]]:
  """(line number, parsed JSON) of each non-blank line of `path`."""
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if line.strip():
        try:
          yield n, json.loads(line)
        except json.JSONDecodeError as e:
          raise DataError(f"{path}:{n} is not JSON ({e.msg}).") from e


def _records(path: str, fields: Sequence[str]) -> Iterator[tuple[str, dict]]:
  """(str(_id), record) of each line of a BEIR JSON-lines file, ids unique."""
  first_line: dict[str, int] = {}
  for n, record in json_lines(path):
    for field in ("_id", *fields):
      if not isinstance(record, dict) or record.get(field) is None:
        raise DataError(f"{path}:{n} has no \"{field}\"; each line of a BEIR "
                        f"{os.path.basename(path)} is an object with \"_id\" and \"text\".")
    # BEIR's ids are strings (qrels are text); some files write numbers.
    key = str(record["_id"])
    if key in first_line:
      raise DataError(f"{path}:{n} repeats the _id \"{key}\" of line {first_line[key]}; "
                      "ids must be unique.")
    first_line[key] = n
    yield key, record


def _read_qrels(path: str) -> dict[str, dict[str, int]]:
  """query id -> doc id -> score of a BEIR qrels TSV (its header line skipped)."""
  qrels: dict[str, dict[str, int]] = {}
  with open(path, encoding="utf-8", newline="") as f:
    for n, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
      if not row or not "".join(row).strip():
        continue
      if len(row) != 3:
        raise DataError(f"{path}:{n} has {len(row)} tab-separated fields; a qrels line is "
                        "query-id, corpus-id, score.")
      try:
        score = int(row[2])
      except ValueError as e:
        if n == 1:  # The header `query-id corpus-id score`, which BEIR skips.
          continue
        raise DataError(f"{path}:{n}: the score {row[2]!r} is not an integer.") from e
      # A repeated pair overwrites the earlier one, as BEIR's loader does.
      qrels.setdefault(row[0], {})[row[1]] = score
  return qrels


def _unknown(kind: str, ids: Sequence[str], known: Mapping, path: str, source: str) -> None:
  missing = [i for i in ids if i not in known]
  if missing:
    raise DataError(f"{path} names {len(missing)} {kind} id(s) not in {source} (the first: "
                    f"\"{missing[0]}\"); use the qrels of the same dataset.")


def read_beir(directory: str, split: str = "test") -> BeirSplit:
  """The corpus, the judged queries and the qrels of `split` of a BEIR dataset.

  Reads `directory`/corpus.jsonl, queries.jsonl and qrels/`split`.tsv. As BEIR's
  `GenericDataLoader`, only the queries the qrels name are kept, a document's missing
  title is "", and numeric ids become strings.
  """
  for name in ("corpus.jsonl", "queries.jsonl", "qrels"):
    if not os.path.exists(os.path.join(directory, name)):
      raise DataError(f"{os.path.join(directory, name)} does not exist; {LAYOUT}.")
  qrels_path = os.path.join(directory, "qrels", f"{split}.tsv")
  if not os.path.isfile(qrels_path):
    present = sorted(f[:-4] for f in os.listdir(os.path.join(directory, "qrels"))
                     if f.endswith(".tsv"))
    raise DataError(f"{qrels_path} does not exist; the splits present are: "
                    f"{', '.join(present) or 'none'}.")
  corpus_path = os.path.join(directory, "corpus.jsonl")
  corpus = {key: {"title": str(r.get("title") or ""), "text": str(r["text"])}
            for key, r in _records(corpus_path, ["text"])}
  if not corpus:
    raise DataError(f"{corpus_path} holds no document.")
  queries_path = os.path.join(directory, "queries.jsonl")
  queries = {key: str(r["text"]) for key, r in _records(queries_path, ["text"])}
  qrels = _read_qrels(qrels_path)
  if not qrels:
    raise DataError(f"{qrels_path} judges no query.")
  _unknown("query", list(qrels), queries, qrels_path, "queries.jsonl")
  _unknown("document", [d for docs in qrels.values() for d in docs], corpus, qrels_path,
           "corpus.jsonl")
  return BeirSplit(corpus=corpus, queries={q: t for q, t in queries.items() if q in qrels},
                   qrels=qrels)


def document_text(doc: Mapping[str, str]) -> str:
  """The text a document is embedded as: `title + " " + text`, stripped (so an empty
  title adds nothing), as BEIR's `SentenceBERT.encode_corpus` (sep " ") and the corpus
  preparation in sentence-transformers' `InformationRetrievalEvaluator` example
  (`(x["title"] + " " + x["text"]).strip()`) both do."""
  return ((doc.get("title") or "") + " " + doc["text"]).strip()


# ---- Exact search -----------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("k",))
def _merge_block(queries, block, valid, offset, best_scores, best_indices, k: int):
  """The running top-k of `queries` [q, E] merged with the documents `block` [b, E]
  (rows >= `valid` are padding), whose first row is document `offset`, by their dot
  products (`merge_top_k`)."""
  scores = jnp.dot(queries, block.T, precision=jax.lax.Precision.HIGHEST)
  return merge_top_k(scores, valid, offset, best_scores, best_indices, k=k)


@functools.partial(jax.jit, static_argnames=("k",))
def merge_top_k(scores, valid, offset, best_scores, best_indices, k: int):
  """The running top-k (best_scores, best_indices [q, k]) merged with a block's
  `scores` [q, b] of documents `offset`, `offset` + 1, ... (columns >= `valid` are
  padding).

  jax.lax.top_k puts the lower index first among equal values. The running entries
  come before the block's in the concatenation and have lower document indices, so
  positions order ties as document indices do: ties go to the earlier document.
  """
  scores = jnp.where(jnp.arange(scores.shape[1])[None, :] < valid, scores, -jnp.inf)
  block_scores, block_indices = jax.lax.top_k(scores, min(k, scores.shape[1]))
  both_scores = jnp.concatenate([best_scores, block_scores], axis=1)
  both_indices = jnp.concatenate([best_indices, block_indices + offset], axis=1)
  top_scores, positions = jax.lax.top_k(both_scores, k)
  return top_scores, jnp.take_along_axis(both_indices, positions, axis=1)


def _matrix(x, what: str) -> np.ndarray:
  x = np.asarray(x, dtype=np.float32)
  if x.ndim != 2:
    raise DataError(f"{what} must be a [N, E] matrix, not of shape {x.shape}.")
  if not np.isfinite(x).all():
    raise DataError(f"{what} hold NaN or infinite values; check the encoder's output.")
  return x


class RunningTopK:
  """Exact top-k by dot product over a corpus that arrives in pieces (`add`), memory
  bounded by `block` documents x `query_block` queries of scores, whatever the corpus.

  queries: [Q, E]. `add(docs [B, E])` appends the next B documents (indices continue
  from the previous ones); `result()` gives (scores [Q, k] float32, indices [Q, k]
  int64), best first, ties by ascending document index.
  """

  def __init__(self, queries, k: int, block: int = BLOCK, query_block: int = QUERY_BLOCK):
    for name, value in (("k", k), ("block", block), ("query_block", query_block)):
      if not (isinstance(value, (int, np.integer)) and value >= 1):
        raise ConfigError(f"top_k: {name}={value!r} must be a positive integer.")
    self.queries = _matrix(queries, "the query embeddings")
    num = len(self.queries)
    if not num:
      raise DataError("no query to search for: the query embeddings have no row.")
    self.k, self.block, self.size = int(k), int(block), 0
    self.query_block = min(int(query_block), num)
    padded = -(-num // self.query_block) * self.query_block
    # The last query block is padded with zero rows (sliced off in `result`): one
    # compiled shape for every block.
    pad = np.zeros((padded - num, self.queries.shape[1]), np.float32)
    self._query_blocks = [jnp.asarray(b) for b in np.split(
        np.concatenate([self.queries, pad]), padded // self.query_block)]
    self._best = [(jnp.full((self.query_block, self.k), -jnp.inf, jnp.float32),
                   jnp.full((self.query_block, self.k), -1, jnp.int32))
                  for _ in self._query_blocks]

  def add(self, docs) -> None:
    """Scores the next documents, docs [B, E], against every query."""
    docs = _matrix(docs, "the document embeddings")
    if docs.shape[1] != self.queries.shape[1]:
      raise DataError(f"the document embeddings have {docs.shape[1]} dimensions, the "
                      f"query embeddings {self.queries.shape[1]}; use one encoder.")
    for start in range(0, len(docs), self.block):
      piece = docs[start:start + self.block]
      valid = len(piece)
      # A short piece (the corpus's last) is padded, masked out by `valid`, to a power
      # of two: few compiled shapes, and at most twice the work on a small corpus.
      size = min(self.block, 1 << (valid - 1).bit_length())
      piece = np.concatenate([piece, np.zeros((size - valid, piece.shape[1]), np.float32)])
      piece = jnp.asarray(piece)  # Sent to the device once for all the query blocks.
      self._best = [_merge_block(q, piece, valid, self.size, *best, k=self.k)
                    for q, best in zip(self._query_blocks, self._best)]
      self.size += valid

  def result(self) -> tuple[np.ndarray, np.ndarray]:
    """(scores [Q, k], indices [Q, k]) of the best k documents added, best first."""
    if self.size < self.k:
      raise ConfigError(f"top_k: k={self.k} is more than the {self.size} documents "
                        f"searched; ask for at most {self.size}.")
    num = len(self.queries)
    scores = np.concatenate([np.asarray(s) for s, _ in self._best])[:num]
    indices = np.concatenate([np.asarray(i) for _, i in self._best])[:num]
    return scores, indices.astype(np.int64)


def top_k(query_embeddings, doc_embeddings, k: int, block: int = BLOCK,
          query_block: int = QUERY_BLOCK) -> tuple[np.ndarray, np.ndarray]:
  """Exact search: the k documents of highest dot product with each query.

  query_embeddings [Q, E] and doc_embeddings [D, E] (normalised upstream for cosine)
  -> (scores [Q, k] float32, indices [Q, k] int64), best first, ties by ascending
  document index. Scores are float32 matmuls at full precision (no TF32 / bf16 passes
  on accelerators), `block` documents x `query_block` queries at a time, with a
  running top-k merged across the blocks.
  """
  search = RunningTopK(query_embeddings, k, block, query_block)
  search.add(doc_embeddings)
  return search.result()


# ---- Measures ---------------------------------------------------------------------


def _ranked(scores: Mapping[str, float]) -> list[str]:
  """Doc ids best first, ties by ascending id (sentence-transformers' order)."""
  return sorted(scores, key=lambda d: (-scores[d], d))


def evaluate(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]],
             k_values: Sequence[int] = K_VALUES, mrr_at: int = MRR_AT) -> dict[str, float]:
  """trec_eval's measures of a run, each the mean over the judged queries, in [0, 1].

  run: query id -> doc id -> score (higher is better; ties ranked by ascending doc id).
  qrels: query id -> doc id -> graded relevance; a query with no grade > 0 is not
  judged and is left out (as sentence-transformers leaves out queries without relevant
  documents). A judged query absent from `run` counts 0 in every mean (pytrec_eval
  alone would skip it, as BEIR's average does).

  Returns `ndcg@k` (graded gains, trec_eval's `ndcg_cut`), `recall@k`, `map@k`
  (trec_eval's `map_cut`: the precision at each relevant document retrieved in the top
  k, summed, over the number of relevant documents) for each k of `k_values`, and
  `mrr@{mrr_at}`: trec_eval's `recip_rank` of each query's run truncated to its first
  `mrr_at` documents (1 / the rank of the first relevant one, 0 if none).
  """
  ks = sorted(set(k_values))
  for k in [*ks, mrr_at]:
    if not (isinstance(k, (int, np.integer)) and k >= 1):
      raise ConfigError(f"retrieval cut-offs must be positive integers, not {k!r}.")
  judged = {q: {d: int(g) for d, g in docs.items()} for q, docs in qrels.items()
            if any(g > 0 for g in docs.values())}
  if not judged:
    raise DataError("the qrels hold no relevant document (no grade > 0): nothing to "
                    "evaluate.")
  # pytrec_eval ranks by score and breaks ties by descending doc id; scores that encode
  # our rank make it follow our order exactly.
  ranked = {q: _ranked(run[q]) for q in judged if run.get(q)}
  full = {q: {d: float(len(ids) - r) for r, d in enumerate(ids)} for q, ids in ranked.items()}
  head = {q: {d: float(mrr_at - r) for r, d in enumerate(ids[:mrr_at])}
          for q, ids in ranked.items()}
  cuts = ",".join(map(str, ks))
  measures = {f"ndcg_cut.{cuts}", f"recall.{cuts}", f"map_cut.{cuts}"}
  per_query = pytrec_eval.RelevanceEvaluator(judged, measures).evaluate(full)
  reciprocal = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(head)
  out = {}
  for name, measure in (("ndcg", "ndcg_cut"), ("recall", "recall"), ("map", "map_cut")):
    for k in ks:
      out[f"{name}@{k}"] = _mean([r[f"{measure}_{k}"] for r in per_query.values()], judged)
  out[f"mrr@{mrr_at}"] = _mean([r["recip_rank"] for r in reciprocal.values()], judged)
  return out


def _mean(values: list[float], judged: Mapping) -> float:
  return math.fsum(values) / len(judged)  # Judged queries not in the run add 0.


class RetrievalEvaluator:
  """BEIR-style evaluation of an embedding model on one split.

    evaluator = RetrievalEvaluator(read_beir(directory), encode_queries, encode_documents)
    metrics = evaluator.evaluate()      # {"ndcg@10": ..., "mrr@10": ..., ...}

  `encode_queries(texts)` and `encode_documents(texts)` return [N, E] embeddings,
  scored by `similarity` (the model's, `contrastive.SIMILARITIES`: 'cosine' normalises
  both sides first, 'dot' takes them as they are). `evaluate` (and `search`) embed
  the corpus once, `corpus_chunk_size` documents (`document_text`) at a time, search it
  exactly for the best max(k_values, mrr_at) documents of every judged query (nothing
  excluded: a document whose id is the query's counts like any other, as in
  sentence-transformers), and score the run with `evaluate`'s measures. Documents are
  searched in ascending id order, so ties at the cut and in the ranking both go to the
  lower id.
  """

  def __init__(self, split: BeirSplit, encode_queries: Encode, encode_documents: Encode,
               k_values: Sequence[int] = K_VALUES, mrr_at: int = MRR_AT,
               corpus_chunk_size: int = 4 * BLOCK, block: int = BLOCK,
               query_block: int = QUERY_BLOCK, similarity: str = "cosine"):
    if not (isinstance(corpus_chunk_size, int) and corpus_chunk_size >= 1):
      raise ConfigError(f"corpus_chunk_size={corpus_chunk_size!r} must be a positive "
                        "integer.")
    _check_similarity(similarity)
    self.similarity = similarity
    self.split, self.k_values, self.mrr_at = split, tuple(k_values), mrr_at
    self.encode_queries, self.encode_documents = encode_queries, encode_documents
    self.corpus_chunk_size, self.block, self.query_block = (
        corpus_chunk_size, block, query_block)
    self.doc_ids = sorted(split.corpus)
    self.query_ids = list(split.queries)
    self.depth = min(max([*self.k_values, mrr_at]), len(self.doc_ids))

  def search(self) -> dict[str, dict[str, float]]:
    """The run: query id -> {doc id: score} of its best `depth` documents."""
    texts = [self.split.queries[q] for q in self.query_ids]
    search = RunningTopK(self._scored(self.encode_queries, texts, "encode_queries"),
                         self.depth, self.block, self.query_block)
    for start in range(0, len(self.doc_ids), self.corpus_chunk_size):
      ids = self.doc_ids[start:start + self.corpus_chunk_size]
      texts = [document_text(self.split.corpus[d]) for d in ids]
      search.add(self._scored(self.encode_documents, texts, "encode_documents"))
    scores, indices = search.result()
    return {q: {self.doc_ids[i]: float(s) for s, i in zip(row_s, row_i)}
            for q, row_s, row_i in zip(self.query_ids, scores, indices)}

  def evaluate(self, run_path: str | None = None) -> dict[str, float]:
    """The measures of `evaluate` (the module's function) on this model's run; with
    `run_path`, the run is also written there in TREC's format (`write_run`)."""
    run = self.search()
    if run_path:
      write_run(run, run_path)
    return evaluate(run, self.split.qrels, self.k_values, self.mrr_at)


  def _scored(self, encode: Encode, texts: list[str], name: str) -> np.ndarray:
    """[N, E] vectors whose dot products are the similarities."""
    vectors = _encoded(encode, texts, name)
    return _unit(vectors) if self.similarity == "cosine" else vectors


def _check_similarity(similarity: str) -> None:
  if similarity not in contrastive.SIMILARITIES:
    raise ConfigError(f"similarity={similarity!r}: use one of {contrastive.SIMILARITIES}.")


def _encoded(encode: Encode, texts: list[str], name: str) -> np.ndarray:
  vectors = np.asarray(encode(texts))
  if vectors.ndim != 2 or len(vectors) != len(texts):
    raise DataError(f"{name} returned an array of shape {vectors.shape} for {len(texts)} "
                    "texts; it must return [N, E].")
  return vectors


def write_run(run: Mapping[str, Mapping[str, float]], path: str, tag: str = "bertjax") -> None:
  """A run in TREC's format (`trec_eval` and pytrec_eval's `parse_run` read it): a line
  `query-id Q0 doc-id rank score tag` per retrieved document, best first."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for q, docs in run.items():
      for rank, d in enumerate(_ranked(docs), 1):
        f.write(f"{q} Q0 {d} {rank} {docs[d]!r} {tag}\n")


# ---- STS --------------------------------------------------------------------------


def read_sts(path: str, sentence1: str = "sentence1", sentence2: str = "sentence2",
             score: str = "score") -> tuple[list[str], list[str], np.ndarray]:
  """(sentences1, sentences2, scores [N] float64) of an STS file: JSON lines (.jsonl,
  .json), CSV (.csv, with a header) or TSV (any other name, with a header; quotes
  literal, as GLUE's STS-B writes them); the columns named by the arguments."""
  if not os.path.isfile(path):
    raise DataError(f"STS file {path} does not exist.")
  columns = (sentence1, sentence2, score)
  if path.endswith((".jsonl", ".json")):
    rows = [(f"{path}:{n}", r) for n, r in json_lines(path)]
  elif path.endswith(".csv"):
    with open(path, encoding="utf-8", newline="") as f:
      rows = [(f"{path}:{n}", r) for n, r in enumerate(csv.DictReader(f), 2)]
  else:
    rows = [(f"{path}:{n}", r) for n, r in enumerate(readers.read_tsv(path), 2)]
  for where, row in rows:
    for column in columns:
      if not isinstance(row, dict) or row.get(column) in (None, ""):
        raise DataError(f"{where} has no \"{column}\"; name the STS columns (now "
                        f"{', '.join(columns)}).")
  if len(rows) < 2:
    raise DataError(f"{path} holds {len(rows)} pair(s); a correlation needs at least 2.")
  values = []
  for where, row in rows:
    try:
      values.append(float(row[score]))
    except (TypeError, ValueError) as e:
      raise DataError(f"{where}: the score {row[score]!r} is not a number.") from e
  return ([str(r[sentence1]) for _, r in rows], [str(r[sentence2]) for _, r in rows],
          np.asarray(values, np.float64))


def sts_spearman(emb1, emb2, scores, similarity: str = "cosine") -> float:
  """Spearman correlation of the similarities (`similarity`: 'cosine' or 'dot') of
  emb1 [N, E] and emb2 [N, E] (row i with row i) with the gold scores [N], in [-1, 1]
  (not x 100): what sentence-transformers' `EmbeddingSimilarityEvaluator` reports as
  `spearman_cosine` (`spearman_dot`)."""
  _check_similarity(similarity)
  a, b = np.asarray(emb1, np.float64), np.asarray(emb2, np.float64)
  gold = np.asarray(scores, np.float64)
  if a.shape != b.shape or a.ndim != 2 or gold.shape != (len(a),):
    raise DataError(f"STS embeddings {a.shape} and {b.shape} and scores {gold.shape} must "
                    "be [N, E], [N, E] and [N].")
  if len(gold) < 2 or np.all(gold == gold[0]):
    raise DataError("the STS scores need at least two different values for a correlation.")
  if similarity == "cosine":
    a, b = _unit(a), _unit(b)
  return task_metrics.spearman(np.einsum("ne,ne->n", a, b), gold)


def _unit(x: np.ndarray) -> np.ndarray:
  """Rows of x [N, E] over their L2 norms clamped at 1e-12 (torch's `F.normalize`,
  which sentence-transformers' `pairwise_cos_sim` applies to each side)."""
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
