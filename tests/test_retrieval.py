"""Embedding models (issue 45): pooling and the contrastive losses against
sentence-transformers' own on the same numbers, GradCache's gradient against the
uncached one and its mini-batches' dropout keys, the loss over an 8-device mesh against
one device with the whole batch, dev evaluation by the model's similarity, the pairs
reader and the batches it makes, the plan's FLOPs against XLA's, and the one-line
errors of bad input."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from jax.sharding import NamedSharding, PartitionSpec
from sentence_transformers.sentence_transformer import losses
from sentence_transformers.sentence_transformer.modules import pooling as st_pooling

from bertjax import model as model_lib
from bertjax.errors import ConfigError, DataError
from bertjax.parallel import mesh as mesh_lib
from bertjax.tasks import contrastive, embedding, pairs, pooling, retrieval
from configs.finetune import retrieval as retrieval_config

B, C, E = 6, 3, 16
RULES = (("activation_batch", ("data", "fsdp")),)


def _task(**kw) -> ml_collections.ConfigDict:
  t = retrieval_config.get_config().task
  t.pooling = "mean"
  for k, v in kw.items():
    t[k] = v
  return t


def _embeddings(seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(B, E)).astype(np.float32),
          rng.normal(size=(B, C, E)).astype(np.float32))


@pytest.mark.parametrize("mode", pooling.POOLINGS)
def test_pooling_matches_sentence_transformers(mode):
  rng = np.random.default_rng(1)
  hidden = rng.normal(size=(4, 7, E)).astype(np.float32)
  lengths = np.array([7, 3, 1, 5])
  mask = (np.arange(7)[None] < lengths[:, None]).astype(np.int32)
  theirs = st_pooling.Pooling(E, pooling_mode=mode)({
      "token_embeddings": torch.from_numpy(hidden),
      "attention_mask": torch.from_numpy(mask)})["sentence_embedding"].numpy()
  ours = np.asarray(pooling.pool(jnp.asarray(hidden), jnp.asarray(mask), mode))
  np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(pooling.normalize(ours)), torch.nn.functional.normalize(
      torch.from_numpy(theirs), dim=-1).numpy(), atol=1e-6)


def _ours(task, q, d, weights=None, teacher=None):
  batch = {"example_weights": jnp.ones(B) if weights is None else jnp.asarray(weights),
           "doc_input_ids": jnp.zeros((B, C, 2), jnp.int32)}
  if teacher is not None:
    batch["teacher"] = jnp.asarray(teacher)
  sums = contrastive.loss_sums(jnp.asarray(q), jnp.asarray(d), batch, task)
  return float(sums["loss"] / contrastive.loss_count(batch, task))


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_losses_match_sentence_transformers(similarity):
  """MNRL (pairs and with hard negatives, one-directional and symmetric), MarginMSE
  (teacher scores and margins), KL: the same numbers as sentence-transformers' on the
  same embeddings; padding rows (weight 0) take no part."""
  q, d = _embeddings()
  fn = {"cosine": None, "dot": "dot"}[similarity]
  from sentence_transformers import util  # pylint: disable=g-import-not-at-top
  kw = {} if fn is None else {"similarity_fct": util.dot_score}
  columns = lambda qq, dd: [torch.from_numpy(qq)] + [torch.from_numpy(dd[:, j])
                                                     for j in range(dd.shape[1])]
  for task, loss in [
      (_task(similarity=similarity), losses.MultipleNegativesRankingLoss(None, **kw)),
      (_task(similarity=similarity, symmetric=True), losses.MultipleNegativesRankingLoss(
          None, directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction",
          **kw))]:
    theirs = float(loss.compute_loss_from_embeddings(columns(q, d), None))
    assert _ours(task, q, d) == pytest.approx(theirs, rel=1e-5)
    pair = float(loss.compute_loss_from_embeddings(columns(q, d[:, :1]), None))
    assert _ours(task, q, d[:, :1]) == pytest.approx(pair, rel=1e-5)
    # The last two rows padding: as if the batch had four examples.
    w = np.array([1, 1, 1, 1, 0, 0], np.float32)
    short = float(loss.compute_loss_from_embeddings(columns(q[:4], d[:4]), None))
    assert _ours(task, q, d, weights=w) == pytest.approx(short, rel=1e-5)
  pairwise = {"cosine": util.pairwise_cos_sim, "dot": util.pairwise_dot_score}[similarity]
  teacher = np.random.default_rng(3).normal(size=(B, C)).astype(np.float32)
  mse = losses.MarginMSELoss(None, similarity_fct=pairwise)
  theirs = float(mse.compute_loss_from_embeddings(columns(q, d), torch.from_numpy(teacher)))
  task = _task(loss="margin_mse", similarity=similarity, teacher_column="t")
  assert _ours(task, q, d, teacher=teacher) == pytest.approx(theirs, rel=1e-5)
  margins = teacher[:, :1] - teacher[:, 1:]
  assert _ours(task, q, d, teacher=margins) == pytest.approx(theirs, rel=1e-5)
  kl = losses.DistillKLDivLoss(None, similarity_fct=pairwise, temperature=2.0)
  theirs = float(kl.compute_loss_from_embeddings(columns(q, d), torch.from_numpy(teacher)))
  task = _task(loss="kl", similarity=similarity, teacher_column="t", temperature=2.0)
  assert _ours(task, q, d, teacher=teacher) == pytest.approx(theirs, rel=1e-5)


def test_matryoshka_matches_sentence_transformers():
  q, d = _embeddings(2)

  class Outputs(torch.nn.Module):  # A "model" returning the given embeddings.
    def forward(self, features):
      return {"sentence_embedding": features["embedding"]}

    def get_embedding_dimension(self):
      return E

  model = Outputs()
  loss = losses.MatryoshkaLoss(model, losses.MultipleNegativesRankingLoss(model),
                               [E, 8, 4], matryoshka_weights=[1.0, 0.5, 0.25])
  theirs = float(loss([{"embedding": torch.from_numpy(x)} for x in (q, d[:, 0], d[:, 1])],
                      None))
  task = _task(matryoshka_dims=(E, 8, 4), matryoshka_weights=(1.0, 0.5, 0.25))
  assert _ours(task, q, d[:, :2].copy()) == pytest.approx(theirs, rel=1e-5)


@pytest.fixture(scope="module")
def tiny():
  """A 2-layer BERT embedding model (mean pooling, normalised), its parameters and a
  batch of 16 queries x (positive, negative) of length 12."""
  config = model_lib.config_from(ml_collections.ConfigDict(dict(
      family="bert", vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
      intermediate_size=32, max_position_embeddings=32, pooler=False, nsp=False,
      dtype="float32", dropout_rate=0.1, attention_dropout_rate=0.0)))
  model = embedding.EmbeddingModel(config, "mean", True)
  rng = np.random.default_rng(0)
  n, t = 16, 12
  lengths = rng.integers(3, t + 1, (n, 3))
  ids = rng.integers(5, 64, (n, 3, t)).astype(np.int32)
  mask = (np.arange(t) < lengths[..., None]).astype(np.int32)
  batch = {"query_input_ids": ids[:, 0], "query_attention_mask": mask[:, 0],
           "doc_input_ids": ids[:, 1:], "doc_attention_mask": mask[:, 1:],
           "example_weights": np.ones(n, np.float32)}
  params = jax.jit(model.init)(jax.random.key(0), batch["query_input_ids"][:1],
                               batch["query_attention_mask"][:1])["params"]
  return model, nn.unbox(params), batch


def _loss_and_grads(model, params, batch, task, devices, rng=None, obj=None):
  """The objective's loss and gradient (`obj`, default the contrastive one of `task`)
  with the batch sharded over `devices`."""
  mesh = jax.make_mesh((len(devices), 1, 1), mesh_lib.AXES, devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  obj = obj or retrieval.objective(model, task, batch)
  loss = lambda p, b, r: obj.loss(obj.sums(p, b, r), obj.counts(b))
  shard = mesh_lib.batch_sharding(mesh, RULES)
  replicated = NamedSharding(mesh, PartitionSpec())
  with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
    f = jax.jit(jax.value_and_grad(loss), in_shardings=(replicated, shard, replicated))
    value, grads = f(jax.device_put(params, replicated), jax.device_put(batch, shard),
                     rng if rng is None else jax.device_put(rng, replicated))
  return float(value), jax.device_get(grads)


def assert_eight_devices_equal_one(model, params, batch, task_of, objective_of):
  """The loss and gradients of `objective_of(mini)` (its task `task_of(mini)`) over 8
  devices, at once and with GradCache mini-batches of 8, are one device's with the
  whole batch."""
  one = _loss_and_grads(model, params, batch, task_of(0), jax.devices()[:1],
                        obj=objective_of(0))
  for mini in (0, 8):
    eight = _loss_and_grads(model, params, batch, task_of(mini), jax.devices()[:8],
                            obj=objective_of(mini))
    assert eight[0] == pytest.approx(one[0], rel=1e-6)
    _assert_trees_close(eight[1], one[1], 1e-5)


def _assert_trees_close(a, b, rtol):
  """Every leaf within `rtol` of the largest magnitude of any leaf of `b` (a gradient
  that is zero analytically, as the key bias's, is rounding on both sides)."""
  scale = max(float(np.abs(y).max()) for y in jax.tree.leaves(b))
  worst = max(float(np.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a),
                                                          jax.tree.leaves(b)))
  assert worst <= rtol * scale, (worst, scale)


