"""Contextual vectors from a pretrained encoder: per token, per word, per sentence.

    embedder = Embedder(load_pretrained(path), layers="mean4")
    vectors, words, segments = embedder.words(["the river bank was muddy ."])[0]

Layers (`layers=`): 'last', an integer layer (0 = embedding output, L = last, negative
counts from the end), or the last four layers combined: 'mean4', 'sum4', 'concat4'
(layers L-3 .. L side by side, [4E]) — the paper's feature-based choices (§5.4).

Words are the text's whitespace-separated pieces, or character spans the caller names
(a span becomes a word of its own). Each word is tokenised on its own, with a leading
space when the text has one before it, so the subwords are those of the whole text and
each subword knows its word; word vectors pool their subwords ('first' or 'mean').

Texts longer than the model's window are split into overlapping windows; each token
takes its vector from the window where it has the most context on its poorer side
(BERT's `_check_is_max_context`), so nothing is truncated. Rows are sorted by length,
padded to a multiple of 16 tokens and sharded over the local devices (batch axis).
"""

from __future__ import annotations

import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.checkpoint.pretrained import Pretrained
from bertjax.console.progress import Progress
from bertjax.errors import ConfigError, DataError

LAYER_NAMES = ("last", "mean4", "sum4", "concat4")
WORD_POOLS = ("first", "mean")
SENTENCE_POOLS = ("cls", "mean")
_BUCKET = 16  # padded lengths are multiples of this: few compilations

Span = tuple[int, int]


def parse_layers(layers: str | int, num_layers: int) -> str | int:
  """Validates a layer choice against a model with `num_layers` blocks; integers
  (or their strings) index hidden_states [L+1] and come back as non-negative ints."""
  if isinstance(layers, str) and re.fullmatch(r"-?\d+", layers.strip()):
    layers = int(layers)
  if isinstance(layers, int):
    if not -(num_layers + 1) <= layers <= num_layers:
      raise ConfigError(f"layers={layers}: the model has hidden states 0..{num_layers} "
                        "(0 = embeddings); pick one in that range.")
    return layers % (num_layers + 1)
  if layers not in LAYER_NAMES:
    raise ConfigError(f"layers={layers!r}: use an integer or one of {LAYER_NAMES}.")
  if layers.endswith("4") and num_layers < 4:
    raise ConfigError(f"layers={layers!r} needs 4 layers but the model has {num_layers}; "
                      "use 'last' or an integer.")
  return layers


def combine_layers(hidden_states, layers: str | int):
  """hidden_states [L+1, ..., E] (numpy or jax) -> [..., E], or [..., 4E] for concat4."""
  xp = np if isinstance(hidden_states, np.ndarray) else jnp
  if isinstance(layers, int):
    return hidden_states[layers]
  if layers == "last":
    return hidden_states[-1]
  last4 = hidden_states[-4:]
  if layers == "mean4":
    return last4.mean(0)
  if layers == "sum4":
    return last4.sum(0)
  return xp.concatenate(list(last4), axis=-1)


def windows(n: int, size: int, overlap: int) -> list[Span]:
  """Content ranges [start, end) covering n tokens with windows of `size` tokens,
  consecutive windows sharing `overlap` tokens; the last one ends at n."""
  if n <= size:
    return [(0, n)]
  starts = list(range(0, n - size, size - overlap)) + [n - size]
  return [(s, s + size) for s in starts]


def best_window(n: int, spans: Sequence[Span]) -> np.ndarray:
  """[n] index of the window giving each token the most context on its poorer side
  (ties: the earlier window)."""
  score = np.full((len(spans), n), -1)
  for w, (s, e) in enumerate(spans):
    j = np.arange(s, e)
    score[w, s:e] = np.minimum(j - s, e - 1 - j)
  return score.argmax(0)


