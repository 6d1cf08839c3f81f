"""ModernBERT's own numerics beyond what every family is held to
(tests/test_family_conformance.py: padded and packed rows against transformers,
scanned and unscanned, the task heads): segment_ids alone restarting the rotary
positions, local layers that are local, mean pooling, gradients, sharding, the
initialisation; full-size parameter counts equal Hugging Face's (eval_shape / meta
device: no memory)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.hf import modernbert as conv
from bertjax.errors import ConfigError
from bertjax.model import modernbert as mb, stack
from tests.helpers import perturb

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-5
T = 24  # > 2 * window + 1: the local layers see part of each row only.
# 4 blocks: global, local, local, global; window 8 (4 each side); distinct thetas.
HF_SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                num_attention_heads=4, global_attn_every_n_layers=3, local_attention=8,
                global_rope_theta=160_000.0, local_rope_theta=10_000.0, pad_token_id=0,
                bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


def _state(model):
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def hf_mlm():
  torch.manual_seed(0)
  config = transformers.ModernBertConfig(**HF_SMALL, attn_implementation="eager")
  model = perturb(transformers.ModernBertForMaskedLM(config))
  cfg = conv.model_config_from_hf(config.to_dict())
  return model, cfg, conv.params_from_hf(_state(model), cfg)


def _ours(cfg, params, scan, **inputs):
  cfg = mb.ModernBertConfig.from_config({**cfg.to_dict(), "scan_layers": scan,
                               "dtype": jnp.float32, "param_dtype": jnp.float32})
  model = mb.FAMILY.pretraining(cfg)
  params = mb.FAMILY.to_layout(params, scan)
  # Jitted: one compiled program, not an eager dispatch of every op.
  hidden = jax.jit(lambda p, i: model.apply(
      {"params": p}, i["input_ids"], i.get("attention_mask"),
      method=lambda m, *a: m.encoder(*a, position_ids=i.get("position_ids"),
                                     segment_ids=i.get("segment_ids"),
                                     output_hidden_states=True)))(params, inputs)
  logits = jax.jit(lambda p, i: model.apply({"params": p}, **i))(params, inputs)
  return np.asarray(hidden["hidden_states"]), np.asarray(logits["mlm_logits"])


def _hf(model, ids, mask=None):
  with torch.no_grad():
    out = model(torch.as_tensor(ids), attention_mask=None if mask is None else
                torch.as_tensor(mask), output_hidden_states=True)
  return (np.stack([h.numpy() for h in out.hidden_states]), out.logits.numpy())


def _ids(rng, shape):
  return rng.integers(3, HF_SMALL["vocab_size"], shape).astype(np.int32)


def test_segment_ids_alone_restart_the_rotary_positions(hf_mlm):
  """Packed rows without position_ids: `segment_ids` restart the rotary positions at
  0 in each document, as the pipeline's explicit positions do (two programs: equal up
  to float32 rounding of their fusions). (Each document against itself alone, every
  family: tests/test_family_conformance.py.)"""
  _, cfg, params = hf_mlm
  rng = np.random.default_rng(1)
  ids, seg, pos = (np.zeros((1, T), np.int32) for _ in range(3))
  at = 0
  for s, n in enumerate((10, 8, 5)):  # + one padding token: T = 24
    ids[0, at:at + n], seg[0, at:at + n], pos[0, at:at + n] = _ids(rng, (n,)), s + 1, np.arange(n)
    at += n
  mask = (seg > 0).astype(np.int32)
  derived = _ours(cfg, params, False, input_ids=ids, attention_mask=mask, segment_ids=seg)
  explicit = _ours(cfg, params, False, input_ids=ids, attention_mask=mask, segment_ids=seg,
                   position_ids=pos)
  np.testing.assert_allclose(derived[1], explicit[1], rtol=0, atol=1e-6)
  # Rotary scores see distances only: doubled ones change the outputs.
  stretched = _ours(cfg, params, False, input_ids=ids, attention_mask=mask, segment_ids=seg,
                    position_ids=2 * pos)
  assert np.abs(stretched[1] - derived[1])[mask > 0].max() > 1e-3


def test_local_layers_really_are_local(hf_mlm):
  """At T = 24 the window (4 each side) matters: widening it changes the outputs."""
  _, cfg, params = hf_mlm
  ids = _ids(np.random.default_rng(2), (1, T))
  _, narrow = _ours(cfg, params, False, input_ids=ids)
  wide = mb.ModernBertConfig.from_config({**cfg.to_dict(), "local_attention": 2 * T})
  _, logits = _ours(wide, params, False, input_ids=ids)
  assert np.abs(logits - narrow).max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean"])  # 'cls': tests/test_family_conformance.py
def test_sequence_classification_head_matches_hf(pooling):
  """`task_features` + `classifier` (params 'head/...') compute
  ModernBertForSequenceClassification's logits; tagging's per-token path likewise."""
  torch.manual_seed(0)
  config = transformers.ModernBertConfig(**HF_SMALL, classifier_pooling=pooling,
                                         classifier_bias=True, num_labels=3,
                                         attn_implementation="eager")
  seq = perturb(transformers.ModernBertForSequenceClassification(config))
  tag = perturb(transformers.ModernBertForTokenClassification(config))
  cfg = conv.model_config_from_hf(config.to_dict())

  class Head(nn.Module):
    pooled: bool

    @nn.compact
    def __call__(self, ids, mask):
      hidden = stack.Encoder(cfg, mb.FAMILY, name="encoder")(ids, mask)["last_hidden_state"]
      return _HeadScope(cfg, self.pooled, name="head")(hidden, mask)

  ids = _ids(np.random.default_rng(3), (2, T))
  mask = (np.arange(T)[None] < np.array([[T], [13]])).astype(np.int32)
  ids = np.where(mask > 0, ids, 0)
  for hf_model, task, pooled in ((seq, "classification", True), (tag, "tagging", False)):
    params = conv.params_from_hf(_state(hf_model), cfg, task)
    ours = np.asarray(jax.jit(Head(pooled).apply)({"params": params}, ids, mask))
    with torch.no_grad():
      ref = hf_model(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask)).logits.numpy()
    real = mask.astype(bool) if not pooled else slice(None)
    diff = np.abs(ours - ref)[real].max()
    print(f"{task} pooling={pooling}: max |dlogits|={diff:.2e}")
    assert diff < ATOL


class _HeadScope(nn.Module):
  """A task head as the lead's task modules will build it: task_features, then the
  task's classifier ('classifier' for sequence classification, 'tagger' per token)."""

  config: mb.ModernBertConfig
  pooled: bool

  @nn.compact
  def __call__(self, hidden, mask):
    x = mb.task_features(self.config, {"last_hidden_state": hidden, "attention_mask": mask},
                         True, self.pooled)
    return mb.classifier(self.config, 3, "classifier" if self.pooled else "tagger")(x)


