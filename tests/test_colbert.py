"""ColBERT (issue 58): MaxSim against sentence-transformers' on the same numbers (masks,
empty documents, a block of documents at a time), the token vectors of a
`MultiVectorEncoder` folder read by bertjax against its own encode (markers, query
expansion, the skip list), its three losses on a transformers model against
sentence-transformers' on the same weights, the loss on an 8-device mesh against one
device with the whole batch, and the one-line errors of bad settings."""

import json
import os
import string

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
from sentence_transformers import MultiVectorEncoder
from sentence_transformers.base.modules import Dense, Normalize, Transformer
from sentence_transformers.multi_vector_encoder import losses
from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
from sentence_transformers.util.similarity import maxsim as st_maxsim

from bertjax import model as model_lib
from bertjax.checkpoint.pretrained import load_pretrained
from bertjax.errors import CheckpointError, ConfigError
from bertjax.tasks import colbert, embedding, retrieval
from configs.finetune import colbert as colbert_config
from tests.test_retrieval import assert_eight_devices_equal_one

DOC = "docs/colbert.md"
QUERIES = ["how do tuples work?", "what is a generator", "sort a list, in place",
           "open a file"]
POSITIVES = ["a tuple is an immutable sequence of values.",
             "generators yield values lazily, one at a time!",
             "sorted() returns a new sorted list from any iterable",
             "open returns a file object for reading or writing"]
NEGATIVES = ["lists grow and shrink.", "the weather is sunny; it's warm",
             "tuples cannot be changed", "a generator is an iterator"]


def _config(init_from: str = "", **task) -> ml_collections.ConfigDict:
  c = colbert_config.get_config()
  c.init_from = init_from
  for k, v in task.items():
    c.task[k] = v
  return colbert.resolve(c)


def test_maxsim_matches_sentence_transformers():
  """Masked query tokens add nothing, masked document tokens never win the max, a
  document without a scored token scores -1e9; a block of documents at a time (and
  its gradient) is the whole at once."""
  rng = np.random.default_rng(0)
  q = rng.normal(size=(3, 5, 8)).astype(np.float32)
  d = rng.normal(size=(7, 6, 8)).astype(np.float32)
  q_mask = (np.arange(5) < np.array([5, 2, 4])[:, None]).astype(np.int32)
  d_mask = (rng.random((7, 6)) < 0.6).astype(np.int32)
  d_mask[3] = 0  # no token to score
  theirs = st_maxsim(torch.from_numpy(q), torch.from_numpy(d), torch.from_numpy(q_mask),
                     torch.from_numpy(d_mask)).numpy()
  ours = colbert.maxsim((jnp.asarray(q), jnp.asarray(q_mask)),
                        (jnp.asarray(d), jnp.asarray(d_mask)))
  np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-6, atol=1e-5)
  assert np.asarray(ours)[:, 3].max() == colbert.EMPTY_DOCUMENT_SCORE
  blocked = lambda q: colbert.maxsim((q, q_mask), (d, d_mask), elements=2 * 3 * 5 * 6)
  whole = lambda q: colbert.maxsim((q, q_mask), (d, d_mask))
  np.testing.assert_allclose(np.asarray(blocked(q)), np.asarray(whole(q)), rtol=1e-6)
  loss = lambda f: lambda q: jnp.sum(jnp.tanh(jnp.where(f(q) > -1e8, f(q), 0)))
  np.testing.assert_allclose(np.asarray(jax.grad(loss(blocked))(q)),
                             np.asarray(jax.grad(loss(whole))(q)), rtol=1e-6, atol=1e-7)
  pair = colbert.maxsim_pairwise((q[:2], q_mask[:2]), (d[:6].reshape(2, 3, 6, 8),
                                                       d_mask[:6].reshape(2, 3, 6)))
  np.testing.assert_allclose(np.asarray(pair), np.stack([theirs[0, :3], theirs[1, 3:6]]),
                             rtol=1e-6, atol=1e-5)


@pytest.fixture(scope="module")
def mve(tiny_hf_bert, tmp_path_factory):
  """sentence-transformers' MultiVectorEncoder of the tiny transformers BERT (a random
  projection to 16 dimensions, queries expanded to 12 tokens, the punctuation skipped,
  PyLate's markers), saved as a folder and loaded back in eval mode."""
  torch.manual_seed(1)
  folder = str(tmp_path_factory.mktemp("mve") / "folder")
  model = MultiVectorEncoder(modules=[
      Transformer(tiny_hf_bert, document_length=24,
                  query_expansion={"strategy": "fixed", "length": 12}),
      Dense(32, 16, bias=False, activation_function=torch.nn.Identity(),
            module_input_name="token_embeddings"),
      MultiVectorMask(skiplist_words=list(string.punctuation)),
      Normalize(module_input_name="token_embeddings")],
      prompts={"query": "[Q] ", "document": "[D] "}, device="cpu")
  model.save_pretrained(folder)
  return MultiVectorEncoder(folder, device="cpu").eval(), folder