@pytest.mark.slow
def test_gradcache_gradient_is_the_uncached_one(tiny, monkeypatch):
  """Mini-batches of 4 under jax.checkpoint: the loss and every gradient equal the
  whole batch's at once (no dropout) to float32 rounding; with dropout, equal to the
  same mini-batches without rematerialisation (the re-run draws the same masks)."""
  model, params, batch = tiny
  one = jax.devices()[:1]
  whole = _loss_and_grads(model, params, batch, _task(mini_batch_size=0), one)
  cached = _loss_and_grads(model, params, batch, _task(mini_batch_size=4), one)
  assert cached[0] == pytest.approx(whole[0], rel=1e-6)
  _assert_trees_close(cached[1], whole[1], 1e-5)
  rng = jax.random.key(3)
  with_dropout = _loss_and_grads(model, params, batch, _task(mini_batch_size=4), one, rng)
  monkeypatch.setattr(jax, "checkpoint", lambda f, **_: f)
  stored = _loss_and_grads(model, params, batch, _task(mini_batch_size=4), one, rng)
  assert with_dropout[0] == pytest.approx(stored[0], rel=1e-6)
  _assert_trees_close(with_dropout[1], stored[1], 1e-5)
  assert abs(with_dropout[0] - whole[0]) > 1e-4  # Dropout was on.


