"""`prepare`'s second stage on Apache Beam: the same units, spread by a Beam runner.

  pip install 'bertjax[beam]'
  python -m bertjax.data.prepare --config=configs/bert_base.py --input=/data/tokens \
      --output=/data/bert_base_examples --runner=DirectRunner \
      --beam_pipeline_options=direct_num_workers=8,direct_running_mode=multi_processing
  # or --runner=DataflowRunner|FlinkRunner|SparkRunner with that runner's options, e.g.
  #   --beam_pipeline_options=project=P,region=R,temp_location=gs://B/tmp,setup_file=./setup.py

This driver does what `prepare_examples.build` does around its worker pool: `plan`
(settings check, split directories, the units left to build), then, once the
pipeline has finished, `finish` (unigram counts, tokenizer, manifest). The pipeline
only distributes the units: `Create(units) | Reshuffle | ParDo(build a unit)`, each
Beam worker initialised by `prepare_examples.init_worker` and building a unit with
`prepare_examples.build_unit`, so the shards and the manifest are those of the
multiprocessing path, byte for byte (tests/test_data_prepared.py checks it). A rerun
skips the units already written, whichever path wrote them.

The workers read the tokenized directory and write the unit files with local file
operations: on a cluster both directories must be a file system every worker mounts
(NFS / Filestore, a GCS FUSE mount), and the workers need bertjax installed
(`setup_file`, `requirements_file` or a custom SDK container). Stage 1 (tokenizing raw
text) stays on the multiprocessing path: its shards are cut from one ordered stream
of documents.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import apache_beam as beam
from apache_beam.options import pipeline_options as beam_options

from bertjax.data import prepare_examples


class _BuildUnits(beam.DoFn):
  """Builds the (split, length, shard) units it is given into their files."""

  def __init__(self, tokens: str, settings: dict[str, Any]):
    super().__init__()
    self._tokens, self._settings = tokens, settings

  def setup(self):
    prepare_examples.init_worker(self._tokens, self._settings)

  def process(self, task):
    counts = prepare_examples.build_unit(tuple(task))
    beam.metrics.Metrics.counter("bertjax", "units").inc()
    beam.metrics.Metrics.counter("bertjax", "examples").inc(counts["examples"])
    yield task[:3]


def parse_options(runner: str, options: str | Sequence[str]) -> beam_options.PipelineOptions:
  """Beam pipeline options from `runner` and `options`: a comma-separated list of
  key=value (as `tfds build --beam_pipeline_options` takes them) or a list of flags."""
  if isinstance(options, str):
    options = [o for o in options.split(",") if o]
  flags = [o if o.startswith("--") else f"--{o}" for o in options]
  return beam_options.PipelineOptions([f"--runner={runner}", *flags])


def build(tokens: str, output: str, data_cfg, *, nsp: bool, seed: int,
          lengths: Sequence[int], runner: str = "DirectRunner",
          options: str | Sequence[str] = ()) -> dict[str, Any]:
  """`prepare_examples.build` with the units run by the Beam `runner` (its `options`,
  see `parse_options`); returns the manifest."""
  start = time.perf_counter()
  plan = prepare_examples.plan(tokens, output, data_cfg, nsp=nsp, seed=seed,
                               lengths=lengths)
  if plan.todo:
    with beam.Pipeline(options=parse_options(runner, options)) as pipeline:
      _ = (pipeline
           | "Units" >> beam.Create([list(task) for task in plan.todo])
           | "Spread" >> beam.Reshuffle()
           | "Build" >> beam.ParDo(_BuildUnits(tokens, plan.settings)))
  return prepare_examples.finish(plan, start)
