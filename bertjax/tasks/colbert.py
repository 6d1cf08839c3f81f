"""The 'colbert' fine-tuning task: a multi-vector (late-interaction) retriever made of any
family's encoder and a linear projection of its token states (`ColbertModel`), trained
on the retrieval task's data, trainer, GradCache and in-batch negatives from the whole
mesh (`bertjax.tasks.retrieval`), with sentence-transformers 6's `MultiVectorEncoder`
losses, and evaluated by exact MaxSim over a BEIR corpus (`MaxSimEvaluator`) or by
reranking a first stage's candidates (`MaxSimReranker`).

    python -m bertjax.finetune --config=configs/finetune/colbert.py \\
        --config.init_from=MODEL --config.data.train=pairs.jsonl \\
        --config.data.dev=BEIR_DIR --workdir=/tmp/colbert

A text becomes a vector per token: the encoder's last states projected to `dim` (128)
without bias and L2-normalised, sentence-transformers' Transformer -> Dense ->
MultiVectorMask -> Normalize. Which tokens are scored is the text's scoring mask
(`Layout`): a query is its prompt (the query marker, e.g. '[Q] ') and text cut to
`query_length` tokens and, with query expansion ('fixed', ColBERT's query
augmentation), padded to exactly `query_length` with the mask token, every position
scored; the encoder attends to the expansion positions only with
`attend_to_expansion`. A document is its prompt and text cut to `max_seq_length`
tokens, scored at its real tokens but those of the skip list (the punctuation, as
ColBERT and PyLate skip it). MaxSim: a query's score against a document is the sum
over the query's scored tokens of the highest dot product with a scored document
token (`maxsim`: masked document tokens never win the max; a document without a
scored token scores -1e9, as in sentence-transformers).

The losses (config.task.loss) are sentence-transformers 6.2.0's multi-vector ones on
MaxSim: 'mnrl' MultiVectorMultipleNegativesRankingLoss (scale 1 by default: MaxSim is
a sum over the query's tokens), 'margin_mse' MultiVectorMarginMSELoss, 'kl'
MultiVectorDistillKLDivLoss (PyLate's Distillation loss: KL to the teacher's softmax).
In-batch negatives come from the global batch (sentence-transformers'
gather_across_devices=True; PyLate's gather_across_devices): under a mesh each device
scores its own queries against every device's documents, their vectors and masks
all-gathered in one collective (`contrastive.mnrl`). MaxSim is computed a block of
documents at a time, each block's [queries, documents, query tokens, document tokens]
scores recomputed in the backward pass (`maxsim`), so that only one block's are live.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.checkpoint import workdir as workdir_lib
from bertjax.checkpoint.pretrained import load_pretrained
from bertjax.errors import ConfigError
from bertjax.hf import convert, sentence_transformers as st
from bertjax.model import attention, family_of
from bertjax.model.config import dtype_of
from bertjax.tasks import embedding, pooling, retrieval_eval
from bertjax.tasks.base import COLBERT_TASK

NAME = COLBERT_TASK  # config.task.name
EXPANSIONS = ("fixed", "")
EMPTY_DOCUMENT_SCORE = -1e9  # sentence-transformers' score of a document with no token.
# MaxSim scores held at once: [queries, documents, query tokens, document tokens]
# float32 elements of one block of queries against one of documents (256 MiB).
MAXSIM_ELEMENTS = 1 << 26
CORPUS_CHUNK = 2048  # Documents an evaluation encodes and scores at once.
QUERY_BLOCK = 256  # Queries an evaluation scores against a block of documents at once.


class ColbertModel(nn.Module):
  """The encoder of `config`'s family (parameters under 'encoder') and a projection of
  its token states to `dim` without bias ('projection'), L2-normalised per token:
  input_ids, attention_mask [N, T] -> [N, T, dim] float32."""

  config: Any
  dim: int = 128

  def setup(self):
    self.encoder = family_of(self.config).encoder(self.config)
    self.projection = nn.Dense(self.dim, use_bias=False, dtype=jnp.float32,
                               param_dtype=jnp.float32)

  def __call__(self, input_ids, attention_mask, deterministic: bool = True) -> jax.Array:
    out = self.encoder(input_ids, attention_mask, deterministic=deterministic)
    x = self.projection(out["last_hidden_state"].astype(jnp.float32))
    return pooling.normalize(x)


def _block_scores(q, q_mask, d, d_mask):
  """MaxSim of q [A, Tq, D] (q_mask [A, Tq]) against d [M, Td, D] (d_mask [M, Td]):
  float32 dot products at the platform's matmul precision (full on a CPU; on a TPU
  one bfloat16 pass, TF32 on a GPU, unless jax_default_matmul_precision says
  otherwise: MaxSim can be a third of a large batch's FLOPs), float32 max and sum."""
  s = jnp.einsum("aqe,mde->amqd", q.astype(jnp.float32), d.astype(jnp.float32))
  s = jnp.where(d_mask[None, :, None, :] > 0, s, jnp.finfo(jnp.float32).min)
  total = jnp.sum(jnp.max(s, axis=-1) * q_mask[:, None, :].astype(jnp.float32), axis=-1)
  return jnp.where(jnp.any(d_mask > 0, axis=-1)[None, :], total, EMPTY_DOCUMENT_SCORE)


