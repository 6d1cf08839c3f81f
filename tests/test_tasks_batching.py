"""Bucketed and packed fine-tuning batches (`bertjax.tasks.batching`): their layout, the
same predictions as full-length rows (packed examples isolated, positions restarting,
each read off its own [CLS]), packed evaluation back in example order with one shape,
one compilation per shape, a stream that resumes from its checkpointed position, and
gradient accumulation exact on packed rows."""

import grain
import jax
import numpy as np
import pytest

from bertjax.errors import ConfigError
from bertjax.parallel import mesh as mesh_lib
from bertjax.tasks import batching, get_task, finetune
from bertjax.train import compilation
from configs.finetune import glue, ner
from tests.tasks_helpers import fixture, fixture_tokenizer, tiny_finetune


def test_bucket_lengths():
  assert batching.bucket_lengths((), 128) == (16, 32, 64, 128)
  assert batching.bucket_lengths((), 100) == (16, 32, 64, 100)
  assert batching.bucket_lengths((), 12) == (12,)
  assert batching.bucket_lengths((48, 16, 512), 128) == (16, 48, 128)
  with pytest.raises(ConfigError, match="bucket_lengths has 0"):
    batching.bucket_lengths((0, 16), 128)


def _arrays(lengths, T=8):
  """Feature arrays of rows of `lengths` real tokens: ids 10*row + position."""
  n = len(lengths)
  ids = np.zeros((n, T), np.int32)
  for r, k in enumerate(lengths):
    ids[r, :k] = 10 * r + np.arange(k) + 1
  return {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int32),
          "token_type_ids": np.zeros((n, T), np.int32),
          "labels": np.arange(n, dtype=np.int32)}


def test_bucketed_batches_cut_to_the_global_batchs_bucket():
  b = batching.Batcher(_arrays([3, 5, 2, 7]), "bucket", (4, 8),
                       ("input_ids", "attention_mask", "token_type_ids"))
  whole = b.batch(np.arange(4), np.ones(4, bool), slice(0, 4))
  assert whole["input_ids"].shape == (4, 8) and whole["labels"].shape == (4,)
  # Process 0 of 2 holds rows 0-1 (at most 5 tokens) but the global batch's longest
  # (7) sets the length, as on process 1: the global batch has one shape.
  assert b.batch(np.arange(4), np.ones(4, bool), slice(0, 2))[
      "input_ids"].shape == (2, 8)
  first = b.batch(np.array([0, 2]), np.ones(2, bool), slice(0, 2))
  assert first["input_ids"].shape == (2, 4)
  np.testing.assert_array_equal(first["input_ids"], whole["input_ids"][[0, 2], :4])
  # Padding rows (valid False) count for nothing, not even their length.
  assert b.batch(np.array([0, 3]), np.array([True, False]), slice(0, 2))[
      "input_ids"].shape == (2, 4)


