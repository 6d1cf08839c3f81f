"""GTE and NomicBERT's own numerics beyond tests/test_family_conformance.py (which checks
every family's hidden states and MLM logits against transformers on padded and packed
rows, bf16, FLOPs): gradients of every parameter equal torch's on padded rows with token
types and packed rows, full-size parameter counts equal Hugging Face's (eval_shape /
meta device), one-line config errors, a length phase's theta."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.errors import ConfigError
from bertjax.hf import convert
from bertjax.model import family_of, gte, nomic_bert
from tests.gte_helpers import FAMILIES, PAD, VOCAB, apply, hf_model, ours, relative

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T = 20
TOL = 1e-4  # of the largest magnitude (measured: below 1e-6)


@pytest.fixture(scope="module", params=FAMILIES)
def mlm(request):
  model = hf_model(request.param)
  return (model, *ours(model)[:2])


def _padded(seed=0):
  rng = np.random.default_rng(seed)
  mask = (np.arange(T)[None] < np.array([[T], [13]])).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(3, VOCAB, (2, T)), PAD).astype(np.int32)
  types = ((np.arange(T)[None] >= 8) & (mask > 0)).astype(np.int32)
  return ids, mask, types


def _hf_grads(model, rows) -> dict[str, np.ndarray]:
  """The summed MLM loss's gradient of every state-dict entry (tied ones share one)."""
  model.zero_grad(set_to_none=True)
  for ids, mask, labels in rows:
    as_long = lambda x: None if x is None else torch.as_tensor(x, dtype=torch.long)
    logits = model(as_long(ids), attention_mask=as_long(mask)).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), as_long(labels).reshape(-1),
                                      ignore_index=-100, reduction="sum").backward()
  return {k: np.zeros(p.shape, np.float32) if p.grad is None else p.grad.numpy().copy()
          for k, p in model.state_dict(keep_vars=True).items()}


def test_gradients_match_hf(mlm):
  """jax.grad of the summed MLM cross-entropy against torch's, every parameter (mapped
  by the same table), on padded rows and on a packed row (each document alone there)."""
  model, cfg, params = mlm
  rng = np.random.default_rng(2)
  mask = (np.arange(T)[None] < np.array([[T], [14]])).astype(np.int32)
  seg = np.where(mask > 0, np.array([[1] * 11 + [2] * 9, [1] * T]), 0).astype(np.int32)
  ids = np.where(mask > 0, rng.integers(3, VOCAB, (2, T)), PAD).astype(np.int32)
  labels = np.where((mask > 0) & (rng.random((2, T)) < 0.4), rng.integers(3, VOCAB, (2, T)),
                    -100).astype(np.int32)
  net = family_of(cfg).pretraining(cfg)

  def loss(p):
    logits = net.apply({"params": p}, ids, mask, segment_ids=seg)["mlm_logits"]
    logp = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(logp, np.maximum(labels, 0)[..., None], -1)[..., 0]
    return -jnp.sum(jnp.where(labels >= 0, picked, 0.0))

  grads = jax.jit(jax.grad(loss))(jax.tree.map(jnp.asarray, params))
  rows = [(ids[:1, :11], None, labels[:1, :11]), (ids[:1, 11:], None, labels[:1, 11:]),
          (ids[1:], mask[1:], labels[1:])]
  hf = model.config.to_dict()
  _, theirs, _ = convert.table_of(hf).load(hf, _hf_grads(model, rows))
  assert jax.tree.structure(theirs) == jax.tree.structure(grads)
  worst = 0.0
  for (path, g), h in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(theirs)):
    assert np.abs(h).max() > 0, jax.tree_util.keystr(path)
    worst = max(worst, relative(g, h))
    assert relative(g, h) < TOL, jax.tree_util.keystr(path)
  print(f"{cfg.family} gradients: largest difference {worst:.1e} of its scale")


