"""Tests of the pretraining data path: corpus, NSP / packing builders, masking, grain."""

import gzip
import json

import grain
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax.data import sources, masking, pipeline, builders
from bertjax.errors import ConfigError, DataError
from configs import bert_tiny
from tests.helpers import offsets

MAX_LEN = 128


@pytest.fixture(scope="module")
def data_cfg():
  cfg = bert_tiny.get_config().data
  cfg.corpus = "embedded"
  cfg.max_seq_length = MAX_LEN
  cfg.dupe_factor = 1
  return cfg


@pytest.fixture(scope="module")
def data(data_cfg, tokenizer):
  return pipeline.build_pretraining_data(data_cfg, tokenizer, batch_size=8, seed=0,
                                         nsp=True)


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def _assert_batches_equal(xs, ys):
  assert len(xs) == len(ys)
  for x, y in zip(xs, ys):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


# Corpus ---------------------------------------------------------------------------


def test_embedded_corpus_is_prose(documents):
  assert 250 <= len(documents) <= 1000
  sentences = [s for d in documents for s in d]
  assert len(sentences) > 2000
  assert all(len(d) >= 2 for d in documents)
  assert not any("::=" in s or ">>>" in s for s in sentences)
  assert sources.load_documents("embedded") == documents


def test_text_files_glob_directory_and_gzip(tmp_path):
  (tmp_path / "a.txt").write_text("First sentence here. Second one!\nA line.\n\n\nDoc two.\n")
  with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
    f.write("Gzipped document.\n")
  (tmp_path / "c.txt").write_bytes(b"Bad \xff\xfe bytes in text.\n")
  expected = [["First sentence here.", "Second one!", "A line."], ["Doc two."],
              ["Gzipped document."], ["Bad \ufffd\ufffd bytes in text."]]
  assert sources.load_documents(str(tmp_path)) == expected
  assert sources.load_documents(str(tmp_path / "*.txt*")) == expected
  assert sources.load_documents(str(tmp_path / "a.txt")) == expected[:2]


@pytest.mark.parametrize("kind, message", [
    ("missing", "matches no file"),
    ("empty", "contains no text"),
    ("binary", "is binary"),
    ("garbage", "is binary"),
    ("empty_dir", "holds no files"),
])
def test_bad_corpus_raises_one_line_data_error(tmp_path, kind, message):
  path = tmp_path / "corpus.txt"
  if kind == "missing":
    path = tmp_path / "nothing*.txt"
  elif kind == "empty":
    path.write_text("\n\n   \n")
  elif kind == "binary":
    path.write_bytes(b"PK\x03\x04\x00\x00binary\x00" * 10)
  elif kind == "garbage":
    path.write_bytes(bytes(np.random.default_rng(0).integers(128, 256, 4096, np.uint8)))
  else:
    path = tmp_path / "empty_dir"
    path.mkdir()
  with pytest.raises(DataError, match=message) as e:
    sources.load_documents(str(path))
  assert "\n" not in str(e.value)


# Masking --------------------------------------------------------------------------


