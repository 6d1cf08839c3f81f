"""Training data of embedding models: (anchor, positive[, negatives...][, teacher scores])
examples from JSON lines, Parquet or CSV / TSV, one source or several, and the batches
contrastive training draws from them.

Columns follow sentence-transformers' convention: `anchor` (the query), `positive`, and
either `negative` or `negative_1` .. `negative_k` (hard negatives), each a string; the
names are config fields (`config.task.anchor_column`, ...). An optional teacher-score
column holds, per example, the scores of [positive, negatives...] or their margins
(positive minus each negative), for distillation (MarginMSE, KL).

Batches (`epoch_batches`): as sentence-transformers' NO_DUPLICATES sampler, no text
appears twice in a batch (an anchor, positive or negative equal to another example's
would be a false in-batch negative); with several sources, every batch is drawn from
one source (FlagEmbedding's `same_dataset_within_batch`: in-batch negatives of one
distribution), sources' batches shuffled together.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from typing import Sequence

import numpy as np

from bertjax.errors import ConfigError, DataError


@dataclasses.dataclass
class Pairs:
  """One source's examples.

  anchors [N] str; documents [N] lists of C strings (the positive, then the k = C - 1
  negatives, the same k for every example); teacher [N, C] float32 scores or [N, C - 1]
  margins, or None.
  """

  name: str
  anchors: list[str]
  documents: list[list[str]]
  teacher: np.ndarray | None

  def __len__(self) -> int:
    return len(self.anchors)


def read_table(path: str):
  """The pyarrow Table of a JSON-lines, Parquet or CSV / TSV file."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(path):
    raise DataError(f"pairs file {path} does not exist; check config.data.train.")
  name = path.lower()
  try:
    if name.endswith((".jsonl", ".json")):
      import pyarrow.json as pj  # pylint: disable=g-import-not-at-top
      return pj.read_json(path)
    if name.endswith(".parquet"):
      import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
      return pq.read_table(path)
    if name.endswith((".csv", ".tsv")):
      import pyarrow.csv as pc  # pylint: disable=g-import-not-at-top
      return pc.read_csv(path, parse_options=pc.ParseOptions(
          delimiter="\t" if name.endswith(".tsv") else ","))
  except (pa.ArrowException, OSError) as e:
    raise DataError(f"pairs file {path} cannot be read "
                    f"({str(e).splitlines()[0][:200]}): give JSON lines, Parquet or CSV "
                    "with one example a row") from None
  raise DataError(f"pairs file {path}: give .jsonl, .parquet, .csv or .tsv")


def negative_columns(names: Sequence[str], configured: Sequence[str]) -> list[str]:
  """The negative columns: `configured`, else `negative` or `negative_1..k` (in numeric
  order) when the table has them, else none."""
  if configured:
    return list(configured)
  numbered = sorted((int(m.group(1)), n) for n in names
                    if (m := re.fullmatch(r"negative_(\d+)", n)))
  if "negative" in names:
    return ["negative", *(n for _, n in numbered)]
  return [n for _, n in numbered]


def read_pairs(path: str, task_cfg, name: str = "") -> Pairs:
  """The examples of one file (the module docstring's columns, named by `task_cfg`:
  anchor_column, positive_column, negative_columns, teacher_column)."""
  table = read_table(path)
  names = table.column_names
  negatives = negative_columns(names, task_cfg.negative_columns)
  wanted = [task_cfg.anchor_column, task_cfg.positive_column, *negatives]
  if task_cfg.teacher_column:
    wanted.append(task_cfg.teacher_column)
  missing = [c for c in wanted if c not in names]
  if missing:
    raise DataError(f"pairs file {path} has no column {missing[0]!r} (it has "
                    f"{', '.join(names)}): rename it or set config.task."
                    f"{_field_of(missing[0], task_cfg)}")
  text = {}
  for column in wanted[:2 + len(negatives)]:
    values = table.column(column).to_pylist()
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str) or not v.strip()),
               None)
    if bad is not None:
      raise DataError(f"pairs file {path}, row {bad + 1}: column {column!r} is "
                      f"{'empty' if isinstance(values[bad], str) else repr(values[bad])}; "
                      "every anchor, positive and negative must be a non-empty text")
    text[column] = values
  if not text[task_cfg.anchor_column]:
    raise DataError(f"pairs file {path} has no rows")
  anchors = text[task_cfg.anchor_column]
  documents = [list(d) for d in zip(*(text[c] for c in wanted[1:2 + len(negatives)]))]
  teacher = None
  if task_cfg.teacher_column:
    teacher = _teacher(table.column(task_cfg.teacher_column).to_pylist(), len(documents[0]),
                       path, task_cfg.teacher_column)
  return Pairs(name, anchors, documents, teacher)


