"""Contrastive losses of embedding models over the global batch, and GradCache.

The losses are sentence-transformers' (v6, `sentence_transformer/losses/`), given as
sums over the batch's rows (rows of weight 0, the padding of a short batch, add
nothing and are no candidates), so that the trainer divides by the row count:

- 'mnrl': MultipleNegativesRankingLoss (InfoNCE): each query against every document of
  the batch (every example's positive and hard negatives), scale x similarity, the own
  positive the label; `symmetric` adds the document-to-query direction, each direction
  its own softmax (its `directions=('query_to_doc', 'doc_to_query')`,
  `partition_mode='per_direction'`).
- 'margin_mse': MarginMSELoss: (sim(q, p) - sim(q, n_j)) against the teacher's margin,
  squared, a term per negative.
- 'kl': DistillKLDivLoss: KL(teacher || student) of the softmaxes over each example's
  own candidates [positive, negatives], student scores divided by `temperature`, the
  loss times temperature^2 (its `batchmean`).
- Matryoshka (MatryoshkaLoss): the loss summed over the embeddings' leading `dims`,
  each times its weight.

"The batch" is the global batch. Under a mesh whose data axes split it, MNRL runs in
`jax.shard_map` (`_gathered`): each device all-gathers every device's embeddings (one
collective: queries, documents and weights packed together; not the inputs), scores
its own queries against every document (its rows of the score matrix) and the loss
sums are summed over the devices; the gradient of a gathered embedding returns to the
device that produced it through the all-gather's transpose, a reduce-scatter
(tests/test_retrieval.py: 8 devices against one; tests/test_retrieval_run.py: two
processes against one). The other losses are per row.

GradCache (Gao et al. 2021): `embed_in_chunks` embeds the batch a mini-batch at a time
under `jax.checkpoint`, inside a scan. The forward pass keeps only each mini-batch's
embeddings; the backward pass re-runs each mini-batch's encoder with the same dropout
key and pulls the loss's gradient with respect to its embeddings through it, which is
GradCache's three steps (embed without activations, the loss's gradient at the
embeddings, re-embed with a vjp) as JAX's rematerialisation performs them. Memory is
set by the mini-batch; the gradient is the uncached one's to rounding.

Shapes: B queries, C documents per example (1 + k negatives), E embedding width.
"""

from __future__ import annotations

import functools

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.errors import ConfigError
from bertjax.tasks import pooling

LOSSES = ("mnrl", "margin_mse", "kl")
SIMILARITIES = ("cosine", "dot")


def similarity(a: jax.Array, b: jax.Array, kind: str) -> jax.Array:
  """[M, E] x [N, E] -> [M, N] float32: cosine (sentence-transformers' cos_sim) or dot."""
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  if kind == "cosine":
    a, b = pooling.normalize(a), pooling.normalize(b)
  return jnp.einsum("me,ne->mn", a, b, precision=jax.lax.Precision.HIGHEST)


def pairwise(a: jax.Array, b: jax.Array, kind: str) -> jax.Array:
  """[B, E] x [B, C, E] -> [B, C]: each row against its own C documents."""
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  if kind == "cosine":
    a, b = pooling.normalize(a), pooling.normalize(b)
  return jnp.einsum("be,bce->bc", a, b, precision=jax.lax.Precision.HIGHEST)


Score = Callable[[Any, Any], jax.Array]  # (a [M, ...], b [N, ...]) -> [M, N] float32


def dense_scores(kind: str) -> tuple[Score, Score]:
  """(all-pairs, row-wise) scores of single vectors by `kind` (`SIMILARITIES`):
  `similarity` and `pairwise`."""
  return (lambda a, b: similarity(a, b, kind)), (lambda a, b: pairwise(a, b, kind))


def _rows_of(tree, index):
  return jax.tree.map(lambda x: x[index], tree)


