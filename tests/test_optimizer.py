"""The optimizer's updates against a hand computation in numpy: LAMB (You et al. 2020,
Algorithm 2) with BERT's schedule, the decay mask and global-norm clipping."""

import numpy as np
import optax
import pytest

from bertjax.train import optimizer
from configs import bert_base

SHAPES = {"dense": {"kernel": (3, 4), "bias": (4,)},
          "LayerNorm": {"scale": (4,), "bias": (4,)},
          "word_embeddings": {"embedding": (5, 3)}}


def _settings(**kw):
  """The recipe's `config.train` (every field) with LAMB and these settings."""
  train = bert_base.get_config().train
  train.update(dict(optimizer="lamb", learning_rate=0.1, warmup_steps=2, num_steps=10,
                    b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, max_grad_norm=1.0,
                    skip_step_on_spikes=False, **kw))
  return train


def _tree(seed: int, scale: float = 1.0) -> dict:
  rng = np.random.default_rng(seed)
  return {layer: {name: (scale * rng.standard_normal(shape)).astype(np.float32)
                  for name, shape in leaves.items()} for layer, leaves in SHAPES.items()}


def _lamb_by_hand(params, grads_per_step, cfg):
  """The parameters after each step, computed leaf by leaf in float64."""
  flat = lambda t: {(a, b): np.asarray(v, np.float64) for a, d in t.items() for b, v in d.items()}
  w = flat(params)
  m = {k: np.zeros_like(v) for k, v in w.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  out = []
  for t, grads in enumerate(grads_per_step, start=1):
    g = flat(grads)
    norm = np.sqrt(sum(np.sum(x ** 2) for x in g.values()))
    g = {k: x * min(1.0, cfg.max_grad_norm / norm) for k, x in g.items()}  # clipping
    # BERT's schedule at step t - 1: warm-up to the peak, then linear decay to 0.
    s = t - 1
    lr = cfg.learning_rate * (s / cfg.warmup_steps if s < cfg.warmup_steps
                              else 1 - s / cfg.num_steps)
    for k in w:
      m[k] = cfg.b1 * m[k] + (1 - cfg.b1) * g[k]
      v[k] = cfg.b2 * v[k] + (1 - cfg.b2) * g[k] ** 2
      r = (m[k] / (1 - cfg.b1 ** t)) / (np.sqrt(v[k] / (1 - cfg.b2 ** t)) + cfg.eps)
      if k[1] in ("kernel", "embedding"):  # weight decay off LayerNorm and biases
        r = r + cfg.weight_decay * w[k]
      w_norm, r_norm = np.linalg.norm(w[k]), np.linalg.norm(r)
      trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0  # per layer
      w[k] = w[k] - lr * trust * r
    out.append({k: x.copy() for k, x in w.items()})
  return out


@pytest.mark.slow
def test_lamb_update_matches_the_hand_computation():
  cfg = _settings()
  params = _tree(0)
  params["dense"]["bias"][:] = 0.0  # A zero-norm parameter: trust ratio 1.
  grads = [_tree(1 + i, scale=0.5 + i) for i in range(4)]  # step 3-4's norms get clipped
  expected = _lamb_by_hand(params, grads, cfg)
  tx = optimizer.create_optimizer(cfg)
  state = tx.init(params)
  for step, g in enumerate(grads):
    updates, state = tx.update(g, state, params)
    new = optax.apply_updates(params, updates)
    for (layer, name), want in expected[step].items():
      np.testing.assert_allclose(new[layer][name], want, rtol=2e-5, atol=1e-7,
                                 err_msg=f"step {step + 1} {layer}/{name}")
    # The trust ratio makes every nonzero layer move by lr * |w| (Adam would not).
    lr = optimizer.learning_rate_schedule(cfg)(step)
    for a, b in (("dense", "kernel"), ("LayerNorm", "scale"), ("word_embeddings", "embedding")):
      np.testing.assert_allclose(np.linalg.norm(new[a][b] - params[a][b]),
                                 lr * np.linalg.norm(params[a][b]), rtol=1e-4, atol=1e-9)
    params = new
