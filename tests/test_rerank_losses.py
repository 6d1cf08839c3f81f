"""Each reranker loss of `bertjax.tasks.rerank_losses` against sentence-transformers
6.2.0's own class on the same logits (rtol 1e-5): the classes are called with a model
that scores each (query, document) pair from a table (`_Table`), and bertjax's loss
reads the same table laid out as [B, G] groups, lists shorter than G padded."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertjax.errors import ConfigError
from bertjax.tasks import rerank_losses as losses

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")
from sentence_transformers.cross_encoder import CrossEncoder  # noqa: E402
from sentence_transformers.cross_encoder import losses as st_losses  # noqa: E402

RTOL = 1e-5


class _Table(CrossEncoder):
  """A CrossEncoder whose scores of a pair ([K] float32) are looked up."""

  def __init__(self, table: dict, num_labels: int = 1):  # pylint: disable=super-init-not-called
    torch.nn.Module.__init__(self)
    self.table, self._labels = table, num_labels

  @property
  def num_labels(self) -> int:
    return self._labels

  @property
  def device(self):
    return torch.device("cpu")

  def preprocess(self, pairs, prompt=None, task=None):
    return {"pairs": [tuple(p) for p in pairs]}

  def forward(self, features, **kwargs):
    return {"scores": torch.stack([torch.as_tensor(self.table[p]).reshape(-1)
                                   for p in features["pairs"]])}


def _lists(rng, lengths, graded=True):
  """queries, their documents, labels and logits (a table) of lists of `lengths`."""
  queries = [f"q{i}" for i in range(len(lengths))]
  docs = [[f"d{i}_{j}" for j in range(n)] for i, n in enumerate(lengths)]
  labels = [rng.integers(0, 4 if graded else 2, n).astype(np.float32) for n in lengths]
  table = {(q, d): np.float32(rng.normal() * 2) for q, ds in zip(queries, docs) for d in ds}
  return queries, docs, labels, table


def _grouped(queries, docs, labels, table, G):
  """bertjax's [B, G] logits, labels, mask of the lists, padded to G."""
  B = len(queries)
  logits = np.zeros((B, G), np.float32)
  lab = np.zeros((B, G), np.float32)
  mask = np.zeros((B, G), np.float32)
  for i, (q, ds) in enumerate(zip(queries, docs)):
    for j, d in enumerate(ds):
      logits[i, j], lab[i, j], mask[i, j] = table[(q, d)], labels[i][j], 1
  return jnp.asarray(logits), jnp.asarray(lab), jnp.asarray(mask)


def _ours(fn, *args, **kw):
  total, count = fn(*args, **kw)
  return float(total) / max(float(count), 1.0)


@pytest.mark.parametrize("pos_weight,act", [(0.0, "identity"), (3.0, "identity"),
                                            (0.0, "sigmoid")])
def test_bce(pos_weight, act):
  rng = np.random.default_rng(0)
  q, d, labels, table = _lists(rng, [1] * 9, graded=False)
  model = _Table(table)
  kw = {"pos_weight": torch.tensor(pos_weight)} if pos_weight else {}
  ref = st_losses.BinaryCrossEntropyLoss(
      model, activation_fn=torch.nn.Sigmoid() if act == "sigmoid" else torch.nn.Identity(),
      **kw)
  want = ref([q, [x[0] for x in d]], torch.tensor([float(l[0]) for l in labels])).item()
  logits, lab, mask = _grouped(q, d, labels, table, 1)
  got = _ours(losses.bce, logits, lab, mask, act, pos_weight)
  np.testing.assert_allclose(got, want, rtol=RTOL)
  assert got > 0


def test_bce_soft_labels_and_mse():
  rng = np.random.default_rng(1)
  q, d, _, table = _lists(rng, [1] * 7)
  soft = [np.array([rng.uniform()], np.float32) for _ in q]
  model = _Table(table)
  logits, lab, mask = _grouped(q, d, soft, table, 1)
  for ref, ours in ((st_losses.BinaryCrossEntropyLoss(model), losses.bce),
                    (st_losses.MSELoss(model), losses.mse)):
    want = ref([q, [x[0] for x in d]], torch.tensor([float(s[0]) for s in soft])).item()
    np.testing.assert_allclose(_ours(ours, logits, lab, mask), want, rtol=RTOL)


