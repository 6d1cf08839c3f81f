"""The layer kit's parts on their own (bertjax/model/layers.py, rotary.py): grouped-query
attention is query heads sharing key / value heads (Hugging Face's `repeat_kv`) on
every attention path, the layer kind under a scan is the unscanned one's, rotary's
linear scaling divides the positions, RMSNorm is Llama's. The families built on the kit
are proven against transformers in tests/test_family_conformance.py and their own
files."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model import layers, rotary
from bertjax.model.config import FamilyConfig


@dataclasses.dataclass(frozen=True)
class _Config(FamilyConfig):
  family = "kit"
  hidden_size: int = 32
  num_heads: int = 4
  kv_heads: int = 2
  intermediate_size: int = 48
  layer_windows: tuple = (None, 3)

  @property
  def num_kv_heads(self) -> int:
    return self.kv_heads

  @property
  def windows(self):
    return self.layer_windows


def _context(B, T, cfg, lengths=(100, 57)):
  padding = (jnp.arange(T)[None] < jnp.asarray(lengths)[:, None]).astype(jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(T), (B, T))
  tables = rotary.tables(positions, cfg.head_dim, (10_000.0, 500.0), cfg.dtype)
  return padding, None, tables


def _apply(cfg, params, x, context, layer=None):
  return layers.SelfAttention(cfg).apply({"params": params}, x, context, True, layer)


@pytest.fixture(scope="module")
def gqa():
  cfg = _Config()
  x = jax.random.normal(jax.random.key(0), (2, 128, cfg.hidden_size))
  context = _context(2, 128, cfg)
  params = nn.unbox(layers.SelfAttention(cfg).init(jax.random.key(1), x, context,
                                                 True)["params"])
  return cfg, x, context, params


def test_grouped_query_heads_share_their_key_value_head(gqa):
  """K=2 key / value heads for N=4 query heads equal a full model whose head h has
  key / value head h // 2's weights (transformers' repeat_kv order)."""
  cfg, x, context, params = gqa
  full = dataclasses.replace(cfg, kv_heads=cfg.num_heads)
  repeated = {k: ({"kernel": jnp.repeat(v["kernel"], 2, axis=1)}
                  if k in ("k_proj", "v_proj") else v) for k, v in params.items()}
  np.testing.assert_allclose(_apply(cfg, params, x, context),
                             _apply(full, repeated, x, context), atol=1e-6)
  assert params["k_proj"]["kernel"].shape == (32, 2, 8)


@pytest.mark.parametrize("impl", ["pallas_gpu", "splash"])
def test_grouped_query_attention_on_every_path(gqa, impl):
  """The Pallas GPU kernel and TPU splash (interpreted on the CPU) give XLA's output
  for grouped-query heads, global and windowed."""
  cfg, x, context, params = gqa
  for layer in (0, 1):
    want = _apply(cfg, params, x, context, layer)
    got = _apply(dataclasses.replace(cfg, attention_impl=impl), params, x, context, layer)
    real = np.asarray(context[0], bool)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-5)


def test_traced_layer_picks_the_same_kind_as_its_index(gqa):
  """Under `scan_layers` the layer index is traced and the kind chosen by lax.cond:
  each layer's output equals the unscanned block's (global 0, windowed 1), and the
  two kinds differ (the window and the local theta act)."""
  cfg, x, context, params = gqa
  traced = jax.jit(lambda layer: _apply(cfg, params, x, context, layer))
  outs = [_apply(cfg, params, x, context, i) for i in (0, 1)]
  for i in (0, 1):
    np.testing.assert_allclose(traced(jnp.asarray(i)), outs[i], atol=1e-6)
  assert float(jnp.abs(outs[0] - outs[1]).max()) > 1e-3


def test_linear_rotary_scaling_divides_the_positions():
  positions = jnp.arange(12)[None]
  scaled = rotary.table(positions, 16, 10_000.0, jnp.float32, factor=4.0)
  by_hand = rotary.table(positions / 4.0, 16, 10_000.0, jnp.float32)
  for a, b in zip(scaled, by_hand):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_rms_norm_is_llamas():
  cfg = _Config()
  x = jax.random.normal(jax.random.key(2), (3, 32)) * 3
  norm = layers.rms_norm(cfg, "norm", 1e-6)
  params = norm.init(jax.random.key(3), x)
  scale = jax.random.normal(jax.random.key(4), (32,))
  params = {"params": {"scale": nn.Partitioned(scale, ("embed",))}}
  want = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale
  np.testing.assert_allclose(norm.apply(params, x), want, rtol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_gated_mlp_is_act_of_the_first_times_the_second(fused):
  cfg = _Config()
  x = jax.random.normal(jax.random.key(5), (2, 3, 32))
  mlp = layers.GatedMLP(cfg, "silu", names=("Wi", "Wo") if fused else
                        ("gate_proj", "up_proj", "down_proj"), fused=fused)
  params = nn.unbox(mlp.init(jax.random.key(6), x, True)["params"])
  if fused:
    a, b = (jnp.einsum("bte,em->btm", x, params["Wi"]["kernel"][:, i]) for i in (0, 1))
  else:
    a, b = (x @ params[n]["kernel"] for n in ("gate_proj", "up_proj"))
  want = (jax.nn.silu(a) * b) @ params[("Wo" if fused else "down_proj")]["kernel"]
  np.testing.assert_allclose(mlp.apply({"params": params}, x, True), want, atol=1e-5)
