"""What a prepared directory holds, and the check that it is what a run's config asks.

`prepare` writes two kinds of directory:
* tokenized documents (its first stage): `summary.json`, `tokenizer/`, ArrayRecord
  shards `part-NNNNN.array_record` with a `part-NNNNN.json` of counts each;
* training examples (its second stage, `--config`): `manifest.json`, `tokenizer/`,
  `unigram_counts.npy` and one directory of `rows` shards per split: `train-T/` for
  every sequence length T of the config's length phases, `eval-T/` for the held-out
  documents at each of those lengths (each phase is evaluated at its own).

The manifest records how the examples were built (builder and its settings, held-out
fraction, seed, lengths, the tokenizer's fingerprint), their counts per split and per
shard, the training text's documents / sentences / tokens / characters (n_i of the
multilingual sampling) and the most frequent training token. Training reads it and
the shards through etils.epath (local paths or gs://), never lists a directory, and
refuses, in one line, a directory built with settings its config does not have.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any, Sequence

from etils import epath
import numpy as np

from bertjax.data import rows as rows_lib
from bertjax.errors import ConfigError, DataError

MANIFEST = "manifest.json"
SETTINGS = "settings.json"  # written first by stage 2: its output directory's settings
SUMMARY = "summary.json"  # of a tokenized directory
TOKENIZER_DIR = "tokenizer"
UNIGRAM_COUNTS = "unigram_counts.npy"
FORMAT = "bertjax-prepared-examples-1"


def kind_of(spec: str) -> str | None:
  """'examples' (a manifest), 'tokens' (a tokenized directory) or None (raw text)."""
  if not spec or spec == "embedded" or spec.startswith("tfds:") or any(
      c in spec for c in "*?["):
    return None
  path = epath.Path(spec)
  if (path / MANIFEST).exists():
    return "examples"
  if (path / SETTINGS).exists():
    raise DataError(f"{spec} holds examples whose preparation did not finish (no "
                    f"{MANIFEST}): rerun the same python -m bertjax.data.prepare command")
  if (path / SUMMARY).exists():
    return "tokens"
  return None


def builder_name(nsp: bool, packing: str) -> str:
  """'nsp' (BERT's sentence pairs) or the packing ('full_sentences', 'stream',
  'doc_sentences')."""
  return "nsp" if nsp else packing


def fingerprint(tokenizer) -> str:
  """A digest of the tokenizer's style and its id -> token table."""
  tokens = []
  for i in range(tokenizer.vocab_size):
    try:
      tokens.append(tokenizer.id_to_token(i))
    except DataError:  # a gap in the vocabulary
      tokens.append(None)
  blob = json.dumps([tokenizer.style, tokenizer.vocab_size, tokens]).encode()
  return hashlib.sha256(blob).hexdigest()[:16]


def load(spec: str) -> dict[str, Any]:
  manifest = json.loads((epath.Path(spec) / MANIFEST).read_text())
  if manifest.get("format") != FORMAT:
    raise DataError(f"{spec}/{MANIFEST} is not a bertjax manifest of format {FORMAT} "
                    "(an older prepare?): run python -m bertjax.data.prepare again")
  return manifest


def train_split(length: int) -> str:
  return f"train-{length}"


def eval_split(length: int) -> str:
  return f"eval-{length}"


def check(manifest: dict[str, Any], spec: str, data_cfg, tokenizer_fingerprint: str, *,
          nsp: bool, lengths: Sequence[int]) -> None:
  """ConfigError (one line) unless `spec` was prepared as `data_cfg` (+ `nsp`: the
  objectives read sentence pairs, `pipeline.sentence_pairs`) would build it, for every length in `lengths` (training and held-out rows),
  with the tokenizer of `tokenizer_fingerprint`."""
  again = (f"prepare it again with this config (python -m bertjax.data.prepare "
           f"--config=... --input=TOKENIZED --output=DIR) or train with the settings it "
           f"was built with")
  builder = builder_name(nsp, data_cfg.packing)
  if manifest["builder"] != builder:
    field = ("config.objectives with 'nsp'" if nsp else
             f"config.objectives without 'nsp', config.data.packing={builder!r}")
    raise ConfigError(f"prepared corpus {spec} holds {manifest['builder']!r} examples "
                      f"but this run ({field}) trains on {builder!r} examples: {again}")
  settings = {"eval_fraction": data_cfg.eval_fraction, "line_breaks": data_cfg.line_breaks}
  if nsp:
    settings.update(dupe_factor=data_cfg.dupe_factor, short_seq_prob=data_cfg.short_seq_prob)
  # Prepared before line_breaks was recorded: a line break was a space.
  manifest = {"line_breaks": "space", **manifest}
  for field, value in settings.items():
    if manifest[field] != value:
      raise ConfigError(f"prepared corpus {spec} was built with config.data.{field}="
                        f"{manifest[field]!r} but this run has {value!r}: {again}")
  if manifest["tokenizer"]["fingerprint"] != tokenizer_fingerprint:
    raise ConfigError(
        f"prepared corpus {spec} was tokenized with another tokenizer than this run's "
        f"(fingerprint {manifest['tokenizer']['fingerprint']} vs {tokenizer_fingerprint}"
        f"): train with --config.data.tokenizer.path={spec}/{TOKENIZER_DIR}")
  missing = [train_split(t) for t in lengths if train_split(t) not in manifest["splits"]]
  held = [eval_split(t) for t in lengths if eval_split(t) not in manifest["splits"]]
  if held and not missing:
    raise ConfigError(
        f"prepared corpus {spec} has no held-out rows {', '.join(held)} (prepared before "
        "each length phase was evaluated at its own length): rerun the python -m "
        "bertjax.data.prepare --config command that built it, which adds them")
  if missing:
    raise ConfigError(
        f"prepared corpus {spec} has no {', '.join(missing)} (it holds "
        f"{', '.join(sorted(manifest['splits']))}): the config's length phases / "
        f"max_seq_length differ from the ones it was built for; {again}")


def split_rows(manifest: dict[str, Any], spec: str, split: str) -> rows_lib.FileRows:
  """The rows of `split` (e.g. 'train-128'), read from its shards on demand."""
  info = manifest["splits"][split]
  dtype = rows_lib.row_dtype(info["length"], np.dtype(manifest["ids"]))
  root = epath.Path(spec)
  return rows_lib.FileRows([str(root / path) for path, _ in info["shards"]],
                           [count for _, count in info["shards"]], dtype)


def unigram_counts(manifest: dict[str, Any], spec: str) -> np.ndarray:
  """[V] int64 counts of every id in the training documents."""
  data = (epath.Path(spec) / manifest["unigram_counts"]).read_bytes()
  return np.load(io.BytesIO(data))
