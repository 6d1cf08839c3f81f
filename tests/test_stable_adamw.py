"""StableAdamW and the warm-up-stable-decay schedule against hand computations in
numpy (float64, written from Wortsman et al. 2023 Algorithm 2 and optimi's
stableadamw.py, not from our code), against optimi's PyTorch StableAdamW when
torch-optimi is installed, and the config fields that select them."""

import math

import jax
import ml_collections
import numpy as np
import optax
import pytest

from bertjax.errors import ConfigError
from bertjax.train import optimizer, pretrain, stable_adamw
from configs import bert_tiny

B1, B2, EPS = 0.9, 0.98, 1e-6
SHAPES = {"dense": {"kernel": (3, 4), "bias": (4,)},
          "LayerNorm": {"scale": (4,)},
          "word_embeddings": {"embedding": (5, 3)}}
DECAYED = ("kernel", "embedding")  # bertjax's decay_mask: not LayerNorm, not biases


def _tree(seed: int, scale: float = 1.0) -> dict:
  rng = np.random.default_rng(seed)
  return {layer: {name: (scale * rng.standard_normal(shape)).astype(np.float32)
                  for name, shape in leaves.items()} for layer, leaves in SHAPES.items()}


def _scaled(tree, scale: dict) -> dict:
  return {layer: {name: (v * scale.get(layer, scale["*"])).astype(np.float32)
                  for name, v in leaves.items()} for layer, leaves in tree.items()}


# Gradients: g, then g / 2 (every tensor's RMS ratio below 1: no clipping), then 10 g
# in the dense layer (its ratio far above 1: clipped) and g / 2 elsewhere, then new ones.
GRADS = [_tree(1), _scaled(_tree(1), {"*": 0.5}),
         _scaled(_tree(1), {"dense": 10.0, "*": 0.5}), _tree(4)]


def _flat(tree) -> dict:
  return {(a, b): np.asarray(v, np.float64) for a, d in tree.items() for b, v in d.items()}


