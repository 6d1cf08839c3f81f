"""Model shapes, full-size parameter counts (eval_shape: no memory), logical axes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.errors import ConfigError
from bertjax.model import ModelConfig, bert, layers, stack
from bertjax.train import state as state_lib
from configs import bert_base, bert_large, roberta_base, xlmr_base, xlmr_large

# The Hugging Face model each recipe's encoder corresponds to: its name, its exact
# parameter count (encoder + pooler: `BertModel` / `RobertaModel` / `XLMRobertaModel`)
# and the sizes of its config.json (the rest at the transformers config's defaults).
LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
             intermediate_size=4096)
ROBERTA = dict(max_position_embeddings=514, type_vocab_size=1)
HF_MODELS = {
    bert_base: ("bert-base-uncased", 109_482_240, "BertConfig", {}),
    bert_large: ("bert-large-uncased", 335_141_888, "BertConfig", LARGE),
    roberta_base: ("roberta-base", 124_645_632, "RobertaConfig",
                   dict(vocab_size=50265, **ROBERTA)),
    xlmr_base: ("xlm-roberta-base", 278_043_648, "XLMRobertaConfig",
                dict(vocab_size=250002, **ROBERTA)),
    xlmr_large: ("xlm-roberta-large", 559_890_432, "XLMRobertaConfig",
                 dict(vocab_size=250002, **ROBERTA, **LARGE)),
}
_ids = lambda m: m.__name__.split(".")[-1]


def _our_count(module) -> int:
  config = module.get_config()
  config.model.pooler = True  # Count as Hugging Face's *Model classes do.
  abstract, boxed = state_lib.abstract_state(config)
  # Every parameter carries logical axis names, one per dimension.
  for leaf in jax.tree.leaves(boxed.params, is_leaf=lambda x: isinstance(x, nn.Partitioned)):
    assert isinstance(leaf, nn.Partitioned) and len(leaf.names) == leaf.value.ndim
  return state_lib.param_count(abstract.params["encoder"])


@pytest.mark.parametrize("module", list(HF_MODELS), ids=_ids)
def test_full_size_parameter_counts_are_exact(module):
  name, count, _, _ = HF_MODELS[module]
  assert _our_count(module) == count, name


@pytest.mark.parametrize("module", list(HF_MODELS), ids=_ids)
def test_hugging_face_counts_from_configs(module):
  """The counts above are what transformers builds from those configs (on the meta
  device: shapes, no memory)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  name, count, config_class, sizes = HF_MODELS[module]
  with torch.device("meta"):
    model = transformers.AutoModel.from_config(getattr(transformers, config_class)(**sizes))
  assert sum(p.numel() for p in model.parameters()) == count, name


def _tiny(**kw):
  return ModelConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                     intermediate_size=32, max_position_embeddings=24, **kw)


@pytest.mark.slow
def test_shapes_and_masked_positions_gather():
  cfg = _tiny()
  model = bert.FAMILY.pretraining(cfg)
  ids = jnp.array(np.random.default_rng(0).integers(1, 50, (3, 10)), jnp.int32)
  pos = jnp.array([[1, 2], [3, 4], [0, 9]], jnp.int32)
  params = nn.unbox(model.init(jax.random.key(0), ids, masked_lm_positions=pos))["params"]
  out = model.apply({"params": params}, ids, masked_lm_positions=pos)
  full = model.apply({"params": params}, ids)
  assert out["mlm_logits"].shape == (3, 2, 50) and out["nsp_logits"].shape == (3, 2)
  np.testing.assert_allclose(out["mlm_logits"],
                             np.take_along_axis(full["mlm_logits"], pos[..., None], 1),
                             rtol=1e-5, atol=1e-5)
  enc = model.apply({"params": params}, ids, method=model.encode)
  assert enc["hidden_states"].shape == (3, 3, 10, 16)