@pytest.mark.slow
def test_gradcache_mini_batch_i_draws_dropout_from_fold_in_i(tiny):
  """`embed_in_chunks` with dropout on: mini-batch i (rows i, i + n, ...) is embedded
  as that mini-batch alone with the key fold_in(rng, i), and the gradient through
  jax.checkpoint is that of those embeddings computed without it; one key shared by
  every mini-batch would draw other masks (the same ones in every mini-batch)."""
  model, params, batch = tiny
  inputs = {"input_ids": batch["query_input_ids"],
            "attention_mask": batch["query_attention_mask"]}
  rng, n = jax.random.key(3), 4
  weights = jnp.asarray(np.random.default_rng(1).normal(size=(16, E)), jnp.float32)

  def embed(p, x, key):
    return model.apply({"params": p}, x["input_ids"], x["attention_mask"],
                       deterministic=False, rngs={"dropout": key})

  def by_hand(p, keys):  # [16, E]: mini-batch i alone with keys[i], in the rows' order
    out = [embed(p, jax.tree.map(lambda x: x[i::n], inputs), keys[i]) for i in range(n)]
    return jnp.stack(out, axis=1).reshape(16, -1)

  def chunked(p, key):
    return contrastive.embed_in_chunks(lambda x, k: embed(p, x, k), inputs, key, 16 // n)

  def with_grads(f):  # (embeddings, gradient of their weighted sum) of f(params, keys)
    g = jax.jit(jax.grad(lambda p, k: (jnp.sum(f(p, k) * weights), f(p, k)), has_aux=True))
    return lambda keys: g(params, keys)[::-1]

  got, got_grads = with_grads(chunked)(rng)
  by_hand_grads = with_grads(by_hand)
  want, want_grads = by_hand_grads([jax.random.fold_in(rng, i) for i in range(n)])
  np.testing.assert_allclose(got, want, atol=1e-6)
  _assert_trees_close(got_grads, want_grads, 1e-5)
  shared, _ = by_hand_grads([rng] * n)
  assert np.abs(np.asarray(shared) - np.asarray(want)).max() > 1e-3


@pytest.mark.slow
def test_eight_devices_equal_one_with_the_whole_batch(tiny):
  """In-batch negatives from every device: the loss and gradients of the batch sharded
  over 8 devices (and with GradCache) are those of one device holding all of it."""
  model, params, batch = tiny
  one = _loss_and_grads(model, params, batch, _task(mini_batch_size=0), jax.devices()[:1])
  for mini in (0, 8):
    eight = _loss_and_grads(model, params, batch, _task(mini_batch_size=mini),
                            jax.devices()[:8])
    assert eight[0] == pytest.approx(one[0], rel=1e-6)
    _assert_trees_close(eight[1], one[1], 1e-5)


def test_dev_evaluation_scores_with_the_models_similarity(tmp_path):
  """`evaluators` of a model not normalised (task.normalize False): with similarity
  'cosine' the dev figures (and dev_results.json) are the normalised vectors' on a BEIR
  directory and on scored pairs, not their dot products (issue 55: nDCG@10 0.095 where
  cosine gives 0.0); with 'dot', the dot products'."""
  from bertjax.tasks import retrieval_eval as rev  # pylint: disable=g-import-not-at-top
  from tests.test_retrieval_eval import bag_of_words  # pylint: disable=g-import-not-at-top

  class Embedder:  # What evaluators calls: vectors of lengths that vary with the text.
    def encode(self, params, texts, kind, batch_size, show=""):
      del params, kind, batch_size, show
      return bag_of_words(texts) * np.asarray([[1 + len(t) % 7] for t in texts], np.float32)

  encode = lambda texts: Embedder().encode(None, texts, "", 0)
  fixtures = os.path.join(os.path.dirname(__file__), "fixtures")
  beir = os.path.join(fixtures, "retrieval", "beir")
  sts = os.path.join(fixtures, "stsb_dev.tsv")
  split, (first, second, gold) = rev.read_beir(beir), rev.read_sts(sts)

  def figures(transform):  # Dot products of the transformed vectors.
    vectors = lambda texts: transform(encode(texts))
    return (rev.RetrievalEvaluator(split, vectors, vectors, similarity="dot").evaluate(),
            rev.sts_spearman(vectors(first), vectors(second), gold, "dot"))

  expected = {"cosine": figures(lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)),
              "dot": figures(lambda x: x)}
  assert expected["cosine"][0]["ndcg@10"] != pytest.approx(expected["dot"][0]["ndcg@10"])
  assert expected["cosine"][1] != pytest.approx(expected["dot"][1])
  c = retrieval_config.get_config()
  c.task.normalize = False
  for similarity, (retrieved, spearman) in expected.items():
    c.task.similarity = similarity
    for dev, want in ((beir, retrieved), (sts, {"spearman": spearman})):
      c.data.dev = dev
      [evaluator] = retrieval.evaluators(c, retrieval.dev_data(c), Embedder(),
                                         str(tmp_path))
      assert evaluator.run(None, 0) == want, (similarity, dev)
      assert json.loads((tmp_path / "dev_results.json").read_text()) == want