SIZES = {  # Published config.json sizes (the rest: the classes' defaults).
    "gte": {"base": dict(), "en_base": dict(vocab_size=30528, type_vocab_size=0),
            "large": dict(vocab_size=30528, hidden_size=1024, num_hidden_layers=24,
                          num_attention_heads=16, intermediate_size=4096,
                          type_vocab_size=0)},
    "nomic_bert": {"base": dict()},
}


@pytest.mark.parametrize("family,size", [(f, s) for f in SIZES for s in SIZES[f]])
def test_full_size_parameter_counts_equal_hf(family, size):
  hf_config = getattr(transformers, {"gte": "GteConfig",
                                     "nomic_bert": "NomicBertConfig"}[family])(**SIZES[family][size])
  cfg = convert.table_of(hf_config.to_dict()).model_config_from_hf(hf_config.to_dict())
  boxed = jax.eval_shape(family_of(cfg).pretraining(cfg).init_params, jax.random.key(0))
  for leaf in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
    assert isinstance(leaf, nn.Partitioned) and len(leaf.names) == leaf.value.ndim
  count = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  cls = {"gte": "GteForMaskedLM", "nomic_bert": "NomicBertForMaskedLM"}[family]
  with torch.device("meta"):
    hf = getattr(transformers, cls)(hf_config)
  theirs = sum(p.numel() for p in hf.parameters())  # tied decoder once
  print(f"{family} {size}: ours {count(nn.unbox(boxed)):,} HF {theirs:,}")
  assert count(nn.unbox(boxed)) == theirs


def test_config_errors_are_one_line():
  small = dict(vocab_size=64, hidden_size=32, num_heads=4, intermediate_size=48,
               pad_token_id=0)
  for cls, bad in ((gte.GteConfig, dict(num_heads=3)), (gte.GteConfig, dict(hidden_act="x")),
                   (gte.GteConfig, dict(rope_type="yarn")),
                   (gte.GteConfig, dict(rope_type="default", rope_factor=2.0)),
                   (gte.GteConfig, dict(rope_theta_phases=(1e4, 5e4))),
                   (gte.GteConfig, dict(type_vocab_size=-1)),
                   (nomic_bert.NomicBertConfig, dict(head_dim=7)),
                   (nomic_bert.NomicBertConfig, dict(dropout_rate=1.0))):
    with pytest.raises(ConfigError) as e:
      cls(**{**small, **bad})
    assert "\n" not in str(e.value), bad
  nomic = nomic_bert.NomicBertConfig(**small, head_dim=12)
  assert nomic.head_dim == 12 and nomic_bert.NomicBertConfig(**small).head_dim == 8
  with pytest.raises(ConfigError, match="family"):
    gte.GteConfig.from_config({"family": "nomic_bert"})
  with pytest.raises(ConfigError, match="2 length phases"):
    gte.phase_inputs(gte.GteConfig(**small, rope_theta_phases=(1e4, 16e4, 16e4),
                                   rope_theta=16e4), [64, 128])
  assert gte.phase_inputs(gte.GteConfig(**small, rope_theta_phases=(1e4, 16e4),
                                        rope_theta=16e4), [64, 128]) == [
                                            {"rope_theta": 1e4}, {"rope_theta": 16e4}]


def test_a_phase_theta_reaches_the_rotary_table(mlm):
  """`rope_theta` per row (a length phase's) changes the logits exactly as a config at
  that theta does."""
  _, cfg, params = mlm
  ids, mask, _ = _padded(5)
  model = family_of(cfg).pretraining(cfg)
  theta = jnp.full((2,), 50.0)
  phased = model.apply({"params": params}, ids, mask, rope_theta=theta)["mlm_logits"]
  _, other = apply(dataclasses.replace(cfg, rope_theta=50.0), params,
                   dict(input_ids=ids, attention_mask=mask))
  np.testing.assert_allclose(np.asarray(phased), other, atol=1e-5)
