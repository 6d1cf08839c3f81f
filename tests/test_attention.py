"""The attention paths (bertjax/model/attention.py) against the XLA reference: padded
rows (one nearly empty), packed rows (three documents and padding), a sliding window,
and both; outputs at real positions and gradients of q, k and v. On the CPU the Pallas
kernels run in Pallas's interpreter (float32, within 1e-5); cuDNN runs only on a GPU
(bf16 and fp16, `BERTJAX_TEST_PLATFORM=gpu`). The choice of path (`resolve_impl`) and
the platform's default dtype are checked here too."""

from __future__ import annotations

import functools
import importlib.util
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.errors import ConfigError
from bertjax.model import attention as attn
from bertjax.model.bert import ModelConfig
from bertjax.model.config import default_dtype, dtype_of

B, T, N, D = 2, 384, 2, 16
WINDOW = 40  # Tiles of 128 (forward) and 32 (backward): key tiles are skipped.
CASES = {"padded": (False, None), "packed": (True, None), "window": (False, WINDOW),
         "packed_window": (True, WINDOW)}
on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu",
                            reason="cuDNN runs on a GPU (BERTJAX_TEST_PLATFORM=gpu)")


def _inputs(case: str, dtype=jnp.float32):
  """q, k, v [B, T, N, D], padding [B, T] (right-padded; row 1 holds 7 tokens),
  segments [B, T] (three documents a row) or None, window, loss weights [B, T, N, D]."""
  packed, window = CASES[case]
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v, w = (jax.random.normal(key, (B, T, N, D), jnp.float32) for key in keys)
  lengths = jnp.array([T - 50, 7] if not packed else [T - 50, 300])
  pos = jnp.arange(T)[None]
  padding = (pos < lengths[:, None]).astype(jnp.int32)
  segments = ((pos >= lengths[:, None] // 3).astype(jnp.int32)
              + (pos >= 2 * lengths[:, None] // 3)) if packed else None
  return (*(t.astype(dtype) for t in (q, k, v)), padding, segments, window, w)


def _value_and_grads(impl: str, case: str, dtype=jnp.float32):
  """(out at real positions [B, T, N, D] float32, (dq, dk, dv) float32)."""
  q, k, v, padding, segments, window, w = _inputs(case, dtype)
  real = padding[:, :, None, None] > 0

  def loss(q, k, v):
    out = attn.attention(q, k, v, padding, segments, window=window, impl=impl)
    out = jnp.where(real, out.astype(jnp.float32), 0.0)
    return jnp.sum(out * w), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
      q, k, v)
  return out, tuple(g.astype(jnp.float32) for g in grads)


@functools.cache
def _reference(case: str):
  return _value_and_grads("xla", case)


@pytest.mark.slow
@pytest.mark.parametrize("impl,case", [("pallas_gpu", c) for c in CASES]
                         + [("splash", c) for c in CASES] + [("cudnn", "packed_window")])
def test_kernel_equals_xla_forward_and_gradients(impl, case):
  """Pallas GPU flash kernel and splash (interpret mode off their platform), and the
  'cudnn' path's packed / windowed rows (the Pallas GPU kernel), float32."""
  out, grads = _value_and_grads(impl, case)
  ref_out, ref_grads = _reference(case)
  np.testing.assert_allclose(out, ref_out, atol=1e-5)
  for g, r in zip(grads, ref_grads):
    np.testing.assert_allclose(g, r, atol=1e-5)


def test_reference_mask_is_the_definition():
  """xla_mask[b, 0, i, j] iff padding[b, j], same segment, |i - j| <= w: every pair."""
  rng = np.random.default_rng(0)
  padding = (rng.random((2, 12)) < 0.8).astype(np.int32)
  segments = np.sort(rng.integers(0, 3, (2, 12)), axis=1)
  for seg, window in ((None, None), (segments, None), (None, 2), (segments, 3)):
    mask = np.broadcast_to(attn.xla_mask(jnp.asarray(padding), seg, window), (2, 1, 12, 12))
    for b, i, j in np.ndindex(2, 12, 12):
      want = (padding[b, j] > 0 and (seg is None or seg[b, i] == seg[b, j])
              and (window is None or abs(i - j) <= window))
      assert mask[b, 0, i, j] == want, (b, i, j, window)


def test_packing_and_window_change_the_result():
  """The cases differ from plain attention: documents and windows really isolate."""
  plain, _ = _reference("padded")
  for case in ("packed", "window"):
    assert not np.allclose(_reference(case)[0], plain, atol=1e-3), case


def test_pallas_gpu_path_lowers_to_triton_without_a_t_by_t_array():
  """Compiled for CUDA (lowered here, no GPU): the forward and backward are two Triton
  kernels, and no [.., T, T] array appears ('cudnn' on packed rows takes this path)."""
  x = jax.ShapeDtypeStruct((B, T, N, 64), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((B, T), jnp.int32)
  for impl in ("pallas_gpu", "cudnn"):
    def loss(q, k, v, segments):
      out = attn.attention(q, k, v, jnp.ones((B, T), jnp.int32), segments, window=WINDOW,
                           impl=impl)
      return jnp.sum(out.astype(jnp.float32))
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(x, x, x, ids).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 2, impl
    assert not re.search(rf"\b{T}x{T}x", text), impl


def test_attention_dropout_only_on_xla():
  q, k, v, padding, *_ = _inputs("padded")
  out = attn.attention(q, k, v, padding, impl="xla", dropout_rate=0.5,
                       dropout_rng=jax.random.key(1))
  same = attn.attention(q, k, v, padding, impl="xla")
  assert np.all(np.isfinite(out)) and not np.allclose(out, same)
  for impl in ("cudnn", "pallas_gpu", "splash"):
    with pytest.raises(ConfigError, match="attention_dropout_rate=0.0"):
      attn.attention(q, k, v, padding, impl=impl, dropout_rate=0.1,
                     dropout_rng=jax.random.key(1))


def _biased_by_hand(q, k, v, padding, segments, window, bias, scale=None):
  """softmax(Q K^T * scale + bias) V in float64 (scale None: 1/sqrt(D)), query i seeing
  key j iff j is real, of i's document and within the window: [B, T, N, D]."""
  q, k, v, bias = (np.asarray(t, np.float64) for t in (q, k, v, bias))
  T = q.shape[1]
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  scores = np.einsum("bind,bjnd->bnij", q, k) * scale + bias
  i, j = np.arange(T)[:, None], np.arange(T)[None, :]
  seen = np.asarray(padding, bool)[:, None, None, :] & (np.abs(i - j) <= window)
  if segments is not None:
    seg = np.asarray(segments)
    seen = seen & (seg[:, None, :, None] == seg[:, None, None, :])
  scores = np.where(seen, scores, -np.inf)
  with np.errstate(invalid="ignore"):  # padding queries that see no key: NaN, unread
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bnij,bjnd->bind", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("case", list(CASES))
def test_float32_xla_path_is_jax_dot_product_attention(case):
  """The float32 XLA path (`_xla_float32`, written out for XLA:CPU's speed) computes what
  `jax.nn.dot_product_attention(implementation='xla')` does: outputs at real queries
  and the gradients of q, k, v, with a score bias and a scale, on every row layout."""
  q, k, v, padding, segments, window, w = _inputs(case)
  bias = jax.random.normal(jax.random.key(5), (1, N, T, T))
  mask = attn.xla_mask(padding, segments, window)
  real = padding[:, :, None, None] > 0

  def loss(fn):
    def f(q, k, v):
      out = jnp.where(real, fn(q, k, v), 0.0)
      return jnp.sum(out * w), out
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))(q, k, v)

  (_, ours), our_grads = loss(lambda q, k, v: attn.attention(
      q, k, v, padding, segments, window=window, bias=bias, scale=0.3, impl="xla"))
  (_, jaxs), jax_grads = loss(lambda q, k, v: jax.nn.dot_product_attention(
      q, k, v, bias=bias, mask=mask, scale=0.3, implementation="xla"))
  np.testing.assert_allclose(ours, jaxs, atol=1e-5)
  for a, b in zip(our_grads, jax_grads):
    np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("bias_batch,bias_heads", [(2, 2), (1, 2), (2, 1)])
def test_score_bias_is_added_to_the_scaled_scores(bias_batch, bias_heads):
  """attention(..., bias) is softmax(Q K^T / sqrt(D) + bias) V written out by hand, on
  padded rows of three documents within a window, for a bias [B or 1, N or 1, T, T];
  the dropout path (at a vanishing rate) adds the same bias."""
  b, t, n, d = 2, 24, 2, 8
  keys = jax.random.split(jax.random.key(3), 4)
  q, k, v = (jax.random.normal(key, (b, t, n, d)) for key in keys[:3])
  bias = 3.0 * jax.random.normal(keys[3], (bias_batch, bias_heads, t, t))
  padding = (jnp.arange(t)[None] < jnp.array([[t], [17]])).astype(jnp.int32)
  segments = jnp.broadcast_to(jnp.arange(t) // 8, (b, t))
  want = _biased_by_hand(q, k, v, padding, segments, 5, bias)
  real = np.asarray(padding, bool)
  got = attn.attention(q, k, v, padding, segments, window=5, bias=bias, impl="xla")
  np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=1e-5)
  dropped = attn.attention(q, k, v, padding, segments, window=5, bias=bias, impl="xla",
                           dropout_rate=1e-9, dropout_rng=jax.random.key(0))
  np.testing.assert_allclose(np.asarray(dropped)[real], want[real], atol=1e-5)
  plain = attn.attention(q, k, v, padding, segments, window=5, impl="xla")
  assert not np.allclose(np.asarray(plain)[real], want[real], atol=1e-3)  # it matters


@pytest.mark.parametrize("impl", ["xla", "xla_dropout", "pallas_gpu", "splash"])
def test_scale_multiplies_the_scores_on_every_path(impl):
  """attention(..., scale=s) is softmax(s Q K^T) V written out by hand (DeBERTa's
  s = 1/sqrt(3 D)) on every path (the Pallas kernels in their interpreter; the dropout
  path at a vanishing rate), padded rows of three documents; None is 1/sqrt(D)."""
  b, t, n, d = 2, 128, 2, 16
  keys = jax.random.split(jax.random.key(4), 3)
  q, k, v = (2.0 * jax.random.normal(key, (b, t, n, d)) for key in keys)
  padding = (jnp.arange(t)[None] < jnp.array([[t], [90]])).astype(jnp.int32)
  segments = jnp.broadcast_to(jnp.arange(t) // 50, (b, t))
  scale = (3 * d) ** -0.5
  want = _biased_by_hand(q, k, v, padding, segments, t, np.zeros((1, 1, t, t)), scale)
  dropout = dict(dropout_rate=1e-9, dropout_rng=jax.random.key(0)) if (
      impl == "xla_dropout") else {}
  run = lambda s: np.asarray(attn.attention(  # noqa: E731
      q, k, v, padding, segments, scale=s, impl=impl.removesuffix("_dropout"), **dropout))
  real = np.asarray(padding, bool)
  np.testing.assert_allclose(run(scale)[real], want[real], atol=1e-5)
  default = _biased_by_hand(q, k, v, padding, segments, t, np.zeros((1, 1, t, t)))
  np.testing.assert_allclose(run(None)[real], default[real], atol=1e-5)
  assert not np.allclose(want[real], default[real], atol=1e-3)  # it matters


def test_score_bias_goes_to_xla_only(caplog):
  """resolve_impl with a bias: '' picks 'xla' on every platform and says why at start-up;
  a kernel named explicitly is a one-line ConfigError, as is a kernel or a misshapen
  bias handed to `attention`."""
  with caplog.at_level(logging.INFO):
    for platform, dtype in (("gpu", jnp.bfloat16), ("tpu", jnp.bfloat16),
                            ("cpu", jnp.float32)):
      assert attn.resolve_impl("", platform=platform, dtype=dtype, dropout=False,
                               seq_len=512, bias=True) == "xla"
      assert attn.resolve_impl("xla", platform=platform, dtype=dtype, dropout=False,
                               seq_len=512, bias=True) == "xla"
  lines = [r.getMessage() for r in caplog.records if "score bias" in r.getMessage()]
  assert len(lines) == 3 and all("-> 'xla'" in line for line in lines), lines
  for impl, platform in (("cudnn", "gpu"), ("pallas_gpu", "gpu"), ("splash", "tpu")):
    with pytest.raises(ConfigError) as e:
      attn.resolve_impl(impl, platform=platform, dtype=jnp.bfloat16, dropout=False,
                        seq_len=512, bias=True)
    assert "\n" not in str(e.value) and "takes no attention score bias" in str(e.value)
  q = jnp.ones((1, 8, 2, 4))
  padding = jnp.ones((1, 8), jnp.int32)
  with pytest.raises(ConfigError, match="'splash' takes no attention score bias"):
    attn.attention(q, q, q, padding, bias=jnp.zeros((1, 1, 8, 8)), impl="splash")
  with pytest.raises(ConfigError, match=r"bias of shape \(1, 3, 8, 8\)"):
    attn.attention(q, q, q, padding, bias=jnp.zeros((1, 3, 8, 8)))


@pytest.mark.parametrize("platform,dtype,dropout,seq_len,want", [
    ("gpu", jnp.bfloat16, False, 512, "cudnn"),
    ("gpu", jnp.float16, False, 100, "cudnn"),
    ("gpu", jnp.float32, False, 512, "xla"),
    ("gpu", jnp.bfloat16, True, 512, "xla"),
    ("tpu", jnp.bfloat16, False, 512, "splash"),
    ("tpu", jnp.float32, False, 512, "splash"),
    ("tpu", jnp.bfloat16, False, 100, "xla"),
    ("tpu", jnp.bfloat16, True, 512, "xla"),
    ("cpu", jnp.float32, False, 512, "xla"),
])
def test_resolve_impl_picks_the_fastest_allowed_path(platform, dtype, dropout, seq_len,
                                                      want):
  assert attn.resolve_impl("", platform=platform, dtype=dtype, dropout=dropout,
                           seq_len=seq_len) == want
  assert attn.resolve_impl(want, platform=platform, dtype=dtype, dropout=dropout,
                           seq_len=seq_len) == want


@pytest.mark.parametrize("requested,platform,dtype,dropout,seq_len,words", [
    ("cudnn", "gpu", jnp.float32, False, 512, ["'cudnn' needs", "bfloat16", "float32"]),
    ("cudnn", "cpu", jnp.bfloat16, False, 512, ["'cudnn' runs on GPUs", "on cpu"]),
    ("cudnn", "gpu", jnp.bfloat16, True, 512, ["no attention dropout",
                                               "attention_dropout_rate=0.0"]),
    ("splash", "tpu", jnp.bfloat16, True, 512, ["no attention dropout"]),
    ("pallas_gpu", "gpu", jnp.bfloat16, True, 512, ["no attention dropout"]),
    ("splash", "tpu", jnp.bfloat16, False, 96, ["divisible by 128", "got 96"]),
    ("splash", "gpu", jnp.bfloat16, False, 512, ["'splash' runs on TPUs"]),
    ("flash", "gpu", jnp.bfloat16, False, 512, ["'flash'", "'pallas_gpu'"]),
])
def test_resolve_impl_refuses_impossible_requests_in_one_line(requested, platform, dtype,
                                                              dropout, seq_len, words):
  with pytest.raises(ConfigError) as e:
    attn.resolve_impl(requested, platform=platform, dtype=dtype, dropout=dropout,
                      seq_len=seq_len)
  message = str(e.value)
  assert "\n" not in message and message.startswith("config.model.attention_impl=")
  for word in words:
    assert word in message, (word, message)


def test_resolve_impl_logs_each_choice_once(caplog):
  with caplog.at_level(logging.INFO):
    for dtype in (jnp.bfloat16, "bfloat16", np.dtype(jnp.bfloat16)):  # The same dtype.
      attn.resolve_impl("", platform="gpu", dtype=dtype, dropout=False, seq_len=1234)
  lines = [r.getMessage() for r in caplog.records if "attention_impl" in r.getMessage()]
  assert lines == ["attention: config.model.attention_impl='' -> 'cudnn' (GPU, bfloat16)"]


def test_dtype_default_is_bf16_on_accelerators_and_fp32_on_the_cpu():
  assert default_dtype("gpu") == default_dtype("tpu") == jnp.bfloat16
  assert default_dtype("cpu") == jnp.float32
  assert dtype_of("") == default_dtype(jax.default_backend())
  assert dtype_of("float32") == jnp.float32  # Explicit float32 wins on any platform.
  cfg = ModelConfig.from_config({"dtype": "", "param_dtype": "float32"})
  assert cfg.dtype == default_dtype(jax.default_backend()) and cfg.param_dtype == jnp.float32
  with pytest.raises(ConfigError, match=r"config.model.param_dtype='': use one of"):
    ModelConfig.from_config({"param_dtype": ""})


@on_gpu
@pytest.mark.parametrize("dtype,tolerance", [(jnp.bfloat16, 3e-2), (jnp.float16, 1e-2)])
@pytest.mark.parametrize("case", list(CASES))
def test_cudnn_equals_xla_forward_and_gradients(case, dtype, tolerance):
  """'cudnn' in bf16 / fp16 (cuDNN for padded rows, the Pallas kernel for packed and
  windowed ones) against the float32 XLA reference: outputs and gradients within
  `tolerance` of the reference's largest magnitude; XLA in the same dtype is as close."""
  out, grads = _value_and_grads("cudnn", case, dtype)
  ref_out, ref_grads = _reference(case)
  same_dtype = _value_and_grads("xla", case, dtype)
  for got, ref, xla in zip((out, *grads), (ref_out, *ref_grads),
                           (same_dtype[0], *same_dtype[1])):
    scale = float(jnp.max(jnp.abs(ref)))
    np.testing.assert_allclose(got, ref, atol=tolerance * scale)
    np.testing.assert_allclose(xla, ref, atol=tolerance * scale)


@on_gpu
@pytest.mark.parametrize("case", list(CASES))
def test_gpu_paths_compile_without_a_t_by_t_buffer(case):
  """The compiled GPU step of 'cudnn' holds no [.., T, T] buffer (the XLA path does)."""
  q, k, v, padding, segments, window, _ = _inputs(case, jnp.bfloat16)

  def text(impl):
    def loss(q, k, v):
      return jnp.sum(attn.attention(q, k, v, padding, segments, window=window,
                                    impl=impl).astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile().as_text()

  assert re.search(rf"\b{T},{T}\]", text("xla"))
  assert not re.search(rf"\b{T},{T}\]", text("cudnn"))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="the TPU compiler (libtpu: the test extra, Linux x86)")
def test_splash_with_window_and_segments_compiles_for_tpu():
  """The windowed splash kernel with segment ids, forward and backward, compiled by the
  TPU compiler for a v5e chip (no TPU here): Pallas kernels, no [T, T] buffer."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  device = topologies.get_topology_desc("v5e:2x2", platform="tpu").devices[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  x = jax.ShapeDtypeStruct((B, T, N, 128), jnp.bfloat16, sharding=sharding)
  ids = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=sharding)

  def loss(q, k, v, segments):
    out = attn.attention(q, k, v, jnp.ones((B, T), jnp.int32), segments, window=WINDOW,
                         impl="splash")
    return jnp.sum(out.astype(jnp.float32))

  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, ids)
  cache = jax.config.jax_enable_compilation_cache  # Compile-only devices: no cache.
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    text = lowered.compile().as_text()
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)
  assert text.count("tpu_custom_call") >= 3  # forward, dq, dkv
  assert not re.search(rf"\b{T},{T}\]", text)


@pytest.mark.skipif(jax.device_count() < 4, reason="a 2 x 2 mesh needs 4 devices")
def test_kernels_run_per_shard_under_a_mesh():
  """Batch over 'data', heads over 'tensor' (the logical rules): each device runs the
  kernel on its [1, T, 1, D] shard; the result equals the unsharded one."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  q, k, v, padding, segments, window, _ = _inputs("packed_window")
  mesh = jax.make_mesh((2, 2), ("data", "tensor"), devices=jax.devices()[:4],
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  rules = ((attn.BATCH, "data"), (attn.HEADS, "tensor"))
  for impl in ("pallas_gpu", "splash"):
    want = attn.attention(q, k, v, padding, segments, window=window, impl=impl)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      spread = [jax.device_put(t, NamedSharding(mesh, P("data", None, "tensor")))
                for t in (q, k, v)]
      got = jax.jit(lambda q, k, v: attn.attention(
          q, k, v, padding, segments, window=window, impl=impl))(*spread)
    np.testing.assert_allclose(got, want, atol=1e-6)