def maxsim(queries: tuple[jax.Array, jax.Array], documents: tuple[jax.Array, jax.Array],
           elements: int = MAXSIM_ELEMENTS) -> jax.Array:
  """(vectors [A, Tq, D], scoring mask [A, Tq]) x (vectors [M, Td, D], mask [M, Td])
  -> [A, M] float32 MaxSim scores (the module docstring), a block of queries against a
  block of documents at a time (at most `elements` token scores live; each block's
  recomputed for its gradient), the blocks about square in queries and documents."""
  q, q_mask = queries
  d, d_mask = documents
  (A, Tq), (M, Td) = q.shape[:2], d.shape[:2]
  pair = max(Tq * Td, 1)
  a = min(A, max(1, math.isqrt(elements // pair)))
  m = min(M, max(1, elements // (a * pair)))
  if a >= A and m >= M:
    return _block_scores(q, q_mask, d, d_mask)

  def blocks(x, size):
    n = -(-x.shape[0] // size)
    x = jnp.pad(x, ((0, n * size - x.shape[0]),) + ((0, 0),) * (x.ndim - 1))
    return x.reshape(n, size, *x.shape[1:])

  qs, q_masks, ds, d_masks = blocks(q, a), blocks(q_mask, a), blocks(d, m), blocks(d_mask, m)
  na, nm = qs.shape[0], ds.shape[0]

  def one(k):  # Block pair k: its inputs sliced from the whole (only k is saved).
    i, j = k // nm, k % nm
    return _block_scores(qs[i], q_masks[i], ds[j], d_masks[j])

  out = jax.lax.map(jax.checkpoint(one), jnp.arange(na * nm)).reshape(na, nm, a, m)
  return jnp.swapaxes(out, 1, 2).reshape(na * a, nm * m)[:A, :M]


def maxsim_pairwise(queries: tuple[jax.Array, jax.Array],
                    documents: tuple[jax.Array, jax.Array]) -> jax.Array:
  """(vectors [B, Tq, D], mask [B, Tq]) x each row's own documents (vectors
  [B, C, Td, D], mask [B, C, Td]) -> [B, C] MaxSim scores."""
  (q, q_mask), (d, d_mask) = queries, documents
  return jax.vmap(lambda *x: _block_scores(x[0][None], x[1][None], x[2], x[3])[0])(
      q, q_mask, d, d_mask)


SCORING = (maxsim, maxsim_pairwise)  # contrastive.loss_sums' (all-pairs, row-wise)


@dataclasses.dataclass(frozen=True)
class Layout:
  """How a ColBERT model's texts become rows (the module docstring): queries cut to
  `query_length` tokens and, with `expansion`, padded to it with `expansion_id`
  (attended with `attend`); documents scored but at `skip_ids`."""

  query_length: int
  expansion: bool
  attend: bool
  expansion_id: int
  skip_ids: tuple[int, ...]

  def queries(self, rows: Sequence[Sequence[int]], width: int, pad_id: int
              ) -> dict[str, np.ndarray]:
    """input_ids, attention_mask and score_mask [N, T] of token rows (`width` wide, or
    exactly query_length with expansion)."""
    if self.expansion:
      ids, mask = embedding.pad(rows, self.query_length, self.expansion_id)
      score = np.ones_like(mask)
      return {"input_ids": ids, "attention_mask": score if self.attend else mask,
              "score_mask": score}
    ids, mask = embedding.pad(rows, width, pad_id)
    return {"input_ids": ids, "attention_mask": mask, "score_mask": mask}

  def documents(self, rows: Sequence[Sequence[int]], width: int, pad_id: int
                ) -> dict[str, np.ndarray]:
    """input_ids, attention_mask and score_mask (the real tokens but the skip list's)."""
    ids, mask = embedding.pad(rows, width, pad_id)
    skipped = np.isin(ids, np.asarray(self.skip_ids, np.int32))
    return {"input_ids": ids, "attention_mask": mask,
            "score_mask": (mask * ~skipped).astype(np.int32)}


def layout(tokenizer, query_length: int, expansion: str, attend: bool,
           skiplist_words: Sequence[str]) -> Layout:
  """The `Layout` of these settings (a ColBERT config's task section, a
  `MultiVectorEncoder` folder's) with `tokenizer`: the skip list's words that are single
  tokens of its vocabulary (sentence-transformers' MultiVectorMask drops the others),
  the mask token the expansion's."""
  unk = tokenizer.id_to_token(tokenizer.unk_id) if tokenizer.unk_id is not None else None
  skip = []
  for word in skiplist_words:
    i = tokenizer.token_to_id(word)
    if i is not None and (i != tokenizer.unk_id or word == unk):
      skip.append(int(i))
  return Layout(query_length, expansion == "fixed", bool(attend), int(tokenizer.mask_id),
                tuple(skip))


def task_layout(task_cfg, tokenizer) -> Layout:
  """The `Layout` of a ColBERT config's task section."""
  t = task_cfg
  return layout(tokenizer, t.query_length, t.query_expansion, t.attend_to_expansion,
                t.skiplist_words)


def check_config(config) -> None:
  """The ColBERT settings of `config` in range (one ConfigError line each)."""
  t = config.task
  if t.query_expansion not in EXPANSIONS:
    raise ConfigError(f"config.task.query_expansion={t.query_expansion!r}: use 'fixed' "
                      "(queries padded to query_length with the mask token) or '' (none).")
  if t.dim < 1:
    raise ConfigError(f"config.task.dim={t.dim}: use a positive width (128 is ColBERT's).")
  if t.first_stage_k < 1:
    raise ConfigError(f"config.task.first_stage_k={t.first_stage_k}: rerank at least one "
                      "candidate a query (100 is the usual).")
  if t.query_length < 3 or t.query_length > t.max_seq_length:
    raise ConfigError(
        f"config.task.query_length={t.query_length} leaves no room for a query between "
        "the special tokens and the query marker, or exceeds config.task.max_seq_length="
        f"{t.max_seq_length}; use a length between 3 and it (32 is ColBERT's).")
  if t.matryoshka_dims or t.symmetric:
    raise ConfigError("config.task.matryoshka_dims and config.task.symmetric are a "
                      "single-vector model's; a ColBERT model takes neither.")
  if t.similarity != "dot":
    raise ConfigError(f"config.task.similarity={t.similarity!r}: a ColBERT model scores "
                      "by MaxSim of its normalised token vectors; use 'dot'.")
  if config.data.get("dev") and not os.path.isdir(config.data.dev):
    raise ConfigError(f"config.data.dev={config.data.dev} is a file: a ColBERT model is "
                      "scored on a directory in BEIR's layout (corpus, queries, qrels).")
  if t.query_expansion and not t.attend_to_expansion:
    requested = config.model.get("attention_impl", "")
    impl = attention.resolve_impl(requested, platform=jax.default_backend(),
                                  dtype=dtype_of(config.model.get("dtype", "")),
                                  dropout=False, seq_len=t.query_length)
    if impl != "xla":
      raise ConfigError(
          f"config.model.attention_impl={requested!r} runs queries through {impl!r}, but "
          "the expansion positions (attention mask 0) are read and only the 'xla' path "
          "computes them as Hugging Face does; set it to 'xla', or "
          "config.task.attend_to_expansion=True.")


def resolve(config):
  """`config` (a copy, changed in place) whose empty ColBERT settings are those of the
  `MultiVectorEncoder` folder `config.init_from` (`st.read_multi_vector`: its prompts,
  lengths, expansion, skip list, width, lower-casing), else the config's defaults."""
  t = config.task
  if config.init_from and st.is_multi_vector_folder(config.init_from):
    folder = st.read_multi_vector(config.init_from)
    s = folder.settings
    t.query_prompt = t.query_prompt or embedding.prompt(s, "query")
    t.document_prompt = t.document_prompt or embedding.prompt(s, "document")
    t.do_lower_case = t.do_lower_case or s.do_lower_case
    t.dim = folder.dim
    t.query_length, t.query_expansion = folder.query_length, folder.expansion
    t.attend_to_expansion = folder.attend
    t.skiplist_words = folder.skiplist_words
  t.pooling = t.pooling or "mean"  # Unused by a multi-vector model; its settings' field.
  return config


def start_projection(path: str) -> dict | None:
  """The projection's parameters of what `path` holds (a 'colbert' workdir or a
  `MultiVectorEncoder` folder), None for an encoder without one (a random projection,
  as sentence-transformers starts from a bare transformers model)."""
  if workdir_lib.is_finetuned(path) and workdir_lib.task_info(path)["name"] == NAME:
    return workdir_lib.open_finetuned(path).params["projection"]
  if st.is_multi_vector_folder(path):
    return {"kernel": st.read_multi_vector(path).projection}
  return None


def is_colbert(path: str) -> bool:
  """Whether `path` holds a multi-vector model: a 'colbert' fine-tuning workdir or a
  sentence-transformers `MultiVectorEncoder` folder."""
  return embedding.holds(path, NAME, st.is_multi_vector_folder)


class TokenEmbedder(embedding.Embedder):
  """Texts -> each text's scored token vectors ([n_i, dim] float32, in the text's
  order), the batches as `embedding.Embedder` makes them, rows padded by `Layout`."""

  def __init__(self, model: ColbertModel, tokenizer, settings: st.Settings, mesh, rules,
               param_shardings, text_layout: Layout):
    super().__init__(model, tokenizer, settings, mesh, rules, param_shardings)
    self.layout = text_layout

  def tokenize(self, texts: Sequence[str], kind: str) -> list[list[int]]:
    length = (self.layout.query_length if kind == "query" else
              self.settings.max_seq_length)
    return embedding.tokenize(self._text_tokenizer, texts, embedding.prompt(
        self.settings, kind), length)

  def pad_batch(self, rows, kind: str) -> dict[str, np.ndarray]:
    width = embedding.bucket(max(map(len, rows)), self.settings.max_seq_length)
    pad = self.layout.queries if kind == "query" else self.layout.documents
    return pad(rows, width, self.tokenizer.pad_id)

  def encode(self, params, texts: Sequence[str], kind: str, batch_size: int = 64,
             show: str = "") -> list[np.ndarray]:
    """Each text's scored token vectors [n_i, dim] float32 as `kind`."""
    out: list[Any] = [None] * len(texts)
    for chosen, vectors, inputs in self.batches(params, texts, kind, batch_size, show):
      for i, v, m in zip(chosen, vectors, inputs["score_mask"]):
        out[i] = v[m > 0]
    return out


def padded(matrices: Sequence[np.ndarray], width: int | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
  """Token matrices [n_i, D] -> (vectors [N, width, D], mask [N, width]) zero-padded
  (width: the longest by default)."""
  width = width or max(len(m) for m in matrices)
  dim = matrices[0].shape[1]
  vectors = np.zeros((len(matrices), width, dim), np.float32)
  mask = np.zeros((len(matrices), width), np.int32)
  for i, m in enumerate(matrices):
    vectors[i, :len(m)], mask[i, :len(m)] = m, 1
  return vectors, mask


@jax.jit
def _scores(q, q_mask, d, d_mask):
  return maxsim((q, q_mask), (d, d_mask))


class MaxSimEvaluator(retrieval_eval.RetrievalEvaluator):
  """BEIR-style evaluation of a multi-vector model by exact MaxSim: every judged query
  against every document, the corpus `corpus_chunk_size` documents at a time (encoded,
  scored, dropped: host memory is one chunk's token matrices), a running top-k;
  `encode_queries` / `encode_documents` return token matrices. The measures are
  `retrieval_eval.evaluate`'s (nDCG@10, MRR@10, Recall@100, ...)."""

  def __init__(self, split, encode_queries, encode_documents,
               corpus_chunk_size: int = CORPUS_CHUNK, query_block: int = QUERY_BLOCK,
               **kw):
    super().__init__(split, encode_queries, encode_documents, similarity="dot",
                     corpus_chunk_size=corpus_chunk_size, query_block=query_block, **kw)

  def search(self) -> dict[str, dict[str, float]]:
    queries = self.encode_queries([self.split.queries[q] for q in self.query_ids])
    q, q_mask = padded(queries)
    n, block = len(q), min(self.query_block, len(q))
    total = -(-n // block) * block  # The last block padded: one compiled query shape.
    q = np.concatenate([q, np.zeros((total - n, *q.shape[1:]), np.float32)])
    q_mask = np.concatenate([q_mask, np.zeros((total - n, q_mask.shape[1]), np.int32)])
    best = [(jnp.full((block, self.depth), -jnp.inf), jnp.full((block, self.depth), -1,
                                                                 jnp.int32))
            for _ in range(0, total, block)]
    for start in range(0, len(self.doc_ids), self.corpus_chunk_size):
      ids = self.doc_ids[start:start + self.corpus_chunk_size]
      docs = self.encode_documents([retrieval_eval.document_text(self.split.corpus[i])
                                    for i in ids])
      # Padded to a power of two of documents and of tokens: few compiled shapes.
      width = embedding.bucket(max(len(m) for m in docs), 1 << 30)
      size = 1 << (len(docs) - 1).bit_length()
      d, d_mask = padded(list(docs) + [docs[0][:1]] * (size - len(docs)), width)
      for b, (lo, (scores, index)) in enumerate(zip(range(0, total, block), best)):
        s = _scores(q[lo:lo + block], q_mask[lo:lo + block], d, d_mask)
        best[b] = retrieval_eval.merge_top_k(s, len(docs), start, scores, index,
                                             k=self.depth)
    scores = np.concatenate([np.asarray(s) for s, _ in best])[:n]
    index = np.concatenate([np.asarray(i) for _, i in best])[:n]
    return {qid: {self.doc_ids[i]: float(s) for s, i in zip(row_s, row_i)}
            for qid, row_s, row_i in zip(self.query_ids, scores, index)}


class MaxSimReranker(MaxSimEvaluator):
  """BEIR-style evaluation of a multi-vector model by reranking a first stage's
  candidates (`candidates`: query id -> doc ids, best first; `rerank_eval.first_stage`'s
  BM25, run file or embedding model) by MaxSim, for corpora too large to score
  exactly: `query_block` queries at a time, their candidates encoded, scored and
  dropped (a document shared by two blocks is encoded twice). A document outside a
  query's candidates is not retrieved. `evaluate` gives `retrieval_eval.evaluate`'s
  measures of the reranked run and the first stage's own beside them (`first_stage_`
  + each name: the candidates in their order)."""

  def __init__(self, split, candidates: dict[str, list[str]], encode_queries,
               encode_documents, query_block: int = 64, **kw):
    super().__init__(split, encode_queries, encode_documents, query_block=query_block, **kw)
    self.candidates = candidates

  def search(self) -> dict[str, dict[str, float]]:
    run = {}
    for lo in range(0, len(self.query_ids), self.query_block):
      ids = self.query_ids[lo:lo + self.query_block]
      lists = [list(self.candidates.get(q, [])) for q in ids]
      k = max(map(len, lists), default=0)
      if not k:
        continue
      q, q_mask = padded(self.encode_queries([self.split.queries[i] for i in ids]))
      docs = sorted({d for lst in lists for d in lst})
      where = {d: i for i, d in enumerate(docs)}
      matrices = self.encode_documents([retrieval_eval.document_text(self.split.corpus[d])
                                        for d in docs])
      width = embedding.bucket(max(len(m) for m in matrices), 1 << 30)
      vectors, mask = padded(matrices, width)
      # Each query's k candidates (a short list padded with scoreless rows).
      index = np.array([[where[d] for d in lst] + [0] * (k - len(lst)) for lst in lists])
      valid = np.arange(k)[None, :] < np.array([len(lst) for lst in lists])[:, None]
      scores = np.asarray(_pair_scores(q, q_mask, vectors[index], mask[index] * valid[..., None]))
      for qid, lst, row in zip(ids, lists, scores):
        run[qid] = {d: float(s) for d, s in zip(lst, row)}
    return run

  def evaluate(self, run_path: str | None = None) -> dict[str, float]:
    out = super().evaluate(run_path)
    first = {q: {d: -float(r) for r, d in enumerate(docs)}
             for q, docs in self.candidates.items()}
    base = retrieval_eval.evaluate(first, self.split.qrels, self.k_values, self.mrr_at)
    return {**out, **{f"first_stage_{k}": v for k, v in base.items()}}


@jax.jit
def _pair_scores(q, q_mask, d, d_mask):
  return maxsim_pairwise((q, q_mask), (d, d_mask))


def load_encoder(path: str, max_seq_length: int = 0) -> embedding.Encoder:
  """The multi-vector model of `path` (a 'colbert' workdir: its config's settings; a
  `MultiVectorEncoder` folder: its files', `st.read_multi_vector`). With
  `max_seq_length`, documents are cut there instead of at the model's own length."""
  path = os.fspath(path)
  if workdir_lib.is_finetuned(path):
    name = workdir_lib.task_info(path)["name"]
    if name != NAME:
      raise ConfigError(f"{path} holds a fine-tuned {name!r} model, not a ColBERT one.")
    task = workdir_lib.load_config(path).task
    settings = embedding.settings_of(task)
    pretrained = load_pretrained(path)
    text_layout = task_layout(task, pretrained.tokenizer)
    params = {k: pretrained.params[k] for k in ("encoder", "projection")}
    dim = task.dim
  else:
    folder = st.read_multi_vector(path)
    pretrained = load_pretrained(path)
    settings, dim = folder.settings, folder.dim
    text_layout = layout(pretrained.tokenizer, folder.query_length, folder.expansion,
                         folder.attend, folder.skiplist_words)
    params = {"encoder": pretrained.params["encoder"],
              "projection": {"kernel": folder.projection}}
  settings = dataclasses.replace(settings, max_seq_length=min(
      max_seq_length or settings.max_seq_length, pretrained.config.max_length))
  return embedding.encoder_of(pretrained.config, None, pretrained.tokenizer, settings,
                              ColbertModel(pretrained.config, dim), params,
                              functools.partial(TokenEmbedder, text_layout=text_layout))


def export(directory: str, workdir: str) -> str:
  """A sentence-transformers `MultiVectorEncoder` folder of the ColBERT model trained in
  `workdir`, in `directory`: its transformers encoder (`convert.save_hf`) and the
  folder's modules (`st.write_multi_vector`: Dense, MultiVectorMask, Normalize), so that
  `MultiVectorEncoder(directory).encode_query` / `encode_document` give the model's
  token vectors. Returns the model_type."""
  task = workdir_lib.load_config(workdir).task
  encoder = load_encoder(workdir)
  params = jax.device_get(encoder.params)
  kind = convert.save_hf(directory, {"encoder": params["encoder"]}, encoder.config,
                         encoder.tokenizer)
  st.write_multi_vector(directory, encoder.settings, st.MultiVector(
      settings=encoder.settings, dim=task.dim,
      projection=np.asarray(params["projection"]["kernel"], np.float32),
      query_length=task.query_length, expansion=task.query_expansion,
      attend=bool(task.attend_to_expansion), skiplist_words=list(task.skiplist_words)))
  return kind
