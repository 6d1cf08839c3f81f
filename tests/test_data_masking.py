"""Masking strategies over many examples: token, whole-word, span (SpanBERT), unigram."""

import numpy as np
import pytest

from bertjax.data import masking
from bertjax.data.tokenizer import load_tokenizer
from configs import bert_tiny

T, B = 128, 3000
WORDS = ("the quick brown fox jumps over lazy dogs while unbelievably extraordinary "
         "internationalisation considerations complicate straightforward tokenization").split()


# A fixed WordPiece vocabulary (a trained one breaks ties differently between runs,
# huggingface/tokenizers#1794, and the rates below are tight): the long words split.
PIECES = ("the quick brown fox jumps over lazy dogs while un ##believ ##ably extra "
          "##ordinary international ##isation consider ##ations complic ##ate straight "
          "##forward token ##ization").split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  d = tmp_path_factory.mktemp("vocab")
  letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *PIECES, *letters,
           *("##" + c for c in letters)]
  (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
  return load_tokenizer(str(d / "vocab.txt"))


@pytest.fixture(scope="module")
def batch(tokenizer):
  """[B, T] rows of real words (many split into pieces), [CLS] ... [SEP] + padding."""
  rng = np.random.default_rng(0)
  word_ids = tokenizer.tokenize_batch(WORDS)
  rows = []
  for _ in range(B):
    length = int(rng.integers(20, T - 1))
    ids = [tokenizer.cls_id]
    while len(ids) < length:
      ids.extend(word_ids[rng.integers(len(WORDS))])
    ids = ids[:length] + [tokenizer.sep_id]
    rows.append(ids + [tokenizer.pad_id] * (T - len(ids)))
  return np.array(rows, np.int32)


def _cfg(tokenizer, **overrides):
  data = bert_tiny.get_config().data
  data.max_predictions_per_seq = 64
  for k, v in overrides.items():
    data[k] = v
  counts = np.zeros(tokenizer.vocab_size)
  counts[tokenizer.tokenize("fox")] = 1e6  # A very skewed corpus for the unigram test.
  return masking.MaskingConfig.create(data, tokenizer, token_counts=counts)


def _chosen(out):
  valid = out["masked_lm_weights"] > 0
  rows = np.broadcast_to(np.arange(valid.shape[0])[:, None], valid.shape)
  return rows[valid], out["masked_lm_positions"][valid], valid


@pytest.mark.parametrize("strategy", ["token", "whole_word", "span"])
def test_budget_and_replacement_rates(tokenizer, batch, strategy):
  cfg = _cfg(tokenizer, masking=strategy)
  out = masking.mask_tokens(batch, np.random.default_rng(1), cfg)
  candidates = ~np.isin(batch, cfg.special_ids)
  r, p, _ = _chosen(out)
  assert candidates[r, p].all()
  budget = np.maximum(1, np.round(candidates.sum(1) * 0.15))
  n = out["masked_lm_weights"].sum(1)
  assert (n <= budget).all()
  assert abs(n.sum() / candidates.sum() - 0.15) < 0.005
  new, orig = out["input_ids"][r, p], batch[r, p]
  np.testing.assert_array_equal(out["masked_lm_ids"][out["masked_lm_weights"] > 0], orig)
  tol = 0.01 if strategy != "span" else 0.02  # span decisions are per span (fewer draws)
  assert abs((new == cfg.mask_id).mean() - 0.8) < tol
  assert abs(((new != cfg.mask_id) & (new != orig)).mean() - 0.1) < tol
  assert not np.isin(new[new != cfg.mask_id], cfg.special_ids).any()
  untouched = np.ones(batch.shape, bool)
  untouched[r, p] = False
  np.testing.assert_array_equal(out["input_ids"][untouched], batch[untouched])


def _word_of(batch, cfg):
  starts = cfg.word_starts[batch] | np.isin(batch, cfg.special_ids)
  return np.cumsum(starts, axis=1)


def test_whole_word_chooses_every_piece(tokenizer, batch):
  cfg = _cfg(tokenizer, masking="whole_word")
  out = masking.mask_tokens(batch, np.random.default_rng(2), cfg)
  r, p, _ = _chosen(out)
  chosen = np.zeros(batch.shape, bool)
  chosen[r, p] = True
  words = _word_of(batch, cfg)
  candidates = ~np.isin(batch, cfg.special_ids)
  split_words = 0
  for i in range(200):
    for w in np.unique(words[i][chosen[i]]):
      in_word = (words[i] == w) & candidates[i]
      assert chosen[i][in_word].all(), (i, w)
      split_words += in_word.sum() > 1
  assert split_words > 50  # the test does see multi-piece words


def test_span_lengths_levels_and_boundaries(tokenizer, batch):
  cfg = _cfg(tokenizer, masking="span")
  # Every token a word: span lengths are then in tokens and easy to measure.
  starts = np.ones(batch.shape, bool)
  out = masking.mask_tokens(batch, np.random.default_rng(3), cfg, word_starts=starts)
  r, p, valid = _chosen(out)
  chosen = np.zeros(batch.shape, bool)
  chosen[r, p] = True
  # Span lengths: on long rows with a low rate spans rarely touch and the first span
  # of a row is never cut by the budget, so its length follows the clipped geometric.
  long_cfg = _cfg(tokenizer, masking="span", masked_lm_prob=0.02)
  n, length = 1000, 2000
  ids = np.full((n, length), batch[0, 1], np.int32)
  sparse = masking.mask_tokens(ids, np.random.default_rng(7), long_cfg,
                               word_starts=np.ones(ids.shape, bool))
  pos, w = sparse["masked_lm_positions"], sparse["masked_lm_weights"] > 0
  first = pos[:, 0]
  run = np.ones(n, int)
  while True:
    nxt = (np.take_along_axis(pos, run[:, None], 1)[:, 0] == first + run) & \
        np.take_along_axis(w, run[:, None], 1)[:, 0]
    if not nxt.any():
      break
    run += nxt
  probs = masking.span_length_distribution(0.2, 10)
  hist = np.bincount(run, minlength=12)[1:] / n
  assert abs(run.mean() - (np.arange(1, 11) * probs).sum()) < 0.2
  assert np.abs(hist[:10] - probs).max() < 0.04 and hist[10:].sum() < 0.01
  assert (sparse["masked_lm_weights"].sum(1) == 40).all()  # the 2% budget, exactly
  # Span-level replacement: all tokens of a span share the decision (mask / keep).
  left, right = out["span_left_positions"], out["span_right_positions"]
  rel = out["span_relative_positions"]
  new = out["input_ids"][r, p]
  orig = batch[r, p]
  span_key = np.stack([r, left[valid]], 1)
  decision = np.where(new == cfg.mask_id, 0, np.where(new == orig, 2, 1))
  _, inverse = np.unique(span_key, axis=0, return_inverse=True)
  masked_spans = np.bincount(inverse.ravel(), decision == 0)
  sizes = np.bincount(inverse.ravel())
  assert ((masked_spans == 0) | (masked_spans == sizes)).all()
  # Boundaries lie just outside the span and are never chosen themselves.
  assert (~chosen[r, left[valid]]).all() and (~chosen[r, right[valid]]).all()
  np.testing.assert_array_equal(p - left[valid] - 1, rel[valid])
  assert (left[valid] < p).all() and (p < right[valid]).all()


def test_span_is_whole_words(tokenizer, batch):
  cfg = _cfg(tokenizer, masking="span")
  out = masking.mask_tokens(batch, np.random.default_rng(4), cfg)
  r, p, _ = _chosen(out)
  chosen = np.zeros(batch.shape, bool)
  chosen[r, p] = True
  words = _word_of(batch, cfg)
  candidates = ~np.isin(batch, cfg.special_ids)
  partial = 0
  for i in range(300):
    for w in np.unique(words[i][chosen[i]]):
      in_word = (words[i] == w) & candidates[i]
      partial += not chosen[i][in_word].all()
  # Only the one span that exhausts a row's budget may stop inside a word.
  assert partial <= 300


def test_unigram_random_replacement(tokenizer, batch):
  fox = tokenizer.tokenize("fox")
  for dist, low, high in (("unigram", 0.9, 1.0), ("uniform", 0.0, 0.05)):
    cfg = _cfg(tokenizer, random_token_distribution=dist)
    out = masking.mask_tokens(batch, np.random.default_rng(5), cfg)
    r, p, _ = _chosen(out)
    new, orig = out["input_ids"][r, p], batch[r, p]
    random = new[(new != cfg.mask_id) & (new != orig)]
    assert low <= np.isin(random, fox).mean() <= high, dist


def test_max_predictions_and_single_example(tokenizer, batch):
  for strategy in masking.STRATEGIES:
    cfg = _cfg(tokenizer, masking=strategy, max_predictions_per_seq=5)
    out = masking.mask_tokens(batch, np.random.default_rng(6), cfg)
    assert out["masked_lm_positions"].shape == (B, 5)
    assert out["masked_lm_weights"].sum(1).max() == 5
    one = masking.mask_tokens(batch[0], np.random.default_rng(6), cfg)
    assert one["input_ids"].shape == (T,) and one["masked_lm_ids"].shape == (5,)


@pytest.mark.parametrize("strategy", masking.STRATEGIES)
def test_row_streams_mask_each_row_as_if_alone(tokenizer, batch, strategy):
  """RowStreams: a row's mask depends on (seed, its index) only, not on its batch."""
  cfg = _cfg(tokenizer, masking=strategy)
  rows, index = batch[:16], np.arange(100, 116)
  out = masking.mask_tokens(rows, masking.RowStreams(7, index), cfg)
  for r in (0, 5, 15):
    alone = masking.mask_tokens(rows[r:r + 1], masking.RowStreams(7, index[r:r + 1]), cfg)
    for k, v in alone.items():
      np.testing.assert_array_equal(v[0], out[k][r], err_msg=k)
  for other in (masking.RowStreams(8, index), masking.RowStreams(7, index + 16)):
    positions = masking.mask_tokens(rows, other, cfg)["masked_lm_positions"]
    assert (positions != out["masked_lm_positions"]).any(1).mean() > 0.8
  u = masking.RowStreams(0, np.arange(B)).random((B, T))
  assert abs(u.mean() - 0.5) < 0.01 and abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.05