@pytest.mark.slow
def test_gradients_are_finite_and_scan_agrees(hf_mlm):
  """Gradients through the attention function (padding + packing + window, the scanned
  `lax.cond` path included) are finite and equal unscanned ones, rematerialised or
  not; dropout runs."""
  _, cfg, params = hf_mlm
  ids = _ids(np.random.default_rng(4), (2, T))
  seg = np.repeat([[1] * 14 + [2] * 6 + [0] * 4], 2, axis=0).astype(np.int32)
  mask = (seg > 0).astype(np.int32)

  def grads(scan, dropout=0.0, rng=None, remat="none"):
    c = mb.ModernBertConfig.from_config({**cfg.to_dict(), "scan_layers": scan, "remat_policy": remat,
                               "attention_dropout": dropout, "mlp_dropout": dropout,
                               "embedding_dropout": dropout, "dtype": jnp.float32,
                               "param_dtype": jnp.float32})
    model = mb.FAMILY.pretraining(c)

    def loss(p):
      out = model.apply({"params": p}, ids, mask, segment_ids=seg,
                        deterministic=rng is None,
                        rngs=None if rng is None else {"dropout": rng})
      return jnp.sum(jax.nn.log_softmax(out["mlm_logits"])[..., 5] * mask)

    return jax.jit(jax.grad(loss))(jax.tree.map(jnp.asarray,
                                                mb.FAMILY.to_layout(params, scan)))

  plain = grads(False)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(plain))
  scanned = mb.FAMILY.to_layout(grads(True, remat="full"), False)
  diff = max(jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()),
                                          plain, scanned)))
  assert diff < 1e-5
  dropped = grads(True, 0.1, jax.random.key(0))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(dropped))


def test_window_and_config_errors_are_one_line():
  cfg = mb.ModernBertConfig(vocab_size=64, hidden_size=32, num_layers=4, num_heads=4,
                            intermediate_size=48, pad_token_id=0, local_attention=128)
  mb.check_window(cfg, 128)
  with pytest.raises(ConfigError, match="local_attention=128 exceeds") as e:
    mb.check_window(cfg, 64)
  assert "\n" not in str(e.value)
  for bad in (dict(local_attention=7), dict(local_attention=0), dict(num_heads=3),
              dict(classifier_pooling="max"), dict(hidden_activation="swish")):
    with pytest.raises(ConfigError):
      mb.ModernBertConfig(**{**dict(vocab_size=64, hidden_size=32, num_heads=4,
                                    pad_token_id=0), **bad})
  with pytest.raises(ConfigError, match="family"):
    mb.ModernBertConfig.from_config({"family": "bert"})
  model = mb.FAMILY.pretraining(cfg)
  params = jax.eval_shape(model.init_params, jax.random.key(0))
  # No part of a ModernBERT model reads SpanBERT's span inputs: they never reach it.
  assert not [k for k in model.inputs if k.startswith("span_")]
  with pytest.raises(TypeError, match="span_left_positions"):
    jax.eval_shape(lambda p: model.apply({"params": p}, jnp.ones((1, 8), jnp.int32),
                                         span_left_positions=jnp.zeros((1, 2), jnp.int32)),
                   params)