@pytest.mark.slow
def test_padding_does_not_change_real_tokens():
  """A padded row's real positions equal the unpadded row's (the mask works)."""
  cfg = _tiny()
  model = bert.FAMILY.pretraining(cfg)
  ids = jnp.array([[2, 7, 8, 9, 3]], jnp.int32)
  padded = jnp.pad(ids, ((0, 0), (0, 4)))
  params = nn.unbox(model.init(jax.random.key(1), ids))["params"]
  short = model.apply({"params": params}, ids, method=model.encode)["last_hidden_state"]
  long = model.apply({"params": params}, padded, jnp.pad(jnp.ones_like(ids), ((0, 0), (0, 4))),
                     method=model.encode)["last_hidden_state"]
  np.testing.assert_allclose(short, long[:, :5], rtol=1e-5, atol=1e-5)


def test_pretraining_heads_by_name_each_reading_its_own_inputs():
  """The pretraining model carries the heads it is built with, each under its name
  (drawn as in the model with every head) giving '<name>_logits'; a head reads only
  its inputs (SBO's span positions: a model without SBO declares none, and an input
  no part reads is refused); an SBO model given no span inputs skips that head."""
  cfg = _tiny(sbo=True)
  every = bert.FAMILY.pretraining(cfg)
  assert every.heads == ("mlm", "nsp", "sbo")
  chosen = bert.FAMILY.pretraining(cfg, heads=("mlm", "sbo"))
  params = nn.unbox(jax.jit(chosen.init_params)(jax.random.key(0)))
  assert set(params) == {"encoder", "mlm", "sbo"}
  jax.tree.map(np.testing.assert_array_equal, params,
               {k: v for k, v in nn.unbox(jax.jit(every.init_params)(jax.random.key(0)))
                .items() if k != "nsp"})
  ids = jnp.ones((2, 8), jnp.int32)
  span = {k: jnp.array([[0, 2], [1, 3]], jnp.int32) for k in chosen.inputs if "span" in k}
  assert len(span) == 3
  apply = jax.jit(chosen.apply)  # One program each, not every op dispatched alone.
  out = apply({"params": params}, ids, masked_lm_positions=span["span_left_positions"],
              **span)
  assert set(out) == {"mlm_logits", "sbo_logits"} and out["sbo_logits"].shape == (2, 2, 50)
  assert set(apply({"params": params}, ids)) == {"mlm_logits"}
  mlm_only = bert.FAMILY.pretraining(cfg, heads=("mlm",))
  assert not [k for k in mlm_only.inputs if "span" in k]
  with pytest.raises(TypeError, match="span_left_positions"):
    mlm_only.apply({"params": params}, ids, **span)
  with pytest.raises(ConfigError, match="no 'rtd' pretraining head"):
    bert.FAMILY.pretraining(cfg, heads=("mlm", "rtd")).init_params(jax.random.key(0))


def test_trunk_depth_orders_the_encoder_bottom_up():
  """What fine-tuning freezes reads: embedding 0, block i at i + 1, the final norm with
  the top block, the pooler and the heads outside the trunk."""
  depth = lambda *path: stack.trunk_depth(path, 4)  # noqa: E731
  assert depth("encoder", "embeddings", "LayerNorm", "scale") == 0
  assert depth("encoder", "layer_0", "attention") == 1
  assert depth("encoder", "layer_3", "output", "kernel") == 4
  assert depth("encoder", "final_norm", "scale") == 4
  assert depth("encoder", "pooler", "kernel") is None
  assert depth("head", "classifier", "kernel") is None and depth("mlm", "bias") is None


def test_roberta_positions_start_past_padding():
  from bertjax.model.bert import position_ids_for
  cfg = _tiny(type_vocab_size=1, pad_token_id=1, position_offset=2)
  pos = position_ids_for(cfg, jnp.array([[0, 5, 6, 2, 1, 1]]))
  np.testing.assert_array_equal(pos, [[2, 3, 4, 5, 1, 1]])


def test_bad_model_config_names_the_field():
  with pytest.raises(ValueError, match="hidden_size=30 is not divisible by .*num_heads=4"):
    ModelConfig(hidden_size=30, num_heads=4)
  with pytest.raises(ConfigError, match="initializer_cutoff_factor=-1 must be >= 0"):
    ModelConfig(initializer_cutoff_factor=-1)


