"""Score (query, document) pairs, or rerank a first stage, with a reranker.

    python -m bertjax.rerank --model=DIR --pairs=pairs.jsonl --out=scores.jsonl
    python -m bertjax.rerank --model=DIR --beir=BEIR_DIR --run=run.trec \
        --out=reranked.trec [--top_k=100]     # --run=bm25: bm25s' top_k

--model: a rerank workdir or a cross-encoder folder (`bertjax.tasks.reranker`).
--pairs: JSON lines with a query and a document a line (--query_column,
--document_column); --out gets each line with its "score" (CrossEncoder.predict's:
Sigmoid for one label). --beir with --run: each judged query's best --top_k
candidates of the run (a TREC run file, or bm25) reranked; --out gets the reranked
run, and MAP, MRR@10 and nDCG@10 of the first stage and of the reranked lists are
printed (CrossEncoderRerankingEvaluator's, always_rerank_positives false).
"""

from __future__ import annotations

import functools

from absl import flags

from bertjax.console import cli
from bertjax.errors import ConfigError
from bertjax.tasks import rerank_eval


def main(argv):
  del argv
  f = flags.FLAGS
  from bertjax.tasks.reranker import load_reranker  # pylint: disable=g-import-not-at-top

  model = functools.cache(lambda: load_reranker(f.model, f.max_seq_length))
  score = lambda pairs: model().predict(pairs, f.batch_size)
  if bool(f.pairs) == bool(f.beir):
    raise ConfigError("give --pairs (pairs to score) or --beir with --run (a first stage "
                      "to rerank).")
  if f.pairs:
    n = rerank_eval.score_file(f.pairs, f.out, score, f.overwrite, f.model, f.query_column,
                               f.document_column)
    print(f"{n} pairs scored -> {f.out}")
    return
  if not f.run:
    raise ConfigError("--beir needs --run: a TREC run file of the first stage, or bm25.")
  figures = rerank_eval.rerank_run(f.beir, f.run, f.out, score, f.top_k, f.split,
                                   f.overwrite, f.model)
  print(summary(figures, f.out))


def summary(figures: dict[str, float], out: str) -> str:
  """The first stage's figures and the reranked ones, a line each."""
  names = [k for k in figures if not k.startswith("base_")]
  lines = [f"reranked run -> {out}", "            first stage  reranked"]
  lines += [f"{k:<12}{figures.get('base_' + k, float('nan')):>11.4f}{figures[k]:>10.4f}"
            for k in names]
  return "\n".join(lines)


def define_flags() -> None:
  flags.DEFINE_string("model", None, "A rerank workdir or a cross-encoder folder.",
                      required=True)
  flags.DEFINE_string("pairs", None, "JSON lines of (query, document) pairs to score.")
  flags.DEFINE_string("beir", None, "A BEIR directory whose first stage to rerank.")
  flags.DEFINE_string("run", None, "The first stage: a TREC run file, or bm25.")
  flags.DEFINE_string("out", None, "Output: JSON lines of scores, or a TREC run.",
                      required=True)
  flags.DEFINE_integer("top_k", 100, "Candidates a query reranked.")
  flags.DEFINE_string("split", "test", "--beir's qrels split.")
  flags.DEFINE_string("query_column", "", "--pairs' query column ('' finds it).")
  flags.DEFINE_string("document_column", "", "--pairs' document column ('' finds it).")
  flags.DEFINE_integer("max_seq_length", 0, "Cut pairs here (0: the model's length).")
  flags.DEFINE_integer("batch_size", 32, "Pairs scored at once.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing --out file.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
