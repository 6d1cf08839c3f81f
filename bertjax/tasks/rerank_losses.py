"""Reranker (cross-encoder) losses by name, each sentence-transformers 6.2.0's
(`cross_encoder/losses/`) on the same logits, given as (sum, count) so that the
trainer divides the global batch's sum by its count (tests/test_rerank_losses.py holds
each to rtol 1e-5 against sentence-transformers' own classes).

Inputs: logits [B, G] (one logit a pair; [B, G, K] for 'cross_entropy'), labels
[B, G] float32 (relevance, a class index, or a teacher's score), mask [B, G] (1: a real
pair; 0: the padding of a list shorter than the group size G, or of a row of weight
0). A group's padding is what sentence-transformers pads a shorter list with (logit
-1e16, label -inf), so a padded group gives its loss on the unpadded list exactly.

- 'bce': BinaryCrossEntropyLoss: BCEWithLogits(activation(logit), label), pos_weight
  multiplying the positive term; the mean over the pairs.
- 'cross_entropy': CrossEntropyLoss: softmax cross-entropy of a pair's K logits
  against its class index; the mean over the pairs.
- 'mse': MSELoss: (activation(logit) - label)^2, the mean over the pairs.
- 'mnrl': MultipleNegativesRankingLoss: column 0 the positive, the others negatives;
  cross-entropy of scale x activation(logits) (Sigmoid by default) with the positive
  as the label; the mean over the rows. Its negatives: the data's (`rerank`: the hard
  negatives and `num_negatives` documents of other examples).
- 'margin_mse': MarginMSELoss: activation(logit_pos) - activation(logit_neg_j) against
  the teacher's margin (labels [B, G] scores: label_pos - label_neg_j); the mean over
  the B x (G - 1) terms.
- 'lambda': LambdaLoss: pairs (i, j) of a list in the model's order whose true labels
  differ (i above j: label_i > label_j), each weight(gain, discount) x
  log2 sigmoid(sigma (s_i - s_j)), within NDCG@k's reach (i < k or j < k; k=0: the
  whole list), weighted by the scheme: 'ndcg2pp' (NDCGLoss2++, mu x NDCGLoss2 +
  LambdaRank, the default), 'ndcg2', 'ndcg1', 'lambdarank', 'none'; -sum / count of
  the pairs in the whole batch.
- 'ranknet': RankNetLoss: LambdaLoss without weights.
- 'listnet': ListNetLoss: cross-entropy of the softmax of the logits against the
  softmax of the labels; the mean over the rows.
- 'listmle': ListMLELoss: the ranking is the list as given (best first;
  `list_order='input'`, its respect_input_order=True) or the labels' order, ties in
  the input's order ('labels'); -log of its Plackett-Luce probability; the mean over
  the rows.
- 'plistmle': PListMLELoss: ListMLE with its default position weights (the i-th of n
  documents 2^(n - i - c) - 2^-c, c = max(n - 127, 0), normalised to sum 1 a list).
- 'adrmse': ADRMSELoss (Rank-DistiLLM): each document's true rank by label (ties at
  their mean rank) against its approximate rank 1 + sum_j sigmoid(alpha (s_j - s_i))
  (`adrmse_alpha`), the squared error discounted by 1 / log2(1 + true rank); the mean
  over the documents of the batch.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from bertjax.errors import ConfigError

LOSSES = ("bce", "cross_entropy", "mse", "mnrl", "margin_mse", "lambda", "ranknet",
          "listnet", "listmle", "plistmle", "adrmse")
# The losses over a list ([B, G] groups); the others are pointwise or a positive first.
LISTWISE = ("lambda", "ranknet", "listnet", "listmle", "plistmle", "adrmse")
LIST_ORDERS = ("input", "labels")  # listmle / plistmle: the ranking a list is scored by
SCHEMES = ("ndcg2pp", "ndcg2", "ndcg1", "lambdarank", "none")
ACTIVATIONS = ("identity", "sigmoid")
# Each loss's default activation_fn (sentence-transformers'): MNRL's Sigmoid, else none.
DEFAULT_ACTIVATION = {"mnrl": "sigmoid"}
PAD_LOGIT = -1e16  # sentence-transformers' logit of a list's padding


def activation(x: jax.Array, name: str) -> jax.Array:
  """'sigmoid' or 'identity' (torch.nn.Sigmoid / Identity)."""
  return jax.nn.sigmoid(x) if name == "sigmoid" else x


def _count(mask: jax.Array) -> jax.Array:
  return jnp.sum(mask.astype(jnp.float32))


def bce(logits, labels, mask, act: str = "identity", pos_weight: float = 0.0):
  """torch's BCEWithLogitsLoss(activation(logits), labels, pos_weight) terms, summed."""
  x = activation(logits.astype(jnp.float32), act)
  y = labels.astype(jnp.float32)
  pw = pos_weight if pos_weight else 1.0
  terms = -(pw * y * jax.nn.log_sigmoid(x) + (1.0 - y) * jax.nn.log_sigmoid(-x))
  m = mask.astype(jnp.float32)
  return jnp.sum(jnp.where(m > 0, terms, 0.0)), _count(m)


