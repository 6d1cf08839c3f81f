"""What bertjax's pretraining data does where transformers' pipeline may differ
(issue 31, item 2; `benchmarks pretrain_fidelity` measures their effect on held-out MLM):
a document's sentences reach the tokenizer as its running text does; FULL-SENTENCES
against a plain stream of the documents ('stream'); a fixed number of predictions per
row against a per-token draw (`masked_lm_draw`); special tokens never masked or
maskable (`mask_special_tokens`); the per-row random streams against numpy's
generator."""

import numpy as np
import pytest
from scipy import stats

from bertjax.data import builders, masking, sources
from bertjax.data import tokenizer as tok_lib
from configs import bert_tiny
from tests import modernbert_helpers
from tests.tasks_helpers import fixture_tokenizer

DOCUMENTS = [["The value is returned.", "This is it!", "Next, we go on."],
             ["A second document starts here.", "It ends here."]]
T, B = 64, 4000


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
  """ModernBERT's kind of byte-level BPE (`modernbert_helpers`)."""
  return tok_lib.load_tokenizer(modernbert_helpers.modernbert_tokenizer(
      str(tmp_path_factory.mktemp("bpe"))))


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
  return tok_lib.load_tokenizer(fixture_tokenizer(str(tmp_path_factory.mktemp("wp"))))


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_documents_are_tokenized_as_their_running_text(request, kind):
  """A byte-level BPE tokenizes 'This' after a space as 'ĠThis': the sentences of a
  document are tokenized as the text holds them (what any tokenizer of the text gives
  at inference); WordPiece ignores the space."""
  tok = request.getfixturevalue(kind)
  docs = builders.tokenize_documents(DOCUMENTS, tok)
  for doc, text in zip(docs, DOCUMENTS):
    assert [i for s in doc for i in s] == tok.tokenize(" ".join(text))
  alone = tok.tokenize_batch(DOCUMENTS[0])
  assert (alone[1:] != docs[0][1:]) == (kind == "bpe")  # What was given before.


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_line_breaks_space_or_apart(request, kind, tmp_path):
  """A text file's document of wrapped lines: with line_breaks='space' its tokens are
  those of its running text (the lines joined by a space), its units sentences; with
  'apart' each line is a unit, unsplit, tokenized alone (transformers' run_mlm.py on
  the same file): a line's first word loses its space with a byte-level BPE, and only
  there; WordPiece gives the same ids either way."""
  tok = request.getfixturevalue(kind)
  lines = ["The value is returned when the", "call ends. Then it goes on", "to the next."]
  path = tmp_path / "doc.txt"
  path.write_text("\n".join(lines) + "\n\nAnother document.\n")
  space, apart = (sources.load_documents(str(path), line_breaks=b)
                  for b in sources.LINE_BREAKS)
  assert space[0] == ["The value is returned when the", "call ends.", "Then it goes on",
                      "to the next."]
  assert apart[0] == lines and apart[1] == space[1] == ["Another document."]
  ids = {b: [i for s in builders.tokenize_documents(docs, tok, b)[0] for i in s]
         for b, docs in (("space", space), ("apart", apart))}
  assert ids["space"] == tok.tokenize(" ".join(lines))
  assert ids["apart"] == [i for line in lines for i in tok.tokenize(line)]
  assert (ids["space"] != ids["apart"]) == (kind == "bpe")
  if kind == "bpe":  # The text each gives back: with or without the lines' spaces.
    assert tok.decode(ids["space"]) == " ".join(lines)
    assert tok.decode(ids["apart"]) == "".join(lines)


def test_stream_packing_leaves_out_the_separators(bpe):
  """'stream' rows: the documents' tokens back to back between [CLS] and [SEP];
  'full_sentences' puts a separator between two documents (but where a row's own
  [SEP] ends the first); both fill every row."""
  docs = builders.tokenize_documents(DOCUMENTS * 6, bpe)
  tokens = [i for d in docs for s in d for i in s]
  for packing in ("stream", "full_sentences"):
    ex = builders.create_packed_examples(docs, bpe, max_seq_length=16, packing=packing)
    rows = [r[1:n - 1] for r, n in zip(ex.input_ids.tolist(), ex.lengths.tolist())]
    assert (ex.lengths[:-1] == 16).all()
    body = [i for r in rows for i in r]
    separators = body.count(bpe.sep_id)
    if packing == "stream":
      assert separators == 0
    else:
      assert len(docs) - 1 - len(rows) <= separators <= len(docs) - 1 and separators > 5
    assert [i for i in body if i != bpe.sep_id] == tokens


