"""The 'sparse' fine-tuning task: SPLADE, a sparse retriever made of any family's encoder
and its MLM head (`SpladeModel`), trained on the retrieval task's data, trainer and
in-batch negatives from the whole mesh (`bertjax.tasks.retrieval`), with
sentence-transformers 6's `SpladeLoss` (`objective`).

    python -m bertjax.finetune --config=configs/finetune/sparse.py \\
        --config.init_from=MLM_CHECKPOINT --config.data.train=pairs.jsonl \\
        --config.data.dev=BEIR_DIR --workdir=/tmp/splade

A text's vector has a weight per vocabulary entry: the MLM head's logits at every token
through log(1 + relu(.)) (`activation` 'log1p_relu': log1p once more, OpenSearch's
models), masked by the attention mask and pooled over the tokens by max (SPLADE v2 and
later) or sum (SPLADE v1): sentence-transformers' `SpladePooling`. Scores are dot
products of the vectors. The [N, T, V] logits are the memory to plan: the gradient of
the head read at once holds several of them (`chunk_size` 0, sentence-transformers'
way). With `chunk_size`, the head reads that many tokens at a time in a scan, each
chunk's logits recomputed in the backward pass (a third more of the head's FLOPs), so
that one chunk's are live at a time (docs/sparse.md's memory figures: BERT-base's head
adds 3.73 GiB to a step's temporaries at once, 0.41 GiB in chunks of 32 tokens).

`SpladeLoss` is the ranking loss of the retrieval task (`contrastive`: 'mnrl' is
SparseMultipleNegativesRankingLoss with config.task.similarity 'dot' and scale 1,
'margin_mse' SparseMarginMSELoss, 'kl' SparseDistillKLDivLoss) plus FLOPS regularisers
(Paria et al. 2020): the sum over the vocabulary of the squared mean weight over the
batch's queries, times `query_regularizer_weight`, and over its documents (positives
and negatives), times `document_regularizer_weight`; with a threshold, only vectors with
more active (non-zero) entries than it add to the mean (its denominator stays the row
count: FlopsLoss's l0 masking). The means are over the global batch, so the loss on a
mesh is one device's with the whole batch (sentence-transformers' trainer takes each
GPU's own batch); padding rows (weight 0) take no part.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse

from bertjax.checkpoint import workdir as workdir_lib
from bertjax.checkpoint.pretrained import load_pretrained
from bertjax.errors import ConfigError
from bertjax.hf import convert, sentence_transformers as st
from bertjax.model import family_of, stack
from bertjax.tasks import contrastive, embedding
from bertjax.tasks.base import SPARSE_TASK
from bertjax.train.step import Objective

NAME = SPARSE_TASK  # config.task.name
POOLINGS = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
QUERY_ENCODERS = ("splade", "static")
QUERY_WEIGHTS = "query_weights"  # An inference-free model's query parameters.
# Documents a dev evaluation scores at once: [CORPUS_CHUNK, V] float32 vectors (125 MB
# at BERT's 30,522 pieces), searched exactly with a running top-k.
CORPUS_CHUNK = 1024
CSR_TEXTS = 4096  # Texts `encode_csr` holds dense at once (500 MB at 30,522 pieces).


def splade_weights(logits: jax.Array, attention_mask: jax.Array, activation: str
                   ) -> jax.Array:
  """[N, t, V] logits, [N, t] mask -> [N, t, V] float32 weights log1p(relu(logits))
  (twice log1p for 'log1p_relu'), 0 at padding."""
  x = jax.nn.relu(logits.astype(jnp.float32) * attention_mask[..., None].astype(jnp.float32))
  x = jnp.log1p(x)
  return jnp.log1p(x) if activation == "log1p_relu" else x


def pool(weights: jax.Array, how: str) -> jax.Array:
  """[N, t, V] -> [N, V]: the max or the sum over the tokens."""
  return jnp.max(weights, axis=1) if how == "max" else jnp.sum(weights, axis=1)


class _Chunk(nn.Module):
  """The MLM head on a chunk of token states, its SPLADE weights pooled into the
  running vector: (total [N, V], (hidden [N, t, E], mask [N, t]), the encoder) ->
  (total, None): the body of `SpladeModel`'s scan over its chunks."""

  config: Any
  pooling: str
  activation: str

  @nn.compact
  def __call__(self, total, chunk, embedding):
    hidden, attention_mask = chunk
    head = stack.MLMHead(self.config, family_of(self.config).mlm_transform, name="mlm")
    logits = head({"last_hidden_state": hidden}, embedding)
    part = pool(splade_weights(logits, attention_mask, self.activation), self.pooling)
    return (jnp.maximum(total, part) if self.pooling == "max" else total + part), None


