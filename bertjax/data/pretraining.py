"""Pretraining example builders: BERT's NSP pairs and RoBERTa's FULL-SENTENCES packing.

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
from typing import Sequence

import numpy as np

from bertjax.errors import ConfigError

Document = list[list[int]]  # sentences, each a list of token ids (no special tokens)


@dataclasses.dataclass(frozen=True, eq=False)
class Examples:
  """N fixed-length examples of length T, stored compactly.

  input_ids [N, T] int32: ids with special tokens, right-padded with `pad_id`.
  token_type_ids [N, T] int8: segment ids (0 for A, 1 for B in BERT style).
  lengths [N] int32: real (non-padding) tokens per example.
  next_sentence_labels [N] int8: 0 = B follows A, 1 = B is random (0 when packed).
  source_documents [N, 2] int32: the documents A and B were taken from (indices into
    the document list given to the builder; packed rows give their first and last).
  """

  input_ids: np.ndarray
  token_type_ids: np.ndarray
  lengths: np.ndarray
  next_sentence_labels: np.ndarray
  source_documents: np.ndarray

  def __len__(self) -> int:
    return len(self.lengths)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    """One example: input_ids, token_type_ids, attention_mask [T] int32 and
    next_sentence_labels [] int32."""
    ids = self.input_ids[i]
    return {
        "input_ids": ids,
        "attention_mask": (np.arange(len(ids)) < self.lengths[i]).astype(np.int32),
        "token_type_ids": self.token_type_ids[i].astype(np.int32),
        "next_sentence_labels": np.int32(self.next_sentence_labels[i]),
    }

  def subset(self, index: np.ndarray) -> Examples:
    """The examples at `index` [M], in that order."""
    return Examples(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))


def tokenize_documents(documents: Sequence[Sequence[str]], tokenizer) -> list[Document]:
  """Tokenizes every sentence in one batched call; drops empty sentences and documents.

  Returns documents aligned with the input except that empty ones are removed.
  """
  flat = [s for doc in documents for s in doc]
  ids = tokenizer.tokenize_batch(flat)
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
  max_num_tokens = max_seq_length - tokenizer.num_special(pair=True)
  if max_num_tokens < 2:
    raise ConfigError(f"config.data.max_seq_length={max_seq_length} leaves no room for "
                      "a sentence pair: use at least 8")
  if dupe_factor < 1:
    raise ConfigError(f"config.data.dupe_factor={dupe_factor} must be >= 1")
  order = rng.permutation(len(documents))
  shuffled = [documents[k] for k in order]
  rows, sources = [], []
  for _ in range(dupe_factor):
    for document_index in range(len(shuffled)):
      for a, b, is_random, b_index in create_instances_from_document(
          shuffled, document_index, max_num_tokens, short_seq_prob, rng):
        rows.append((*tokenizer.build_inputs(a, b), is_random))
        sources.append((order[document_index], order[b_index]))
  perm = rng.permutation(len(rows))
  return _to_examples([rows[k] for k in perm], [sources[k] for k in perm],
                      max_seq_length, tokenizer.pad_id)


def create_packed_examples(documents: Sequence[Document], tokenizer, *,
                           max_seq_length: int) -> Examples:
  """RoBERTa's FULL-SENTENCES: contiguous sentences packed up to `max_seq_length`,
  crossing document boundaries with an extra separator token between documents.

  A sentence longer than a whole row is cut into row-sized pieces.
  """
  max_num_tokens = max_seq_length - tokenizer.num_special(pair=False)
  if max_num_tokens < 1:
    raise ConfigError(f"config.data.max_seq_length={max_seq_length} leaves no room for "
                      "text: use at least 8")
  rows, sources = [], []
  current, first_doc = [], 0

  def emit(last_doc):
    rows.append((*tokenizer.build_inputs(current), 0))
    sources.append((first_doc, last_doc))

  for d, document in enumerate(documents):
    for j, sentence in enumerate(document):
      boundary = j == 0 and bool(current)
      for start in range(0, len(sentence), max_num_tokens):
        piece = sentence[start:start + max_num_tokens]
        if len(current) + len(piece) + boundary > max_num_tokens:
          emit(d - 1 if boundary else d)
          current, boundary = [], False
        if boundary:
          current.append(tokenizer.sep_id)
          boundary = False
        if not current:
          first_doc = d
        current.extend(piece)
  if current:
    emit(len(documents) - 1)
  return _to_examples(rows, sources, max_seq_length, tokenizer.pad_id)


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
