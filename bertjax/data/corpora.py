"""One source of a run's corpus as example rows: a prepared directory read in place, or
raw text (or a tokenized directory) built in memory, both split the same way.

A directory `prepare --config` built (`manifest.json`) is checked against the config
and read by random access (`manifest.split_rows`); anything else below
`config.data.raw_text_limit_mb` is read (`bertjax.data.sources`: every format), its
documents split into training and held-out ones (`permutation.held_out` of the seed:
the same documents `prepare` holds out), tokenized and built into rows at every length
of the length phases, training and held-out alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bertjax.data import builders, manifest, permutation, prepare_tokens, rows as rows_lib
from bertjax.data import seeds, sources as sources_lib
from bertjax.errors import DataError


@dataclasses.dataclass
class Corpus:
  """One source's example rows.

  train / held_out: {length: rows} at every phase length; train_tokens: {length: real
  tokens in the training rows}; counts [V] int64 training token counts; text:
  documents, sentences, tokens, characters of the whole source (n_i of the
  multilingual sampling); documents: (train, held-out) counts.
  """

  train: dict[int, Any]
  train_tokens: dict[int, int]
  held_out: dict[int, Any]
  counts: np.ndarray
  text: dict[str, int]
  documents: tuple[int, int]
  prepared: bool


def prepared(spec: str, data_cfg, fingerprint: str, *, nsp: bool,
             lengths: list[int]) -> Corpus:
  """A directory built by `prepare --config`: checked against the config, read in place."""
  info = manifest.load(spec)
  manifest.check(info, spec, data_cfg, fingerprint, nsp=nsp, lengths=lengths)
  return Corpus(
      train={t: manifest.split_rows(info, spec, manifest.train_split(t)) for t in lengths},
      train_tokens={t: info["splits"][manifest.train_split(t)]["tokens"] for t in lengths},
      held_out={t: manifest.split_rows(info, spec, manifest.eval_split(t)) for t in lengths},
      counts=manifest.unigram_counts(info, spec), text=info["text"],
      documents=(info["documents"]["train"], info["documents"]["eval"]), prepared=True)


def in_memory(spec: str, data_cfg, tokenizer, *, seed: int, nsp: bool, lengths: list[int],
              tokenized: bool) -> Corpus:
  """Raw text (or a tokenized directory) below the size limit, built in memory. Its
  held-out split and rows depend on the seed, not on where the source stands among a
  mixture's (as a prepared directory's do not)."""
  limit = data_cfg.raw_text_limit_mb * 2**20
  size = (prepare_tokens.text_bytes(spec) if tokenized
          else sources_lib.text_bytes(spec, data_cfg.text_field))
  if limit and size is not None and size > limit:
    raise sources_lib.too_large(spec, size, limit)
  if tokenized:
    documents = list(prepare_tokens.read_documents(spec))
    characters = prepare_tokens.summary(spec).get("characters", 0)
  else:  # (the limit checked as it reads, where the files do not tell their size)
    text = sources_lib.load_documents(spec, data_cfg.text_field, limit_chars=limit or None,
                                      line_breaks=data_cfg.line_breaks)
    characters = sum(len(s) for d in text for s in d)
    documents = builders.tokenize_documents(text, tokenizer, data_cfg.line_breaks)
    del text
  n = len(documents)
  held = permutation.held_out(np.arange(n), n, data_cfg.eval_fraction,
                              seeds.stream_seed(seed, seeds.SPLIT, 0))
  if n - int(held.sum()) < 2:
    raise DataError(f"corpus {spec!r} has {n} non-empty documents: too few to hold out "
                    f"{int(held.sum())} for evaluation and train on the rest; give more "
                    "documents (blank lines separate them)")
  train = [documents[i] for i in np.flatnonzero(~held)]
  held_out = [documents[i] for i in np.flatnonzero(held)]
  words, ids = tokenizer.word_starts(), rows_lib.id_dtype(tokenizer.vocab_size)

  def build(docs, length, dupe_factor, *stream):
    if nsp:
      examples = builders.create_nsp_examples(
          docs, tokenizer, max_seq_length=length, short_seq_prob=data_cfg.short_seq_prob,
          dupe_factor=dupe_factor,
          rng=np.random.default_rng(seeds.stream_seed(seed, *stream)))
    else:
      examples = builders.create_packed_examples(
          docs, tokenizer, max_seq_length=length,
          packing=data_cfg.packing, isolate_documents=True)
    return rows_lib.MemoryRows(rows_lib.encode(examples, words, ids))

  flat = np.concatenate([np.asarray(s, np.int64) for d in train for s in d])
  built = {t: build(train, t, data_cfg.dupe_factor, seeds.TRAIN_EXAMPLES, 0, i)
           for i, t in enumerate(lengths)}
  # Held-out pairs at max_seq_length keep the stream they always had; other lengths
  # draw their own.
  last = data_cfg.max_seq_length
  return Corpus(
      train=built, train_tokens={t: int(r.rows["length"].sum()) for t, r in built.items()},
      held_out={t: build(held_out, t, 1, seeds.EVAL_EXAMPLES, 0, *([t] if t != last else []))
                for t in lengths},
      counts=np.bincount(flat, minlength=tokenizer.vocab_size).astype(np.int64),
      text={"documents": n, "sentences": sum(map(len, documents)),
            "tokens": sum(len(s) for d in documents for s in d), "characters": characters},
      documents=(len(train), len(held_out)), prepared=False)