def _by_hand(params, grads_per_step, lrs, weight_decay, rms_seen=None):
  """The parameters after each step: per tensor, Adam's bias-corrected moments, the
  update's RMS ratio, the clipped learning rate, decoupled decay on DECAYED."""
  w = _flat(params)
  m = {k: np.zeros_like(x) for k, x in w.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  out = []
  for t, grads in enumerate(grads_per_step, start=1):
    g = _flat(grads)
    for k in w:
      m[k] = B1 * m[k] + (1 - B1) * g[k]
      v[k] = B2 * v[k] + (1 - B2) * g[k] ** 2
      m_hat, v_hat = m[k] / (1 - B1 ** t), v[k] / (1 - B2 ** t)
      rms = math.sqrt(np.mean(g[k] ** 2 / np.maximum(v_hat, EPS ** 2)))
      if rms_seen is not None:
        rms_seen.append(rms)
      lr = lrs[t - 1] / max(1.0, rms)
      decay = weight_decay * w[k] if k[1] in DECAYED else 0.0
      w[k] = w[k] - lr * (m_hat / (np.sqrt(v_hat) + EPS) + decay)
    out.append({k: x.copy() for k, x in w.items()})
  return out


def _run(tx, params, grads_per_step):
  state = tx.init(params)
  out = []
  for g in grads_per_step:
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
    out.append(_flat(params))
  return out


def _assert_close(got, want):
  for step, (a, b) in enumerate(zip(got, want)):
    for k in b:
      np.testing.assert_allclose(a[k], b[k], rtol=2e-5, atol=1e-7, err_msg=f"step {step + 1} {k}")


def _train_cfg(**kw):
  t = bert_tiny.get_config().train
  t.update(dict(optimizer="stable_adamw", learning_rate=0.1, warmup_steps=1, num_steps=4,
                b1=B1, b2=B2, eps=EPS, weight_decay=0.05, max_grad_norm=0.0,
                schedule="wsd", decay_fraction=0.5, decay_shape="1-sqrt",
                final_lr_fraction=0.1, decouple_lr=False, skip_step_on_spikes=False))
  t.update(kw)
  return t


def test_stable_adamw_matches_the_hand_computation_with_and_without_clipping():
  params, lrs = _tree(0), [0.1, 0.05, 0.02, 0.01]
  rms = []
  want = _by_hand(params, GRADS, lrs, 0.05, rms)
  rms = np.array(rms).reshape(len(GRADS), -1)  # [step, tensor]
  np.testing.assert_allclose(rms[0], 1.0, rtol=1e-9)  # step 1: g**2 / v_hat = 1
  assert (rms[1] < 0.7).all()  # g / 2: no clipping
  assert rms[2][:2].min() > 1.5 and (rms[2][2:] < 1).all()  # the spike: dense clipped
  tx = stable_adamw.stable_adamw(lambda t: np.array(lrs)[t], B1, B2, EPS, 0.05,
                                 optimizer.decay_mask)
  _assert_close(_run(tx, params, GRADS), want)


def test_create_optimizer_wires_stable_adamw_wsd_and_decouple_lr():
  """optimizer='stable_adamw', schedule='wsd', decouple_lr: the decay is
  (lr_t / peak) * weight_decay."""
  t = _train_cfg(decouple_lr=True)
  lrs = [0.0, 0.1, 0.1, 0.01 + 0.09 * (1 - math.sqrt(0.5))]  # warm-up, hold, 1-sqrt
  np.testing.assert_allclose([optimizer.learning_rate_schedule(t)(s) for s in range(4)],
                             lrs, rtol=1e-6)
  want = _by_hand(_tree(0), GRADS, lrs, 0.05 / 0.1)
  _assert_close(_run(optimizer.create_optimizer(t), _tree(0), GRADS), want)


def test_scanned_layers_are_clipped_per_layer():
  """A stacked [L, ...] leaf under 'layers' moves as the L unstacked tensors would,
  although only one layer's gradient spikes (a whole-leaf RMS would clip both)."""
  rng = np.random.default_rng(0)
  p = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2)]
  g = [[rng.standard_normal((3, 4)).astype(np.float32) * (10 if s == 1 and i == 0 else 1)
        for i in range(2)] for s in range(3)]
  tx = stable_adamw.stable_adamw(0.1, B1, B2, EPS, 0.0)
  apart = _run(tx, {f"layer_{i}": {"kernel": p[i]} for i in range(2)},
               [{f"layer_{i}": {"kernel": s[i]} for i in range(2)} for s in g])
  for key in ("layers", "blocks"):  # 'blocks' is not a stacked key: one RMS for both
    stacked = _run(tx, {key: {"kernel": np.stack(p)}},
                   [{key: {"kernel": np.stack(s)}} for s in g])
    diff = max(np.abs(b[(key, "kernel")][i] - a[(f"layer_{i}", "kernel")]).max()
               for a, b in zip(apart, stacked) for i in range(2))
    assert diff < 1e-6 if key == "layers" else diff > 1e-3, (key, diff)


@pytest.mark.filterwarnings("ignore:You are using weight_decay")  # optimi: 0.3 is high
def test_stable_adamw_matches_optimi():
  """optimi's StableAdamW (ModernBERT's optimizer: decouple_lr=True, decay off 1-D
  tensors and biases) for six steps of the wsd schedule, the learning rate set on its
  parameter groups each step as Composer's scheduler does."""
  optimi = pytest.importorskip("optimi")
  torch = pytest.importorskip("torch")
  t = _train_cfg(num_steps=6, warmup_steps=2, decay_fraction=0.5, decouple_lr=True,
                 weight_decay=0.3)
  schedule = optimizer.learning_rate_schedule(t)
  grads = GRADS + [_tree(5, 3.0), _tree(6)]
  params = _tree(0)
  theirs = {k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float32))
            for k, v in _flat(params).items()}
  groups = [{"params": [p for k, p in theirs.items() if k[1] in DECAYED]},
            {"params": [p for k, p in theirs.items() if k[1] not in DECAYED],
             "weight_decay": 0.0}]
  opt = optimi.StableAdamW(groups, lr=t.learning_rate, betas=(B1, B2), eps=EPS,
                           weight_decay=t.weight_decay, decouple_lr=True)
  ours = _run(optimizer.create_optimizer(t), params, grads)
  for step, g in enumerate(grads):
    for group in opt.param_groups:
      group["lr"] = float(schedule(step))
    for k, p in theirs.items():
      p.grad = torch.tensor(_flat(g)[k], dtype=torch.float32)
    opt.step()
    for k, p in theirs.items():
      np.testing.assert_allclose(ours[step][k], p.detach().numpy(), rtol=1e-5, atol=1e-7,
                                 err_msg=f"step {step + 1} {k}")