def cross_entropy(logits, labels, mask, act: str = "identity"):
  """logits [B, G, K], int class labels [B, G]."""
  x = activation(logits.astype(jnp.float32), act)
  cls = jnp.where(mask > 0, labels, 0).astype(jnp.int32)
  logp = jax.nn.log_softmax(x, axis=-1)
  terms = -jnp.take_along_axis(logp, cls[..., None], axis=-1)[..., 0]
  return jnp.sum(jnp.where(mask > 0, terms, 0.0)), _count(mask)


def mse(logits, labels, mask, act: str = "identity"):
  x = activation(logits.astype(jnp.float32), act)
  terms = jnp.square(x - labels.astype(jnp.float32))
  return jnp.sum(jnp.where(mask > 0, terms, 0.0)), _count(mask)


def mnrl(logits, mask, act: str = "sigmoid", scale: float = 10.0):
  """Column 0 the positive; rows whose positive is padding add nothing."""
  x = activation(logits.astype(jnp.float32), act)
  if scale:
    x = x * scale
  x = jnp.where(mask > 0, x, -jnp.inf)
  rows = mask[:, 0] > 0
  terms = jax.nn.logsumexp(jnp.where(rows[:, None], x, 0.0), axis=1) - jnp.where(
      rows, x[:, 0], 0.0)
  return jnp.sum(jnp.where(rows, terms, 0.0)), _count(rows)


def margin_mse(logits, labels, mask, act: str = "identity"):
  """labels [B, G]: the teacher's scores of [positive, negatives...]."""
  x = activation(logits.astype(jnp.float32), act)
  y = labels.astype(jnp.float32)
  errors = jnp.square((x[:, :1] - x[:, 1:]) - (y[:, :1] - y[:, 1:]))
  m = (mask[:, :1] * mask[:, 1:]) > 0
  return jnp.sum(jnp.where(m, errors, 0.0)), _count(m)


def _padded(logits, labels, mask):
  x = jnp.where(mask > 0, logits.astype(jnp.float32), PAD_LOGIT)
  y = jnp.where(mask > 0, labels.astype(jnp.float32), -jnp.inf)
  return x, y


def _weights(scheme: str, gain, discount, mu: float):
  """[B, G, G] (or a scalar) weights of sentence-transformers' weighting schemes;
  gain [B, G], discount [1, G]."""
  if scheme == "none":
    return jnp.ones((), jnp.float32)
  if scheme == "ndcg1":
    return (gain / discount)[:, :, None]
  G = gain.shape[1]

  def ndcg2():
    pos = jnp.arange(1, G + 1)
    delta = jnp.abs(pos[:, None] - pos[None, :])
    # discount[0, delta - 1] at delta 0 reads the last element, as torch's -1 index.
    d = discount[0]
    deltas = jnp.abs(jnp.power(jnp.abs(d[(delta - 1) % G]), -1.0)
                     - jnp.power(jnp.abs(d[jnp.minimum(delta, G - 1)]), -1.0))
    # torch indexes discount[0, delta] with delta <= G - 1: always in range.
    deltas = jnp.where(jnp.eye(G, dtype=bool), 0.0, deltas)
    return deltas[None] * jnp.abs(gain[:, :, None] - gain[:, None, :])

  def lambdarank():
    return (jnp.abs(jnp.power(discount[:, :, None], -1.0) - jnp.power(discount[:, None, :], -1.0))
            * jnp.abs(gain[:, :, None] - gain[:, None, :]))

  if scheme == "ndcg2":
    return ndcg2()
  if scheme == "lambdarank":
    return lambdarank()
  return mu * ndcg2() + lambdarank()