def test_a_folder_encodes_as_sentence_transformers_encodes_it(mve):
  """A MultiVectorEncoder folder read by bertjax: the same token vectors for queries
  (marker, expansion to 12 tokens, every position) and documents (marker, cut at 24
  tokens, punctuation left out); a run from it takes its settings."""
  st, folder = mve
  encoder = colbert.load_encoder(folder)
  long_document = " ".join(["tuples and lists, again."] * 8)
  for kind, texts in (("query", QUERIES), ("document", POSITIVES + [long_document])):
    ours = encoder.encode(texts, kind)
    theirs = (st.encode_query if kind == "query" else st.encode_document)(
        texts, convert_to_numpy=True)
    assert [len(m) for m in ours] == [len(m) for m in theirs], kind
    for a, b in zip(ours, theirs):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  assert {len(m) for m in encoder.encode(QUERIES, "query")} == {12}
  t = _config(init_from=folder, query_prompt="", document_prompt="").task
  assert (t.dim, t.query_length, t.query_expansion, t.query_prompt, t.max_seq_length) == (
      16, 12, "fixed", "[Q] ", 180)
  assert encoder.settings.max_seq_length == 24


def _batch(st, config, tokenizer, texts_per_column):
  """Our batch of the columns' texts, tokenized and laid out by bertjax (the query
  rows checked against sentence-transformers' own)."""
  t = config.task
  layout = colbert.task_layout(t, tokenizer)
  settings = embedding.settings_of(t)
  rows = [embedding.tokenize(tokenizer, texts, embedding.prompt(settings, kind), length)
          for texts, kind, length in zip(texts_per_column, ("query", "document", "document"),
                                         (t.query_length, 24, 24))]
  q = layout.queries(rows[0], 16, tokenizer.pad_id)
  theirs = st.preprocess(["[Q] " + x for x in texts_per_column[0]], task="query")
  np.testing.assert_array_equal(q["input_ids"], theirs["input_ids"].numpy())
  np.testing.assert_array_equal(q["attention_mask"], theirs["attention_mask"].numpy())
  docs = [layout.documents(r, 24, tokenizer.pad_id) for r in rows[1:]]
  out = {f"query_{k}": v for k, v in q.items()}
  for k in docs[0]:
    out[f"doc_{k}"] = np.stack([d[k] for d in docs], 1)
  out["example_weights"] = np.ones(len(rows[0]), np.float32)
  return out


def test_losses_match_sentence_transformers(mve):
  """MultiVectorMultipleNegativesRankingLoss (in-batch and hard negatives), MarginMSE
  and DistillKLDiv on teacher scores: bertjax's loss of the folder's weights equals
  sentence-transformers' within 1e-5."""
  st, folder = mve
  config = _config(init_from=folder)
  pretrained = load_pretrained(folder)
  params = {"encoder": pretrained.params["encoder"],
            "projection": {"kernel": colbert.start_projection(folder)["kernel"]}}
  columns = (QUERIES, POSITIVES, NEGATIVES)
  batch = _batch(st, config, pretrained.tokenizer, columns)
  features = [st.preprocess([p + x for x in texts], task=task) for texts, p, task in zip(
      columns, ("[Q] ", "[D] ", "[D] "), ("query", "document", "document"))]
  for f, task in zip(features, ("query", "document", "document")):
    f["task"] = task
  teacher = np.array([[3.0, 1.0], [2.5, 0.5], [1.0, 1.5], [4.0, -1.0]], np.float32)
  model = colbert.ColbertModel(pretrained.config, 16)
  cases = [("mnrl", losses.MultiVectorMultipleNegativesRankingLoss(st, scale=2.0), None),
           ("margin_mse", losses.MultiVectorMarginMSELoss(st), teacher[:, :1] - teacher[:, 1:]),
           ("kl", losses.MultiVectorDistillKLDivLoss(st, temperature=2.0), teacher)]
  for name, theirs_loss, labels in cases:
    with torch.no_grad():
      theirs = float(theirs_loss(features, None if labels is None else torch.from_numpy(
          labels[:, 0] if name == "margin_mse" else labels)))
    t = _config(init_from=folder, loss=name, scale=2.0, temperature=2.0,
                teacher_column="t" if labels is not None else "").task
    obj = retrieval.objective(model, t, batch, colbert.SCORING)
    b = dict(batch, teacher=teacher) if labels is not None else batch
    ours = float(jax.jit(lambda p, b: obj.loss(obj.sums(p, b, None), obj.counts(b)))(
        params, b))
    assert ours == pytest.approx(theirs, rel=1e-5), name