def static_vectors(input_ids: jax.Array, attention_mask: jax.Array, weights: jax.Array
                   ) -> jax.Array:
  """sentence-transformers' SparseStaticEmbedding: [N, T] ids and mask, [V] weights ->
  [N, V] float32, weights[v] where a real token of the row is v (once however often),
  else 0."""
  N, V = input_ids.shape[0], weights.shape[0]
  present = jnp.zeros((N, V), jnp.float32).at[jnp.arange(N)[:, None], input_ids].max(
      attention_mask.astype(jnp.float32))
  return present * weights.astype(jnp.float32)


class SpladeModel(nn.Module):
  """The encoder of `config`'s family and its MLM head (parameters under 'encoder' and
  'mlm', as in its pretraining model), SPLADE-pooled: input_ids, attention_mask [N, T]
  -> [N, V] float32 non-negative weights (V the config's vocabulary size). With
  `chunk_size`, the head reads that many tokens at a time in a scan, each chunk
  rematerialised in the backward pass (the module docstring). With `query_encoder`
  'static' (inference-free SPLADE), `queries` embeds a query by a weight per vocabulary
  entry ('query_weights' [V], ones at first as sentence-transformers starts them) for
  each token it holds (`static_vectors`); else `queries` is the document's SPLADE."""

  config: Any
  pooling: str = "max"
  activation: str = "relu"
  chunk_size: int = 0
  query_encoder: str = "splade"

  def setup(self):
    family = family_of(self.config)
    self.encoder = family.encoder(self.config)
    if self.query_encoder == "static":
      self.query_weights = self.param(QUERY_WEIGHTS, nn.initializers.ones,
                                      (self.config.vocab_size,), jnp.float32)
    if self.chunk_size:
      self.chunks = nn.scan(nn.remat(_Chunk), variable_broadcast="params",
                            split_rngs={"params": False}, in_axes=(0, nn.broadcast))(
                                self.config, self.pooling, self.activation)
      nn.share_scope(self, self.chunks)  # Its head's parameters: 'mlm', as unchunked.
    else:
      self.mlm = stack.MLMHead(self.config, family.mlm_transform)

  def __call__(self, input_ids, attention_mask, deterministic: bool = True) -> jax.Array:
    out = self.encoder(input_ids, attention_mask, deterministic=deterministic)
    if not self.chunk_size:
      logits = self.mlm(out, self.encoder)
      return pool(splade_weights(logits, attention_mask, self.activation), self.pooling)
    hidden = out["last_hidden_state"]
    (N, T, E), c = hidden.shape, self.chunk_size
    pad = -T % c  # Padded positions weigh 0: no max or sum moves.
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    mask = jnp.pad(attention_mask, ((0, 0), (0, pad)))
    chunks = (jnp.swapaxes(hidden.reshape(N, -1, c, E), 0, 1),
              jnp.swapaxes(mask.reshape(N, -1, c), 0, 1))
    total, _ = self.chunks(jnp.zeros((N, self.config.vocab_size), jnp.float32), chunks,
                           self.encoder)
    return total

  def queries(self, input_ids, attention_mask, deterministic: bool = True) -> jax.Array:
    """[N, V] vectors of queries: `static_vectors` of the query weights (their ids
    without special tokens, as SparseStaticEmbedding tokenizes), or the SPLADE vector."""
    if self.query_encoder == "static":
      return static_vectors(input_ids, attention_mask, self.query_weights)
    return self(input_ids, attention_mask, deterministic)