def _mnrl_rows(queries, rows: jax.Array, all_queries, documents, weights: jax.Array, *,
               scale: float, score: Score, symmetric: bool) -> tuple[jax.Array, jax.Array]:
  """MNRL of the queries [b, ...] at global `rows` [b] against every document of the
  batch, documents [B, C, ...] (column 0 the positives), all_queries [B, ...], weights
  [B] (0: padding) -> (summed loss over those rows, how many rank their positive
  first). An embedding may be a tuple of arrays (a ColBERT text's vectors and mask)."""
  B, C = weights.shape[0], jax.tree.leaves(documents)[0].shape[1]
  candidates = jax.tree.map(  # positives, then negatives
      lambda d: jnp.swapaxes(d, 0, 1).reshape(C * B, *d.shape[2:]), documents)
  valid = weights > 0
  scores = score(queries, candidates) * scale  # [b, C * B]
  scores = jnp.where(jnp.tile(valid, C)[None, :], scores, -jnp.inf)
  positive = jnp.take_along_axis(scores, rows[:, None], axis=1)[:, 0]
  terms = jax.nn.logsumexp(scores, axis=1) - positive
  if symmetric:  # Each of these rows' positives against every query: its own softmax.
    positives = jax.tree.map(lambda d: d[rows, 0], documents)
    back = score(positives, all_queries) * scale  # [b, B]
    back = jnp.where(valid[None, :], back, -jnp.inf)
    terms = (terms + jax.nn.logsumexp(back, axis=1) - positive) / 2
  mine = valid[rows]
  correct = (jnp.argmax(scores, axis=1) == rows) & mine
  w = weights[rows]
  return jnp.sum(jnp.where(mine, terms, 0.0) * w), jnp.sum(correct * w)


def mnrl(queries, documents, weights: jax.Array, *, scale: float, score: Score,
         symmetric: bool) -> tuple[jax.Array, jax.Array]:
  """queries [B, ...], documents [B, C, ...] (column 0 the positives; either may be a
  tuple of arrays), weights [B] (0: padding), scored by `score` -> (summed loss over
  the rows, rows whose positive scores highest); over the data axes of the mesh in
  context, each device its own rows (`_gathered`)."""
  kw = dict(scale=scale, score=score, symmetric=symmetric)
  axes = data_axes()
  if axes is None:
    B = weights.shape[0]
    return _mnrl_rows(queries, jnp.arange(B), queries, documents, weights, **kw)
  return _gathered(queries, documents, weights, axes, **kw)


