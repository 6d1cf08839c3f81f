"""`python -m bertjax.convert --to=hf|bertjax --src=DIR --dst=DIR`: a pretrained bertjax
workdir (or a Hugging Face dir) to a Hugging Face dir (of a workdir training several
networks, the exported one in DST and each other in DST/<name>: an ELECTRA pair's
discriminator and DST/generator), a fine-tuning workdir to the
matching Hugging Face `*For<Task>` dir (an embedding model's, 'retrieval', to a
sentence-transformers folder; a reranker's, 'rerank', to a CrossEncoder folder; a sparse
model's, 'sparse', to a SparseEncoder folder; a ColBERT model's, 'colbert', to a
MultiVectorEncoder folder), or a Hugging Face dir to a bertjax workdir
(`bertjax.hf.convert` holds the conversion)."""

from __future__ import annotations

import argparse
import os

from bertjax import writes
from bertjax.checkpoint import pretrained as pretrained_lib, workdir
from bertjax.console import cli
from bertjax.errors import CheckpointError
from bertjax.hf import convert
from bertjax.tasks import colbert, embedding, finetuned, rerank, reranker, sparse


def _is_workdir(path: str) -> bool:
  """Whether `path` is a bertjax workdir (its config.json has a model section)."""
  try:
    return "model" in workdir.load_config(path)
  except CheckpointError:  # no config.json: load_pretrained names what it is not
    return False


def _is_embedding_model(path: str) -> bool:
  """Whether `path` is a fine-tuning workdir of an embedding model ('retrieval')."""
  return workdir.task_info(path)["name"] == embedding.NAME


def _is_sparse_model(path: str) -> bool:
  """Whether `path` is a fine-tuning workdir of a sparse model ('sparse')."""
  return workdir.task_info(path)["name"] == sparse.NAME


def _is_colbert_model(path: str) -> bool:
  """Whether `path` is a fine-tuning workdir of a multi-vector model ('colbert')."""
  return workdir.task_info(path)["name"] == colbert.NAME


def _is_reranker(path: str) -> bool:
  """Whether `path` is a fine-tuning workdir of a reranker ('rerank')."""
  return workdir.task_info(path)["name"] == rerank.NAME


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m bertjax.convert", description=(
      "--to=hf: a bertjax workdir (or HF dir) -> a Hugging Face dir (a fine-tuning "
      "workdir -> its *ForSequenceClassification / ForTokenClassification / "
      "ForQuestionAnswering / ForMultipleChoice; an embedding model's -> a "
      "sentence-transformers folder); --to=bertjax: a Hugging Face dir -> a bertjax "
      "workdir. DST is written whole into a temporary folder, then renamed into place "
      "(bertjax.writes)."))
  parser.add_argument("--to", choices=("hf", "bertjax"), required=True)
  parser.add_argument("--src", required=True)
  parser.add_argument("--dst", required=True)
  parser.add_argument("--overwrite", action="store_true", help=(
      "DST may hold files: the export's replace theirs, and the files another bertjax "
      "export writes there go; other files stay."))
  args = parser.parse_args(argv)
  with cli.one_line_errors():
    kind = convert_checkpoint(args.to, args.src, args.dst, args.overwrite)
  print(f"wrote {kind} checkpoint to {args.dst}")


def convert_checkpoint(to: str, src: str, dst: str, overwrite: bool = False) -> str:
  """The command: `src` converted `to` 'hf' or 'bertjax' into `dst` (`writes.export_dir`:
  whole or absent; `dst` equal to `src`, inside it or holding it refused, a non-empty
  one without `overwrite` too). Returns what was written ('bert', 'sentence-transformers
  (bert)', 'BertForSequenceClassification', 'bertjax')."""
  if to == "hf" and _is_workdir(src):
    family = workdir.saved_model(src).family  # checked before the weights
    convert.family_table(family)
    if workdir.is_finetuned(src) and not (_is_embedding_model(src) or _is_sparse_model(src)
                                          or _is_colbert_model(src)):
      convert.check_exportable("classification" if _is_reranker(src)
                               else workdir.task_info(src)["name"], family)
  with writes.export_dir(dst, overwrite, {"--src": src},
                         writes.CONVERSION if to == "bertjax" else "") as out:
    if to == "hf" and workdir.is_finetuned(src) and _is_embedding_model(src):
      return f"sentence-transformers ({embedding.export(out, embedding.load_encoder(src))})"
    if to == "hf" and workdir.is_finetuned(src) and _is_sparse_model(src):
      return f"SparseEncoder ({sparse.export(out, src)})"
    if to == "hf" and workdir.is_finetuned(src) and _is_colbert_model(src):
      return f"MultiVectorEncoder ({colbert.export(out, src)})"
    if to == "hf" and workdir.is_finetuned(src) and _is_reranker(src):
      return f"CrossEncoder ({reranker.export(out, reranker.load_reranker(src))})"
    if to == "hf" and workdir.is_finetuned(src):
      return convert.save_hf_finetuned(out, finetuned.load_finetuned(src))
    if to == "hf":
      pretrained = pretrained_lib.load_pretrained(src)
      kind = convert.save_hf(out, pretrained.params, pretrained.config, pretrained.tokenizer)
      for name in workdir.other_networks(src):  # An ELECTRA pair's generator.
        other = pretrained_lib.load_pretrained(src, network=name)
        written = convert.save_hf(os.path.join(out, name), other.params, other.config,
                                  other.tokenizer)
        print(f"wrote {written} checkpoint of the {name} to {os.path.join(dst, name)}")
      return kind
    pretrained = pretrained_lib.load_pretrained(src)
    pretrained_lib.save_workdir(out, pretrained.params, pretrained.config,
                                pretrained.tokenizer)
    return "bertjax"


if __name__ == "__main__":
  main()