def test_packed_layout_classification():
  arrays = _arrays([3, 5, 2, 4, 6, 1, 2, 3])
  b = batching.Batcher(arrays, "pack", (8,), ("input_ids", "attention_mask",
                                               "token_type_ids"), "cls", groups=2,
                       position_offset=2, pad_id=0)
  valid = np.array([True] * 7 + [False])
  out = b.batch(np.arange(8), valid, slice(0, 8))
  # Group 0 (rows 0-3, lengths 3 5 2 4): first fit into rows of 8 -> [0, 1], [2, 3];
  # group 1 (lengths 6 1 2, row 7 invalid) -> [4, 5], [6]. R = 2 rows per group.
  # Slots per row: a group's 4 examples.
  assert out["input_ids"].shape == (4, 8) and out["cls_positions"].shape == (4, 4)
  np.testing.assert_array_equal(out["input_ids"][0], [1, 2, 3, 11, 12, 13, 14, 15])
  np.testing.assert_array_equal(out["segment_ids"][0], [1, 1, 1, 2, 2, 2, 2, 2])
  np.testing.assert_array_equal(out["position_ids"][0], [2, 3, 4, 2, 3, 4, 5, 6])
  np.testing.assert_array_equal(out["position_ids"][3], [2, 3, 2, 2, 2, 2, 2, 2])
  np.testing.assert_array_equal(out["cls_positions"][:, :2], [[0, 3], [0, 2], [0, 6], [0, 0]])
  np.testing.assert_array_equal(out["labels"][:, :2], [[0, 1], [2, 3], [4, 5], [6, 0]])
  np.testing.assert_array_equal(out["example_weights"], [[1, 1, 0, 0], [1, 1, 0, 0],
                                                         [1, 1, 0, 0], [1, 0, 0, 0]])
  np.testing.assert_array_equal(out["attention_mask"][3], [1, 1, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(out["slot_rows"], [[0, 1, -1, -1], [2, 3, -1, -1],
                                                   [4, 5, -1, -1], [6, -1, -1, -1]])
  # Process 1 of 2 gets group 1's rows alone.
  theirs = b.batch(np.arange(8), valid, slice(4, 8))
  np.testing.assert_array_equal(theirs["input_ids"], out["input_ids"][2:])
  # At least `min_rows` rows per group (a power of two), the extra rows empty.
  wide = b.batch(np.arange(8), valid, slice(0, 8), min_rows=3)
  assert wide["input_ids"].shape == (8, 8) and not wide["example_weights"][2:4].any()
  # Outputs per slot back in batch order (the invalid row 7 left at 0).
  logits = out["labels"][..., None] * np.ones(3, np.float32)
  back = batching.unpack({"logits": logits}, {"slot_rows": out["slot_rows"]}, 8, 8, {})
  np.testing.assert_array_equal(back["logits"][:, 0], [0, 1, 2, 3, 4, 5, 6, 0])


def test_packed_tokens_unpack_to_their_rows():
  arrays = _arrays([3, 5, 2, 4])
  arrays["labels"] = arrays["input_ids"].copy()
  keys = ("input_ids", "attention_mask", "token_type_ids", "labels")
  b = batching.Batcher(arrays, "pack", (8,), keys, "tokens")
  out = b.batch(np.arange(4), np.ones(4, bool), slice(0, 4))
  assert out["input_ids"].shape == (2, 8)  # [0, 1], [2, 3]
  back = batching.unpack({"tags": out["labels"]}, {k: out[k] for k in (
      "token_rows", "token_cols")}, 4, 8, {"tags": -7})
  expected = np.where(arrays["attention_mask"] > 0, arrays["labels"], -7)
  np.testing.assert_array_equal(back["tags"], expected)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return fixture_tokenizer(str(tmp_path_factory.mktemp("vocab")))


def _setup(config, train_file, n):
  """(task, features of `n` training examples, Setup) of a tiny random encoder."""
  start = finetune.load_start(config)
  task = get_task(config.task.name)(config.task, start.tokenizer, config.task.max_seq_length)
  examples = task.read(train_file, "train")
  task.labels = task.fit_labels(examples)
  features = task.featurize(examples[:n], train=True)
  return task, features, start.model, finetune.build(config, task, start.model,
                                                 finetune.example_batch(features), 4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sst2", "ner"])
def test_packed_and_bucketed_rows_predict_as_full_rows(vocab, name):
  """The tiny encoder's logits of every example (no dropout): from full-length rows,
  bucketed rows and packed rows (several examples a row), equal."""
  if name == "sst2":
    c = tiny_finetune(glue.get_config("sst2"), vocab)
    train = fixture("sst2_train.tsv")
  else:
    c = tiny_finetune(ner.get_config(), vocab)
    c.task.max_seq_length = c.model.max_position_embeddings = 64  # Sentences of 16+ pieces.
    train = fixture("conll_train.txt")
  c.model.position_offset = 0
  task, features, model, setup = _setup(c, train, 8)
  params = setup.init_params(c)
  apply = jax.jit(lambda p, b: setup.model.apply({"params": p}, b)["logits"])
  n = len(features)  # sst2: 8 sentences; conll: its 4
  idx, valid = np.arange(n), np.ones(n, bool)
  full = np.asarray(apply(params, finetune.rows(features, idx, valid)))
  c.task.batching = "bucket"
  bucketed = finetune.batcher(task, features, model).batch(idx, valid, slice(0, n))
  assert bucketed["input_ids"].shape[1] < c.task.max_seq_length
  got = np.asarray(apply(params, bucketed))
  c.task.batching = "pack"
  packed = finetune.batcher(task, features, model).batch(idx, valid, slice(0, n))
  assert packed["input_ids"].shape[0] < n  # Several examples share a row.
  out = np.asarray(apply(params, packed))
  if name == "sst2":
    np.testing.assert_allclose(got, full, atol=2e-5)
    slots = [(r, k) for r in range(out.shape[0]) for k in range(out.shape[1])
             if packed["example_weights"][r, k]]
    order = [int(packed["labels"][r, k]) for r, k in slots]
    assert sorted(order) == sorted(features.arrays["labels"].tolist())
    # Slots in batch order: each packed example against its own full row.
    np.testing.assert_allclose(np.stack([out[r, k] for r, k in slots]), full, atol=2e-5)
  else:
    T = got.shape[1]
    np.testing.assert_allclose(got, full[:, :T], atol=2e-5)
    lengths = features.arrays["attention_mask"].sum(-1)
    for r, row in enumerate(batching._first_fit(lengths, c.task.max_seq_length)):  # pylint: disable=protected-access
      at = 0
      for i in row:
        n = int(lengths[i])
        np.testing.assert_array_equal(packed["labels"][r, at:at + n],
                                      features.arrays["labels"][i, :n])
        np.testing.assert_allclose(out[r, at:at + n], full[i, :n], atol=2e-5)
        at += n


def test_pack_refused_where_it_does_not_apply(vocab):
  from configs.finetune import squad
  c = tiny_finetune(squad.get_config(), vocab)
  c.task.batching = "pack"
  task = get_task("squad")(c.task, None, 32)
  with pytest.raises(ConfigError, match="'pack' does not apply to task 'squad'"):
    finetune.batcher(task, None, None)


@pytest.mark.slow
def test_one_compilation_per_shape_and_the_stream_resumes(vocab):
  """A bucketed stream (batches of 8 over sentences of 7 to 12 tokens, two of 12;
  buckets 9, 12, 32): the jitted step compiles once per distinct batch shape; the
  stream restored from its state continues exactly."""
  c = tiny_finetune(glue.get_config("sst2"), vocab)
  c.task.batching = "bucket"
  c.task.bucket_lengths = (9, 12)
  task, features, model, setup = _setup(c, fixture("sst2_train.tsv"), 48)
  batches = finetune.batcher(task, features, model)
  steps = 12
  stream = finetune.train_stream(batches, 8, c.seed, steps)
  state, shapes, seen = setup.init_state(c), set(), []
  with jax.set_mesh(setup.mesh):
    for k, batch in enumerate(stream):
      if k == 5:
        saved = stream.get_state()
      seen.append(batch)
      shapes.add(batch["input_ids"].shape)
      state, _ = setup.train_step(state, mesh_lib.put_batch(batch, setup.batch_sharding))
  assert len(shapes) >= 2
  assert setup.train_step.jitted._cache_size() == len(shapes)  # pylint: disable=protected-access
  again = finetune.train_stream(batches, 8, c.seed, steps)
  again.set_state(saved)
  for want in seen[6:]:
    got = next(again)
    assert got.keys() == want.keys()
    for k in got:
      np.testing.assert_array_equal(got[k], want[k])
  assert isinstance(again, grain.DatasetIterator)


@pytest.mark.parametrize("name", ["sst2", "ner"])
def test_packed_evaluation_predicts_as_bucketed_with_one_shape(vocab, name):
  """The predictor's outputs and dev loss from packed batches (every batch padded to
  the same rows: one compiled shape) equal those from bucketed ones."""
  c = tiny_finetune(glue.get_config("sst2") if name == "sst2" else ner.get_config(), vocab)
  c.model.position_offset = 0
  train = fixture("sst2_train.tsv" if name == "sst2" else "conll_train.txt")
  task, features, _, setup = _setup(c, train, 48)
  params = setup.init_params(c)
  got = {}
  for mode in ("bucket", "pack"):
    c.task.batching = mode
    with compilation.clock() as clock:
      got[mode] = finetune.predictor(setup.inference, task)(params, features, 8)
    got[mode] += (clock["programs"],)
  (bucket, bucket_loss, _), (pack, pack_loss, programs) = got["bucket"], got["pack"]
  assert programs == 1 and pack_loss == pytest.approx(bucket_loss, rel=1e-5)
  real = features.arrays["attention_mask"] > 0  # Tags past a row's end mean nothing.
  for k in bucket:
    if k in task.token_outputs:
      np.testing.assert_array_equal(pack[k][real], bucket[k][real])
    else:
      np.testing.assert_allclose(pack[k], bucket[k], atol=2e-5)