def data_axes() -> tuple[str, ...] | None:
  """The mesh axes (of the mesh and logical-axis rules in context) that split the batch
  ('activation_batch'), those of size 1 left out; None without a split."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return None
  spec = nn.logical_to_mesh_axes(("activation_batch",))[0]
  axes = (spec,) if isinstance(spec, str) else tuple(spec or ())
  axes = tuple(a for a in axes if mesh.shape[a] > 1)
  return axes or None


def _gathered(queries, documents, weights, axes, **kw) -> tuple[jax.Array, jax.Array]:
  """MNRL in `jax.shard_map` over `axes` (the module docstring): every array of a row
  (its query's, its documents', its weight) flattened into one float32 row, the rows
  all-gathered in one collective and unpacked."""
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top

  def local(q, d, w):
    b = w.shape[0]
    leaves, tree = jax.tree.flatten((q, d, w))
    packed = jnp.concatenate([x.reshape(b, -1).astype(jnp.float32) for x in leaves], axis=1)
    every = jax.lax.all_gather(packed, axes, axis=0, tiled=True)  # [B, row]
    sizes = np.cumsum([int(np.prod(x.shape[1:])) for x in leaves])[:-1]
    parts = [p.reshape(-1, *x.shape[1:]).astype(x.dtype)
             for p, x in zip(jnp.split(every, sizes, axis=1), leaves)]
    all_q, all_d, all_w = jax.tree.unflatten(tree, parts)
    rows = jax.lax.axis_index(axes) * b + jnp.arange(b)
    loss, correct = _mnrl_rows(q, rows, all_q, all_d, all_w, **kw)
    return jax.lax.psum(loss, axes), jax.lax.psum(correct, axes)

  spec = P(axes)
  specs = jax.tree.map(lambda _: spec, (queries, documents, weights))
  return jax.shard_map(local, in_specs=specs, out_specs=(P(), P()))(
      queries, documents, weights)


def margin_mse(scores: jax.Array, teacher: jax.Array, weights: jax.Array) -> jax.Array:
  """Summed squared errors of the margins of `scores` [B, C] (a row's query against its
  positive, then its negatives), s(q, p) - s(q, n_j), against the teacher's [B, C - 1]
  margins (or [B, C] scores, turned into margins)."""
  if teacher.shape[1] == scores.shape[1]:
    teacher = teacher[:, :1] - teacher[:, 1:]
  errors = jnp.square(scores[:, :1] - scores[:, 1:] - teacher)
  return jnp.sum(errors * weights[:, None])


def kl(scores: jax.Array, teacher: jax.Array, weights: jax.Array, temperature: float
       ) -> jax.Array:
  """Summed KL(teacher || student) over each row's C candidates (`scores`, teacher
  [B, C])."""
  student = jax.nn.log_softmax(scores / temperature, axis=1)
  target = jax.nn.softmax(teacher.astype(jnp.float32) / temperature, axis=1)
  terms = jnp.sum(target * (jnp.log(jnp.maximum(target, 1e-30)) - student), axis=1)
  return jnp.sum(terms * weights) * temperature**2


def loss_sums(queries, documents, batch: dict, task_cfg,
              scoring: tuple[Score, Score] | None = None) -> dict[str, jax.Array]:
  """{'loss': summed loss, 'correct': rows ranking their positive first} of the batch,
  summed over the Matryoshka dimensions (weighted) when `task_cfg.matryoshka_dims`.
  `scoring`: (all-pairs, row-wise) scores (default `dense_scores` of
  task_cfg.similarity; a ColBERT model's MaxSim, whose embeddings are tuples)."""
  weights = batch["example_weights"].astype(jnp.float32)
  score, pair = scoring or dense_scores(task_cfg.similarity)
  dims = tuple(task_cfg.matryoshka_dims) or (None,)
  dim_weights = tuple(task_cfg.matryoshka_weights) or (1.0,) * len(dims)
  total = correct = jnp.zeros((), jnp.float32)
  for d, w in zip(dims, dim_weights):
    q, docs = (queries, documents) if d is None else (queries[..., :d], documents[..., :d])
    if task_cfg.loss == "mnrl":
      loss, right = mnrl(q, docs, weights, scale=task_cfg.scale, score=score,
                         symmetric=task_cfg.symmetric)
      correct = right if d == dims[0] else correct
    elif task_cfg.loss == "margin_mse":
      loss = margin_mse(pair(q, docs), batch["teacher"], weights)
    else:
      loss = kl(pair(q, docs), batch["teacher"], weights, task_cfg.temperature)
    total = total + w * loss
  return {"loss": total, "correct": correct}


def loss_count(batch: dict, task_cfg) -> jax.Array:
  """The denominator of `loss_sums`' loss: rows (MarginMSE: row x negative terms)."""
  rows = jnp.sum(batch["example_weights"].astype(jnp.float32))
  if task_cfg.loss == "margin_mse":
    return rows * (batch["doc_input_ids"].shape[1] - 1)
  return rows


def embed_in_chunks(embed: Callable[[dict, jax.Array | None], jax.Array], inputs: dict,
                    rng: jax.Array | None, mini_batch_size: int) -> jax.Array:
  """`embed(inputs, rng)` ([N, ...] arrays -> [N, ...]) over `inputs` a mini-batch of
  `mini_batch_size` rows at a time, under `jax.checkpoint` (GradCache: the module
  docstring); 0 or >= N: at once. Mini-batch i holds rows r * n + i (n mini-batches):
  every device keeps its own rows. Each mini-batch draws dropout from fold_in(rng, i),
  the same in the backward pass's re-run."""
  n_rows = next(iter(inputs.values())).shape[0]
  if not mini_batch_size or mini_batch_size >= n_rows:
    return embed(inputs, rng)
  if n_rows % mini_batch_size:
    raise ConfigError(f"config.task.mini_batch_size={mini_batch_size} does not divide the "
                      f"{n_rows} texts of a batch's column; use a divisor of "
                      "config.train.batch_size")
  n = n_rows // mini_batch_size
  chunks = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(-1, n, *x.shape[1:]), 0, 1), inputs)
  cached = jax.checkpoint(embed)

  def body(_, xs):
    i, chunk = xs
    return None, cached(chunk, None if rng is None else jax.random.fold_in(rng, i))

  _, out = jax.lax.scan(body, None, (jnp.arange(n), chunks))  # [n, N / n, E]
  return jnp.swapaxes(out, 0, 1).reshape(n_rows, *out.shape[2:])