def segments(text: str, spans: Sequence[Span] = ()) -> list[Span]:
  """Word spans of `text`: its whitespace-separated pieces, with each span in `spans`
  cut out as a word of its own (pieces it splits keep their remainders)."""
  for s, e in spans:
    if not 0 <= s < e <= len(text) or not text[s:e].strip():
      raise DataError(f"span [{s}, {e}) is not a non-blank part of the text {text!r}.")
  spans = sorted(set(spans))
  for (_, e1), (s2, _) in zip(spans, spans[1:]):
    if s2 < e1:
      raise DataError(f"spans {spans} overlap in the text {text!r}; give disjoint spans.")
  out, pos = [], 0
  for s, e in list(spans) + [(len(text), len(text))]:
    out += [(pos + m.start(), pos + m.end()) for m in re.finditer(r"\S+", text[pos:s])]
    if e > s:
      out.append((s, e))
    pos = e
  return out


def find_all(text: str, word: str) -> list[Span]:
  """Character spans of the whole-word, case-insensitive matches of `word`."""
  return [m.span() for m in re.finditer(rf"(?<!\w){re.escape(word)}(?!\w)", text,
                                        re.IGNORECASE)]


def find_word(text: str, word: str, occurrence: int = 0) -> Span:
  """Character span of the `occurrence`-th whole-word, case-insensitive match."""
  matches = find_all(text, word)
  if len(matches) <= occurrence:
    raise DataError(f"{word!r} occurs {len(matches)} time(s) in {text!r}; cannot take "
                    f"occurrence {occurrence}.")
  return matches[occurrence]


