"""`python -m bertjax.convert --to=hf|bertjax --src=DIR --dst=DIR`: a pretrained bertjax
workdir (or a Hugging Face dir) to a Hugging Face dir, or a Hugging Face dir to a
bertjax workdir. The program sits above `bertjax.api` (which reads both kinds through
`bertjax.convert`), so it is not part of `bertjax.convert` itself."""

from __future__ import annotations

import argparse

from bertjax import api, cli, convert


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m bertjax.convert", description=(
      "--to=hf: a bertjax workdir (or HF dir) -> a Hugging Face dir; --to=bertjax: "
      "a Hugging Face dir -> a bertjax workdir."))
  parser.add_argument("--to", choices=("hf", "bertjax"), required=True)
  parser.add_argument("--src", required=True)
  parser.add_argument("--dst", required=True)
  args = parser.parse_args(argv)
  with cli.one_line_errors():
    pretrained = api.load_pretrained(args.src)
    if args.to == "hf":
      kind = convert.save_hf(args.dst, pretrained.params, pretrained.config,
                             pretrained.tokenizer)
    else:
      convert.save_workdir(args.dst, pretrained.params, pretrained.config,
                           pretrained.tokenizer)
      kind = "bertjax"
  print(f"wrote {kind} checkpoint to {args.dst}")