def embed_columns(model, params, batch: dict, rng: jax.Array | None, mini_batch_size: int,
                  query_method: str | None = None) -> tuple[jax.Array, jax.Array]:
  """`model`'s embeddings of the batch's queries [B, E] (by its method `query_method`
  where given) and documents [B, C, E], each column embedded `mini_batch_size` texts at
  a time under GradCache when set (`embed_in_chunks`); dropout from `rng` (None:
  deterministic)."""
  def embed(inputs, key, method=None):
    return model.apply({"params": params}, inputs["input_ids"], inputs["attention_mask"],
                       deterministic=key is None, method=method,
                       rngs=None if key is None else {"dropout": key})
  keys = (None, None) if rng is None else jax.random.split(rng)
  queries = embed_in_chunks(functools.partial(embed, method=query_method), {
      "input_ids": batch["query_input_ids"],
      "attention_mask": batch["query_attention_mask"]}, keys[0], mini_batch_size)
  B, C, T = batch["doc_input_ids"].shape
  documents = embed_in_chunks(embed, {
      "input_ids": batch["doc_input_ids"].reshape(B * C, T),
      "attention_mask": batch["doc_attention_mask"].reshape(B * C, T)}, keys[1],
      mini_batch_size)
  return queries, documents.reshape(B, C, *documents.shape[1:])


def check_config(task_cfg, hidden_size: int | None = None) -> None:
  """The loss settings of `config.task`, in range (one ConfigError line each)."""
  if task_cfg.loss not in LOSSES:
    raise ConfigError(f"config.task.loss={task_cfg.loss!r}: use one of {LOSSES}.")
  if task_cfg.similarity not in SIMILARITIES:
    raise ConfigError(f"config.task.similarity={task_cfg.similarity!r}: use one of "
                      f"{SIMILARITIES}.")
  if task_cfg.loss in ("margin_mse", "kl") and not task_cfg.teacher_column:
    raise ConfigError(f"config.task.loss={task_cfg.loss!r} distils a teacher's scores: set "
                      "config.task.teacher_column to the column holding them.")
  if task_cfg.scale <= 0 or task_cfg.temperature <= 0:
    raise ConfigError("config.task.scale and config.task.temperature must be positive.")
  if task_cfg.mini_batch_size < 0:
    raise ConfigError(f"config.task.mini_batch_size={task_cfg.mini_batch_size}: use 0 (no "
                      "GradCache) or a positive mini-batch.")
  dims, weights = tuple(task_cfg.matryoshka_dims), tuple(task_cfg.matryoshka_weights)
  if weights and len(weights) != len(dims):
    raise ConfigError(f"config.task.matryoshka_weights has {len(weights)} weights for "
                      f"{len(dims)} matryoshka_dims; give one each, or () for 1 each.")
  too_big = [d for d in dims if d < 1 or (hidden_size and d > hidden_size)]
  if too_big:
    raise ConfigError(f"config.task.matryoshka_dims: {too_big[0]} is not between 1 and the "
                      f"embedding width{f' {hidden_size}' if hidden_size else ''}; use "
                      "smaller dimensions.")
