"""Hard-negative mining: (anchor, positive) pairs -> (anchor, positive, negative) triplets.

The rule is sentence-transformers' `util.mine_hard_negatives` (v6.2) with its "top"
sampling: the anchors (each once) and the candidate corpus (the given documents, then
the positives, each text once) are embedded and L2-normalised (cosine scores, whatever
the model's own normalisation, as sentence-transformers normalises there too); each
anchor's best `range_max + max_positives` documents are retrieved exactly (`top_k`);
its own positives are dropped, then any candidate too close to its positive score:

  absolute_margin  dropped when  score + absolute_margin > positive_score
  relative_margin  dropped when  score > positive_score - |positive_score| x relative_margin
  max_score        dropped when  score > max_score;  min_score: when score < min_score

where positive_score is the anchor's lowest positive score (its hardest positive).
NV-Retriever's best rule, TopK-PercPos at 95% (keep negatives scoring below 95% of
the positive; Moreira et al. 2024), is relative_margin=0.05. Of what remains, best
first, the first `range_max` are the candidates, the first `range_min` of those are
skipped and the next `num_negatives` are the negatives. Margins default to off, as in
sentence-transformers; `range_max` defaults to 10 and `num_negatives` to 1 here.

Output rows use the pairs' own column names: `{anchor, positive, negative}` for one
negative (an anchor's every positive gets a row; a pair without a negative gets none),
`{anchor, positive, negative_1, ..., negative_n}` for several (only the pairs that
found all n), sentence-transformers' "triplet" and "n-tuple" formats. For rerankers
(`output_format`, its other two): "labeled-pair", a row (anchor, document, label) an
anchor's positive (label 1), then one each of its negatives found (label 0), anchor
by anchor; "labeled-list", a row a pair: (anchor, [its positive, the negatives found],
labels [1, 0, ...]), the document list in the positive's column and the labels in
`labels` (a pair that found no negative gets none; one that found fewer than n, a
shorter list).
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Sequence

import numpy as np

from bertjax import writes
from bertjax.errors import ConfigError, DataError
from bertjax.tasks import retrieval_eval

# encode(texts, kind) -> [N, E], kind 'query' or 'document' (`load_encoder(...).encode`).
EncodeKind = Callable[[list[str], str], np.ndarray]
RANGE_MAX = 10
NUM_NEGATIVES = 1
OUTPUT_FORMATS = ("", "labeled-pair", "labeled-list")  # '': triplet / n-tuple


def read_pairs(path: str, anchor_column: str = "anchor",
               positive_column: str = "positive") -> tuple[list[str], list[str]]:
  """(anchors, positives) of a JSON-lines file of pairs, a pair a line."""
  if not os.path.isfile(path):
    raise DataError(f"pairs file {path} does not exist; give JSON lines with the columns "
                    f"\"{anchor_column}\" and \"{positive_column}\".")
  anchors, positives = [], []
  for n, row in retrieval_eval.json_lines(path):
    for column, texts in ((anchor_column, anchors), (positive_column, positives)):
      if not isinstance(row, dict) or column not in row:
        present = ", ".join(map(str, row)) if isinstance(row, dict) else "none"
        raise DataError(f"{path}:{n} has no column \"{column}\" (it has: {present}); name "
                        "the columns with --anchor_column and --positive_column.")
      texts.append(_text(row[column], f"{path}:{n}: the \"{column}\" text"))
  if not anchors:
    raise DataError(f"{path} holds no pair.")
  return anchors, positives


def read_corpus(path: str) -> list[str]:
  """Candidate documents: a BEIR corpus.jsonl (or any JSON lines with "text", an
  optional "title" joined as `document_text`), or a text file of one document a line."""
  if not os.path.isfile(path):
    raise DataError(f"corpus file {path} does not exist; give a BEIR corpus.jsonl, JSON "
                    "lines with \"text\" or a text file of one document a line.")
  if path.endswith((".jsonl", ".json")):
    docs = []
    for n, row in retrieval_eval.json_lines(path):
      if not isinstance(row, dict) or not isinstance(row.get("text"), str):
        raise DataError(f"{path}:{n} has no \"text\"; a corpus line is an object with "
                        "\"text\" (and an optional \"title\").")
      docs.append(_text(retrieval_eval.document_text(row), f"{path}:{n}: the document"))
  else:
    with open(path, encoding="utf-8") as f:
      docs = [line.strip() for line in f if line.strip()]
  if not docs:
    raise DataError(f"{path} holds no document.")
  return docs


def _text(value, where: str) -> str:
  if not isinstance(value, str):
    raise DataError(f"{where} is {type(value).__name__}, not a string.")
  if not value.strip():
    raise DataError(f"{where} is empty; remove the line or fill it in.")
  return value


def _check(range_min: int, range_max: int, num_negatives: int, margins: dict) -> None:
  for name, value, lo in (("range_min", range_min, 0), ("range_max", range_max, 1),
                          ("num_negatives", num_negatives, 1)):
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= lo):
      raise ConfigError(f"{name}={value!r} must be an integer >= {lo}.")
  if num_negatives > range_max - range_min:
    raise ConfigError(f"num_negatives={num_negatives} is more than the {range_max - range_min} "
                      f"candidates between range_min={range_min} and range_max={range_max}; "
                      "lower num_negatives or range_min, or raise range_max.")
  for name, value in margins.items():
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
      raise ConfigError(f"{name}={value!r} must be a finite number (or unset).")


def _embedded(encode: EncodeKind, texts: list[str], kind: str) -> np.ndarray:
  vectors = np.asarray(encode(texts, kind), np.float32)
  if vectors.ndim != 2 or len(vectors) != len(texts):
    raise DataError(f"the encoder returned an array of shape {vectors.shape} for "
                    f"{len(texts)} {kind} texts; it must return [N, E].")
  # torch's F.normalize, as sentence-transformers' normalize_embeddings=True.
  return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def mine_hard_negatives(
    anchors: Sequence[str], positives: Sequence[str], encode: EncodeKind,
    corpus: Sequence[str] | None = None, *, range_min: int = 0,
    range_max: int = RANGE_MAX, num_negatives: int = NUM_NEGATIVES,
    absolute_margin: float | None = None, relative_margin: float | None = None,
    max_score: float | None = None, min_score: float | None = None,
    anchor_column: str = "anchor", positive_column: str = "positive",
    output_format: str = "", block: int = retrieval_eval.BLOCK, query_block: int = retrieval_eval.QUERY_BLOCK,
) -> tuple[list[dict[str, str]], dict[str, int]]:
  """Rows of (anchor, positive, negative(s)) mined for the pairs (module docstring).

  anchors, positives: [P] texts, pair i = (anchors[i], positives[i]); an anchor that
  appears in several pairs is one query whose positives are all of them.
  corpus: extra candidate documents (the positives are always candidates).
  encode(texts, kind) -> [N, E], kind 'query' for anchors, 'document' for the corpus.

  Returns (rows, counts): rows as dicts keyed by `anchor_column`, `positive_column` and
  `negative` (num_negatives 1) or `negative_1`... (`output_format` '', else the
  module docstring's labeled rows); counts: `pairs`, `anchors`,
  `corpus`, `rows`, `short` (pairs short of negatives, left out) and, per filter,
  `skipped_<name>` (candidates it dropped).
  """
  if len(anchors) != len(positives):
    raise DataError(f"{len(anchors)} anchors but {len(positives)} positives; give pairs.")
  if not anchors:
    raise DataError("no pair to mine negatives for.")
  margins = {"absolute_margin": absolute_margin, "relative_margin": relative_margin,
             "max_score": max_score, "min_score": min_score}
  if output_format not in OUTPUT_FORMATS:
    raise ConfigError(f"output_format={output_format!r}: use one of "
                      f"{[f for f in OUTPUT_FORMATS if f]} (or leave it out: triplets, or "
                      "n-tuples with several negatives).")
  _check(range_min, range_max, num_negatives, margins)
  for name, texts in (("anchor", anchors), ("positive", positives),
                      ("corpus", corpus or [])):
    for i, text in enumerate(texts):
      _text(text, f"{name} {i}")

  queries = list(dict.fromkeys(anchors))
  documents = list(dict.fromkeys([*(corpus or []), *positives]))
  if len(documents) < num_negatives + 1:
    raise DataError(f"the corpus holds {len(documents)} distinct documents, too few for a "
                    f"positive and {num_negatives} negative(s); add candidates (--corpus).")
  query_row = {q: i for i, q in enumerate(queries)}
  doc_row = {d: i for i, d in enumerate(documents)}
  own: list[list[int]] = [[] for _ in queries]  # Each query's positives, first seen first.
  for anchor, positive in zip(anchors, positives):
    if doc_row[positive] not in own[query_row[anchor]]:
      own[query_row[anchor]].append(doc_row[positive])
  max_positives = max(len(p) for p in own)

  doc_vectors = _embedded(encode, documents, "document")
  query_vectors = _embedded(encode, queries, "query")
  depth = range_max + max_positives
  scores, indices = retrieval_eval.top_k(query_vectors, doc_vectors,
                                         min(depth, len(documents)), block, query_block)
  if scores.shape[1] < depth:  # A small corpus: pad with nothing to choose.
    missing = depth - scores.shape[1]
    scores = np.pad(scores, ((0, 0), (0, missing)), constant_values=-np.inf)
    indices = np.pad(indices, ((0, 0), (0, missing)), constant_values=-1)
  positive_scores = [np.einsum("e,pe->p", query_vectors[q], doc_vectors[p])
                     for q, p in enumerate(own)]
  hardest = np.array([s.min() for s in positive_scores], np.float32)[:, None]

  is_positive = np.array([np.isin(row, p) for row, p in zip(indices, own)])
  scores[is_positive | (indices < 0)] = -np.inf
  counts = {"pairs": len(anchors), "anchors": len(queries), "corpus": len(documents)}
  drops = {
      "absolute_margin": lambda s: s + absolute_margin > hardest,
      "relative_margin": lambda s: s > hardest - np.abs(hardest) * relative_margin,
      "max_score": lambda s: s > max_score,
      "min_score": lambda s: s < min_score,
  }
  for name, dropped in drops.items():
    if margins[name] is not None:
      # -inf (gone already) is never above a threshold; only min_score must skip it.
      removed = dropped(scores) & np.isfinite(scores)
      counts[f"skipped_{name}"] = int(removed.sum())
      scores[removed] = -np.inf

  # Best first, ties in retrieval order (score, then document index).
  order = np.argsort(-scores, axis=1, kind="stable")[:, :range_max][:, range_min:]
  order = order[:, :num_negatives]
  chosen = np.take_along_axis(indices, order, axis=1)
  found = np.isfinite(np.take_along_axis(scores, order, axis=1))

  rows = []
  short = 0
  for q, query in enumerate(queries):
    negatives = [documents[d] for d, ok in zip(chosen[q], found[q]) if ok]
    if output_format == "labeled-pair":
      rows += [{anchor_column: query, positive_column: documents[p], "label": 1}
               for p in own[q]]
      rows += [{anchor_column: query, positive_column: d, "label": 0} for d in negatives]
      continue
    if output_format == "labeled-list":
      for p in own[q]:
        if negatives:
          rows.append({anchor_column: query, positive_column: [documents[p], *negatives],
                       "labels": [1] + [0] * len(negatives)})
        else:
          short += 1
      continue
    for p in own[q]:
      pair = {anchor_column: query, positive_column: documents[p]}
      if num_negatives == 1:
        if found[q, 0]:
          rows.append({**pair, "negative": documents[chosen[q, 0]]})
        else:
          short += 1
      elif found[q].all():
        rows.append({**pair, **{f"negative_{j}": documents[d]
                                for j, d in enumerate(chosen[q], 1)}})
      else:
        short += 1
  counts.update(rows=len(rows), short=short)
  if not rows:
    raise DataError(f"no pair found {num_negatives} negative(s) within the best {range_max} "
                    "candidates; raise --range_max, loosen the margins or add documents.")
  return rows, counts


def write_jsonl(rows: Sequence[dict], path: str) -> None:
  """One JSON object a line, UTF-8 unescaped."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")


def mine_file(pairs_path: str, out_path: str, encode: EncodeKind,
              corpus_path: str | None = None, anchor_column: str = "anchor",
              positive_column: str = "positive", overwrite: bool = False,
              model_path: str = "", **options) -> dict[str, int]:
  """`bertjax.mine`'s work: reads the pairs (and `corpus_path`, else the positives are
  the candidates), mines (`options`: `mine_hard_negatives`' keywords), writes the rows
  to `out_path` as JSON lines (`bertjax.writes.output_file`: not one of the inputs, nor
  inside the model `model_path`; an existing file replaced only with `overwrite`);
  returns the counts."""
  with writes.output_file(out_path, overwrite, {
      "--pairs": pairs_path, "--corpus": corpus_path or "", "--model": model_path}) as tmp:
    anchors, positives = read_pairs(pairs_path, anchor_column, positive_column)
    corpus = read_corpus(corpus_path) if corpus_path else None
    rows, counts = mine_hard_negatives(anchors, positives, encode, corpus,
                                       anchor_column=anchor_column,
                                       positive_column=positive_column, **options)
    write_jsonl(rows, tmp)
  return counts