def _write(path, rows):
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def test_pairs_reader_formats_and_columns(tmp_path):
  rows = [{"anchor": f"q{i}", "positive": f"p{i}", "negative_2": f"m{i}", "negative_1": f"n{i}",
           "scores": [1.0, 0.5, 0.25]} for i in range(5)]
  _write(tmp_path / "a.jsonl", rows)
  pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
  task = _task(teacher_column="scores")
  for name in ("a.jsonl", "a.parquet"):
    got = pairs.read_pairs(str(tmp_path / name), task)
    assert got.anchors == [f"q{i}" for i in range(5)]
    assert got.documents[3] == ["p3", "n3", "m3"]  # negative_1 before negative_2.
    np.testing.assert_array_equal(got.teacher[0], [1.0, 0.5, 0.25])
  (tmp_path / "b.csv").write_text("question,answer\nwhat is x,x is y\nwho,him\n")
  got = pairs.read_pairs(str(tmp_path / "b.csv"), _task(anchor_column="question",
                                                        positive_column="answer"))
  assert got.documents == [["x is y"], ["him"]]


def test_bad_input_is_one_line(tmp_path):
  _write(tmp_path / "a.jsonl", [{"query": "q", "positive": "p"}])
  _write(tmp_path / "empty.jsonl", [{"anchor": "q", "positive": " "}])
  _write(tmp_path / "same.jsonl", [{"anchor": f"q{i}", "positive": f"p{i % 2}"} for i in range(6)])
  cases = [
      (lambda: pairs.read_pairs(str(tmp_path / "a.jsonl"), _task()), DataError,
       "no column 'anchor'.*set config.task.anchor_column"),
      (lambda: pairs.read_pairs(str(tmp_path / "empty.jsonl"), _task()), DataError,
       "row 1: column 'positive' is empty"),
      (lambda: pairs.read_pairs(str(tmp_path / "none.jsonl"), _task()), DataError,
       "does not exist"),
      (lambda: pairs.distinct_batches(pairs.example_texts(pairs.read_pairs(
          str(tmp_path / "same.jsonl"), _task())), np.arange(6), 4, "same"), DataError,
       "only 2 of its examples have texts that differ.*batch_size=4"),
      (lambda: contrastive.check_config(_task(matryoshka_dims=(8, 64)), 32), ConfigError,
       "matryoshka_dims: 64 is not between 1 and the embedding width 32"),
      (lambda: contrastive.check_config(_task(loss="kl")), ConfigError, "teacher_column"),
      (lambda: pooling.check("median"), ConfigError, "config.task.pooling='median'"),
      (lambda: embedding.tokenize(None, ["a", " "], "", 8), DataError, "text 1 is empty"),
  ]
  config = retrieval_config.get_config()
  config.train.grad_accum_steps = 2
  cases.append((lambda: retrieval.check_config(config), ConfigError, "mini_batch_size"))
  for fn, error, message in cases:
    with pytest.raises(error, match=message) as e:
      fn()
    assert "\n" not in str(e.value)