def _field_of(column: str, task_cfg) -> str:
  for field in ("anchor_column", "positive_column", "teacher_column"):
    if task_cfg[field] == column:
      return f"{field}"
  return "negative_columns"


def _teacher(values: list, candidates: int, path: str, column: str) -> np.ndarray:
  """[N, C] scores or [N, C - 1] margins (a float per row: one margin)."""
  rows = [v if isinstance(v, list) else [v] for v in values]
  widths = {len(r) for r in rows}
  if len(widths) != 1 or widths.pop() not in (candidates, candidates - 1) or any(
      not isinstance(x, (int, float)) for r in rows for x in r):
    raise DataError(f"pairs file {path}: column {column!r} must hold, in every row, "
                    f"{candidates} teacher scores (positive, negatives) or {candidates - 1} "
                    "margins (positive minus each negative), as numbers")
  return np.asarray(rows, np.float32)


def read_sources(spec: str, task_cfg) -> list[Pairs]:
  """`config.data.train`: one path, or several as 'NAME=PATH,NAME=PATH' (each batch
  from one source). Every source has the same number of documents per example."""
  parts = [p for p in spec.split(",") if p.strip()]
  named = [p.split("=", 1) if "=" in p else ("", p) for p in parts]
  if len(named) > 1 and not all(n for n, _ in named):
    raise ConfigError(f"config.data.train={spec!r}: name every source of several "
                      "('NAME=PATH,NAME=PATH')")
  sources = [read_pairs(path.strip(), task_cfg, name.strip()) for name, path in named]
  widths = {len(s.documents[0]) for s in sources}
  if len(widths) > 1:
    raise DataError(f"config.data.train={spec!r}: the sources have different numbers of "
                    "negatives per example; give each the same (or set "
                    "config.task.negative_columns to the ones to use)")
  return sources


def distinct_batches(texts: list[set[str]], order: np.ndarray, batch_size: int,
                     source: str) -> list[np.ndarray]:
  """sentence-transformers' NO_DUPLICATES batching of one source's examples in `order`:
  each pass over the examples not yet used adds an example to the batch when none of
  its texts is in it yet, and a batch is closed when full or when the pass ends (a
  short batch: every example left shares a text with it). Returns index arrays [B]
  padded with -1."""
  if len(order) < batch_size:
    raise DataError(f"source {source or 'of config.data.train'} holds {len(order)} examples, "
                    f"fewer than config.train.batch_size={batch_size}: lower the batch size")
  remaining = collections.deque(order.tolist())
  out = []
  while remaining:
    seen: set[str] = set()
    batch, skipped = [], []
    while remaining and len(batch) < batch_size:
      i = remaining.popleft()
      if texts[i].isdisjoint(seen):
        batch.append(i)
        seen |= texts[i]
      else:
        skipped.append(i)
    remaining.extendleft(reversed(skipped))  # First in the next batch, in their order.
    if not out and len(batch) < batch_size and skipped:
      raise DataError(f"source {source or 'of config.data.train'}: only {len(batch)} of its "
                      f"examples have texts that differ from each other, fewer than "
                      f"config.train.batch_size={batch_size} (an in-batch negative equal to "
                      "an example's own text is a false one); lower the batch size or "
                      "remove duplicates")
    out.append(np.asarray(batch + [-1] * (batch_size - len(batch)), np.int64))
  return out


def example_texts(source: Pairs) -> list[set[str]]:
  """Each example's texts (anchor, positive, negatives): what must not repeat in a
  batch."""
  return [{a, *d} for a, d in zip(source.anchors, source.documents)]


def epoch_batches(sources: Sequence[Pairs], texts: Sequence[list[set[str]]],
                  batch_size: int, seed: int, epoch: int) -> list[tuple[int, np.ndarray]]:
  """One epoch: every source's examples shuffled (seed, epoch, source) and cut into
  `distinct_batches`, the batches of all sources in one shuffled order:
  [(source index, example indices [B] padded with -1)]."""
  batches = []
  for s, source in enumerate(sources):
    order = np.random.default_rng([seed, epoch, s]).permutation(len(source))
    batches += [(s, b) for b in distinct_batches(texts[s], order, batch_size, source.name)]
  perm = np.random.default_rng([seed, epoch, len(sources)]).permutation(len(batches))
  return [batches[k] for k in perm]
