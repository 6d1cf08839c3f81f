"""Prepare a corpus once, offline: tokenized documents, then a config's training examples.

  # Stage 1: tokenize into ArrayRecord shards (one record a document).
  python -m bertjax.data.prepare --input='/data/*.txt' --tokenizer=vocab.txt \
      --output=/data/tokens --workers=8
  # Stage 2: the examples a config trains on, every length phase and the held-out
  # documents (the input a stage-1 directory, or raw text: then both stages run).
  python -m bertjax.data.prepare --config=configs/bert_base.py --input=/data/tokens \
      --output=/data/bert_base_examples --workers=8 [--config.data.dupe_factor=10]
  # then train with --config.data.corpus=/data/bert_base_examples
  #                 --config.data.tokenizer.path=/data/bert_base_examples/tokenizer
  # Stage 2 on Apache Beam instead of --workers: --runner=DirectRunner|DataflowRunner|
  # FlinkRunner|SparkRunner --beam_pipeline_options=key=value,... (`prepare_beam`).

The program: stage 1 (`prepare_tokens`) alone, or with `--config` a recipe's stage 1
when its corpus is raw text and stage 2 (`prepare_examples.build` on `--workers`
processes, or `prepare_beam.build` on the Apache Beam `--runner`).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Iterator

from absl import app, flags, logging
from ml_collections import config_flags

from bertjax import writes
from bertjax.console import cli
from bertjax.data import (manifest, mixture, phases, pipeline, prepare_examples,
                          prepare_tokens, sources, vocab_extension)
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import ConfigError
from bertjax import objectives as objectives_lib


def main(argv):
  del argv
  f = flags.FLAGS
  if f.config is None:
    if f.runner:
      raise app.UsageError("--runner builds a config's examples: give --config=RECIPE "
                           "(tokenizing raw text runs on --workers processes)")
    missing = [n for n in ("input", "tokenizer") if not f[n].value]
    if missing:
      raise app.UsageError(f"--{' and --'.join(missing)} needed (or --config=RECIPE to "
                           "build its training examples)")
    if mixture.is_mixture(f.input):
      raise app.UsageError("--input is a mixture: give --config=RECIPE with it as "
                           "config.data.corpus, which prepares each source into "
                           "OUTPUT/NAME")
    claim_output(f.output, {"--input": f.input, "--tokenizer": f.tokenizer})
    totals = prepare_tokens.prepare(f.input, f.tokenizer, f.output, f.workers,
                                    f.chunk_documents, f.text_field,
                                    line_breaks=f.line_breaks)
    print(" | ".join(f"{k} {v:,}" for k, v in totals.items()))
    return
  for line in prepare_config(
      f.config, input_spec=f.input, tokenizer_path=f.tokenizer, output=f.output,
      workers=f.workers, chunk_documents=f.chunk_documents, runner=f.runner,
      beam_options=f.beam_pipeline_options):
    print(line)


def prepare_config(config, *, input_spec: str | None, tokenizer_path: str | None,
                   output: str, workers: int, chunk_documents: int = 1000,
                   runner: str | None = None, beam_options: str = "") -> Iterator[str]:
  """The `prepare --config` command: for the corpus (or each source of a mixture or of
  `config.data.languages`, `mixture.sources_of`) stage 1 when it is raw text (into
  OUTPUT[/NAME]/tokens), then stage 2 into OUTPUT[/NAME] (on the Apache Beam `runner`
  with `beam_options` when given, see `prepare_beam`); yields summary lines and the
  flags to train with (the same sources and weights, each its prepared directory).
  With `config.init_from` (continued pretraining) the text is tokenized with the run's
  tokenizer: `tokenizer_path`, config.data.tokenizer.path or the checkpoint's,
  extended by config.vocab_extension (the flags then turn the extension off: the
  prepared tokenizer holds it)."""
  # The sections the examples depend on, in range, as training checks them; the rows
  # the objectives read (NSP's sentence pairs, or packed rows).
  objectives = objectives_lib.check(config)
  init_from = config.get("init_from", "")
  claim_output(output, {"--input": input_spec or "", "--tokenizer": tokenizer_path or "",
                        "config.init_from": init_from,
                        **{f"config.data ({s.name or 'corpus'})": s.spec
                           for s in mixture.sources_of(config.data)}})
  lengths = phases.row_lengths(pipeline.check_config(
      config.data, objectives.model, config.train.num_steps, trains_tokenizer=not init_from))
  with tempfile.TemporaryDirectory() as tmp:
    if init_from:  # Tokenized as the continued run will tokenize it.
      tokenizer_path = _continued_tokenizer(config, tokenizer_path, tmp)
    yield from _prepare(config, objectives, input_spec, tokenizer_path, output, workers,
                        chunk_documents, runner, beam_options, lengths)


def claim_output(output: str, inputs: dict[str, str]) -> None:
  """`--output` checked as `bertjax.writes` says before anything is read or written: none
  of `inputs` ({flag: path}) is it or inside it, and it is new, empty or a corpus this
  command prepared (a rerun finishes it); its run.json then written."""
  writes.claim(output, writes.PREPARED, inputs=inputs, flag="--output")
  writes.record(output, writes.PREPARED)


def _continued_tokenizer(config, given: str | None, tmp: str) -> str:
  """The tokenizer a continued run of `config` tokenizes with (`vocab_extension.
  run_tokenizer`: `given`, config.data.tokenizer.path or the checkpoint's, extended by
  config.vocab_extension), saved under `tmp`; its path."""
  path = given or config.data.tokenizer.path
  base = (tok_lib.load_tokenizer(path) if path else
          vocab_extension.checkpoint_tokenizer(config.init_from))
  tokenizer, words, added = vocab_extension.run_tokenizer(config, base)
  if words:
    logging.info("Vocabulary extension: %d of %d words added (%d -> %d tokens).",
                 len(added), len(words), base.vocab_size, tokenizer.vocab_size)
  out = os.path.join(tmp, "tokenizer")
  tokenizer.save(out)
  return out


def _prepare(config, objectives, input_spec, tokenizer_path, output, workers,
             chunk_documents, runner, beam_options, lengths) -> Iterator[str]:
  """`prepare_config` once its tokenizer is known; the examples at `lengths`."""
  nsp = pipeline.sentence_pairs(objectives.fields)
  data = config.data
  beam = _beam() if runner else None  # before any work: Beam may not be installed
  sources = mixture.sources_of(data)
  named = bool(sources[0].name)  # languages or a mixture: each into OUTPUT/NAME
  if named and input_spec:
    raise ConfigError("--input and the config's sources (config.data.languages or a "
                      "mixture in config.data.corpus) both name corpora: give one")
  jobs = ([(s.name, s.spec, os.path.join(output, s.name)) for s in sources]
          if named else [("", input_spec or data.corpus, output)])
  for name, spec, out in jobs:
    tokens = spec
    if manifest.kind_of(spec) != "tokens":
      path = tokenizer_path or data.tokenizer.path
      if not path:
        raise ConfigError("raw text needs a tokenizer: give --tokenizer or "
                          "config.data.tokenizer.path (train one with "
                          "python -m bertjax.data.train_tokenizer)")
      tokens = os.path.join(out, "tokens")
      totals = prepare_tokens.prepare(spec, path, tokens, workers, chunk_documents,
                                      data.text_field, line_breaks=data.line_breaks)
      yield " | ".join(f"{k} {v:,}" for k, v in totals.items())
    if runner:
      built = beam.build(tokens, out, data, nsp=nsp, seed=config.seed, lengths=lengths,
                         runner=runner, options=beam_options)
    else:
      built = prepare_examples.build(tokens, out, data, nsp=nsp, seed=config.seed,
                                     lengths=lengths, workers=workers)
    parts = [f"{split} {info['examples']:,}" for split, info in built["splits"].items()]
    yield (f"{name + ': ' if name else ''}examples {' | '.join(parts)} | documents "
           f"{built['documents']['train']:,} + {built['documents']['eval']:,} held out | "
           f"seconds {built['seconds']:,}")
  prepared = [dataclasses.replace(s, spec=out) for s, (_, _, out) in zip(sources, jobs)]
  field = "languages" if data.languages else "corpus"
  corpus_flag = (f"--config.data.{field}='{mixture.spec_of(prepared)}'"
                 if named else f"--config.data.corpus={output}")
  tokenizer_dir = os.path.join(jobs[0][2], manifest.TOKENIZER_DIR)
  # A continued run's extension is done: the prepared tokenizer holds it.
  done = (" --config.vocab_extension.tokens_file='' --config.vocab_extension."
          "num_new_tokens=0" if config.get("init_from") and vocab_extension.extending(
              config) else "")
  yield f"train with {corpus_flag} --config.data.tokenizer.path={tokenizer_dir}{done}"


def _beam():
  """The `prepare_beam` module, or a one-line error saying how to install Beam."""
  try:
    from bertjax.data import prepare_beam  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    if "apache_beam" not in str(e):
      raise
    raise ConfigError("--runner needs Apache Beam: pip install 'bertjax[beam]' (or drop "
                      "--runner to prepare with --workers processes)") from e
  return prepare_beam


def define_flags() -> None:
  """Defined only when run as a program (importing the module defines no flags)."""
  flags.DEFINE_string("input", None, "Corpus: file, glob, directory (text, JSON lines, "
                      ".gz, .zst, Parquet, Arrow, a datasets save_to_disk directory; "
                      "local or gs://), tfds:NAME, embedded; with --config also a "
                      "tokenized directory (default: its corpus or sources).")
  flags.DEFINE_string("tokenizer", None, "vocab.txt, .model, tokenizer.json or dir "
                      "(with --config, default: config.data.tokenizer.path).")
  flags.DEFINE_string("output", None, "Directory for the shards.")
  flags.DEFINE_integer("workers", os.cpu_count() or 1, "Worker processes.")
  flags.DEFINE_integer("chunk_documents", 1000, "Documents per tokenized shard.")
  flags.DEFINE_string("text_field", "text", "JSON-lines / TFDS text key, Parquet / "
                      "Arrow text column.")
  flags.DEFINE_enum("line_breaks", "space", list(sources.LINE_BREAKS), "Without "
                    "--config: a line break inside a document is a space (its lines "
                    "running text) or 'apart' (each line tokenized alone); with it, "
                    "config.data.line_breaks.")
  flags.DEFINE_string("runner", None, "With --config: build the examples on this Apache "
                      "Beam runner (DirectRunner, DataflowRunner, FlinkRunner, "
                      "SparkRunner, ...) instead of --workers processes; needs "
                      "pip install 'bertjax[beam]'.")
  flags.DEFINE_string("beam_pipeline_options", "", "With --runner: Beam pipeline "
                      "options, comma-separated key=value (e.g. "
                      "project=P,region=R,temp_location=gs://B/tmp).")
  config_flags.DEFINE_config_file(
      "config", None, "Recipe (e.g. configs/bert_base.py): build its training examples "
      "(every length phase and the held-out documents) from the tokenized documents.",
      lock_config=True)
  flags.mark_flags_as_required(["output"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
