"""Packing: FULL-SENTENCES fill, DOC-SENTENCES boundaries, per-document attention
isolation (segment_ids, restarting position_ids) in the builder, pipeline and model."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.data import pipeline, builders
from bertjax.train import state as state_lib
from configs import bert_tiny
from tests import helpers

MAX_LEN = 128


def _pack(tokenized, tokenizer, **kw):
  return builders.create_packed_examples(tokenized, tokenizer, max_seq_length=MAX_LEN,
                                            **kw)


def test_full_sentences_fills_rows(tokenized, tokenizer):
  ex = _pack(tokenized, tokenizer)
  assert ex.segment_ids is None
  assert ex.lengths.sum() / ex.input_ids.size >= 0.99
  # Every corpus token is kept, in order (minus [CLS], the final [SEP], the separators).
  text = [t for row, n in zip(ex.input_ids, ex.lengths) for t in row[1:n - 1]
          if t != tokenizer.sep_id]
  assert text == [t for d in tokenized for s in d for t in s]
  assert (ex.source_documents[:, 0] < ex.source_documents[:, 1]).mean() > 0.3


def test_doc_sentences_never_crosses_documents(tokenized, tokenizer):
  ex = _pack(tokenized, tokenizer, packing="doc_sentences")
  first, last = ex.source_documents.T
  np.testing.assert_array_equal(first, last)
  for row, n, d in zip(ex.input_ids, ex.lengths, first):
    body = list(row[1:n - 1])
    assert tokenizer.sep_id not in body  # no document separator inside a row
    doc = [t for s in tokenized[d] for t in s]
    assert pipeline_offsets(doc, body)
  assert ex.lengths.sum() / ex.input_ids.size < 0.99  # it pays for it in padding


def pipeline_offsets(haystack, needle) -> bool:
  """Whether `needle` occurs contiguously in `haystack`."""
  hay = np.asarray(haystack, np.int32).tobytes()
  sub = np.asarray(needle, np.int32).tobytes()
  k = hay.find(sub)
  while k >= 0 and k % 4:
    k = hay.find(sub, k + 1)
  return k >= 0


def test_isolation_ids(tokenized, tokenizer):
  ex = _pack(tokenized, tokenizer, isolate_documents=True, position_offset=2)
  plain = _pack(tokenized, tokenizer)
  np.testing.assert_array_equal(ex.input_ids, plain.input_ids)
  for r in range(len(ex)):
    n = ex.lengths[r]
    seg, pos, ids = ex.segment_ids[r], ex.position_ids[r], ex.input_ids[r]
    assert (seg[n:] == 0).all() and seg[0] == 1 and (np.diff(seg[:n]) >= 0).all()
    docs = ex.source_documents[r, 1] - ex.source_documents[r, 0] + 1
    assert seg[n - 1] == docs
    starts = np.flatnonzero(np.diff(seg[:n])) + 1
    assert (ids[starts - 1] == tokenizer.sep_id).all()  # a separator ends each document
    assert (pos[np.r_[0, starts]] == 2).all()
    assert (np.diff(pos[:n])[np.diff(seg[:n]) == 0] == 1).all()


@pytest.fixture(scope="module")
def tiny_model():
  config = helpers.tiny_config()
  model = state_lib.build_model(config)
  ids = jnp.ones((1, 16), jnp.int32)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), ids))["params"]

  @jax.jit
  def hidden(ids, mask, segment_ids, position_ids):
    return model.apply({"params": params}, ids, mask, jnp.zeros_like(ids), position_ids,
                       segment_ids, method=lambda m, *a: m.encoder(*a))["last_hidden_state"]
  return config, hidden


def test_isolation_blocks_cross_document_attention(tiny_model):
  """Two documents in one row: changing the second never moves the first's outputs,
  and each document's outputs equal those of the document alone in its own row."""
  config, hidden = tiny_model
  rng = np.random.default_rng(0)
  V, T = config.model.vocab_size, 16
  a, b, b2 = (rng.integers(5, V, size=n).tolist() for n in (6, 7, 7))
  tok = _ToyTokenizer()
  ex = builders.create_packed_examples([[a], [b]], tok, max_seq_length=T,
                                          isolate_documents=True)
  ex2 = builders.create_packed_examples([[a], [b2]], tok, max_seq_length=T,
                                           isolate_documents=True)
  assert len(ex) == 1 and ex.segment_ids[0].max() == 2
  row, row2 = ex[0], ex2[0]
  n_a = int((row["segment_ids"] == 1).sum())

  def run(r, isolate=True):
    x = {k: jnp.asarray(v)[None] for k, v in r.items()}
    return np.asarray(hidden(x["input_ids"], x["attention_mask"],
                             x["segment_ids"] if isolate else None,
                             x["position_ids"] if isolate else None))[0]

  h, h2 = run(row), run(row2)
  np.testing.assert_allclose(h[:n_a], h2[:n_a], atol=1e-6)
  assert np.abs(h[n_a:] - h2[n_a:]).max() > 1e-2  # the second document did change
  # Without isolation the first document sees the second.
  assert np.abs(run(row, False)[:n_a] - run(row2, False)[:n_a]).max() > 1e-3
  # Document B alone: its tokens first, positions from 0, its own [SEP] closing it.
  n = int(row["attention_mask"].sum())
  alone = np.zeros(T, np.int32)
  alone[:n - n_a] = row["input_ids"][n_a:n]
  single = {"input_ids": alone, "attention_mask": (alone > 0).astype(np.int32),
            "segment_ids": (alone > 0).astype(np.int32), "position_ids": np.arange(T)}
  np.testing.assert_allclose(run(single)[:n - n_a], h[n_a:n], atol=1e-5)


class _ToyTokenizer:
  """BERT-style specials over a toy vocabulary: [PAD]=0 [CLS]=2 [SEP]=3."""
  pad_id, cls_id, sep_id = 0, 2, 3

  def num_special(self, pair):
    return 3 if pair else 2

  def build_inputs(self, a, b=None):
    ids = [self.cls_id, *a, self.sep_id]
    return ids, [0] * len(ids)


def test_pipeline_isolated_batches(tokenizer):
  cfg = bert_tiny.get_config().data
  cfg.max_seq_length = MAX_LEN
  cfg.isolate_documents = True
  data = pipeline.build_pretraining_data(cfg, tokenizer, batch_size=4, seed=0, nsp=False,
                                         position_offset=2)
  batch = next(iter(data.train))
  for b in (batch, data.eval_batches[0]):
    assert b["segment_ids"].shape == b["position_ids"].shape == (4, MAX_LEN)
    assert (b["segment_ids"] > 0).sum() == b["attention_mask"].sum()
    assert b["position_ids"].min() == 2
  assert (batch["segment_ids"].max(axis=1) > 1).any()