def lambda_loss(logits, labels, mask, *, scheme: str = "ndcg2pp", k: int = 0,
                sigma: float = 1.0, eps: float = 1e-10, binary_log: bool = True,
                mu: float = 10.0, act: str = "identity"):
  """LambdaLoss's (-sum of the kept pairs' terms, number of kept pairs)."""
  x, y = _padded(activation(logits.astype(jnp.float32), act), labels, mask)
  B, G = x.shape
  order = jnp.argsort(-x, axis=-1, stable=True)
  x_sorted = jnp.take_along_axis(x, order, axis=1)
  y_sorted = -jnp.sort(-y, axis=-1)
  true = jnp.take_along_axis(y, order, axis=1)
  diffs = true[:, :, None] - true[:, None, :]
  keep = jnp.isfinite(diffs)
  if scheme != "ndcg1":
    keep = keep & (diffs > 0)
  kk = k or G
  idx = jnp.arange(G)
  keep = keep & ((idx[:, None] < kk) | (idx[None, :] < kk))[None]
  true = jnp.maximum(true, 0.0)
  y_sorted = jnp.maximum(y_sorted, 0.0)
  discount = jnp.log2(1.0 + jnp.arange(1, G + 1, dtype=jnp.float32))[None, :]
  max_dcg = jnp.maximum(jnp.sum(((jnp.power(2.0, y_sorted) - 1) / discount)[:, :kk],
                                axis=-1), eps)
  gain = (jnp.power(2.0, true) - 1) / max_dcg[:, None]
  weights = _weights(scheme, gain, discount, mu)
  s = jnp.clip(x_sorted[:, :, None] - x_sorted[:, None, :], -1e8, 1e8)
  s = jnp.where(jnp.isnan(s), 0.0, s)
  losses = weights * jax.nn.log_sigmoid(sigma * s)
  if binary_log:
    losses = losses / math.log(2)
  return -jnp.sum(jnp.where(keep, losses, 0.0)), _count(keep)


def listnet(logits, labels, mask, act: str = "identity"):
  x, y = _padded(activation(logits.astype(jnp.float32), act), labels, mask)
  rows = jnp.any(mask > 0, axis=1)
  target = jax.nn.softmax(jnp.where(rows[:, None], y, 0.0), axis=1)
  terms = -jnp.sum(target * jax.nn.log_softmax(x, axis=1), axis=1)
  return jnp.sum(jnp.where(rows, terms, 0.0)), _count(rows)


def plistmle(logits, labels, mask, act: str = "identity", order: str = "input",
             weighted: bool = True):
  """PListMLELoss (`weighted`; ListMLELoss without): per list, -sum_i w_i log(exp(s_i)
  / sum_{j >= i} exp(s_j)) over its real documents, ranked as `order` says; the mean
  over the lists. Its weights are set by the real documents' count and positions."""
  x = activation(logits.astype(jnp.float32), act)
  m = mask > 0
  if order == "labels":  # best label first; a stable sort keeps ties in input order
    y = jnp.where(m, labels.astype(jnp.float32), -jnp.inf)
    idx = jnp.argsort(-y, axis=1, stable=True)
    x, ranked = jnp.take_along_axis(x, idx, 1), jnp.take_along_axis(m, idx, 1)
  else:
    ranked = m
  s = jnp.where(ranked, x, jnp.finfo(jnp.float32).min)
  tail = jnp.flip(jax.lax.cumlogsumexp(jnp.flip(s, 1), axis=1), 1)
  logp = x - tail
  if weighted:  # PListMLELambdaWeight on the unsorted mask, as sentence-transformers
    # Its 2^(n - i - c) - 2^-c scaled by 2^(1 + c - n) (exact: a power of two), which
    # normalising cancels: 2^(1 - i) - 2^(1 - n). Unscaled, a list of 128 or more
    # weighs up to 2^126, whose normaliser's reciprocal is below float32's normal range.
    mf = m.astype(jnp.float32)
    n = jnp.sum(mf, axis=1, keepdims=True)
    ranks = jnp.arange(1, m.shape[1] + 1, dtype=jnp.float32)[None]
    w = (jnp.power(2.0, 1.0 - ranks) - jnp.power(2.0, 1.0 - n)) * mf
    logp = logp * (w / (jnp.sum(w, axis=1, keepdims=True) + 1e-10))  # a list of 1: 0
  logp = jnp.where(ranked, logp, 0.0)
  rows = jnp.any(m, axis=1)
  return -jnp.sum(jnp.where(rows, jnp.sum(logp, axis=1), 0.0)), _count(rows)


def listmle(logits, labels, mask, act: str = "identity", order: str = "input"):
  """ListMLELoss: `plistmle` without position weights."""
  return plistmle(logits, labels, mask, act, order, weighted=False)