@pytest.fixture(scope="module")
def rows(wordpiece):
  """[B, T] rows: [CLS] 20..62 random non-special ids [SEP], padding."""
  rng = np.random.default_rng(0)
  out = np.full((B, T), wordpiece.pad_id, np.int32)
  lengths = rng.integers(22, T + 1, B)
  for r, n in enumerate(lengths):
    out[r, 0], out[r, n - 1] = wordpiece.cls_id, wordpiece.sep_id
    out[r, 1:n - 1] = rng.integers(5, wordpiece.vocab_size, n - 2)
  return out


def _cfg(tok, **data):
  d = bert_tiny.get_config().data
  d.max_predictions_per_seq = T
  d.masked_lm_prob = 0.3
  for k, v in data.items():
    d[k] = v
  return masking.MaskingConfig.create(d, tok)


def _chosen(out, shape):
  chosen = np.zeros(shape, bool)
  valid = out["masked_lm_weights"] > 0
  r = np.broadcast_to(np.arange(shape[0])[:, None], valid.shape)
  chosen[r[valid], out["masked_lm_positions"][valid]] = True
  return chosen


@pytest.mark.parametrize("streams", [False, True])
def test_per_token_draw_is_binomial_and_fixed_is_exact(wordpiece, rows, streams):
  """'fixed': round(0.3 n) predictions in every row; 'per_token': each maskable token
  with probability 0.3 independently (count mean n p, variance n p (1 - p); a
  position's rate p whatever its place); the cap P holds."""
  n = (~np.isin(rows, [wordpiece.cls_id, wordpiece.sep_id, wordpiece.pad_id])).sum(1)
  rng = lambda: masking.RowStreams(3, np.arange(B)) if streams else np.random.default_rng(3)
  fixed = masking.mask_tokens(rows, rng(), _cfg(wordpiece))["masked_lm_weights"].sum(1)
  np.testing.assert_array_equal(fixed, np.maximum(1, np.round(0.3 * n)))
  out = masking.mask_tokens(rows, rng(), _cfg(wordpiece, masked_lm_draw="per_token"))
  count = out["masked_lm_weights"].sum(1)
  z = (count - 0.3 * n) / np.sqrt(n * 0.3 * 0.7)
  assert abs(z.mean()) < 0.06 and abs(z.std() - 1) < 0.05
  rate = _chosen(out, rows.shape)[:, 1:21].mean(0)  # Every row has 20 tokens there.
  assert np.abs(rate - 0.3).max() < 0.035
  capped = masking.mask_tokens(rows, rng(), _cfg(wordpiece, masked_lm_draw="per_token",
                                                  max_predictions_per_seq=12))
  assert capped["masked_lm_weights"].sum(1).max() == 12


def test_special_tokens_maskable_only_when_asked(wordpiece, rows):
  """Never [CLS] / [SEP] by default; with mask_special_tokens at the rate of any token;
  padding never."""
  pad = rows == wordpiece.pad_id
  ends = np.isin(rows, [wordpiece.cls_id, wordpiece.sep_id])
  for maskable in (False, True):
    out = masking.mask_tokens(rows, np.random.default_rng(4),
                              _cfg(wordpiece, mask_special_tokens=maskable))
    chosen = _chosen(out, rows.shape)
    assert not chosen[pad].any()
    assert chosen[ends].mean() == pytest.approx(0.3 * maskable, abs=0.02)
    # Random replacements stay non-special either way.
    new, old = out["input_ids"][chosen], rows[chosen]
    assert not np.isin(new[(new != wordpiece.mask_id) & (new != old)],
                       [wordpiece.cls_id, wordpiece.sep_id, wordpiece.pad_id]).any()


def test_row_streams_are_as_uniform_and_independent_as_numpy():
  """bertjax's per-row SplitMix64 streams pass what numpy's PCG64 passes at the same
  size: uniform (Kolmogorov-Smirnov), no correlation between a row's consecutive
  numbers nor between neighbouring rows' (index and index + 1: the rows of one batch)."""
  for u in (masking.RowStreams(0, np.arange(2000)).random((2000, 500)),
            np.random.default_rng(0).random((2000, 500))):
    assert stats.kstest(u.ravel(), "uniform").pvalue > 1e-3
    for a, b in ((u[:, :-1], u[:, 1:]), (u[:-1], u[1:])):
      assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 4 / np.sqrt(a.size)