@pytest.mark.slow
def test_eight_devices_equal_one_with_the_whole_batch():
  """In-batch documents (vectors and masks) from the whole mesh: the loss and
  gradients over 8 devices, with GradCache too, are one device's with the batch."""
  config = model_lib.config_from(ml_collections.ConfigDict(dict(
      family="bert", vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
      intermediate_size=32, max_position_embeddings=32, pooler=False, nsp=False,
      dtype="float32", dropout_rate=0.0)))
  model = colbert.ColbertModel(config, 8)
  rng = np.random.default_rng(0)
  n, tq, td = 16, 6, 10
  q_ids = rng.integers(5, 64, (n, tq)).astype(np.int32)
  d_ids = rng.integers(5, 64, (n, 2, td)).astype(np.int32)
  d_mask = (np.arange(td) < rng.integers(3, td + 1, (n, 2))[..., None]).astype(np.int32)
  q_mask = (np.arange(tq) < rng.integers(2, tq + 1, n)[:, None]).astype(np.int32)
  batch = {"query_input_ids": q_ids, "query_attention_mask": q_mask,
           "query_score_mask": np.ones_like(q_mask),
           "doc_input_ids": d_ids, "doc_attention_mask": d_mask,
           "doc_score_mask": d_mask * (d_ids % 7 != 0),
           "example_weights": np.ones(n, np.float32)}
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), q_ids[:1], q_mask[:1])["params"])
  task = lambda mini: _config(mini_batch_size=mini).task
  assert_eight_devices_equal_one(
      model, params, batch, task,
      lambda mini: retrieval.objective(model, task(mini), batch, colbert.SCORING))