@pytest.mark.parametrize("shape", ["1-sqrt", "linear"])
def test_wsd_schedule_at_its_knots(shape):
  t = ml_collections.ConfigDict(dict(learning_rate=2.0, warmup_steps=10, num_steps=100,
                                     schedule="wsd", decay_fraction=0.2, decay_shape=shape,
                                     final_lr_fraction=0.05))
  lr = optimizer.learning_rate_schedule(t)
  fall = (lambda x: 1 - math.sqrt(x)) if shape == "1-sqrt" else (lambda x: 1 - x)
  end = 2.0 * 0.05
  knots = {0: 0.0, 5: 1.0, 10: 2.0, 50: 2.0, 79: 2.0, 80: 2.0,
           85: end + (2.0 - end) * fall(0.25), 90: end + (2.0 - end) * fall(0.5),
           99: end + (2.0 - end) * fall(0.95), 100: end, 130: end}
  for step, want in knots.items():
    np.testing.assert_allclose(float(lr(step)), want, rtol=1e-6, atol=1e-7,
                               err_msg=f"step {step}")


def test_wsd_without_decay_or_warmup():
  """decay_fraction=0: constant after the warm-up (ModernBERT's 1,024-token phase);
  warmup_steps=0 and decay_fraction=1: a decay-only run (its decay phase)."""
  hold = optimizer.wsd_schedule(1.0, 4, 0, 20)
  np.testing.assert_allclose([float(hold(s)) for s in (0, 2, 4, 19, 25)],
                             [0.0, 0.5, 1.0, 1.0, 1.0])
  decay = optimizer.wsd_schedule(1.0, 0, 16, 16, 0.001, "1-sqrt")
  np.testing.assert_allclose([float(decay(s)) for s in (0, 4, 16)],
                             [1.0, 0.001 + 0.999 * 0.5, 0.001], rtol=1e-6)


@pytest.mark.parametrize("field,value,names", [
    ("decay_shape", "cosine", ["config.train.decay_shape='cosine'"]),
    ("final_lr_fraction", 1.5, ["config.train.final_lr_fraction=1.5"]),
    ("decay_fraction", -0.1, ["config.train.decay_fraction=-0.1"]),
    ("decay_fraction", 0.95, ["config.train.decay_fraction=0.95", "warmup_steps=150"]),
])
def test_wsd_fields_out_of_range(field, value, names):
  config = bert_tiny.get_config()
  config.train.schedule = "wsd"
  config.train.optimizer = "stable_adamw"
  pretrain.check_config(config)
  config.train[field] = value
  with pytest.raises(ConfigError) as e:
    pretrain.check_config(config)
  assert "\n" not in str(e.value) and all(n in str(e.value) for n in names), str(e.value)


def test_sharded_parameters_give_the_unsharded_update():
  """Each tensor's RMS is a mean over the whole tensor, not over a device's shard:
  the jitted update with parameters and moments split over 8 devices equals the
  unsharded one."""
  rng = np.random.default_rng(0)
  params = {"dense": {"kernel": rng.standard_normal((8, 4)).astype(np.float32)}}
  grads = [{"dense": {"kernel": (rng.standard_normal((8, 4)) * s).astype(np.float32)}}
           for s in (1.0, 0.5, 10.0)]
  grads[2]["dense"]["kernel"][:4] *= 0.01  # the spike on half the rows (other devices)
  tx = stable_adamw.stable_adamw(0.1, B1, B2, EPS, 0.01)
  want = _run(tx, params, grads)
  mesh = jax.make_mesh((8,), ("fsdp",))
  shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
  put = lambda tree: jax.device_put(tree, shard)
  step = jax.jit(lambda g, s, p: tx.update(g, s, p))
  p = put(params)
  state = jax.tree.map(lambda x: jax.device_put(x, shard) if x.ndim else x, tx.init(p))
  for i, g in enumerate(grads):
    updates, state = step(put(g), state, p)
    p = optax.apply_updates(p, updates)
    assert len(p["dense"]["kernel"].sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(p["dense"]["kernel"]), want[i][("dense", "kernel")],
                               rtol=1e-6, atol=1e-7)