def test_masking_statistics(data_cfg, tokenizer):
  cfg = masking.MaskingConfig.create(data_cfg, tokenizer)
  big = masking.MaskingConfig(cfg.mask_id, cfg.special_ids, cfg.random_ids,
                              max_predictions_per_seq=MAX_LEN)
  rng = np.random.default_rng(0)
  b = 4000
  ids = rng.integers(0, tokenizer.vocab_size, (b, MAX_LEN)).astype(np.int32)
  ids = np.where(np.isin(ids, cfg.special_ids), 100, ids)
  lengths = rng.integers(10, MAX_LEN + 1, b)
  ids[:, 0] = tokenizer.cls_id
  ids[np.arange(b), lengths - 1] = tokenizer.sep_id
  ids[np.arange(MAX_LEN)[None, :] >= lengths[:, None]] = tokenizer.pad_id
  candidates = ~np.isin(ids, cfg.special_ids)

  out = masking.mask_tokens(ids, rng, big)
  weights = out["masked_lm_weights"]
  chosen = weights.sum()
  assert abs(chosen / candidates.sum() - 0.15) < 0.005
  pos, valid = out["masked_lm_positions"], weights > 0
  rows = np.broadcast_to(np.arange(b)[:, None], pos.shape)
  assert candidates[rows[valid], pos[valid]].all()  # never a special token or padding
  np.testing.assert_array_equal(out["masked_lm_ids"][valid], ids[rows[valid], pos[valid]])
  assert (np.diff(np.where(valid, pos, MAX_LEN + 1), axis=1) > 0)[valid[:, 1:]].all()
  new = out["input_ids"][rows[valid], pos[valid]]
  orig = ids[rows[valid], pos[valid]]
  assert abs((new == cfg.mask_id).mean() - 0.8) < 0.01
  assert abs(((new != cfg.mask_id) & (new != orig)).mean() - 0.1) < 0.01
  assert abs((new == orig).mean() - 0.1) < 0.01
  assert not np.isin(new[new != cfg.mask_id], cfg.special_ids).any()
  unchosen = np.ones_like(ids, bool)
  unchosen[rows[valid], pos[valid]] = False
  np.testing.assert_array_equal(out["input_ids"][unchosen], ids[unchosen])

  capped = masking.mask_tokens(ids, rng, cfg)
  n_pred = capped["masked_lm_weights"].sum(1)
  expected = np.minimum(20, np.maximum(1, np.round(candidates.sum(1) * 0.15)))
  np.testing.assert_array_equal(n_pred, expected)
  one = masking.mask_tokens(ids[0], rng, cfg)
  assert one["input_ids"].shape == (MAX_LEN,) and one["masked_lm_ids"].shape == (20,)


# Example builders -----------------------------------------------------------------


def test_nsp_examples_follow_bert(tokenized, tokenizer):
  ex = builders.create_nsp_examples(tokenized, tokenizer, max_seq_length=MAX_LEN,
                                       short_seq_prob=0.1, dupe_factor=1,
                                       rng=np.random.default_rng(0))
  assert len(ex) > 500
  random_next = ex.next_sentence_labels.mean()
  # Single-segment chunks always take a random B (as in BERT), so slightly above 50%.
  assert 0.45 < random_next < 0.65
  assert (ex.lengths <= MAX_LEN).all()
  assert (ex.input_ids[:, 0] == tokenizer.cls_id).all()
  flat = [np.concatenate(d) for d in tokenized]
  for i in range(len(ex)):
    ids, types = ex.input_ids[i, :ex.lengths[i]], ex.token_type_ids[i, :ex.lengths[i]]
    assert ids[-1] == tokenizer.sep_id and (ex.input_ids[i, ex.lengths[i]:] == 0).all()
    a_len = int((types == 0).sum())
    assert ids[a_len - 1] == tokenizer.sep_id and (types[a_len:] == 1).all()
    a, b = ids[1:a_len - 1], ids[a_len:-1]
    assert len(a) >= 1 and len(b) >= 1
    doc_a, doc_b = ex.source_documents[i]
    starts_a, starts_b = offsets(flat[doc_a], a), offsets(flat[doc_b], b)
    assert starts_a and starts_b
    if ex.next_sentence_labels[i] == 0:
      # B continues A in the same document (truncation may cut A's end / B's start).
      assert doc_a == doc_b and any(sb >= sa + len(a) for sa in starts_a for sb in starts_b)
      if ex.lengths[i] < MAX_LEN:  # nothing truncated: exactly adjacent
        assert offsets(flat[doc_a], np.concatenate([a, b]))
    else:
      assert doc_a != doc_b


