"""Pretraining example builders: BERT's NSP pairs and RoBERTa's FULL-SENTENCES and
DOC-SENTENCES packing (or a plain stream of the documents' tokens), optionally with
per-document attention isolation.

Both take tokenized documents (each a list of sentences, each a list of ids without
special tokens) and return `Examples`: fixed-length numpy arrays plus lengths, with the
special tokens of the tokenizer's style already in place. Masking happens later, per
epoch, in the input pipeline (`masking.py`), so examples are stored unmasked.

`create_nsp_examples` reproduces google-research/bert `create_pretraining_data.py`
(`create_training_instances`, `create_instances_from_document`, `truncate_seq_pair`)
decision for decision, with a numpy Generator in place of Python's `random.Random`
(`rng.randint(a, b)` there is `rng.integers(a, b + 1)` here).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

import numpy as np

from bertjax.data import tokenizer as tok_lib
from bertjax.errors import ConfigError

Document = list[list[int]]  # sentences, each a list of token ids (no special tokens)
# Sentences per batched tokenizer call: large enough to amortise the call, small
# enough that a corpus's encodings are never all held at once.
_TOKENIZE_CHUNK = 1 << 16


@dataclasses.dataclass(frozen=True, eq=False)
class Examples:
  """N fixed-length examples of length T, stored compactly.

  input_ids [N, T] int32: ids with special tokens, right-padded with `pad_id`.
  token_type_ids [N, T] int8: segment ids (0 for A, 1 for B in BERT style).
  lengths [N] int32: real (non-padding) tokens per example.
  next_sentence_labels [N] int8: 0 = B follows A, 1 = B is random (0 when packed).
  source_documents [N, 2] int32: the documents A and B were taken from (indices into
    the document list given to the builder; packed rows give their first and last).
  segment_ids [N, T] int16 or None: packed rows with isolated documents: 1 + the
    index of each token's document within its row (0 on padding), so attention stays
    inside a document.
  position_ids [N, T] int16 or None: with `segment_ids`, positions restarting at
    `position_offset` at each document's first token.
  """

  input_ids: np.ndarray
  token_type_ids: np.ndarray
  lengths: np.ndarray
  next_sentence_labels: np.ndarray
  source_documents: np.ndarray
  segment_ids: np.ndarray | None = None
  position_ids: np.ndarray | None = None

  def __len__(self) -> int:
    return len(self.lengths)

  def __getitem__(self, i: int | np.ndarray) -> dict[str, np.ndarray]:
    """One example (int i) or a batch (i [b]): input_ids, token_type_ids,
    attention_mask [T] / [b, T] int32 and next_sentence_labels [] / [b] int32;
    segment_ids, position_ids [T] / [b, T] int32 when isolated."""
    ids = self.input_ids[i]
    out = {
        "input_ids": ids,
        "attention_mask": (np.arange(ids.shape[-1]) < self.lengths[i][..., None]
                           ).astype(np.int32),
        "token_type_ids": self.token_type_ids[i].astype(np.int32),
        "next_sentence_labels": self.next_sentence_labels[i].astype(np.int32),
    }
    if self.segment_ids is not None:
      out["segment_ids"] = self.segment_ids[i].astype(np.int32)
      out["position_ids"] = self.position_ids[i].astype(np.int32)
    return out

  def subset(self, index: np.ndarray) -> Examples:
    """The examples at `index` [M], in that order."""
    return Examples(*(None if getattr(self, f.name) is None else getattr(self, f.name)[index]
                      for f in dataclasses.fields(self)))


def tokenize_documents(documents: Sequence[Sequence[str]], tokenizer,
                       line_breaks: str = "space") -> list[Document]:
  """Tokenizes the units (`tok_lib.unit_texts` of `line_breaks`) in batched calls of
  `_TOKENIZE_CHUNK` (the library's threads, bounded memory); drops empty units and
  documents.

  Returns documents aligned with the input except that empty ones are removed.
  """
  flat = [s for doc in documents for s in tok_lib.unit_texts(doc, line_breaks)]
  ids = [x for i in range(0, len(flat), _TOKENIZE_CHUNK)
         for x in tokenizer.tokenize_batch(flat[i:i + _TOKENIZE_CHUNK])]
  out, k = [], 0
  for doc in documents:
    sentences = [s for s in ids[k:k + len(doc)] if s]
    k += len(doc)
    if sentences:
      out.append(sentences)
  return out


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                      rng: np.random.Generator) -> None:
  """Truncates the longer side, one token at a time from its front or back at random
  (in place), until the pair fits in `max_num_tokens`."""
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    if rng.random() < 0.5:
      del trunc_tokens[0]
    else:
      trunc_tokens.pop()


def create_instances_from_document(
    all_documents: Sequence[Document], document_index: int, max_num_tokens: int,
    short_seq_prob: float, rng: np.random.Generator
) -> list[tuple[list[int], list[int], int, int]]:
  """BERT's NSP instances from one document.

  Returns (tokens_a, tokens_b, is_random_next, b_document_index) tuples; the pair fits
  in `max_num_tokens` (max_seq_length minus the special tokens).
  """
  document = all_documents[document_index]
  # Usually fill the whole sequence, but sometimes use a shorter one to reduce the
  # mismatch between pretraining and (short) fine-tuning inputs.
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = int(rng.integers(2, max_num_tokens + 1))
  instances = []
  current_chunk, current_length = [], 0
  i = 0
  while i < len(document):
    segment = document[i]
    current_chunk.append(segment)
    current_length += len(segment)
    if i == len(document) - 1 or current_length >= target_seq_length:
      if current_chunk:
        # How many segments of the chunk go into A.
        a_end = 1
        if len(current_chunk) >= 2:
          a_end = int(rng.integers(1, len(current_chunk)))
        tokens_a = [t for j in range(a_end) for t in current_chunk[j]]
        tokens_b = []
        b_document_index = document_index
        if len(current_chunk) == 1 or rng.random() < 0.5:
          is_random_next = 1
          target_b_length = target_seq_length - len(tokens_a)
          # Ten tries at another document (one only fails on single-document corpora).
          for _ in range(10):
            b_document_index = int(rng.integers(0, len(all_documents)))
            if b_document_index != document_index:
              break
          random_document = all_documents[b_document_index]
          random_start = int(rng.integers(0, len(random_document)))
          for j in range(random_start, len(random_document)):
            tokens_b.extend(random_document[j])
            if len(tokens_b) >= target_b_length:
              break
          # The chunk's segments after A were not used: put them back for the next one.
          i -= len(current_chunk) - a_end
        else:
          is_random_next = 0
          for j in range(a_end, len(current_chunk)):
            tokens_b.extend(current_chunk[j])
        truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        instances.append((tokens_a, tokens_b, is_random_next, b_document_index))
      current_chunk, current_length = [], 0
    i += 1
  return instances


def create_nsp_examples(documents: Sequence[Document], tokenizer, *, max_seq_length: int,
                        short_seq_prob: float, dupe_factor: int,
                        rng: np.random.Generator) -> Examples:
  """BERT's `create_training_instances`: `dupe_factor` passes over the (shuffled)
  documents, each pairing them differently, then the instances shuffled."""
  order = rng.permutation(len(documents))
  shuffled = [documents[k] for k in order]
  rows, sources = _nsp_rows(shuffled, range(len(shuffled)), tokenizer, max_seq_length,
                            short_seq_prob, dupe_factor, rng)
  sources = order[np.asarray(sources, np.int64).reshape(-1, 2)]
  perm = rng.permutation(len(rows))
  return _to_examples([rows[k] for k in perm], sources[perm], max_seq_length,
                      tokenizer.pad_id)


def nsp_examples_of(all_documents: Sequence[Document], document_indices: Sequence[int],
                    tokenizer, *, max_seq_length: int, short_seq_prob: float,
                    dupe_factor: int, rng: np.random.Generator) -> Examples:
  """The NSP examples of the documents at `document_indices` only, `dupe_factor`
  passes over them, each random B drawn from all of `all_documents` (any sequence with
  random access, e.g. a view of prepared shards): one shard of `prepare`'s offline
  build, in document order (training shuffles globally). source_documents index
  `all_documents`."""
  rows, sources = _nsp_rows(all_documents, document_indices, tokenizer, max_seq_length,
                            short_seq_prob, dupe_factor, rng)
  return _to_examples(rows, sources, max_seq_length, tokenizer.pad_id)


def _nsp_rows(documents: Sequence[Document], document_indices: Sequence[int], tokenizer,
              max_seq_length: int, short_seq_prob: float, dupe_factor: int,
              rng: np.random.Generator) -> tuple[list, list]:
  """(ids, token types, is_random_next) rows and (A, B) document indices of
  `dupe_factor` passes of `create_instances_from_document` over `document_indices`."""
  max_num_tokens = max_seq_length - tokenizer.num_special(pair=True)
  if max_num_tokens < 2:
    raise ConfigError(f"config.data.max_seq_length={max_seq_length} leaves no room for "
                      "a sentence pair: use at least 8")
  rows, sources = [], []
  for _ in range(dupe_factor):
    for document_index in document_indices:
      for a, b, is_random, b_index in create_instances_from_document(
          documents, document_index, max_num_tokens, short_seq_prob, rng):
        rows.append((*tokenizer.build_inputs(a, b), is_random))
        sources.append((document_index, b_index))
  return rows, sources


# config.data.packing of rows without NSP: 'full_sentences' (RoBERTa: rows filled across
# documents, a separator token between two), 'stream' (filled the same way, documents
# back to back without one: transformers' run_mlm.py over untokenized specials) or
# 'doc_sentences' (a row ends with its document).
PACKINGS = ("full_sentences", "stream", "doc_sentences")


def create_packed_examples(documents: Sequence[Document], tokenizer, *,
                           max_seq_length: int, packing: str = "full_sentences",
                           isolate_documents: bool = False,
                           position_offset: int = 0) -> Examples:
  """RoBERTa's packing of contiguous text into rows of `max_seq_length`.

  packing='full_sentences' fills every row completely, crossing document boundaries
  with an extra separator token between documents (only the last row has padding);
  'stream' fills them the same way without the separator; 'doc_sentences' ends a row
  at each document's end instead. Text that does not fit in a row continues in the
  next one.
  With `isolate_documents`, each row also gets `segment_ids` (no token attends to
  another document's tokens) and `position_ids` restarting at `position_offset` for
  each document; a separator belongs to the document it ends, [CLS] to the first.
  """
  max_num_tokens = max_seq_length - tokenizer.num_special(pair=False)
  if max_num_tokens < 1:
    raise ConfigError(f"config.data.max_seq_length={max_seq_length} leaves no room for "
                      "text: use at least 8")
  rows, sources, row_spans = [], [], []
  current: list[int] = []
  spans: list[list[int]] = []  # [document, tokens] per document in the current row

  def emit():
    rows.append((*tokenizer.build_inputs(current), 0))
    sources.append((spans[0][0], spans[-1][0]))
    row_spans.append([n for _, n in spans])
    current.clear()
    spans.clear()

  for d, document in enumerate(documents):
    if current and packing == "doc_sentences":
      emit()
    if current and packing == "full_sentences":  # a separator ends the previous one
      current.append(tokenizer.sep_id)
      spans[-1][1] += 1
      if len(current) == max_num_tokens:
        emit()
    tokens = list(itertools.chain.from_iterable(document))
    pos = 0
    while pos < len(tokens):
      if not spans or spans[-1][0] != d:
        spans.append([d, 0])
      take = min(max_num_tokens - len(current), len(tokens) - pos)
      current.extend(tokens[pos:pos + take])
      spans[-1][1] += take
      pos += take
      if len(current) == max_num_tokens:
        emit()
  if current:
    emit()
  examples = _to_examples(rows, sources, max_seq_length, tokenizer.pad_id)
  if not isolate_documents:
    return examples
  segment_ids = np.zeros(examples.input_ids.shape, np.int16)
  position_ids = np.full(examples.input_ids.shape, position_offset, np.int16)
  for r, counts in enumerate(row_spans):
    counts = np.asarray(counts)
    counts[0] += 1  # [CLS]
    counts[-1] += 1  # the closing separator
    n = int(counts.sum())
    segment_ids[r, :n] = np.repeat(np.arange(1, len(counts) + 1), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    position_ids[r, :n] = np.arange(n) - starts + position_offset
  return dataclasses.replace(examples, segment_ids=segment_ids, position_ids=position_ids)


def _to_examples(rows: list[tuple[list[int], list[int], int]],
                 sources: list[tuple[int, int]], max_seq_length: int,
                 pad_id: int) -> Examples:
  """Pads (ids, token types, label) rows into `Examples` arrays."""
  n = len(rows)
  input_ids = np.full((n, max_seq_length), pad_id, np.int32)
  token_type_ids = np.zeros((n, max_seq_length), np.int8)
  lengths = np.zeros(n, np.int32)
  labels = np.zeros(n, np.int8)
  for r, (ids, types, label) in enumerate(rows):
    input_ids[r, :len(ids)] = ids
    token_type_ids[r, :len(types)] = types
    lengths[r] = len(ids)
    labels[r] = label
  return Examples(input_ids, token_type_ids, lengths, labels,
                  np.asarray(sources, np.int32).reshape(n, 2))