def resolve(config):
  """`config` (a copy, changed in place) whose empty SPLADE settings (splade_pooling,
  activation, prompts, query_encoder) are those of the `SparseEncoder` folder or sparse
  workdir `config.init_from` (`st.read_sparse`; 'static' for an inference-free one),
  else 'max', 'relu' and 'splade'; lower-casing on where the folder's is."""
  t = config.task
  if config.init_from and st.is_folder(config.init_from):
    settings, how, activation = st.read_sparse(config.init_from)
    t.splade_pooling = t.splade_pooling or how
    t.activation = t.activation or activation
    t.query_prompt = t.query_prompt or embedding.prompt(settings, "query")
    t.document_prompt = t.document_prompt or embedding.prompt(settings, "document")
    t.do_lower_case = t.do_lower_case or settings.do_lower_case
  if config.init_from and st.is_folder(config.init_from):
    queries = st.read_static_queries(config.init_from)
    t.query_weights_frozen = t.query_weights_frozen or bool(queries and queries.frozen)
  if config.init_from and not t.query_encoder:
    t.query_encoder = "static" if start_query_weights(config.init_from) is not None else ""
  t.splade_pooling = t.splade_pooling or "max"
  t.activation = t.activation or "relu"
  t.query_encoder = t.query_encoder or "splade"
  t.pooling = t.pooling or "mean"  # Unused by a sparse model; its settings' field.
  return config


def regularizer_sums(vectors: jax.Array, weights: jax.Array, threshold: int
                     ) -> tuple[jax.Array, jax.Array]:
  """[N, V] vectors, [N] row weights (0: padding) -> (the weighted sum of the vectors
  that count for FLOPS [V]: with `threshold` > 0 those with more active entries than
  it; the active entries summed over the rows)."""
  active = jnp.sum(vectors != 0, axis=1).astype(jnp.float32)
  counted = weights * (active > threshold) if threshold else weights
  return jnp.sum(vectors * counted[:, None], axis=0), jnp.sum(active * weights)


def flops(vector_sum: jax.Array, rows: jax.Array) -> jax.Array:
  """FlopsLoss: the sum over the vocabulary of the squared mean weight over `rows`."""
  return jnp.sum(jnp.square(vector_sum / jnp.maximum(rows, 1.0)))


def objective(model: SpladeModel, task_cfg, sample: dict) -> Objective:
  """`SpladeLoss` (the module docstring) of `model`'s query and document vectors over
  the global batch (`contrastive.embed_columns`: GradCache when `task_cfg.mini_batch_size`).
  Metrics: the in-batch accuracy (with 'mnrl'), the mean active dimensions of the
  queries and documents, and the two FLOPS terms unweighted."""
  ids = jnp.asarray(sample["query_input_ids"])
  init = lambda rng: model.init(rng, ids, jnp.ones_like(ids))["params"]
  only_documents = task_cfg.document_regularizer_only

  def sums(params, batch, rng):
    queries, documents = contrastive.embed_columns(model, params, batch, rng,
                                                   task_cfg.mini_batch_size, "queries")
    out = contrastive.loss_sums(queries, documents, batch, task_cfg)
    w = batch["example_weights"].astype(jnp.float32)
    B, C, V = documents.shape
    docs, doc_w = documents.reshape(B * C, V), jnp.repeat(w, C)
    q_sum, q_active = regularizer_sums(queries, w, task_cfg.query_regularizer_threshold)
    d_sum, d_active = regularizer_sums(docs, doc_w, task_cfg.document_regularizer_threshold)
    if only_documents:  # Every column a document, under the documents' threshold.
      q_as_doc, _ = regularizer_sums(queries, w, task_cfg.document_regularizer_threshold)
      d_sum = d_sum + q_as_doc
    return dict(out, query_vector_sum=q_sum, document_vector_sum=d_sum,
                query_active=q_active, document_active=d_active)

  def counts(batch):
    rows = jnp.sum(batch["example_weights"].astype(jnp.float32))
    C = batch["doc_input_ids"].shape[1]
    return {"loss": contrastive.loss_count(batch, task_cfg), "correct": rows,
            "queries": rows, "documents": rows * (C + 1 if only_documents else C),
            "document_vectors": rows * C}

  def regularizers(s, c):
    return (flops(s["query_vector_sum"], c["queries"]),
            flops(s["document_vector_sum"], c["documents"]))

  def loss(s, c):
    q, d = regularizers(s, c)
    total = s["loss"] / jnp.maximum(c["loss"], 1.0) + task_cfg.document_regularizer_weight * d
    return total if only_documents else total + task_cfg.query_regularizer_weight * q

  def metrics(s, c):
    q, d = regularizers(s, c)
    out = {"query_active_dims": s["query_active"] / jnp.maximum(c["queries"], 1.0),
           "document_active_dims": s["document_active"] / jnp.maximum(
               c["document_vectors"], 1.0),
           "query_flops": q, "document_flops": d}
    if task_cfg.loss == "mnrl":
      out["in_batch_accuracy"] = s["correct"] / jnp.maximum(c["correct"], 1.0)
    return out

  names = (("in_batch_accuracy",) if task_cfg.loss == "mnrl" else ()) + (
      "query_active_dims", "document_active_dims", "query_flops", "document_flops")
  return Objective(init=init, sums=sums, counts=counts, loss=loss, metrics=metrics,
                   metric_names=names)