def test_nsp_dupe_factor_and_determinism(tokenized, tokenizer):
  make = lambda seed, dupe: builders.create_nsp_examples(
      tokenized, tokenizer, max_seq_length=64, short_seq_prob=0.1, dupe_factor=dupe,
      rng=np.random.default_rng(seed))
  one, again, two = make(1, 1), make(1, 1), make(1, 2)
  np.testing.assert_array_equal(one.input_ids, again.input_ids)
  assert 1.7 * len(one) < len(two) < 2.3 * len(one)


def test_packed_examples_keep_every_token(tokenized, tokenizer):
  ex = builders.create_packed_examples(tokenized, tokenizer, max_seq_length=MAX_LEN)
  assert (ex.lengths <= MAX_LEN).all() and (ex.next_sentence_labels == 0).all()
  assert (ex.input_ids[:, 0] == tokenizer.cls_id).all()
  assert (ex.input_ids[np.arange(len(ex)), ex.lengths - 1] == tokenizer.sep_id).all()
  assert ex.lengths.mean() > 0.8 * MAX_LEN  # whole sentences: rows end a bit short
  inner = [ex.input_ids[i, 1:ex.lengths[i] - 1] for i in range(len(ex))]
  separators = sum(int((x == tokenizer.sep_id).sum()) for x in inner)
  total = sum(len(s) for d in tokenized for s in d)
  assert sum(len(x) for x in inner) - separators == total
  assert separators >= len(tokenized) - len(ex) - 1  # documents joined inside rows


# Pipeline -------------------------------------------------------------------------


def test_pipeline_batches_and_eval(data, data_cfg, tokenizer):
  batch = next(iter(data.train))
  p = data_cfg.max_predictions_per_seq
  shapes = {"input_ids": (8, MAX_LEN), "attention_mask": (8, MAX_LEN),
            "token_type_ids": (8, MAX_LEN), "masked_lm_positions": (8, p),
            "masked_lm_ids": (8, p), "masked_lm_weights": (8, p),
            "next_sentence_labels": (8,)}
  assert {k: v.shape for k, v in batch.items()} == shapes
  assert batch["masked_lm_weights"].dtype == np.float32
  assert all(batch[k].dtype == np.int32 for k in shapes if k != "masked_lm_weights")
  assert data.stats["train_examples"] > 800 and data.stats["eval_documents"] >= 2
  assert data.most_frequent_token not in tokenizer.special_ids
  n_eval = sum(b["example_weights"].sum() for b in data.eval_batches)
  assert n_eval == data.stats["eval_examples"]
  last = data.eval_batches[-1]
  pad = last["example_weights"] == 0
  assert (last["masked_lm_weights"][pad] == 0).all()
  assert all(b["input_ids"].shape == (8, MAX_LEN) for b in data.eval_batches)


