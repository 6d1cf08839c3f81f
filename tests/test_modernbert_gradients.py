"""ModernBERT's gradients equal transformers' (float32): the MLM loss (summed
cross-entropy at labelled positions) of `ModernBertForMaskedLM` differentiated by torch,
its gradients mapped into our tree by the same table as the weights
(`bertjax.hf.modernbert`: transposes and reshapes, exact), against `jax.grad` of ours,
every parameter, on padded rows and on packed rows (each document alone on the
transformers side: the loss is a sum, so are the gradients). Rows longer than the
window: global and sliding-window layers, rotary positions restarting per document."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.hf import convert
from bertjax.model import family_of
from tests.helpers import perturb

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T, VOCAB = 40, 96
# Each gradient within RTOL of its largest magnitude (float32; measured below 2e-6).
RTOL = 1e-4


@pytest.fixture(scope="module")
def hf_mlm():
  """4 layers (0 and 3 global), window 8 (4 each side), every weight moved."""
  torch.manual_seed(0)
  config = transformers.ModernBertConfig(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
      num_attention_heads=4, global_attn_every_n_layers=3, local_attention=8,
      max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
      cls_token_id=1, sep_token_id=2, attn_implementation="eager")
  return perturb(transformers.ModernBertForMaskedLM(config))


def _hf_grads(model, rows) -> dict[str, np.ndarray]:
  """The summed loss's gradient of every state-dict entry (tied ones share theirs);
  rows: (ids [1, t], mask [1, t] or None, labels [1, t] with -100 unlabelled)."""
  model.zero_grad(set_to_none=True)
  for ids, mask, labels in rows:
    logits = model(torch.as_tensor(ids, dtype=torch.long),
                   attention_mask=None if mask is None else torch.as_tensor(mask)).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB), torch.as_tensor(labels, dtype=torch.long).reshape(-1),
        ignore_index=-100, reduction="sum")
    loss.backward()
  return {k: (np.zeros(p.shape, np.float32) if p.grad is None else p.grad.numpy().copy())
          for k, p in model.state_dict(keep_vars=True).items()}


def _our_grads(model, ids, mask, labels, segment_ids=None):
  state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  hf_json = model.config.to_dict()
  cfg, params, _ = convert.table_of(hf_json).load(hf_json, state)
  net = family_of(cfg).pretraining(cfg)
  labelled = labels >= 0

  def loss(p):
    segments = None if segment_ids is None else jnp.asarray(segment_ids)
    logits = net.apply({"params": p}, jnp.asarray(ids), jnp.asarray(mask),
                       segment_ids=segments)["mlm_logits"]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    picked = jnp.take_along_axis(logp, jnp.asarray(np.maximum(labels, 0))[..., None], -1)
    return -jnp.sum(jnp.where(jnp.asarray(labelled), picked[..., 0], 0.0))

  return jax.jit(jax.grad(loss))(params)


def _compare(model, grads, hf_rows) -> float:
  """The largest difference of our `grads` from transformers' on `hf_rows` over every
  parameter, each relative to that gradient's largest magnitude (asserted < RTOL)."""
  hf_json = model.config.to_dict()
  _, theirs, _ = convert.table_of(hf_json).load(hf_json, _hf_grads(model, hf_rows))
  assert jax.tree.structure(theirs) == jax.tree.structure(grads)
  worst = 0.0
  leaves = zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(theirs))
  for (path, g), h in leaves:
    scale = float(np.abs(h).max())
    assert scale > 0, jax.tree_util.keystr(path)  # Every parameter has a gradient.
    diff = float(np.abs(np.asarray(g) - h).max()) / scale
    assert diff < RTOL, (jax.tree_util.keystr(path), diff)
    worst = max(worst, diff)
  return worst


def _labels(rng, ids, real):
  """Labels at about a third of the real positions (-100 elsewhere)."""
  chosen = real & (rng.random(ids.shape) < 0.35)
  return np.where(chosen, rng.integers(3, VOCAB, ids.shape), -100).astype(np.int32)


def test_padded_rows_gradients_match_hf(hf_mlm):
  rng = np.random.default_rng(0)
  lengths = [T, 23]
  mask = (np.arange(T)[None] < np.array(lengths)[:, None]).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(3, VOCAB, (2, T)), 0).astype(np.int32)
  labels = _labels(rng, ids, mask > 0)
  worst = _compare(hf_mlm, _our_grads(hf_mlm, ids, mask, labels),
                   [(ids[i:i + 1], mask[i:i + 1], labels[i:i + 1]) for i in range(2)])
  print(f"padded rows: largest gradient difference {worst:.1e} of its scale")


@pytest.mark.slow
def test_packed_rows_gradients_match_each_document_alone(hf_mlm):
  rng = np.random.default_rng(1)
  sizes = (17, 12, 7)  # + 4 padding tokens: T = 40
  ids = np.zeros((1, T), np.int32)
  seg = np.zeros((1, T), np.int32)
  at = 0
  for s, n in enumerate(sizes):
    ids[0, at:at + n], seg[0, at:at + n] = rng.integers(3, VOCAB, n), s + 1
    at += n
  labels = _labels(rng, ids, seg > 0)
  bounds = np.cumsum((0,) + sizes)
  docs = [(ids[:, a:b], None, labels[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
  mask = (seg > 0).astype(np.int32)
  worst = _compare(hf_mlm, _our_grads(hf_mlm, ids, mask, labels, seg), docs)
  print(f"packed rows: largest gradient difference {worst:.1e} of its scale")
