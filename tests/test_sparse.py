"""SPLADE (issue 58): the pooling and FLOPS regulariser against sentence-transformers'
own on the same numbers, the whole SpladeLoss of a transformers MLM model against
sentence-transformers' SparseEncoder reading the same weights (every ranking loss,
thresholds, the MLM head a chunk of tokens at a time), the loss on an 8-device mesh against one device with the
whole batch, and the one-line errors of bad settings."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import scipy.sparse
import torch
from sentence_transformers.sparse_encoder import SparseEncoder, losses
from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

from bertjax import convert, model as model_lib
from bertjax.checkpoint import workdir as workdir_lib
from bertjax.checkpoint.pretrained import load_pretrained
from bertjax.errors import CheckpointError, ConfigError
from bertjax.tasks import finetune, sparse
from configs.finetune import sparse as sparse_config
from tests.test_retrieval import assert_eight_devices_equal_one

DOC = "docs/sparse.md"


def _task(**kw) -> ml_collections.ConfigDict:
  t = sparse.resolve(sparse_config.get_config()).task
  for k, v in kw.items():
    t[k] = v
  return t


@pytest.mark.parametrize("how", sparse.POOLINGS)
@pytest.mark.parametrize("activation", sparse.ACTIVATIONS)
def test_pooling_matches_sentence_transformers(how, activation):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 7, 50)).astype(np.float32) * 3
  mask = (np.arange(7)[None] < np.array([7, 3, 1, 5])[:, None]).astype(np.int32)
  theirs = SpladePooling(how, activation).eval()({
      "token_embeddings": torch.from_numpy(logits),
      "attention_mask": torch.from_numpy(mask)})["sentence_embedding"].numpy()
  ours = sparse.pool(sparse.splade_weights(jnp.asarray(logits), jnp.asarray(mask),
                                           activation), how)
  np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("threshold", [0, 20])
def test_flops_matches_sentence_transformers(threshold):
  """FlopsLoss (with its l0 threshold) on the real rows; padding rows (weight 0) are as
  if absent."""
  rng = np.random.default_rng(1)
  x = np.maximum(rng.normal(size=(6, 40)), 0).astype(np.float32)
  x[1, :30] = 0  # 10 or fewer active: under the threshold
  theirs = float(losses.FlopsLoss(None, threshold or None).compute_loss_from_embeddings(
      torch.from_numpy(x[:4])))
  w = jnp.asarray([1, 1, 1, 1, 0, 0], jnp.float32)
  total, active = sparse.regularizer_sums(jnp.asarray(x), w, threshold)
  assert float(sparse.flops(total, jnp.sum(w))) == pytest.approx(theirs, rel=1e-6)
  assert float(active) == np.count_nonzero(x[:4])


def test_max_active_dims_keeps_what_sentence_transformers_keeps():
  from sentence_transformers.util import select_max_active_dims  # pylint: disable=g-import-not-at-top
  x = np.maximum(np.random.default_rng(2).normal(size=(5, 40)), 0).astype(np.float32)
  for k in (1, 7, 40):
    np.testing.assert_array_equal(sparse.top_active(x, k), select_max_active_dims(
        torch.from_numpy(x), k).numpy())
  assert sparse.top_active(x, 0) is x


@pytest.fixture(scope="module")
def splade(tiny_hf_bert):
  """sentence-transformers' SparseEncoder of the tiny transformers BertForMaskedLM
  (max pooling) in eval mode, bertjax's parameters of it, and a tokenized batch of 4
  queries x (positive, negative)."""
  st = SparseEncoder(modules=[MLMTransformer(tiny_hf_bert, max_seq_length=32),
                              SpladePooling("max")], device="cpu").eval()
  pretrained = load_pretrained(tiny_hf_bert)
  params = {k: pretrained.params[k] for k in ("encoder", "mlm")}
  texts = [["how do tuples work", "a tuple is an immutable sequence of values",
            "lists grow and shrink"],
           ["what is a generator", "generators yield values lazily one at a time",
            "the weather is sunny"],
           ["sort a list", "sorted returns a new sorted list from any iterable",
            "tuples cannot be changed"],
           ["open a file", "open returns a file object for reading or writing",
            "a generator is an iterator"]]
  features = [st.tokenize([row[j] for row in texts]) for j in range(3)]
  T = max(f["input_ids"].shape[1] for f in features)

  def padded(f, key):
    x = f[key].numpy().astype(np.int32)
    return np.pad(x, ((0, 0), (0, T - x.shape[1])))
  batch = {"query_input_ids": padded(features[0], "input_ids"),
           "query_attention_mask": padded(features[0], "attention_mask"),
           "doc_input_ids": np.stack([padded(f, "input_ids") for f in features[1:]], 1),
           "doc_attention_mask": np.stack([padded(f, "attention_mask")
                                           for f in features[1:]], 1),
           "example_weights": np.ones(4, np.float32)}
  return st, pretrained.config, params, features, batch


def _our_loss(config, params, batch, task, chunk_size=0):
  model = sparse.SpladeModel(config, "max", "relu", chunk_size)
  obj = sparse.objective(model, task, batch)
  return float(jax.jit(lambda p, b: obj.loss(obj.sums(p, b, None), obj.counts(b)))(
      params, batch))


def test_vectors_match_sentence_transformers(splade):
  st, config, params, features, batch = splade
  with torch.no_grad():
    theirs = st(features[1])["sentence_embedding"].numpy()
  model = sparse.SpladeModel(config, "max", "relu")
  ours = jax.jit(model.apply)({"params": params}, batch["doc_input_ids"][:, 0],
                              batch["doc_attention_mask"][:, 0])
  np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-5)
  assert (np.asarray(ours) > 0).sum() == (theirs > 0).sum()


def test_splade_loss_matches_sentence_transformers(splade):
  """SpladeLoss with each ranking loss (MNRL over in-batch and hard negatives,
  MarginMSE and KL on teacher scores), with and without thresholds and the query side
  regularised as documents, equal to sentence-transformers' within 1e-5; the MLM head
  a chunk of tokens at a time gives the same loss."""
  st, config, params, features, batch = splade
  teacher = np.array([[3.0, 1.0], [2.5, 0.5], [1.0, 1.5], [4.0, -1.0]], np.float32)
  cases = [
      (dict(), losses.SparseMultipleNegativesRankingLoss(st), {}),
      (dict(loss="margin_mse", teacher_column="t"), losses.SparseMarginMSELoss(st),
       # The random model's vectors have 27.4k-29.8k active dimensions: these thresholds
       # leave out half the queries and the positives under 29.4k and every negative.
       dict(document_regularizer_threshold=29400, query_regularizer_threshold=28000)),
      (dict(loss="kl", teacher_column="t"), losses.SparseDistillKLDivLoss(st), {}),
  ]
  for task_kw, base, splade_kw in cases:
    for only_documents in (False, True):
      kw = dict(query_regularizer_weight=5e-2, document_regularizer_weight=3e-2,
                **splade_kw)
      theirs_loss = losses.SpladeLoss(st, base, use_document_regularizer_only=only_documents,
                                      **{**kw, "query_regularizer_weight": None}
                                      if only_documents else kw)
      labels = None
      if "teacher_column" in task_kw:
        labels = torch.from_numpy(teacher[:, 0] - teacher[:, 1] if task_kw["loss"] ==
                                  "margin_mse" else teacher)
      with torch.no_grad():
        theirs = float(sum(theirs_loss(features, labels).values()))
      task = _task(**task_kw, **kw, document_regularizer_only=only_documents)
      b = dict(batch, teacher=teacher) if labels is not None else batch
      assert _our_loss(config, params, b, task) == pytest.approx(theirs, rel=1e-5), (
          task_kw, only_documents)
  # The head 5 tokens at a time in a scan (the last chunk padded): the same loss.
  assert batch["query_input_ids"].shape[1] % 5
  assert _our_loss(config, params, batch, _task(), chunk_size=5) == pytest.approx(
      _our_loss(config, params, batch, _task()), rel=1e-6)


def test_a_published_folder_is_read_with_its_pooling_and_prompts(splade, tmp_path):
  """A SparseEncoder folder as sentence-transformers saves one (sum pooling of
  log1p_relu, a query prompt, v6's Transformer): a run from it takes its settings, and
  bertjax's vectors of its weights are sentence-transformers' own; a folder without
  SpladePooling is refused in one line."""
  st, *_ = splade
  folder = str(tmp_path / "published")
  SparseEncoder(modules=[st[0], SpladePooling("sum", "log1p_relu")], device="cpu",
                prompts={"query": "query: "}).save_pretrained(folder)
  c = sparse_config.get_config()
  c.init_from = folder
  t = sparse.resolve(c).task
  assert (t.splade_pooling, t.activation, t.query_prompt) == ("sum", "log1p_relu", "query: ")
  pretrained = load_pretrained(folder)
  model = sparse.SpladeModel(pretrained.config, t.splade_pooling, t.activation)
  texts = ["query: how do tuples work", "query: open a file"]
  features = st.tokenize(texts)
  ours = jax.jit(model.apply)({"params": {k: pretrained.params[k] for k in ("encoder", "mlm")}},
                              features["input_ids"].numpy(), features["attention_mask"].numpy())
  theirs = SparseEncoder(folder, device="cpu").encode_query(
      [t[len("query: "):] for t in texts], convert_to_tensor=True).to_dense().numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5, atol=1e-5)
  modules = json.load(open(os.path.join(folder, "modules.json")))
  json.dump(modules[:1], open(os.path.join(folder, "modules.json"), "w"))
  with pytest.raises(CheckpointError, match="not an MLM Transformer at the folder's root"):
    sparse.resolve(c)


@pytest.fixture(scope="module")
def inference_free(tiny_hf_bert, tmp_path_factory):
  """An inference-free SparseEncoder (sentence-transformers' Router.for_query_document:
  SparseStaticEmbedding with random weights for queries, the tiny BertForMaskedLM and
  SpladePooling for documents) in eval mode and the folder it saved."""
  from sentence_transformers.base.modules import Router  # pylint: disable=g-import-not-at-top
  from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding  # pylint: disable=g-import-not-at-top
  documents = MLMTransformer(tiny_hf_bert, max_seq_length=32)
  static = SparseStaticEmbedding(tokenizer=documents.tokenizer)
  with torch.no_grad():
    static.weight.copy_(torch.rand(static.weight.shape, generator=torch.Generator().manual_seed(0)) * 3)
  model = SparseEncoder(modules=[Router.for_query_document(
      query_modules=[static], document_modules=[documents, SpladePooling("max")])],
                        similarity_fn_name="dot", device="cpu").eval()
  folder = str(tmp_path_factory.mktemp("inference_free") / "st")
  model.save_pretrained(folder)
  return model, folder


def test_inference_free_folder_encodes_and_trains_as_sentence_transformers(inference_free):
  """A saved inference-free folder: bertjax reads its query weights and model, encodes
  queries (their distinct tokens, no special tokens) and documents as
  sentence-transformers does, and its SpladeLoss (with and without a FLOPS term on the
  queries) equals sentence-transformers'; a run from it is inference-free and starts
  from its weights."""
  st, folder = inference_free
  encoder = sparse.load_encoder(folder)
  queries = ["how do tuples work", "open a file with open() and open it", "sort a list"]
  documents = ["a tuple is an immutable sequence of values", "open returns a file object",
               "sorted returns a new sorted list from any iterable"]
  ours = encoder.encode(queries, "query"), encoder.encode(documents, "document")
  theirs = (st.encode_query(queries, convert_to_tensor=True).to_dense().numpy(),
            st.encode_document(documents, convert_to_tensor=True).to_dense().numpy())
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a != 0, b != 0)
  # A query's active dimensions are its distinct tokens ("open" twice counts once).
  tokens = [set(st.tokenize([q], task="query")["input_ids"][0].tolist()) for q in queries]
  assert [int(n) for n in (ours[0] != 0).sum(1)] == [len(t) for t in tokens]
  # Fresh features for each of sentence-transformers' calls: SparseStaticEmbedding
  # multiplies its output into a features dict's sentence_embedding left by an earlier one.
  tokenize = lambda: [st.tokenize(queries, task="query"),
                      st.tokenize(documents, task="document")]
  features = tokenize()
  T = max(f["input_ids"].shape[1] for f in features)
  pad = lambda x: np.pad(x.numpy().astype(np.int32), ((0, 0), (0, T - x.shape[1])))
  batch = {"query_input_ids": pad(features[0]["input_ids"]),
           "query_attention_mask": pad(features[0]["attention_mask"]),
           "doc_input_ids": pad(features[1]["input_ids"])[:, None],
           "doc_attention_mask": pad(features[1]["attention_mask"])[:, None],
           "example_weights": np.ones(3, np.float32)}
  c = sparse_config.get_config()
  c.init_from = folder
  resolved = sparse.resolve(c)
  assert resolved.task.query_encoder == "static"
  for query_weight in (0.0, 5e-2):
    kw = dict(query_regularizer_weight=query_weight, document_regularizer_weight=3e-2)
    with torch.no_grad():
      want = float(sum(losses.SpladeLoss(
          st, losses.SparseMultipleNegativesRankingLoss(st), **kw)(tokenize(), None).values()))
    task = _task(query_encoder="static", **kw)
    obj = sparse.objective(encoder.embedder.model, task, batch)
    got = float(jax.jit(lambda p, b, obj=obj: obj.loss(obj.sums(p, b, None), obj.counts(b)))(
        encoder.params, batch))
    assert got == pytest.approx(want, rel=1e-5), query_weight
  kept = finetune._kept_params(resolved, load_pretrained(folder))
  np.testing.assert_array_equal(kept[sparse.QUERY_WEIGHTS],
                                st[0].sub_modules["query"][0].weight.detach().numpy())


def test_inference_free_folders_bertjax_cannot_compute_are_one_line(inference_free, tmp_path):
  """A Router of other routes, and a SparseStaticEmbedding that points to an IDF json
  instead of holding its weights: each refused in one line saying what to do."""
  import shutil  # pylint: disable=g-import-not-at-top
  _, saved = inference_free
  folder = str(tmp_path / "st")
  shutil.copytree(saved, folder)
  os.remove(os.path.join(folder, "query_0_SparseStaticEmbedding", "model.safetensors"))
  with pytest.raises(CheckpointError, match="has no model.safetensors.*save_pretrained"):
    sparse.load_encoder(folder)
  router = json.load(open(os.path.join(folder, "router_config.json")))
  router["structure"]["query"] = router["structure"]["document"]
  json.dump(router, open(os.path.join(folder, "router_config.json"), "w"))
  with pytest.raises(CheckpointError, match="computes only that Router"):
    sparse.load_encoder(folder)


def test_query_weights_train_at_their_own_rate():
  """An inference-free run's optimizer: the query weights' first AdamW step is their
  own learning rate, the rest's the run's (one group each, as sentence-transformers'
  learning_rate_mapping makes them); frozen, they do not move."""
  import optax  # pylint: disable=g-import-not-at-top
  c = sparse_config.get_config()
  c.task.query_encoder, c.train.warmup_fraction, c.train.weight_decay = "static", 0.0, 0.0
  c.train.learning_rate, c.task.query_learning_rate = 2e-5, 1e-3
  params = {"encoder": {"kernel": jnp.ones((3, 2))}, "mlm": {"bias": jnp.ones(4)},
            sparse.QUERY_WEIGHTS: jnp.ones(4)}
  grads = jax.tree.map(lambda x: 0.3 * jnp.ones_like(x), params)
  for frozen, want in ((False, 1e-3), (True, 0.0)):
    c.task.query_weights_frozen = frozen
    tx, _ = finetune.make_optimizer(c, None, 10)
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates[sparse.QUERY_WEIGHTS], -want, rtol=1e-4)
    np.testing.assert_allclose(updates["encoder"]["kernel"], -2e-5, rtol=1e-4)
    np.testing.assert_allclose(updates["mlm"]["bias"], -2e-5, rtol=1e-4)
  assert isinstance(tx, optax.GradientTransformation)


@pytest.mark.slow
def test_eight_devices_equal_one_with_the_whole_batch():
  """In-batch negatives and the FLOPS means over the global batch: the loss and
  gradients over 8 devices (with GradCache too) are one device's with the batch."""
  config = model_lib.config_from(ml_collections.ConfigDict(dict(
      family="bert", vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
      intermediate_size=32, max_position_embeddings=32, pooler=False, nsp=False,
      dtype="float32", dropout_rate=0.0)))
  model = sparse.SpladeModel(config, "max", "relu", chunk_size=4)
  rng = np.random.default_rng(0)
  n, t = 16, 12
  ids = rng.integers(5, 64, (n, 3, t)).astype(np.int32)
  mask = (np.arange(t) < rng.integers(3, t + 1, (n, 3))[..., None]).astype(np.int32)
  batch = {"query_input_ids": ids[:, 0], "query_attention_mask": mask[:, 0],
           "doc_input_ids": ids[:, 1:], "doc_attention_mask": mask[:, 1:],
           "example_weights": np.ones(n, np.float32)}
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), ids[:1, 0], mask[:1, 0])["params"])
  task = lambda mini: _task(mini_batch_size=mini, query_regularizer_weight=0.5,
                            document_regularizer_weight=0.3)
  assert_eight_devices_equal_one(model, params, batch, task,
                                 lambda mini: sparse.objective(model, task(mini), batch))