def test_pipeline_is_deterministic_and_restores(data, data_cfg, tokenizer, tmp_path):
  again = pipeline.build_pretraining_data(data_cfg, tokenizer, batch_size=8, seed=0,
                                          nsp=True)
  it = iter(data.train)
  first = _take(it, 5)
  _assert_batches_equal(first, _take(iter(again.train), 5))
  _assert_batches_equal(data.eval_batches, again.eval_batches)
  other = pipeline.build_pretraining_data(data_cfg, tokenizer, batch_size=8, seed=1,
                                          nsp=True)
  assert not np.array_equal(first[0]["input_ids"], next(iter(other.train))["input_ids"])

  manager = ocp.CheckpointManager(tmp_path / "ckpt")
  manager.save(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
  manager.wait_until_finished()
  expected = _take(it, 3)
  fresh = iter(again.train)
  manager.restore(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
  _assert_batches_equal(expected, _take(fresh, 3))
  manager.close()


def _indexed_examples(n, length):
  """Example i holds token 100 + i everywhere between [CLS]=2 and [SEP]=3."""
  ids = np.full((n, length), 100, np.int32) + np.arange(n, dtype=np.int32)[:, None]
  ids[:, 0], ids[:, -1] = 2, 3
  return builders.Examples(ids, np.zeros_like(ids, np.int8), np.full(n, length, np.int32),
                              np.zeros(n, np.int8), np.zeros((n, 2), np.int32))


def _example_index(batch):
  """[b] which indexed example each row holds (the commonest token, minus 100)."""
  return np.array([np.bincount(row).argmax() - 100 for row in batch["input_ids"]])


def test_epochs_and_processes(data_cfg, tokenizer):
  n, length, b = 32, 40, 4
  examples = _indexed_examples(n, length)
  cfg = masking.MaskingConfig.create(data_cfg, tokenizer)
  seen = {}
  for process in (0, 1):
    ds = pipeline.make_train_dataset(examples, cfg, batch_size=b, seed=0, nsp=False,
                                     process_index=process, process_count=2)
    batches = _take(iter(ds), 2 * n // (2 * b))  # two epochs of this process's share
    epochs = [np.concatenate([_example_index(x) for x in batches[:n // (2 * b)]]),
              np.concatenate([_example_index(x) for x in batches[n // (2 * b):]])]
    assert len(set(epochs[0])) == n // 2  # each example once per epoch
    assert list(epochs[0]) != list(epochs[1])  # reshuffled
    seen[process] = set(epochs[0])
    # The same example is masked differently in the next epoch.
    positions = [{i: tuple(p) for x in part for i, p in zip(_example_index(x),
                                                            x["masked_lm_positions"])}
                 for part in (batches[:n // (2 * b)], batches[n // (2 * b):])]
    common = set(positions[0]) & set(positions[1])
    assert common and sum(positions[0][i] != positions[1][i] for i in common) > len(common) // 2
  assert not seen[0] & seen[1]
  assert seen[0] | seen[1] == set(range(n))


def test_too_few_examples_or_documents(tmp_path, data_cfg, tokenizer):
  path = tmp_path / "small.txt"
  path.write_text("\n\n".join(f"Document number {i} is short. It has two sentences."
                              for i in range(20)))
  cfg = data_cfg.copy_and_resolve_references()
  cfg.corpus = str(path)
  with pytest.raises(DataError, match="fewer than one batch"):
    pipeline.build_pretraining_data(cfg, tokenizer, batch_size=512, seed=0, nsp=True)
  path.write_text("Only one document. With two sentences.\n")
  with pytest.raises(DataError, match="too few"):
    pipeline.build_pretraining_data(cfg, tokenizer, batch_size=2, seed=0, nsp=True)
  packed = pipeline.build_pretraining_data(data_cfg, tokenizer, batch_size=4, seed=0,
                                           nsp=False)
  batch = next(iter(packed.train))
  assert "next_sentence_labels" not in batch and batch["input_ids"].shape == (4, MAX_LEN)


def test_packing_removes_padding(data, data_cfg, tokenizer):
  """The stats report the padding share of the train rows; packing fills the rows."""
  packed = pipeline.build_pretraining_data(data_cfg, tokenizer, batch_size=4, seed=0,
                                           nsp=False)
  packed_pad, nsp_pad = packed.stats["padding_fraction"], data.stats["padding_fraction"]
  assert 0 <= packed_pad < min(nsp_pad, 0.2), (packed_pad, nsp_pad)


def test_permutation_shuffles_each_epoch_without_a_table():
  """Each epoch visits every row once, in a new order; batches straddling an epoch
  and a copy pickled into a grain worker read the same rows."""
  import pickle
  from bertjax.data import permutation
  for n in (1, 2, 3, 50, 1000, 4097):
    for epoch in (0, 1):
      image = permutation.permute(np.arange(n), n, 7, epoch)
      assert sorted(image) == list(range(n))
      np.testing.assert_array_equal(permutation.unpermute(image, n, 7, epoch), np.arange(n))
      assert [permutation.unpermute_one(int(v), n, 7, epoch) for v in image[:20]] == list(
          range(min(n, 20)))
  epochs = [permutation.permute(np.arange(50), 50, 7, e).tolist() for e in range(3)]
  assert epochs[0] != epochs[1] != epochs[2]
  rows = pipeline.MaskBatch((pipeline.rows_lib.MemoryRows(np.arange(50)),), (7,), None,
                            False, False, 0, 0).rows
  straddling = rows(np.arange(40, 60))  # epoch 0's last 10, epoch 1's first 10
  np.testing.assert_array_equal(straddling, epochs[0][40:] + epochs[1][:10])
  copy = pickle.loads(pickle.dumps(rows.__self__)).rows
  np.testing.assert_array_equal(copy(np.arange(100, 150)), epochs[2])


def _side_by_side(batches):
  """The global batch of per-process batches: their rows one process after the other."""
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.mark.parametrize("strategy", masking.STRATEGIES)
def test_batches_do_not_depend_on_the_process_count(data_cfg, tokenizer, strategy):
  """Process p of 2 feeds block p of each global batch, masked by the rows' global
  indices: the 2 processes' batches side by side are the 1 process's, masks included,
  at the start and across the end of the first epoch; the evaluation batches too."""
  cfg = data_cfg.copy_and_resolve_references()
  cfg.masking = strategy
  one = pipeline.build_pretraining_data(cfg, tokenizer, batch_size=8, seed=0, nsp=True)
  two = [pipeline.build_pretraining_data(cfg, tokenizer, batch_size=4, seed=0, nsp=True,
                                         process_index=p, process_count=2) for p in (0, 1)]
  epoch_end = (one.stats["train_examples"] - 1) // 8  # holds epoch 0's last row
  for start in (0, epoch_end):
    streams = [iter(d.train) for d in (one, *two)]
    for it in streams:
      it.set_state({"next_index": start})
    for _ in range(2):
      want, *got = (next(it) for it in streams)
      _assert_batches_equal([_side_by_side(got)], [want])
  assert len(two[0].eval_batches) == len(two[1].eval_batches) == len(one.eval_batches)
  for i, want in enumerate(one.eval_batches):
    _assert_batches_equal([_side_by_side([t.eval_batches[i] for t in two])], [want])


def test_restore_onto_another_process_count(data_cfg, tokenizer, tmp_path, monkeypatch):
  """A checkpoint written by 2 processes resumes on 1: the next global batch is the
  2 processes' next batches side by side, masks included (the global stream goes on)."""
  import jax
  from grain._src.python.checkpoint import handler
  from bertjax.checkpoint import manager as ckpt_lib, files
  n, length, b, k = 48, 24, 4, 7  # per-process batch b; 7 batches cross an epoch
  examples = _indexed_examples(n, length)
  cfg = masking.MaskingConfig.create(data_cfg, tokenizer)

  def stream(process, count, batch):
    return iter(pipeline.make_train_dataset(examples, cfg, batch_size=batch, seed=3,
                                            nsp=False, process_index=process,
                                            process_count=count))

  its = [stream(p, 2, b) for p in (0, 1)]
  for it in its:
    _take(it, k)
  state = {"w": jax.numpy.arange(3.0)}
  ckpt = ckpt_lib.Checkpointer(str(tmp_path))
  with monkeypatch.context() as m:  # Process 0 of 2 writes; process 1's file beside it.
    m.setattr(handler.sharding, "get_process_index_and_count", lambda: (0, 2))
    ckpt.save(k, state, its[0], force=True)
    ckpt.wait()
  data = tmp_path / files.CHECKPOINT_DIR / str(k) / "data"
  (data / "process_1-of-2.json").write_text(json.dumps(its[1].get_state()))
  expected = _side_by_side([next(it) for it in its])

  single = stream(0, 1, 2 * b)
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
  restored = ckpt.restore(k, abstract, single)
  np.testing.assert_array_equal(restored["w"], state["w"])
  _assert_batches_equal([next(single)], [expected])

  (data / "process_1-of-2.json").write_text(json.dumps({"next_index": k + 1}))
  with pytest.raises(ConfigError, match="written by 2 processes"):
    ckpt.restore(k, abstract, stream(0, 1, 2 * b))
  ckpt.close()