@pytest.mark.parametrize("cutoff,std", [(2.0, 0.02 * 0.8796), (0.0, 0.02)])
def test_initial_weights_follow_the_cutoff(cutoff, std):
  """Kernels and tables are drawn at `initializer_range` scale, cut at +-cutoff scales
  (google-research/bert's truncated normal: std 0.88 x 0.02) or not at all (0:
  transformers' normal); LayerNorm scales are 1, biases 0."""
  config = ModelConfig(vocab_size=512, hidden_size=64, num_layers=1, num_heads=2,
                       intermediate_size=128, initializer_cutoff_factor=cutoff)
  params = nn.unbox(jax.jit(bert.FAMILY.pretraining(config).init)(
      jax.random.key(0), jnp.ones((1, 8), jnp.int32)))["params"]
  kernels = np.concatenate([np.ravel(x) for path, x in jax.tree_util.tree_leaves_with_path(params)
                            if path[-1].key in ("kernel", "embedding")])
  assert kernels.size > 50_000
  np.testing.assert_allclose(kernels.std(), std, rtol=0.02)
  assert (np.abs(kernels).max() <= 0.04 + 1e-7) == (cutoff == 2.0)


def _scatter_rows(fn, *args) -> list[int]:
  """The rows of every table `fn(*args)` scatter-adds into (nested jaxprs included)."""
  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "scatter-add":
        yield eqn.invars[0].aval.shape[0]
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
            yield from walk(getattr(sub, "jaxpr", sub))
  return sorted(walk(jax.make_jaxpr(fn)(*args).jaxpr))


@pytest.mark.parametrize("rows", [2, layers.ONE_HOT_ROWS, layers.ONE_HOT_ROWS + 1])
def test_small_tables_are_read_by_a_one_hot_matmul_exactly(rows):
  """A table of at most ONE_HOT_ROWS rows reads by a one-hot matmul, so its gradient is
  a matmul, not a scatter-add into a few rows (serialized on a GPU): its values equal
  the gather's; its gradients the float32 gather's, to float32's rounding or
  (bf16) one bf16 rounding of the float32 sum (a bf16 scatter-add rounds every add)."""
  ids = jnp.array(np.random.default_rng(0).integers(0, rows, (4, 33)), jnp.int32)
  dy = jnp.array(np.random.default_rng(1).normal(size=(4, 33, 8)), jnp.bfloat16)
  grad = lambda f: lambda e: jax.vjp(f, e)[1](dy.astype(f(e).dtype))[0]
  for dtype in (jnp.float32, jnp.bfloat16):
    table = layers.Embed(rows, 8, dtype=dtype)
    emb = table.init(jax.random.key(0), ids)["params"]["embedding"]
    ours = lambda e: table.apply({"params": {"embedding": e}}, ids)
    np.testing.assert_array_equal(ours(emb), jnp.take(emb.astype(dtype), ids, 0))
    if dtype == jnp.float32 or rows <= layers.ONE_HOT_ROWS:
      np.testing.assert_allclose(grad(ours)(emb), grad(lambda e: jnp.take(e, ids, 0))(emb),
                                 rtol=1e-6 if dtype == jnp.float32 else 2**-8, atol=1e-6)
    assert _scatter_rows(grad(ours), emb) == ([rows] if rows > layers.ONE_HOT_ROWS else [])


def test_bert_gradient_scatters_only_into_large_tables():
  """BERT's backward pass adds into the word and position tables by scatter (many rows:
  few collisions) and into the token-type table by a matmul."""
  cfg = ModelConfig(vocab_size=100, hidden_size=16, num_layers=1, num_heads=2,
                    intermediate_size=32, max_position_embeddings=72, type_vocab_size=2)
  model = bert.FAMILY.pretraining(cfg)
  ids = jnp.ones((2, 12), jnp.int32)
  params = nn.unbox(model.init(jax.random.key(0), ids))["params"]
  loss = lambda p: model.apply({"params": p}, ids)["mlm_logits"].sum()
  assert _scatter_rows(jax.grad(loss), params) == [cfg.max_position_embeddings,
                                                   cfg.vocab_size]