def test_batches_hold_distinct_texts_and_one_source(tmp_path):
  """No text twice in a batch (sentence-transformers' NO_DUPLICATES rule: an example
  sharing one waits for a later batch); every batch from one source; every example
  once an epoch; a batch is a function of (seed, epoch)."""
  rng = np.random.default_rng(0)
  for name, n in (("a", 40), ("b", 23)):
    _write(tmp_path / f"{name}.jsonl", [
        {"anchor": f"{name}q{i}", "positive": f"{name}p{rng.integers(0, 15)}"}
        for i in range(n)])
  sources = pairs.read_sources(f"a={tmp_path}/a.jsonl,b={tmp_path}/b.jsonl", _task())
  texts = [pairs.example_texts(s) for s in sources]
  plan = pairs.epoch_batches(sources, texts, 4, seed=1, epoch=0)
  seen = {0: [], 1: []}
  for s, index in plan:
    real = index[index >= 0]
    words = [t for i in real for t in texts[s][i]]
    assert len(words) == len(set(words))
    seen[s] += real.tolist()
  assert sorted(seen[0]) == list(range(40)) and sorted(seen[1]) == list(range(23))
  assert {s for s, _ in plan} == {0, 1}
  again = pairs.epoch_batches(sources, texts, 4, seed=1, epoch=0)
  assert all(s == t and (a == b).all() for (s, a), (t, b) in zip(plan, again))
  other = pairs.epoch_batches(sources, texts, 4, seed=1, epoch=1)
  assert any((a != b).any() for (_, a), (_, b) in zip(plan, other))


@pytest.mark.slow
def test_pod_plan_compiles_the_contrastive_step():
  """`benchmark plan` of a retrieval config compiles the contrastive step (GradCache on)
  for the mesh and counts its batch and model FLOPs (docs/retrieval.md's v5p-8 row is
  the same call on TPU chips). The count against XLA's of the compiled step without
  GradCache (whose scanned loop's body XLA counts once), a positive and a negative an
  example: ours is at most XLA's and within 15% of it (XLA's is 1.09x ours: it counts
  the elementwise work we leave out), so documents left out (2.2x) or queries counted
  twice (0.8x) fail."""
  from bertjax.benchmarks import plan as plan_lib  # pylint: disable=g-import-not-at-top
  c = retrieval_config.get_config("modernbert_tiny")
  c.task.max_seq_length, c.task.mini_batch_size, c.model.dtype = 32, 8, "float32"
  c = plan_lib.candidate(c, (4, 1, 1), "none", 1)
  topology = plan_lib.topology("cpu:4", hbm_gb=8)
  r = plan_lib.plan(c, topology, 16)
  assert r["fits"] and r["per_chip_batch"] == 4
  assert r["batch"] == 4 * (2 * 32 * 4 + 2 * 32 * 4 + 4)  # ids and masks, weights: 4 rows.
  flops = retrieval.train_flops(c, model_lib.config_from(c.model), 16)
  assert r["model_flops"] == pytest.approx(flops / 4)
  c.task.mini_batch_size = 0  # GradCache runs each forward twice: 4/3 of the FLOPs.
  assert flops == pytest.approx(4 / 3 * retrieval.train_flops(
      c, model_lib.config_from(c.model), 16))
  c.task.negative_columns = ("negative",)
  r = plan_lib.plan(c, topology, 16)
  assert 1.0 <= r["flops"] / r["model_flops"] < 1.15, (r["flops"], r["model_flops"])
