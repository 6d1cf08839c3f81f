"""`python -m bertjax.merge --src=A,B[,C...] --dst=DIR [--method=average|ties]
[--weights=...] [--base=BASE --density=0.5 --scale=1] [--to=hf|bertjax]`: one model
from the parameters of several checkpoints of one architecture (bertjax workdirs or
Hugging Face folders, as `config.init_from` takes them), as mmBERT's authors merged
their decay-phase variants: their weighted mean ('average', mergekit's linear) or
TIES-merging of their differences from --base ('ties'; `bertjax.checkpoint.merging`
states both). The checkpoints must have one model config (dropouts aside), one
parameter tree and one vocabulary; the merged model is written whole to DST as a
Hugging Face folder (--to=hf) or a bertjax workdir (--to=bertjax) with the first
checkpoint's tokenizer (`bertjax.writes.export_dir`: DST never one of the sources).
"""

from __future__ import annotations

import argparse
import dataclasses

import jax

from bertjax import writes
from bertjax.checkpoint import merging, pretrained as pretrained_lib
from bertjax.console import cli
from bertjax.data.tokenizer import check_same_vocabulary
from bertjax.errors import CheckpointError, ConfigError
from bertjax.hf import convert


def _settings(config) -> dict:
  """A model config's fields that fix the architecture (dropouts and dtype aside)."""
  return {k: v for k, v in dataclasses.asdict(config).items()
          if "dropout" not in k and k != "dtype"}


def _check_same(first, first_path: str, other, path: str) -> None:
  a, b = _settings(first.config), _settings(other.config)
  if type(first.config) is not type(other.config) or a.keys() != b.keys():
    raise CheckpointError(f"{path} is a {type(other.config).__name__} and {first_path} a "
                          f"{type(first.config).__name__}: merge checkpoints of one "
                          "architecture.")
  field = next((k for k in a if a[k] != b[k]), None)
  if field:
    raise CheckpointError(f"{path} has {field}={b[field]!r} where {first_path} has "
                          f"{a[field]!r}: merge checkpoints of one architecture.")
  shapes = lambda p: jax.tree.map(lambda x: (x.shape, str(x.dtype)), p)
  if jax.tree.structure(first.params) != jax.tree.structure(other.params) or (
      shapes(first.params) != shapes(other.params)):
    raise CheckpointError(f"{path}'s parameters are not {first_path}'s (other heads or "
                          "shapes): merge checkpoints of one model.")
  check_same_vocabulary(other.tokenizer, first.tokenizer, path, first_path,
                        "merge checkpoints trained with one tokenizer")


def merge_checkpoints(sources: list[str], dst: str, method: str = "average",
                      weights: list[float] | None = None, base: str = "",
                      density: float = 1.0, scale: float = 1.0, to: str = "hf",
                      overwrite: bool = False) -> str:
  """The command (module docstring); returns what was written ('bert', 'bertjax')."""
  if method not in merging.METHODS:
    raise ConfigError(f"--method={method!r}: use one of {merging.METHODS}.")
  if method == "ties" and not base:
    raise ConfigError("--method=ties merges differences from a base: give --base (the "
                      "checkpoint the others were trained from).")
  if method == "average" and base:
    raise ConfigError("--base is TIES-merging's (--method=ties); leave it out to average.")
  if len(sources) < (1 if base else 2):
    raise ConfigError(f"--src names {len(sources)} checkpoint: merge two or more.")
  inputs = {f"--src {i + 1}": s for i, s in enumerate(sources)} | {"--base": base}
  with writes.export_dir(dst, overwrite, inputs,
                         writes.CONVERSION if to == "bertjax" else "") as out:
    models = [pretrained_lib.load_pretrained(s) for s in sources]
    first = models[0]
    reference = pretrained_lib.load_pretrained(base) if base else None
    for model, path in zip(models[1:], sources[1:]):
      _check_same(first, sources[0], model, path)
    if reference is not None:
      _check_same(first, sources[0], reference, base)
    trees = [m.params for m in models]
    params = (merging.average(trees, weights) if method == "average" else
              merging.ties(reference.params, trees, weights, density, scale))
    if to == "bertjax":
      pretrained_lib.save_workdir(out, params, first.config, first.tokenizer)
      return "bertjax"
    return convert.save_hf(out, params, first.config, first.tokenizer)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m bertjax.merge", description=__doc__)
  parser.add_argument("--src", required=True, help="Checkpoints, comma-separated.")
  parser.add_argument("--dst", required=True)
  parser.add_argument("--method", default="average", choices=merging.METHODS)
  parser.add_argument("--weights", default="", help="A weight a checkpoint (default: 1 "
                      "each), comma-separated.")
  parser.add_argument("--base", default="", help="ties: the checkpoint the others were "
                      "trained from.")
  parser.add_argument("--density", type=float, default=1.0, help="ties: the share of "
                      "each difference kept, largest magnitudes first.")
  parser.add_argument("--scale", type=float, default=1.0, help="ties: the merged "
                      "difference's factor (mergekit's lambda).")
  parser.add_argument("--to", choices=("hf", "bertjax"), default="hf")
  parser.add_argument("--overwrite", action="store_true", help="DST may hold files, as "
                      "for python -m bertjax.convert.")
  args = parser.parse_args(argv)
  with cli.one_line_errors():
    try:
      weights = [float(w) for w in args.weights.split(",")] if args.weights else None
    except ValueError:
      raise ConfigError(f"--weights={args.weights!r}: give numbers, comma-separated.") from None
    sources = [s for s in args.src.split(",") if s]
    kind = merge_checkpoints(sources, args.dst, args.method, weights, args.base,
                             args.density, args.scale, args.to, args.overwrite)
  print(f"wrote the {args.method} of {len(sources)} checkpoints ({kind}) to {args.dst}")


if __name__ == "__main__":
  main()