class Embedder:
  """Runs a `Pretrained` model over texts and returns numpy float32 vectors."""

  def __init__(self, pretrained: Pretrained, layers: str | int = "last",
               batch_size: int = 32, max_length: int = 512, overlap: int = 128,
               progress: bool = False):
    config = pretrained.config
    self.tokenizer = pretrained.tokenizer
    self.layers = parse_layers(layers, config.num_layers)
    self.max_length = min(max_length, config.max_length)
    self.window = self.max_length - self.tokenizer.num_special(False)
    if self.window < 2:
      raise ConfigError(f"max_length={max_length} leaves {self.window} tokens per "
                        "window; give at least 4.")
    if overlap < 0:
      raise ConfigError(f"overlap={overlap}: give a non-negative number of tokens.")
    self.overlap = min(overlap, self.window // 2)  # windows must advance
    self.progress = progress
    devices = jax.local_devices()
    self.batch_size = -(-max(batch_size, 1) // len(devices)) * len(devices)
    mesh = Mesh(np.array(devices), ("data",))
    self._rows = NamedSharding(mesh, PartitionSpec("data"))
    self._params = jax.device_put(pretrained.params, NamedSharding(mesh, PartitionSpec()))
    model, chosen = pretrained.model, self.layers

    def forward(params, ids, mask):
      """ids, mask [B, T] -> combined layers [B, T, D] (float32)."""
      out = model.apply({"params": params}, ids, mask, jnp.zeros_like(ids),
                        method="encode")
      return combine_layers(out["hidden_states"], chosen).astype(jnp.float32)

    self._forward = jax.jit(forward, out_shardings=self._rows)

  def _run(self, id_lists: Sequence[Sequence[int]]) -> tuple[list[np.ndarray], np.ndarray]:
    """Content-token vectors of each id list ([n_i, D], specials excluded) and the
    [CLS] vector of each [N, D] (the mean over its windows)."""
    rows = [(i, s, e) for i, ids in enumerate(id_lists)
            for s, e in windows(len(ids), self.window, self.overlap)]
    order = sorted(range(len(rows)), key=lambda r: rows[r][2] - rows[r][1])
    outputs: list[np.ndarray] = [None] * len(rows)
    batches = range(0, len(order), self.batch_size)
    for b in Progress("embed", len(batches), "batches", enable=self.progress).wrap(batches):
      chunk = order[b:b + self.batch_size]
      inputs = [self.tokenizer.build_inputs(id_lists[rows[r][0]][rows[r][1]:rows[r][2]])[0]
                for r in chunk]
      longest = max(len(x) for x in inputs)
      T = min(-(-longest // _BUCKET) * _BUCKET, self.max_length)
      ids = np.full((self.batch_size, T), self.tokenizer.pad_id, np.int32)
      mask = np.zeros((self.batch_size, T), np.int32)
      for k, x in enumerate(inputs):
        ids[k, :len(x)], mask[k, :len(x)] = x, 1
      out = np.asarray(self._forward(self._params, jax.device_put(ids, self._rows),
                                     jax.device_put(mask, self._rows)))
      for k, (r, x) in enumerate(zip(chunk, inputs)):
        outputs[r] = out[k, :len(x)]
    vectors, cls, first = [], [], 0
    for i, ids in enumerate(id_lists):
      spans = windows(len(ids), self.window, self.overlap)
      outs = outputs[first:first + len(spans)]
      first += len(spans)
      owner = best_window(len(ids), spans)
      vec = np.zeros((len(ids), outs[0].shape[-1]), np.float32)
      for w, (s, _) in enumerate(spans):
        j = np.flatnonzero(owner == w)
        vec[j] = outs[w][1 + j - s]  # +1: the [CLS] (<s>) in front
      vectors.append(vec)
      cls.append(np.mean([o[0] for o in outs], axis=0))
    return vectors, np.stack(cls)

  def tokens(self, texts: Sequence[str]) -> list[tuple[np.ndarray, list[str]]]:
    """For each text, its subword vectors [n, D] and subword strings (no specials)."""
    id_lists = self.tokenizer.tokenize_batch(list(texts))
    vectors, _ = self._run(id_lists)
    return [(v, [self.tokenizer.id_to_token(i) for i in ids])
            for v, ids in zip(vectors, id_lists)]

  def words(self, texts: Sequence[str], spans: Sequence[Sequence[Span]] | None = None,
            pool: str = "mean") -> list[tuple[np.ndarray, list[str], list[Span]]]:
    """For each text, word vectors [w, D] pooled from their subwords, the words and
    their character spans. `spans[i]`: spans of text i to treat as words. A word the
    tokenizer drops entirely (control characters) gets NaNs."""
    if pool not in WORD_POOLS:
      raise ConfigError(f"word pool {pool!r}: use one of {WORD_POOLS}.")
    spans = spans if spans is not None else [()] * len(texts)
    segs = [segments(t, s) for t, s in zip(texts, spans)]
    pieces = [(" " if s > 0 and t[s - 1].isspace() else "") + t[s:e]
              for t, seg in zip(texts, segs) for s, e in seg]
    piece_ids = iter(self.tokenizer.tokenize_batch(pieces) if pieces else [])
    id_lists, word_of = [], []
    for seg in segs:
      ids = [next(piece_ids) for _ in seg]
      id_lists.append([i for x in ids for i in x])
      word_of.append(np.repeat(np.arange(len(seg)), [len(x) for x in ids]))
    vectors, _ = self._run(id_lists)
    out = []
    for text, seg, vec, owner in zip(texts, segs, vectors, word_of):
      pooled = np.full((len(seg), vec.shape[-1]), np.nan, np.float32)
      for w in np.unique(owner):
        members = vec[owner == w]
        pooled[w] = members[0] if pool == "first" else members.mean(0)
      out.append((pooled, [text[s:e] for s, e in seg], seg))
    return out

  def targets(self, texts: Sequence[str], spans: Sequence[Span], pool: str = "mean"
              ) -> np.ndarray:
    """[N, D] the vector of the word at character span `spans[i]` of text i."""
    found = self.words(texts, [[s] for s in spans], pool)
    return np.stack([vec[seg.index(tuple(span))]
                     for (vec, _, seg), span in zip(found, spans)])

  def sentences(self, texts: Sequence[str], pool: str = "cls") -> np.ndarray:
    """[N, D]: the [CLS] (<s>) vector, or the mean of the content-token vectors."""
    if pool not in SENTENCE_POOLS:
      raise ConfigError(f"sentence pool {pool!r}: use one of {SENTENCE_POOLS}.")
    vectors, cls = self._run(self.tokenizer.tokenize_batch(list(texts)))
    if pool == "cls":
      return cls
    return np.stack([v.mean(0) if len(v) else np.full(cls.shape[1], np.nan, np.float32)
                     for v in vectors])