def check_config(task_cfg) -> None:
  """The SPLADE settings of `config.task` in range (one ConfigError line each)."""
  if task_cfg.splade_pooling not in POOLINGS:
    raise ConfigError(f"config.task.splade_pooling={task_cfg.splade_pooling!r}: use one "
                      f"of {POOLINGS}.")
  if task_cfg.max_active_dims < 0:
    raise ConfigError(f"config.task.max_active_dims={task_cfg.max_active_dims}: use 0 "
                      "(every active entry) or a positive count.")
  if task_cfg.chunk_size < 0:
    raise ConfigError(f"config.task.chunk_size={task_cfg.chunk_size}: use 0 (every token "
                      "at once) or a positive number of tokens.")
  if task_cfg.query_encoder not in QUERY_ENCODERS:
    raise ConfigError(f"config.task.query_encoder={task_cfg.query_encoder!r}: use one of "
                      f"{QUERY_ENCODERS} ('static': inference-free SPLADE).")
  if task_cfg.query_learning_rate < 0:
    raise ConfigError(f"config.task.query_learning_rate={task_cfg.query_learning_rate}: "
                      "use 0 (the run's learning rate) or a positive peak rate.")
  if task_cfg.activation not in ACTIVATIONS:
    raise ConfigError(f"config.task.activation={task_cfg.activation!r}: use one of "
                      f"{ACTIVATIONS}.")
  if task_cfg.similarity != "dot":
    raise ConfigError(f"config.task.similarity={task_cfg.similarity!r}: a sparse model "
                      "scores by dot products of its vectors; use 'dot'.")
  for side in ("query", "document"):
    if task_cfg[f"{side}_regularizer_weight"] < 0:
      raise ConfigError(f"config.task.{side}_regularizer_weight must be 0 (none) or "
                        "positive.")
    if task_cfg[f"{side}_regularizer_threshold"] < 0:
      raise ConfigError(f"config.task.{side}_regularizer_threshold must be 0 (every "
                        "vector) or a number of active dimensions.")


def _static(task_cfg) -> bool:
  return task_cfg.name == NAME and task_cfg.get("query_encoder") == "static"


def own_rates(task_cfg) -> dict[str, float]:
  """The parameters of a run's task that train at a peak learning rate of their own
  (`optimizer.create_optimizer`): an inference-free model's query weights at
  task.query_learning_rate (0: the run's), as sentence-transformers'
  learning_rate_mapping gives SparseStaticEmbedding its own."""
  if not _static(task_cfg) or not task_cfg.query_learning_rate or task_cfg.query_weights_frozen:
    return {}
  return {QUERY_WEIGHTS: float(task_cfg.query_learning_rate)}


def fixed_params(task_cfg) -> tuple[str, ...]:
  """The top-level parameters of a run's task that never train: an inference-free
  model's query weights with task.query_weights_frozen (SparseStaticEmbedding's
  frozen)."""
  return (QUERY_WEIGHTS,) if _static(task_cfg) and task_cfg.query_weights_frozen else ()