def adrmse(logits, labels, mask, act: str = "identity", alpha: float = 1.0):
  """ADRMSELoss's (sum of the discounted squared rank errors, number of documents)."""
  m = mask > 0
  x = jnp.where(m, activation(logits.astype(jnp.float32), act), PAD_LOGIT)
  y = jnp.where(m, labels.astype(jnp.float32), 0.0)
  valid_j = m[:, None, :]
  greater = jnp.sum((y[:, None, :] > y[:, :, None]) & valid_j, axis=-1).astype(jnp.float32)
  equal = jnp.sum((y[:, None, :] == y[:, :, None]) & valid_j, axis=-1).astype(jnp.float32)
  true_ranks = greater + (equal + 1.0) / 2.0
  mf = m.astype(jnp.float32)
  pairwise = jax.nn.sigmoid(alpha * (x[:, None, :] - x[:, :, None])) * mf[:, None, :]
  approx = 1.0 + jnp.sum(pairwise, axis=2) - 0.5 * mf
  terms = jnp.square(true_ranks - approx) / jnp.log2(true_ranks + 1.0)
  return jnp.sum(jnp.where(m, terms, 0.0)), _count(m)


def loss_of(name: str, logits, labels, mask, task_cfg):
  """(summed loss, its count) of the loss `name` with `task_cfg`'s settings."""
  act = task_cfg.loss_activation or DEFAULT_ACTIVATION.get(name, "identity")
  if name == "bce":
    return bce(logits[..., 0], labels, mask, act, task_cfg.pos_weight)
  if name == "cross_entropy":
    return cross_entropy(logits, labels, mask, act)
  if name == "mse":
    return mse(logits[..., 0], labels, mask, act)
  if name == "mnrl":
    return mnrl(logits[..., 0], mask, act, task_cfg.scale)
  if name == "margin_mse":
    return margin_mse(logits[..., 0], labels, mask, act)
  if name in ("lambda", "ranknet"):
    return lambda_loss(logits[..., 0], labels, mask,
                       scheme=task_cfg.lambda_scheme if name == "lambda" else "none",
                       k=task_cfg.lambda_k, sigma=task_cfg.sigma, eps=1e-10,
                       binary_log=task_cfg.reduction_log == "binary", mu=task_cfg.mu,
                       act=act)
  if name == "listnet":
    return listnet(logits[..., 0], labels, mask, act)
  if name == "adrmse":
    return adrmse(logits[..., 0], labels, mask, act, task_cfg.adrmse_alpha)
  return plistmle(logits[..., 0], labels, mask, act, task_cfg.list_order,
                  weighted=name == "plistmle")


def check_config(task_cfg) -> None:
  """The loss settings of a rerank config, one ConfigError line each."""
  if task_cfg.loss not in LOSSES:
    raise ConfigError(f"config.task.loss={task_cfg.loss!r}: use one of {LOSSES}.")
  if task_cfg.loss_activation not in ("", *ACTIVATIONS):
    raise ConfigError(f"config.task.loss_activation={task_cfg.loss_activation!r}: use '' "
                      f"(the loss's own) or one of {ACTIVATIONS}.")
  if task_cfg.lambda_scheme not in SCHEMES:
    raise ConfigError(f"config.task.lambda_scheme={task_cfg.lambda_scheme!r}: use one of "
                      f"{SCHEMES}.")
  if task_cfg.list_order not in LIST_ORDERS:
    raise ConfigError(f"config.task.list_order={task_cfg.list_order!r}: use one of "
                      f"{LIST_ORDERS}.")
  if task_cfg.reduction_log not in ("binary", "natural"):
    raise ConfigError(f"config.task.reduction_log={task_cfg.reduction_log!r}: use "
                      "'binary' or 'natural'.")
  if task_cfg.lambda_k < 0 or task_cfg.num_negatives < 0 or task_cfg.pos_weight < 0:
    raise ConfigError("config.task.lambda_k, num_negatives and pos_weight must be >= 0.")
  if task_cfg.num_labels != 1 and task_cfg.loss != "cross_entropy":
    raise ConfigError(f"config.task.num_labels={task_cfg.num_labels}: only the "
                      "'cross_entropy' loss reads several logits a pair (the others one, "
                      "as sentence-transformers'); set num_labels=1 or that loss.")
  if task_cfg.loss == "cross_entropy" and task_cfg.num_labels < 2:
    raise ConfigError("config.task.loss='cross_entropy' classifies each pair: set "
                      "config.task.num_labels to the number of classes (>= 2).")
