"""Mine hard negatives for (anchor, positive) pairs with a trained embedding model.

    python -m bertjax.mine --model=DIR --pairs=pairs.jsonl --out=triplets.jsonl \
        [--corpus=corpus.jsonl] [--relative_margin=0.05] [--num_negatives=1]

--pairs is JSON lines with an anchor and a positive text a line (columns
--anchor_column / --positive_column); the candidates are the distinct positives, plus
--corpus when given (a BEIR corpus.jsonl, JSON lines with "text", or a text file of a
document a line). Each anchor's best --range_max candidates (its positives dropped,
and with a margin any candidate scoring too close to its positive: a likely false
negative) give --num_negatives negatives: sentence-transformers' `mine_hard_negatives`
rule, NV-Retriever's TopK-PercPos 95% being --relative_margin=0.05
(`bertjax.tasks.mining`). --out gets a row a pair in sentence-transformers' columns:
anchor, positive, negative (or negative_1..negative_n); with --output_format=
labeled-pair or labeled-list, a reranker's training rows (`configs/finetune/rerank.py`).
"""

from __future__ import annotations

import functools

from absl import flags

from bertjax.console import cli
from bertjax.tasks import mining


def main(argv):
  del argv
  f = flags.FLAGS
  # Imported here: the model code loads only when a model is used.
  from bertjax.tasks.embedding import load_encoder  # pylint: disable=g-import-not-at-top

  # Loaded at the first text to encode: a bad pairs file or setting fails at once.
  model = functools.cache(lambda: load_encoder(f.model))
  counts = mining.mine_file(
      f.pairs, f.out, lambda texts, kind: model().encode(texts, kind), f.corpus,
      f.anchor_column, f.positive_column,
      range_min=f.range_min, range_max=f.range_max, num_negatives=f.num_negatives,
      absolute_margin=f.absolute_margin, relative_margin=f.relative_margin,
      max_score=f.max_score, min_score=f.min_score, output_format=f.output_format,
      overwrite=f.overwrite,
      model_path=f.model)
  print(summary(counts, f.out))


def summary(counts: dict[str, int], out: str) -> str:
  """What a run did, in a few lines."""
  lines = [f"{counts['rows']} rows -> {out} ({counts['pairs']} pairs, {counts['anchors']} "
           f"distinct anchors, {counts['corpus']} candidate documents)"]
  for key, value in counts.items():
    if key.startswith("skipped_"):
      lines.append(f"{value} candidates dropped by {key[len('skipped_'):]}")
  if counts["short"]:
    lines.append(f"{counts['short']} pairs found too few negatives and were left out "
                 "(raise --range_max or loosen the margins)")
  return "\n".join(lines)


def define_flags() -> None:
  """Defined only when run as a program: importing it next to the other programs
  defines no --model twice."""
  flags.DEFINE_string("model", None, "Embedding model: a retrieval workdir, a "
                      "sentence-transformers folder or a checkpoint "
                      "(bertjax.tasks.embedding.load_encoder).", required=True)
  flags.DEFINE_string("pairs", None, "JSON lines of (anchor, positive) pairs.",
                      required=True)
  flags.DEFINE_string("out", None, "Output JSON lines of mined rows.", required=True)
  flags.DEFINE_string("corpus", None, "Extra candidates: BEIR corpus.jsonl, JSON lines "
                      "with \"text\", or a text file (default: the positives only).")
  flags.DEFINE_string("anchor_column", "anchor", "The anchor (query) column of --pairs.")
  flags.DEFINE_string("positive_column", "positive", "The positive column of --pairs.")
  flags.DEFINE_integer("range_min", 0, "Skip this many best candidates.")
  flags.DEFINE_integer("range_max", mining.RANGE_MAX, "Consider this many best "
                       "candidates (after the positives and margins).")
  flags.DEFINE_integer("num_negatives", mining.NUM_NEGATIVES, "Negatives per pair.")
  flags.DEFINE_float("absolute_margin", None, "Drop candidates scoring above the "
                     "positive's score minus this.")
  flags.DEFINE_float("relative_margin", None, "Drop candidates scoring above "
                     "positive - |positive| x this (0.05: NV-Retriever's TopK-PercPos 95%).")
  flags.DEFINE_float("max_score", None, "Drop candidates scoring above this.")
  flags.DEFINE_float("min_score", None, "Drop candidates scoring below this.")
  flags.DEFINE_enum("output_format", "", list(mining.OUTPUT_FORMATS), "'' (triplets, "
                    "n-tuples with several negatives), or a reranker's: 'labeled-pair' "
                    "(anchor, document, label), 'labeled-list' (anchor, [documents], "
                    "labels), as sentence-transformers' mine_hard_negatives writes them.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing --out file.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
