"""`python -m bertjax.convert --to=hf|bertjax --src=DIR --dst=DIR`: a pretrained bertjax
workdir (or a Hugging Face dir) to a Hugging Face dir (of a workdir training several
networks, the exported one in DST and each other in DST/<name>: an ELECTRA pair's
discriminator and DST/generator), a fine-tuning workdir to the
matching Hugging Face `*For<Task>` dir (an embedding model's, 'retrieval', to a
sentence-transformers folder), or a Hugging Face dir to a bertjax workdir
(`bertjax.hf.convert` holds the conversion)."""

from __future__ import annotations

import argparse
import os

from bertjax.checkpoint import pretrained as pretrained_lib, workdir
from bertjax.console import cli
from bertjax.errors import CheckpointError
from bertjax.hf import convert
from bertjax.tasks import embedding, finetuned


def _is_workdir(path: str) -> bool:
  """Whether `path` is a bertjax workdir (its config.json has a model section)."""
  try:
    return "model" in workdir.load_config(path)
  except CheckpointError:  # no config.json: load_pretrained names what it is not
    return False


def _is_embedding_model(path: str) -> bool:
  """Whether `path` is a fine-tuning workdir of an embedding model ('retrieval')."""
  return workdir.task_info(path)["name"] == embedding.NAME


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m bertjax.convert", description=(
      "--to=hf: a bertjax workdir (or HF dir) -> a Hugging Face dir (a fine-tuning "
      "workdir -> its *ForSequenceClassification / ForTokenClassification / "
      "ForQuestionAnswering / ForMultipleChoice; an embedding model's -> a "
      "sentence-transformers folder); --to=bertjax: a Hugging Face dir -> a bertjax "
      "workdir."))
  parser.add_argument("--to", choices=("hf", "bertjax"), required=True)
  parser.add_argument("--src", required=True)
  parser.add_argument("--dst", required=True)
  args = parser.parse_args(argv)
  with cli.one_line_errors():
    if args.to == "hf" and _is_workdir(args.src):
      family = workdir.saved_model(args.src).family  # checked before the weights
      convert.family_table(family)
      if workdir.is_finetuned(args.src) and not _is_embedding_model(args.src):
        convert.check_exportable(workdir.task_info(args.src)["name"], family)
    if args.to == "hf" and workdir.is_finetuned(args.src) and _is_embedding_model(args.src):
      kind = embedding.export(args.dst, embedding.load_encoder(args.src))
      kind = f"sentence-transformers ({kind})"
    elif args.to == "hf" and workdir.is_finetuned(args.src):
      kind = convert.save_hf_finetuned(args.dst, finetuned.load_finetuned(args.src))
    elif args.to == "hf":
      pretrained = pretrained_lib.load_pretrained(args.src)
      kind = convert.save_hf(args.dst, pretrained.params, pretrained.config,
                             pretrained.tokenizer)
      for name in workdir.other_networks(args.src):  # An ELECTRA pair's generator.
        other = pretrained_lib.load_pretrained(args.src, network=name)
        dst = os.path.join(args.dst, name)
        print(f"wrote {convert.save_hf(dst, other.params, other.config, other.tokenizer)} "
              f"checkpoint of the {name} to {dst}")
    else:
      pretrained = pretrained_lib.load_pretrained(args.src)
      pretrained_lib.save_workdir(args.dst, pretrained.params, pretrained.config,
                                  pretrained.tokenizer)
      kind = "bertjax"
  print(f"wrote {kind} checkpoint to {args.dst}")


if __name__ == "__main__":
  main()