def test_bad_settings_are_one_line():
  for kw, words in [(dict(similarity="cosine"), "use 'dot'"),
                    (dict(splade_pooling="mean"), "splade_pooling"),
                    (dict(activation="gelu"), "activation"),
                    (dict(query_regularizer_weight=-1.0), "query_regularizer_weight"),
                    (dict(chunk_size=-2), "chunk_size"),
                    (dict(query_encoder="idf"), "query_encoder='idf'.*inference-free"),
                    (dict(query_learning_rate=-1.0), "query_learning_rate"),
                    (dict(max_active_dims=-1), "max_active_dims")]:
    with pytest.raises(ConfigError, match=words):
      sparse.check_config(_task(**kw))
  c = sparse_config.get_config()
  c.init_from = "/x"

  class Discriminator:  # An ELECTRA discriminator's heads.
    params = {"encoder": {}, "rtd": {}}
  with pytest.raises(ConfigError, match=r"/x has no MLM head \(its heads: \['rtd'\]\)"):
    finetune._kept_params(c, Discriminator())


@pytest.mark.slow
def test_documented_run_scores_its_sparsity_resumes_and_exports(tiny_hf_bert, tmp_path,
                                                                 monkeypatch):
  """docs/sparse.md's quick start from a transformers MLM model: scored on the BEIR
  fixture at the start and the end with its vectors' active dimensions (cut to
  max_active_dims), its steps
  logging them; rerun, it resumes at the end and trains nothing again; exported, the
  folder's `SparseEncoder` encodes as bertjax does."""
  import subprocess  # pylint: disable=g-import-not-at-top
  from tests import faults  # pylint: disable=g-import-not-at-top
  from tests.test_readme import REPO, documented  # pylint: disable=g-import-not-at-top
  workdir, folder = str(tmp_path / "splade"), str(tmp_path / "st")
  train = documented(DOC, "--config.task.eval_at_start=True", f"--workdir={workdir}",
                     f"--config.init_from={tiny_hf_bert}", "--config.compilation_cache_dir=",
                     "--config.train.log_every=2", "--config.task.chunk_size=16",
                     "--config.task.max_active_dims=300")
  done = subprocess.run(train, cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  dev = json.load(open(os.path.join(workdir, "dev_results.json")))
  assert {"ndcg@10", "mrr@10", "recall@100", "query_active_dims", "corpus_active_dims",
          "avg_flops"} <= set(dev)
  # The random model's vectors: thousands of active entries, cut to 300 for scoring.
  assert dev["query_active_dims"] == dev["corpus_active_dims"] == 300
  assert 0 < dev["avg_flops"] <= 300
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  train_rows = [r for r in rows if r["split"] == "train"]
  assert train_rows and all(r["document_active_dims"] > 0 and "query_flops" in r
                            for r in train_rows)
  assert [r["step"] for r in rows if r["split"] == "dev"] == [0, 9]  # 135 pairs / 16
  losses = faults.losses(workdir)
  monkeypatch.chdir(REPO)  # The documented command's paths are the repository's.
  c = workdir_lib.load_config(workdir)
  finetune.run(c, workdir)  # The same run, resumed at its end: nothing trained again.
  assert faults.losses(workdir) == losses
  convert.main([*documented(DOC, "--dst=/tmp/splade_st")[3:], f"--src={workdir}",
                f"--dst={folder}"])
  queries = [json.loads(line)["text"] for line in open(
      "tests/fixtures/retrieval/beir/queries.jsonl")]
  ours = sparse.load_encoder(workdir).encode(queries, "query")
  st = SparseEncoder(folder, device="cpu")
  theirs = st.encode_query(queries, convert_to_tensor=True).to_dense().numpy()
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
  assert np.count_nonzero(ours) == np.count_nonzero(theirs)
  out = str(tmp_path / "queries.npz")
  done = subprocess.run(documented(DOC, "python -m bertjax.embed encode",
                                   f"--checkpoint={folder}", f"--out={out}"),
                        cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "24 x 30522 sparse vectors (CSR), 64.0 active dimensions a text" in done.stdout
  cut = st.encode_query(queries, convert_to_tensor=True, max_active_dims=64)
  np.testing.assert_allclose(scipy.sparse.load_npz(out).toarray(), cut.to_dense().numpy(),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_documented_inference_free_run_exports_what_sentence_transformers_loads(
    tiny_hf_bert, tmp_path):
  """docs/sparse.md's inference-free run from a transformers MLM model: its query
  weights train at their own rate from one, its queries' active dimensions are their
  tokens; exported, the folder is sentence-transformers' Router layout, and its
  `SparseEncoder` encodes queries and documents as bertjax does."""
  import subprocess  # pylint: disable=g-import-not-at-top
  from tests.test_readme import REPO, documented  # pylint: disable=g-import-not-at-top
  workdir, folder = str(tmp_path / "splade_if"), str(tmp_path / "st")
  done = subprocess.run(documented(DOC, "query_encoder=static", f"--workdir={workdir}",
                                   f"--config.init_from={tiny_hf_bert}",
                                   "--config.compilation_cache_dir="),
                        cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "inference-free queries (a weight per token at lr 0.001)" in done.stderr
  dev = json.load(open(os.path.join(workdir, "dev_results.json")))
  assert 3 < dev["query_active_dims"] < 20 < dev["corpus_active_dims"]
  params = workdir_lib.open_finetuned(workdir).params
  moved = np.abs(np.asarray(params[sparse.QUERY_WEIGHTS]) - 1)
  # 9 steps of AdamW at a peak of 1e-3 (warm-up, linear decay): at most 9e-3 each.
  assert 1e-3 < moved.max() <= 9e-3
  assert set(params) == {"encoder", "mlm", sparse.QUERY_WEIGHTS}
  done = subprocess.run(documented(DOC, "--dst=/tmp/splade_if_st")[:4] + [
      f"--src={workdir}", f"--dst={folder}"], cwd=REPO, capture_output=True, text=True,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.load(open(os.path.join(folder, "modules.json")))[0]["type"].endswith("Router")
  queries = [json.loads(line)["text"] for line in open(
      os.path.join(REPO, "tests/fixtures/retrieval/beir/queries.jsonl"))]
  documents = [json.loads(line)["text"] for line in open(
      os.path.join(REPO, "tests/fixtures/retrieval/beir/corpus.jsonl"))][:32]
  st = SparseEncoder(folder, device="cpu")
  for kind, texts in (("query", queries), ("document", documents)):
    ours = sparse.load_encoder(workdir).encode(texts, kind)
    theirs = st.encode(texts, task=kind, convert_to_tensor=True).to_dense().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(ours != 0, theirs != 0)