def test_bad_settings_are_one_line(tmp_path):
  for kw, words in [(dict(similarity="cosine"), "use 'dot'"),
                    (dict(query_expansion="min"), "query_expansion"),
                    (dict(query_length=2), "query_length=2"),
                    (dict(dim=0), "config.task.dim=0"),
                    (dict(matryoshka_dims=(8,)), "takes neither")]:
    with pytest.raises(ConfigError, match=words):
      colbert.check_config(_config(**kw))
  c = _config()
  c.model.attention_impl = "pallas_gpu"
  with pytest.raises(ConfigError, match="attend_to_expansion=True"):
    colbert.check_config(c)
  c = _config()
  c.data.dev = str(tmp_path / "sts.jsonl")
  with pytest.raises(ConfigError, match="BEIR's layout"):
    colbert.check_config(c)
  folder = tmp_path / "older"
  folder.mkdir()
  json.dump([{"idx": 0, "name": "0", "path": "", "type":
              "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}],
            open(folder / "modules.json", "w"))
  json.dump({"model_type": "MultiVectorEncoder"},
            open(folder / "config_sentence_transformers.json", "w"))
  with pytest.raises(CheckpointError, match="save_pretrained it to convert older layouts"):
    colbert.resolve(_config(init_from=str(folder)))


@pytest.mark.slow
def test_documented_run_scores_resumes_and_exports(tiny_hf_bert, tmp_path, monkeypatch):
  """docs/colbert.md's quick start from a transformers model (a random projection):
  scored by exact MaxSim on the BEIR fixture at the start and the end; rerun, it
  resumes at the end and trains nothing again; exported, the folder's
  `MultiVectorEncoder` encodes as bertjax does, and `embed encode` writes its token
  matrices."""
  import subprocess  # pylint: disable=g-import-not-at-top
  from bertjax import convert  # pylint: disable=g-import-not-at-top
  from bertjax.checkpoint import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import finetune  # pylint: disable=g-import-not-at-top
  from tests import faults  # pylint: disable=g-import-not-at-top
  from tests.test_readme import REPO, documented  # pylint: disable=g-import-not-at-top
  workdir, folder = str(tmp_path / "colbert"), str(tmp_path / "st")
  train = documented(DOC, "python -m bertjax.finetune", f"--workdir={workdir}",
                     f"--config.init_from={tiny_hf_bert}", "--config.compilation_cache_dir=",
                     "--config.train.log_every=2")
  done = subprocess.run(train, cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "128-dimensional token vectors scored by MaxSim, queries of 32 tokens expanded" in (
      done.stderr)
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  dev = [r for r in rows if r["split"] == "dev"]
  assert [r["step"] for r in dev] == [0, 9]  # 135 pairs / 16
  assert all(0 <= r["ndcg@10"] <= 1 and "mrr@10" in r and "recall@100" in r for r in dev)
  assert [r for r in rows if r["split"] == "train" and r["in_batch_accuracy"] >= 0]
  losses = faults.losses(workdir)
  monkeypatch.chdir(REPO)  # The documented command's paths are the repository's.
  finetune.run(workdir_lib.load_config(workdir), workdir)  # Resumed at its end.
  assert faults.losses(workdir) == losses
  convert.main([*documented(DOC, "python -m bertjax.convert")[3:], f"--src={workdir}",
                f"--dst={folder}"])
  queries = [json.loads(line)["text"] for line in open(
      "tests/fixtures/retrieval/beir/queries.jsonl")]
  corpus = [json.loads(line)["text"] for line in open(
      "tests/fixtures/retrieval/beir/corpus.jsonl")][:16]
  st = MultiVectorEncoder(folder, device="cpu")
  ours = colbert.load_encoder(workdir)
  for kind, texts, theirs in (("query", queries, st.encode_query),
                              ("document", corpus, st.encode_document)):
    mine = ours.encode(texts, kind)
    assert [len(m) for m in mine] == [len(m) for m in theirs(texts, convert_to_numpy=True)]
    np.testing.assert_allclose(np.concatenate(mine), np.concatenate(
        theirs(texts, convert_to_numpy=True)), rtol=1e-5, atol=1e-5)
  out = str(tmp_path / "query_tokens.npz")
  done = subprocess.run(documented(DOC, "python -m bertjax.embed encode",
                                   f"--checkpoint={folder}", f"--out={out}"),
                        cwd=REPO, capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "24 texts, 768 token vectors of 128 dimensions (MaxSim)" in done.stdout
  written = np.load(out)
  np.testing.assert_allclose(written["vectors"], np.concatenate(
      st.encode_query(queries, convert_to_numpy=True)), rtol=1e-5, atol=1e-5)
  assert list(written["offsets"]) == list(range(0, 769, 32))


@pytest.mark.slow
def test_reranking_every_candidate_is_the_exact_search(mve):
  """MaxSimReranker of a first stage (BM25's top 20 of the BEIR fixture, and every
  document) scores each candidate as the exact search does; over every document the
  two give the same figures, and the first stage's own come beside them."""
  from bertjax.tasks import rerank_eval, retrieval_eval  # pylint: disable=g-import-not-at-top
  _, folder = mve
  encoder = colbert.load_encoder(folder)
  split = retrieval_eval.read_beir("tests/fixtures/retrieval/beir")
  encode = lambda kind: lambda texts: encoder.encode(texts, kind)
  exact = colbert.MaxSimEvaluator(split, encode("query"), encode("document"),
                                  k_values=(1, 10, 159), mrr_at=10)
  every = {q: sorted(split.corpus) for q in split.queries}
  rerank = colbert.MaxSimReranker(split, every, encode("query"), encode("document"),
                                  query_block=5, k_values=(1, 10, 159), mrr_at=10)
  ranked = exact.search()
  for q, docs in rerank.search().items():
    for d, s in ranked[q].items():
      assert docs[d] == pytest.approx(s, rel=1e-5, abs=1e-5)
  figures = rerank.evaluate()
  for k, v in exact.evaluate().items():
    assert figures[k] == pytest.approx(v, abs=1e-6), k
  bm25 = rerank_eval.first_stage(split, "bm25", 20)
  top = colbert.MaxSimReranker(split, bm25, encode("query"), encode("document")).evaluate()
  assert top["first_stage_ndcg@10"] > 0 and 0 <= top["ndcg@10"] <= 1
  assert top["recall@100"] == top["first_stage_recall@100"]  # The same 20 candidates.


@pytest.mark.slow
def test_pod_plan_counts_the_colbert_step():
  """`benchmark plan` of a ColBERT config compiles its step (queries at query_length,
  scoring masks in the batch) and its model FLOPs (`retrieval.train_flops`: the
  encoder over queries and documents at their own lengths, the projection, MaxSim of
  every query against every document) are within 15% of XLA's count of the compiled
  step, at most it (XLA counts the elementwise work too): queries counted at the
  documents' length, or MaxSim left out, fail."""
  from bertjax.benchmarks import plan as plan_lib  # pylint: disable=g-import-not-at-top
  c = colbert_config.get_config("modernbert_tiny")
  c.task.max_seq_length, c.task.query_length, c.model.dtype = 128, 16, "float32"
  c.task.negative_columns = ("negative",)
  c = plan_lib.candidate(c, (4, 1, 1), "none", 1)
  r = plan_lib.plan(c, plan_lib.topology("cpu:4", hbm_gb=8), 64)
  assert r["fits"] and r["per_chip_batch"] == 16
  # Ids, attention and scoring masks of 16 queries x 16 and 16 x 2 documents x 128, weights.
  assert r["batch"] == 4 * (3 * 16 * 16 + 3 * 16 * 2 * 128 + 16)
  assert 1.0 <= r["flops"] / r["model_flops"] < 1.15, (r["flops"], r["model_flops"])