# ---- Full-size parameter counts ---------------------------------------------------

SIZES = {  # Hugging Face's config.json sizes (the rest at ModernBertConfig's defaults).
    "base": dict(num_hidden_layers=22, hidden_size=768, intermediate_size=1152,
                 num_attention_heads=12),
    "large": dict(num_hidden_layers=28, hidden_size=1024, intermediate_size=2624,
                  num_attention_heads=16),
    # Every bias on: each carries one logical axis name per dimension too.
    "base_biases": dict(num_hidden_layers=22, hidden_size=768, intermediate_size=1152,
                        num_attention_heads=12, attention_bias=True, mlp_bias=True,
                        norm_bias=True, classifier_bias=True),
}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("scan", [False, True], ids=["unscanned", "scanned"])
def test_full_size_parameter_counts_equal_hf(size, scan):
  hf_config = transformers.ModernBertConfig(**SIZES[size])
  cfg = conv.model_config_from_hf(hf_config.to_dict(), scan_layers=scan)
  boxed = jax.eval_shape(mb.FAMILY.pretraining(cfg).init_params, jax.random.key(0))
  for leaf in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
    assert isinstance(leaf, nn.Partitioned) and len(leaf.names) == leaf.value.ndim
  params = nn.unbox(boxed)
  count = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  with torch.device("meta"):
    hf_model = transformers.ModernBertForMaskedLM(hf_config)
  hf_count = lambda m: sum(p.numel() for p in m.parameters())  # tied decoder once
  print(f"{size}: encoder ours {count(params['encoder']):,} HF "
        f"{hf_count(hf_model.model):,}; with MLM head ours {count(params):,} "
        f"HF {hf_count(hf_model):,}")
  assert count(params["encoder"]) == hf_count(hf_model.model)
  assert count(params) == hf_count(hf_model)


@pytest.mark.slow
def test_sharded_forward_and_gradient_match_one_device(hf_mlm):
  """On a (data 2, fsdp 2, tensor 2) mesh with BERT's logical-axis rules (parameters
  sharded by their axis names, activations constrained), the scanned model's loss and
  gradients equal one device's."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bertjax.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from configs import bert_base  # pylint: disable=g-import-not-at-top

  _, cfg, params = hf_mlm
  cfg = mb.ModernBertConfig.from_config({**cfg.to_dict(), "scan_layers": True, "dtype": jnp.float32,
                               "param_dtype": jnp.float32})
  model = mb.FAMILY.pretraining(cfg)
  params = jax.tree.map(jnp.asarray, mb.FAMILY.to_layout(params, True))
  ids = _ids(np.random.default_rng(5), (4, T))
  seg = np.repeat([[1] * 14 + [2] * 6 + [0] * 4], 4, axis=0).astype(np.int32)
  mask = (seg > 0).astype(np.int32)

  def loss(p, ids, mask, seg):
    logits = model.apply({"params": p}, ids, mask, segment_ids=seg)["mlm_logits"]
    return jnp.sum(jax.nn.log_softmax(logits)[..., 5] * mask)

  ref = jax.jit(jax.value_and_grad(loss))(params, ids, mask, seg)
  mesh = mesh_lib.create_mesh(ml_collections.ConfigDict(dict(
      data=2, fsdp=2, tensor=2, dcn_data=1, dcn_fsdp=1, dcn_tensor=1)))
  rules = bert_base.LOGICAL_AXIS_RULES
  boxed = jax.eval_shape(model.init_params, jax.random.key(0))
  shardings = mesh_lib.logical_shardings(boxed, mesh, rules)
  assert any(s.spec != jax.sharding.PartitionSpec() for s in jax.tree.leaves(shardings))
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    sharded = jax.jit(jax.value_and_grad(loss))(jax.device_put(params, shardings), ids,
                                                 mask, seg)
  np.testing.assert_allclose(sharded[0], ref[0], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(sharded[1]), jax.tree.leaves(ref[1])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_initialisation_follows_hf():
  """Truncated normals cut at 2 std: 0.02 for embeddings, Wqkv, Wi; 0.02 / sqrt(2L) for
  both Wo and the heads' dense; norms at 1. Each weight's spread and range match a
  freshly initialised Hugging Face model's (biases zero when present)."""
  sizes = dict(vocab_size=512, hidden_size=64, intermediate_size=128,
               num_hidden_layers=4, num_attention_heads=4, pad_token_id=0)
  torch.manual_seed(0)
  hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**sizes))
  cfg = conv.model_config_from_hf(hf.config.to_dict())
  ours = conv.params_to_hf(nn.unbox(jax.jit(mb.FAMILY.pretraining(cfg).init_params)(
      jax.random.key(0))), cfg)
  for key, theirs in _state(hf).items():
    a, b = np.asarray(ours[key]), theirs
    if np.all(b == 1) or np.all(b == 0):
      np.testing.assert_array_equal(a, b, err_msg=key)
    else:
      assert abs(a.std() / b.std() - 1) < 0.05, key
      assert abs(np.abs(a).max() / np.abs(b).max() - 1) < 0.05, key