def kept_params(config, pretrained) -> dict:
  """What a sparse run keeps of `pretrained` beside its encoder (`Start.kept_params`):
  its MLM head (a ConfigError line when it has none) and, for an inference-free run,
  config.init_from's query weights where it has them."""
  if "mlm" not in pretrained.params:
    raise ConfigError(
        f"config.init_from={config.init_from} has no MLM head (its heads: "
        f"{[h for h in pretrained.params if h != 'encoder'] or 'none'}): a sparse model pools "
        "the MLM head's logits; start from a checkpoint with one (of ELECTRA, the generator).")
  query_weights = (start_query_weights(config.init_from)
                   if config.task.query_encoder == "static" else None)
  return {"mlm": pretrained.params["mlm"], **(
      {} if query_weights is None else {QUERY_WEIGHTS: query_weights})}


class Sparsity:
  """The active (non-zero) dimensions of what an evaluation encodes, as
  sentence-transformers' `SparseInformationRetrievalEvaluator` reports them:
  query_active_dims and corpus_active_dims (the mean over the vectors) and avg_flops
  (the dot product of the queries' and the documents' mean active indicators: the
  expected multiplications of a query against a document)."""

  def __init__(self):
    self.counts: dict[str, np.ndarray] = {}
    self.rows: dict[str, int] = {}

  def counting(self, encode: Callable[[Sequence[str]], np.ndarray], kind: str
               ) -> Callable[[Sequence[str]], np.ndarray]:
    """`encode`, tallying its vectors under `kind` ('query' or 'corpus')."""
    def wrapped(texts):
      vectors = np.asarray(encode(texts))
      active = np.count_nonzero(vectors, axis=0) if len(vectors) else 0
      self.counts[kind] = self.counts.get(kind, 0) + active
      self.rows[kind] = self.rows.get(kind, 0) + len(vectors)
      return vectors
    return wrapped

  def results(self) -> dict[str, float]:
    means = {k: np.asarray(self.counts[k], np.float64) / max(self.rows[k], 1)
             for k in self.counts}
    out = {f"{k}_active_dims": float(m.sum()) for k, m in means.items()}
    if len(means) == 2:
      out["avg_flops"] = float(np.dot(means["query"], means["corpus"]))
    return out


class SparseEmbedder(embedding.Embedder):
  """Texts -> SPLADE vectors as `embedding.Embedder` makes them; an inference-free
  model's queries tokenized without special tokens and embedded by `SpladeModel.queries`,
  as sentence-transformers' SparseStaticEmbedding does."""

  def method(self, kind: str) -> str | None:
    return "queries" if kind == "query" else None

  def tokenize(self, texts: Sequence[str], kind: str) -> list[list[int]]:
    static = kind == "query" and self.model.query_encoder == "static"
    return embedding.tokenize(self._text_tokenizer, texts, embedding.prompt(
        self.settings, kind), self.settings.max_seq_length, specials=not static)


def start_query_weights(path: str) -> Any:
  """The query weights [V] of what `path` holds, an inference-free SPLADE model (a
  'sparse' workdir of one, or a folder with SparseStaticEmbedding for its queries);
  None for any other checkpoint."""
  if workdir_lib.is_finetuned(path):
    if workdir_lib.task_info(path)["name"] != NAME:
      return None
    return workdir_lib.open_finetuned(path).params.get(QUERY_WEIGHTS)
  queries = st.read_static_queries(path) if st.is_folder(path) else None
  return None if queries is None else queries.weights


def is_sparse(path: str) -> bool:
  """Whether `path` holds a sparse model: a 'sparse' fine-tuning workdir or a
  sentence-transformers `SparseEncoder` folder."""
  return embedding.holds(path, NAME, st.is_sparse_folder)


