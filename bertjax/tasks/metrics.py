"""Evaluation metrics of the fine-tuning tasks.

Classification uses scikit-learn and scipy (accuracy, F1, Matthews correlation,
Pearson / Spearman); entity F1 follows seqeval's chunking (BIO / IOB1 / BIOES, micro
average over typed spans); SQuAD EM/F1 follow the official v1.1 / v2.0 evaluation
scripts (answer normalisation, max over gold answers, '' for no answer).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Sequence

import numpy as np
from scipy import stats
from sklearn import metrics as skm


def accuracy(predictions: Sequence, labels: Sequence) -> float:
  return float(skm.accuracy_score(labels, predictions))


def f1_binary(predictions: Sequence[int], labels: Sequence[int]) -> float:
  """F1 of the positive class 1 (MRPC, QQP)."""
  return float(skm.f1_score(labels, predictions, pos_label=1, zero_division=0.0))


def matthews(predictions: Sequence[int], labels: Sequence[int]) -> float:
  """Matthews correlation coefficient (CoLA)."""
  return float(skm.matthews_corrcoef(labels, predictions))


def pearson(predictions: Sequence[float], labels: Sequence[float]) -> float:
  return float(stats.pearsonr(predictions, labels).statistic)


def spearman(predictions: Sequence[float], labels: Sequence[float]) -> float:
  return float(stats.spearmanr(predictions, labels).statistic)


CLASSIFICATION_METRICS = {"accuracy": accuracy, "f1": f1_binary, "matthews": matthews,
                          "pearson": pearson, "spearman": spearman}


# ---- Entity spans (seqeval's chunking rules) --------------------------------------

def _split(tag: str) -> tuple[str, str]:
  if tag in ("O", ""):
    return "O", ""
  prefix, _, kind = tag.partition("-")
  return (prefix, kind) if kind else ("I", prefix)


def _ends(prev: str, tag: str, prev_kind: str, kind: str) -> bool:
  return (prev in ("E", "S") or (prev in ("B", "I") and tag in ("B", "S", "O"))
          or (prev != "O" and prev_kind != kind))


def _starts(prev: str, tag: str, prev_kind: str, kind: str) -> bool:
  return (tag in ("B", "S") or (prev in ("E", "S", "O") and tag in ("I", "E"))
          or (tag != "O" and prev_kind != kind))


def tag_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """Typed spans (kind, first, last) of a tag sequence (BIO, IOB1 or BIOES; an `I-X`
  that follows O or another type opens a span, as seqeval does)."""
  spans, prev, prev_kind, begin = [], "O", "", 0
  for i, tag in enumerate(list(tags) + ["O"]):
    prefix, kind = _split(tag)
    if _ends(prev, prefix, prev_kind, kind):
      spans.append((prev_kind, begin, i - 1))
    if _starts(prev, prefix, prev_kind, kind):
      begin = i
    prev, prev_kind = prefix, kind
  return spans


def span_prf(predicted: Iterable[set], gold: Iterable[set]) -> dict[str, float]:
  """Micro precision / recall / F1 of per-sentence sets of typed spans."""
  tp = n_pred = n_gold = 0
  for p, g in zip(predicted, gold):
    tp += len(set(p) & set(g))
    n_pred += len(p)
    n_gold += len(g)
  precision = tp / n_pred if n_pred else 0.0
  recall = tp / n_gold if n_gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
  return {"precision": precision, "recall": recall, "f1": f1}


def entity_prf(predicted_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]]
               ) -> dict[str, float]:
  """seqeval-style entity precision / recall / F1 over tagged sentences."""
  return span_prf((set(tag_spans(t)) for t in predicted_tags),
                  (set(tag_spans(t)) for t in gold_tags))


# ---- SQuAD (the official evaluation scripts' semantics) -------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
  """Lower case, drop punctuation, articles and extra whitespace."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
  return " ".join(_ARTICLES.sub(" ", text).split())


def _exact(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1(prediction: str, gold: str) -> float:
  pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
  if not pred or not ref:  # v2: a no-answer matches only a no-answer.
    return float(pred == ref)
  common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
  if common == 0:
    return 0.0
  precision, recall = common / len(pred), common / len(ref)
  return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: dict[str, str], golds: dict[str, Sequence[str]]
                 ) -> dict[str, float]:
  """Exact match and F1 in percent, each the max over a question's gold answers; a
  question without gold answers (SQuAD 2.0) has the single gold answer ''. Also
  reported for v2: `HasAns_*` and `NoAns_*` splits. Missing predictions score 0."""
  per = {"exact": {}, "f1": {}}
  for qid, answers in golds.items():
    answers = [a for a in answers if normalize_answer(a)] or [""]
    pred = predictions.get(qid)
    per["exact"][qid] = 0.0 if pred is None else max(_exact(pred, a) for a in answers)
    per["f1"][qid] = 0.0 if pred is None else max(_f1(pred, a) for a in answers)
  result = {k: 100.0 * float(np.mean(list(v.values()))) if v else 0.0 for k, v in per.items()}
  has = {q for q, a in golds.items() if any(normalize_answer(x) for x in a)}
  if len(has) < len(golds):
    for name, subset in (("HasAns", has), ("NoAns", set(golds) - has)):
      for k in ("exact", "f1"):
        vals = [per[k][q] for q in subset]
        result[f"{name}_{k}"] = 100.0 * float(np.mean(vals)) if vals else 0.0
  return result