def test_cross_entropy():
  rng = np.random.default_rng(2)
  K, n = 3, 8
  q = [f"q{i}" for i in range(n)]
  d = [f"d{i}" for i in range(n)]
  table = {(a, b): rng.normal(size=K).astype(np.float32) for a, b in zip(q, d)}
  labels = rng.integers(0, K, n)
  want = st_losses.CrossEntropyLoss(_Table(table, K))([q, d], torch.tensor(labels)).item()
  logits = jnp.asarray(np.stack([table[(a, b)] for a, b in zip(q, d)])[:, None, :])
  got = _ours(losses.cross_entropy, logits, jnp.asarray(labels[:, None]),
              jnp.ones((n, 1)))
  np.testing.assert_allclose(got, want, rtol=RTOL)


@pytest.mark.parametrize("hard", [0, 2])
def test_mnrl_all_in_batch(hard):
  """num_negatives=None: every other example's documents are negatives (ST's
  `get_in_batch_negatives`); bertjax's group of a row holds the same documents."""
  rng = np.random.default_rng(3)
  B = 5
  anchors = [f"q{i}" for i in range(B)]
  columns = [[f"p{i}" for i in range(B)]] + [[f"n{c}_{i}" for i in range(B)]
                                             for c in range(hard)]
  docs_of = lambda i: [col[i] for col in columns]
  table = {(a, d): np.float32(rng.normal() * 3) for a in anchors for col in columns
           for d in col}
  ref = st_losses.MultipleNegativesRankingLoss(_Table(table), num_negatives=None)
  want = ref([anchors, *columns], torch.zeros(B)).item()
  groups = [[columns[0][i]] + [d for j in range(B) if j != i for d in docs_of(j)]
            + docs_of(i)[1:] for i in range(B)]
  G = len(groups[0])
  logits = jnp.asarray([[table[(anchors[i], d)] for d in g] for i, g in enumerate(groups)])
  got = _ours(losses.mnrl, logits, jnp.ones((B, G)), "sigmoid", 10.0)
  np.testing.assert_allclose(got, want, rtol=RTOL)


def test_margin_mse():
  rng = np.random.default_rng(4)
  B, k = 6, 3
  anchors = [f"q{i}" for i in range(B)]
  columns = [[f"c{c}_{i}" for i in range(B)] for c in range(k + 1)]
  table = {(a, col[i]): np.float32(rng.normal()) for i, a in enumerate(anchors)
           for col in columns}
  teacher = rng.normal(size=(B, k + 1)).astype(np.float32)
  want = st_losses.MarginMSELoss(_Table(table))([anchors, *columns],
                                                torch.tensor(teacher)).item()
  logits = jnp.asarray([[table[(a, col[i])] for col in columns] for i, a in enumerate(anchors)])
  got = _ours(losses.margin_mse, logits, jnp.asarray(teacher), jnp.ones((B, k + 1)))
  np.testing.assert_allclose(got, want, rtol=RTOL)


LENGTHS = [5, 3, 6, 1, 4]  # Lists of unequal length, padded to G = 6 (and 8).


@pytest.mark.parametrize("scheme,k,log", [
    ("ndcg2pp", 0, "binary"), ("ndcg2", 0, "binary"), ("ndcg1", 0, "natural"),
    ("lambdarank", 0, "binary"), ("none", 0, "binary"), ("ndcg2pp", 3, "binary"),
    ("ndcg1", 2, "binary")])
def test_lambda_loss(scheme, k, log):
  rng = np.random.default_rng(5)
  q, d, labels, table = _lists(rng, LENGTHS)
  cls = {"ndcg2pp": st_losses.NDCGLoss2PPScheme, "ndcg2": st_losses.NDCGLoss2Scheme,
         "ndcg1": st_losses.NDCGLoss1Scheme, "lambdarank": st_losses.LambdaRankScheme,
         "none": st_losses.NoWeightingScheme}[scheme]
  ref = st_losses.LambdaLoss(_Table(table), weighting_scheme=cls(), k=k or None,
                             reduction_log=log)
  want = ref([q, d], [torch.tensor(l) for l in labels]).item()
  for G in (max(LENGTHS), 8):
    logits, lab, mask = _grouped(q, d, labels, table, G)
    total, count = losses.lambda_loss(logits, lab, mask, scheme=scheme, k=k,
                                      binary_log=log == "binary")
    # Padding beyond the longest list changes no pair.
    np.testing.assert_allclose(float(total) / float(count), want, rtol=RTOL)
  assert want != 0


