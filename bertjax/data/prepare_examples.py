"""`prepare`'s second stage: a config's training examples, built once, offline.

From a tokenized directory (stage 1) it writes, for `config.data` and the model's
`nsp`, every split training reads (`manifest.py` describes the layout):
* `train-T/` for each length T of the length phases: BERT's NSP pairs (`dupe_factor`
  passes, `short_seq_prob`, google-research/bert's `create_instances_from_document`
  decision for decision, the random B drawn from the whole training split by random
  access into the tokenized shards) or packed rows (FULL-SENTENCES / DOC-SENTENCES,
  each row's document boundaries kept so attention can be isolated per document);
  every row carries its word starts (whole-word and SpanBERT span masking);
* `eval-T/` at each of those lengths from the held-out documents (the same held-out set
  the in-memory pipeline takes: `permutation.held_out` of the same seed, decided per
  document from its index, so no process needs the corpus in memory);
* `unigram_counts.npy` (the training tokens' counts) and `manifest.json`.

A unit of work is (split, length, tokenized shard) -> one rows shard, written
atomically with a `.json` of its counts; worker processes take units in parallel,
each holding one shard's documents and examples, so memory is bounded whatever the
corpus size. A rerun skips finished units (and refuses an output directory built
with other settings); the manifest is written last.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
from typing import Any, NamedTuple, Sequence

from etils import epath
import numpy as np

from bertjax.console import progress as progress_lib
from bertjax.data import (manifest, multilingual, permutation, prepare_tokens, builders,
                          rows as rows_lib, seeds)
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import ConfigError, DataError

_worker: dict[str, Any] = {}


class SplitDocuments:
  """The documents of one split (training or held-out) of a tokenized directory, with
  random access and nothing held per document: the split's k-th document in the order
  of the held-out permutation (`permutation.held_out`: the k-th held-out document is
  unpermute(k), the k-th training one unpermute(E + k) with E held out).
  `of_shard(s)` gives the split's indices of tokenized shard s's documents."""

  def __init__(self, documents: prepare_tokens.TokenizedDocuments, held_out: bool,
               fraction: float, seed: int):
    self._documents, self._seed, self._n = documents, seed, len(documents)
    held = permutation.num_held_out(self._n, fraction)
    self._first, self._len = (0, held) if held_out else (held, self._n - held)

  def __len__(self) -> int:
    return self._len

  @property
  def shards(self) -> int:
    return len(self._documents.starts) - 1

  def __getitem__(self, k: int) -> builders.Document:
    return self._documents[permutation.unpermute_one(self._first + k, self._n, self._seed)]

  def of_shard(self, shard: int) -> np.ndarray:
    """[m] the split's indices of the documents of tokenized shard `shard`, in corpus
    order."""
    starts = self._documents.starts
    k = permutation.permute(np.arange(starts[shard], starts[shard + 1]), self._n,
                            self._seed) - self._first
    return k[(k >= 0) & (k < self._len)]


def _settings(data_cfg, nsp: bool, seed: int, tokens: str, lengths: Sequence[int]
              ) -> dict[str, Any]:
  """What the examples depend on: a rerun into the same directory must match."""
  builder = manifest.builder_name(nsp, data_cfg.packing)
  return {
      "builder": builder,
      "dupe_factor": data_cfg.dupe_factor if nsp else None,
      "short_seq_prob": data_cfg.short_seq_prob if nsp else None,
      "eval_fraction": data_cfg.eval_fraction,
      "seed": seed,
      "train_lengths": list(lengths),
      "tokenizer_fingerprint": prepare_tokens.summary(tokens).get("tokenizer_fingerprint"),
      # Tokenized before the setting was recorded: a line break was a space.
      "line_breaks": prepare_tokens.summary(tokens).get("line_breaks", "space"),
      "input": os.path.abspath(tokens),
  }


class _WithOwn:
  """A split's documents with those at `own` (a unit's, read at every dupe pass) read
  once and kept."""

  def __init__(self, documents: SplitDocuments, own: np.ndarray):
    self._documents, self._own = documents, {int(k): documents[k] for k in own}

  def __len__(self) -> int:
    return len(self._documents)

  def __getitem__(self, k: int) -> builders.Document:
    document = self._own.get(k)
    return self._documents[k] if document is None else document


def init_worker(tokens: str, settings: dict[str, Any]) -> None:
  """Readies this process (a pool worker, a Beam worker, or the driver) to build units
  of the tokenized directory `tokens` with `settings` (see `plan`)."""
  tok = tok_lib.load_tokenizer(os.path.join(tokens, manifest.TOKENIZER_DIR))
  documents = prepare_tokens.TokenizedDocuments(tokens)
  split_seed = seeds.stream_seed(settings["seed"], seeds.SPLIT, 0)
  _worker.update(
      tokenizer=tok, word_starts=tok.word_starts(), ids=rows_lib.id_dtype(tok.vocab_size),
      settings=settings,
      splits={held: SplitDocuments(documents, held, settings["eval_fraction"], split_seed)
              for held in (False, True)})


def build_unit(task: tuple[str, int, int, str, bool]) -> dict[str, int]:
  """Builds one (split, length, tokenized shard) unit into `path`; returns its counts."""
  split, length, shard, path, count_tokens = task
  tok, settings = _worker["tokenizer"], _worker["settings"]
  documents = _worker["splits"][split == "eval"]
  mine = documents.of_shard(shard).tolist()
  stream = seeds.TRAIN_EXAMPLES if split == "train" else seeds.EVAL_EXAMPLES
  own = _WithOwn(documents, mine)
  if settings["builder"] == "nsp":
    examples = builders.nsp_examples_of(
        own, mine, tok, max_seq_length=length, short_seq_prob=settings["short_seq_prob"],
        dupe_factor=settings["dupe_factor"] if split == "train" else 1,
        rng=np.random.default_rng(seeds.stream_seed(settings["seed"], stream, length,
                                                    shard)))
  else:
    examples = builders.create_packed_examples(
        [own[k] for k in mine], tok, max_seq_length=length, packing=settings["builder"],
        isolate_documents=True)
  rows = rows_lib.encode(examples, _worker["word_starts"], _worker["ids"])
  counts = {"examples": len(rows), "tokens": int(rows["length"].sum()),
            "random_next": int(rows["label"].sum())}
  if count_tokens:  # The unigram counts of the shard's training documents.
    ids = np.concatenate([np.asarray(s, np.int64) for k in mine for s in own[k]] or [[]])
    found = np.bincount(ids.astype(np.int64), minlength=tok.vocab_size)
    nonzero = np.flatnonzero(found)
    np.save(path + ".unigram.npy", np.stack([nonzero, found[nonzero]]))
  rows_lib.write(path, rows)
  _write_json(path + ".json", counts)
  return counts


def _write_json(path: str, value: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(value, f, indent=1)
  os.replace(tmp, path)


class Plan(NamedTuple):
  """What stage 2 has to do in an output directory (see `plan`)."""
  tokens: str  # the tokenized directory
  output: str
  settings: dict[str, Any]
  units: list[tuple[str, int, int]]  # every (split, length, tokenized shard)
  todo: list[tuple[str, int, int, str, bool]]  # the unfinished ones: `build_unit`'s tasks
  names: dict[tuple[str, int], str]  # (split, length) -> its directory name

  def path(self, split: str, length: int, shard: int) -> str:
    return os.path.join(self.output, self.names[split, length],
                        f"part-{shard:05d}{rows_lib.SUFFIX}")


def plan(tokens: str, output: str, data_cfg, *, nsp: bool, seed: int,
         lengths: Sequence[int]) -> Plan:
  """Checks the settings (a rerun must match the output's), writes them and the split
  directories, and lists the units still to build (a unit is done once its `.json`
  exists) at each of `lengths` (the row lengths training reads, ascending:
  `phases.row_lengths` of the config's length phases). Leaves this process initialised
  as a worker."""
  settings = _settings(data_cfg, nsp, seed, tokens, lengths)
  os.makedirs(output, exist_ok=True)
  settings_path = os.path.join(output, manifest.SETTINGS)
  if os.path.exists(settings_path):
    with open(settings_path) as f:
      old = json.load(f)
    changed = [f"{k}={settings[k]!r} (was {old.get(k)!r})" for k in settings
               if old.get(k) != settings[k]]
    if changed:
      raise DataError(f"{output} holds examples built with other settings: "
                      f"{', '.join(changed)}; use a new --output")
  _write_json(settings_path, settings)
  init_worker(tokens, settings)  # The split's counts per shard, here too.
  splits = _worker["splits"]
  lengths = settings["train_lengths"]
  for held, name in ((False, "training"), (True, "held-out")):
    if len(splits[held]) < 2:
      raise DataError(f"{tokens} has {len(splits[False]) + len(splits[True])} documents: "
                      f"too few for 2 {name} ones; give more documents")
  shards = range(splits[False].shards)
  units = [("train", t, s) for t in lengths for s in shards]
  units += [("eval", t, s) for t in lengths for s in shards]
  names = {("train", t): manifest.train_split(t) for t in lengths}
  names.update({("eval", t): manifest.eval_split(t) for t in lengths})
  for name in names.values():
    os.makedirs(os.path.join(output, name), exist_ok=True)
  out = Plan(tokens, output, settings, units, [], names)
  out.todo.extend((*unit, out.path(*unit), unit[0] == "train" and unit[1] == lengths[0])
                  for unit in units if not os.path.exists(out.path(*unit) + ".json"))
  return out


def unit_counts(plan_: Plan) -> dict[tuple[str, int, int], dict[str, int]]:
  """The counts of every unit of `plan_`, read from their `.json` files (all built)."""
  counts = {}
  for unit in plan_.units:
    with open(plan_.path(*unit) + ".json") as f:
      counts[unit] = json.load(f)
  return counts


def finish(plan_: Plan, start: float) -> dict[str, Any]:
  """Once every unit is built: the unigram counts, the tokenizer and the manifest
  (written last); returns the manifest."""
  results, settings, output = unit_counts(plan_), plan_.settings, plan_.output
  tok, splits = _worker["tokenizer"], _worker["splits"]
  counts = np.zeros(tok.vocab_size, np.int64)
  for split, length, shard in plan_.units:
    if split == "train" and length == settings["train_lengths"][0]:
      found = np.load(plan_.path(split, length, shard) + ".unigram.npy")
      counts[found[0]] += found[1]
  np.save(os.path.join(output, manifest.UNIGRAM_COUNTS), counts)
  baseline = counts.copy()
  baseline[sorted(tok.special_ids | {tok.pad_id})] = 0
  text = prepare_tokens.summary(plan_.tokens)
  tok.save(os.path.join(output, manifest.TOKENIZER_DIR))
  out = {
      "format": manifest.FORMAT,
      **{k: settings[k] for k in ("builder", "dupe_factor", "short_seq_prob",
                                  "eval_fraction", "seed", "input", "line_breaks")},
      "tokenizer": {"fingerprint": manifest.fingerprint(tok), "vocab_size": tok.vocab_size,
                    "style": tok.style},
      "ids": rows_lib.id_dtype(tok.vocab_size).str,
      "documents": {"total": len(splits[False]) + len(splits[True]),
                    "train": len(splits[False]), "eval": len(splits[True])},
      "text": {k: text.get(k, 0) for k in multilingual.COUNTS + ("documents",)},
      "train_tokens": int(counts.sum()),
      "most_frequent_token": int(np.argmax(baseline)),
      "unigram_counts": manifest.UNIGRAM_COUNTS,
      "splits": {},
  }
  for (split, length), name in plan_.names.items():
    parts = [(s, results[split, length, s]) for sp, t, s in plan_.units
             if (sp, t) == (split, length)]
    out["splits"][name] = {
        "length": length,
        **{k: sum(c[k] for _, c in parts) for k in ("examples", "tokens", "random_next")},
        "shards": [[os.path.relpath(plan_.path(split, length, s), output), c["examples"]]
                   for s, c in parts if c["examples"]]}
  out["seconds"] = round(time.perf_counter() - start, 3)
  _write_json(os.path.join(output, manifest.MANIFEST), out)
  return out


def build(tokens: str, output: str, data_cfg, *, nsp: bool, seed: int,
          lengths: Sequence[int], workers: int = 1, progress: bool = True
          ) -> dict[str, Any]:
  """Builds `data_cfg`'s examples at `lengths` (`plan`) from the tokenized directory
  `tokens` into `output` with `workers` processes (0: in this one); returns the
  manifest. (`prepare_beam` runs the same units on Apache Beam.)"""
  start = time.perf_counter()
  plan_ = plan(tokens, output, data_cfg, nsp=nsp, seed=seed, lengths=lengths)
  with contextlib.ExitStack() as stack:
    if workers > 0:
      pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(
          workers, init_worker, (tokens, plan_.settings)))
      built = pool.imap(build_unit, plan_.todo)
    else:  # In this process (small corpora, tests).
      built = map(build_unit, plan_.todo)
    bar = stack.enter_context(
        progress_lib.Progress("examples", len(plan_.units), "shards", enable=progress))
    bar.update(len(plan_.units) - len(plan_.todo))
    for _ in built:
      bar.update()
  return finish(plan_, start)