def load_encoder(path: str, max_seq_length: int = 0):
  """The sparse model of `path` (a 'sparse' workdir: its config's settings; a
  `SparseEncoder` folder: its files', `st.read_sparse`) as an `embedding.Encoder`:
  `encode(texts, kind)` -> [N, V] vectors. With `max_seq_length`, texts are cut there
  instead of at the model's own length."""
  if workdir_lib.is_finetuned(path):
    name = workdir_lib.task_info(path)["name"]
    if name != NAME:
      raise ConfigError(f"{path} holds a fine-tuned {name!r} model, not a sparse one.")
    task = workdir_lib.load_config(path).task
    settings, how, activation, chunk = (embedding.settings_of(task), task.splade_pooling,
                                        task.activation, task.chunk_size)
  else:
    (settings, how, activation), chunk = st.read_sparse(path), 0
  pretrained = load_pretrained(path)
  if "mlm" not in pretrained.params:
    raise ConfigError(f"{path} has no MLM head: it is no sparse model.")
  settings = dataclasses.replace(settings, max_seq_length=min(
      max_seq_length or settings.max_seq_length, pretrained.config.max_length))
  params = {k: pretrained.params[k] for k in ("encoder", "mlm")}
  query_weights = start_query_weights(path)
  if query_weights is not None:
    params[QUERY_WEIGHTS] = jnp.asarray(query_weights, jnp.float32)
  model = SpladeModel(pretrained.config, how, activation, chunk,
                      "splade" if query_weights is None else "static")
  return embedding.encoder_of(pretrained.config, None, pretrained.tokenizer, settings,
                              model, params, SparseEmbedder)


def top_active(vectors: np.ndarray, max_active_dims: int) -> np.ndarray:
  """`vectors` [N, V] with all but each row's `max_active_dims` largest magnitudes set
  to 0 (sentence-transformers' `select_max_active_dims`; 0: unchanged)."""
  if not max_active_dims or max_active_dims >= vectors.shape[1]:
    return vectors
  keep = np.argpartition(-np.abs(vectors), max_active_dims - 1, axis=1)[:, :max_active_dims]
  out = np.zeros_like(vectors)
  np.put_along_axis(out, keep, np.take_along_axis(vectors, keep, axis=1), axis=1)
  return out


def encode_csr(encoder, texts: Sequence[str], kind: str, batch_size: int = 64,
               max_active_dims: int = 0, show: str = ""):
  """`texts`' vectors by `encoder` (`load_encoder`) as a scipy CSR matrix [N, V]
  float32, `CSR_TEXTS` texts encoded at a time (host memory: one such block dense),
  each row cut to its `max_active_dims` largest entries (0: all)."""
  texts = list(texts)
  blocks = [scipy.sparse.csr_matrix(top_active(
      encoder.encode(texts[lo:lo + CSR_TEXTS], kind, batch_size, show), max_active_dims))
            for lo in range(0, len(texts), CSR_TEXTS)]
  return (scipy.sparse.vstack(blocks, format="csr") if blocks else
          scipy.sparse.csr_matrix((0, encoder.config.vocab_size), dtype=np.float32))


def export(directory: str, workdir: str) -> str:
  """A sentence-transformers `SparseEncoder` folder of the sparse model trained in
  `workdir`, in `directory`: its transformers *ForMaskedLM model (the encoder and MLM
  head, `convert.save_hf`) and the folder's files (`st.write_sparse`), so that
  `SparseEncoder(directory).encode` gives the model's vectors; an inference-free model's
  as sentence-transformers saves its Router (`st.write_inference_free`: the model in
  the document route's folder). Returns the model_type."""
  encoder = load_encoder(workdir)
  model, params = encoder.embedder.model, jax.device_get(encoder.params)
  if model.query_encoder != "static":
    kind = convert.save_hf(directory, params, encoder.config, encoder.tokenizer)
    st.write_sparse(directory, encoder.settings, encoder.config.vocab_size, model.pooling,
                    model.activation)
    return kind
  kind = convert.save_hf(os.path.join(directory, st.ROUTED_TRANSFORMER_DIR), params,
                         encoder.config, encoder.tokenizer)
  frozen = workdir_lib.load_config(workdir).task.get("query_weights_frozen", False)
  st.write_inference_free(directory, encoder.settings, encoder.config.vocab_size,
                          model.pooling, model.activation,
                          st.StaticQueries(params[QUERY_WEIGHTS], frozen))
  return kind