def test_ranknet():
  rng = np.random.default_rng(6)
  q, d, labels, table = _lists(rng, LENGTHS)
  want = st_losses.RankNetLoss(_Table(table))([q, d], [torch.tensor(l) for l in labels]).item()
  logits, lab, mask = _grouped(q, d, labels, table, 7)
  got = _ours(losses.lambda_loss, logits, lab, mask, scheme="none")
  np.testing.assert_allclose(got, want, rtol=RTOL)


@pytest.mark.parametrize("name", ["listnet", "listmle"])
def test_listnet_listmle(name):
  rng = np.random.default_rng(7)
  q, d, labels, table = _lists(rng, LENGTHS)
  cls = st_losses.ListNetLoss if name == "listnet" else st_losses.ListMLELoss
  want = cls(_Table(table))([q, d], [torch.tensor(l) for l in labels]).item()
  logits, lab, mask = _grouped(q, d, labels, table, 7)
  got = _ours(getattr(losses, name), logits, lab, mask)
  np.testing.assert_allclose(got, want, rtol=RTOL)


@pytest.mark.parametrize("name,order", [("listmle", "labels"), ("plistmle", "input"),
                                        ("plistmle", "labels")])
def test_listmle_by_labels_and_plistmle(name, order):
  """Distinct labels, so that torch's unstable sort and ours rank a list alike; a list
  of 130 documents reaches PListMLE's weight clamp (n > 127)."""
  rng = np.random.default_rng(9)
  lengths = LENGTHS + [130]
  q, d, _, table = _lists(rng, lengths)
  labels = [rng.permutation(n).astype(np.float32) for n in lengths]
  if name == "listmle":
    ref = st_losses.ListMLELoss(_Table(table), respect_input_order=order == "input")
  else:
    ref = st_losses.PListMLELoss(_Table(table), respect_input_order=order == "input")
  want = ref([q, d], [torch.tensor(l) for l in labels]).item()
  logits, lab, mask = _grouped(q, d, labels, table, 132)
  got = _ours(losses.loss_of, name, logits[..., None], lab, mask,
              _cfg(loss=name, list_order=order))
  np.testing.assert_allclose(got, want, rtol=RTOL)
  assert want != 0


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_adrmse(alpha):
  """Graded labels with ties (their mean rank), lists padded to the group size."""
  rng = np.random.default_rng(10)
  q, d, labels, table = _lists(rng, LENGTHS)
  want = st_losses.ADRMSELoss(_Table(table), alpha=alpha)(
      [q, d], [torch.tensor(l) for l in labels]).item()
  logits, lab, mask = _grouped(q, d, labels, table, 8)
  got = _ours(losses.adrmse, logits, lab, mask, alpha=alpha)
  np.testing.assert_allclose(got, want, rtol=RTOL)
  assert want != 0


def test_gradients_finite_through_padding():
  """A padded group's gradient is finite and zero at the padding."""
  rng = np.random.default_rng(8)
  q, d, labels, table = _lists(rng, LENGTHS)
  logits, lab, mask = _grouped(q, d, labels, table, 7)
  for name in losses.LISTWISE + ("mnrl",):
    cfg = _cfg(loss=name)
    g = jax.grad(lambda x: losses.loss_of(name, x[..., None], lab, mask, cfg)[0])(logits)
    assert np.isfinite(np.asarray(g)).all(), name
    assert np.all(np.asarray(g)[np.asarray(mask) == 0] == 0), name


def _cfg(**kw):
  c = ml_collections.ConfigDict(dict(
      loss="bce", loss_activation="", pos_weight=0.0, scale=10.0, lambda_scheme="ndcg2pp",
      lambda_k=0, sigma=1.0, reduction_log="binary", mu=10.0, num_negatives=4,
      num_labels=1, list_order="input", adrmse_alpha=1.0))
  c.update(kw)
  return c


@pytest.mark.parametrize("kw,match", [
    ({"loss": "lambdaloss"}, "config.task.loss="),
    ({"lambda_scheme": "ndcg3"}, "lambda_scheme"),
    ({"loss": "bce", "num_labels": 3}, "num_labels=3"),
    ({"loss": "cross_entropy", "num_labels": 1}, "num_labels"),
    ({"loss_activation": "tanh"}, "loss_activation"),
    ({"list_order": "score"}, "list_order")])
def test_config_errors(kw, match):
  with pytest.raises(ConfigError, match=match):
    losses.check_config(_cfg(**kw))
