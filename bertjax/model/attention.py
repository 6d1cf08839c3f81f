"""THE attention of every encoder family (`attention`), and the one place its
implementation is chosen (`resolve_impl`).

Semantics, on every path: query i may attend key j iff padding[j] (a real key), the two
are in the same segment (document) of a packed row, and, with a window w, |i - j| <= w
(ModernBERT's local_attention=128 is w=64). Scale 1/sqrt(D) unless given (DeBERTa's
1/sqrt(3 D)), float32 softmax statistics.
An additive score bias (float32, added to the scaled scores before the softmax: a
family's relative-position terms, DeBERTa's c2p + p2c) is taken by the 'xla' path only;
`resolve_impl` picks that path for a model with one.
Outputs at padding queries are defined (finite) but differ between paths: never read
them. The paths (`IMPLS`):

- 'xla': the reference. Builds the boolean mask from padding / segments / window and
  runs `jax.nn.dot_product_attention` (XLA; in float32 the same computation written
  out, `_xla_float32`); with attention dropout, flax's attention
  (float32 softmax; a dropout draw per example, head, query and key, as BERT's and
  Hugging Face's: flax's default broadcasts one [T, T] mask over rows and heads). The
  only path with attention-probability dropout, and with a score bias.
- 'cudnn' (GPU, bfloat16 / float16): right-padded rows go to cuDNN's flash attention
  (`jax.nn.dot_product_attention(implementation='cudnn')` with the key lengths, no mask
  array). What cuDNN cannot express through jax 0.10.2's public API goes to the Pallas
  flash kernel of `bertjax.model.flash_gpu` (segment ids, no [T, T] mask): packed rows
  (the cuDNN packed layout, q/kv offsets, is reachable only through jax's private
  `jax._src.cudnn`, on Hopper and later, with a static segment count per row) and
  sliding windows (cuDNN's window is left-only: jax refuses a right window without a
  causal mask).
- 'pallas_gpu' (GPU): every call through `bertjax.model.flash_gpu` (its float32 dots
  follow `jax_default_matmul_precision`: TF32 by default on a GPU, as XLA's matmuls).
- 'splash' (TPU): the Pallas splash-attention kernel (`jax.experimental.pallas.ops.tpu`)
  with kernel segment ids and, for a window, `splash.LocalMask`; it skips the blocks
  the mask empties and never builds the [B, N, T, T] scores.

Under a mesh the Pallas kernels run per shard (`jax.shard_map`: batch and heads split
as the logical-axis rules say, T whole). Off their platform (on the CPU) they run in
Pallas's interpreter: slow, for the numerics tests. Shapes: B batch, T length,
N heads, D head size.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import PartitionSpec

from bertjax.errors import ConfigError

IMPLS = ("xla", "cudnn", "pallas_gpu", "splash")
BATCH, HEADS = "activation_batch", "activation_heads"  # Logical axes of q, k, v.
SPLASH_BLOCK = 128  # The splash kernel's tile along T (its compute blocks are 128 wide).
_FIELD = "config.model.attention_impl"
_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def target_platform() -> str:
  """The platform the program being traced is for ('cpu', 'gpu', 'tpu'): that of the
  context mesh's devices (every bertjax program runs under its mesh, `jax.set_mesh`;
  `benchmark plan` compiles for a TPU topology's or a GPU target's abstract devices),
  else `jax.default_backend()`."""
  mesh = jax.sharding.get_abstract_mesh()  # Inside jit too (its device's kind only).
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  return jax.default_backend() if device is None else device.platform


def resolve_impl(requested: str | None, *, platform: str, dtype, dropout: bool,
                 seq_len: int | None = None, bias: bool = False) -> str:
  """The attention path to run: `requested` (config.model.attention_impl) checked, or
  for '' the fastest one that `platform` ('cpu', 'gpu', 'tpu': `jax.default_backend()`),
  the compute `dtype`, attention `dropout` (training with attention_dropout_rate > 0),
  the length `seq_len` and an additive score `bias` (a family's relative-position
  terms) allow: with a bias or dropout 'xla'; on a GPU in bfloat16 / float16 'cudnn';
  on a TPU 'splash' (T a multiple of 128); otherwise 'xla'. An impossible request is a
  one-line ConfigError. Each distinct choice is logged once (the first trace, at
  start-up)."""
  platform = "gpu" if platform in ("cuda", "rocm") else platform
  return _resolve(requested or "", platform, jnp.dtype(dtype), bool(dropout), seq_len,
                  bool(bias))


@functools.cache
def _resolve(requested: str, platform: str, dtype: np.dtype, dropout: bool,
             seq_len: int | None, bias: bool) -> str:
  if requested == "":
    if bias:
      impl, why = "xla", ("an attention score bias: only the XLA path takes one (it "
                          "builds the [B, N, T, T] scores)")
    elif dropout:
      impl, why = "xla", "attention dropout: only the XLA path has it"
    elif platform == "gpu" and dtype in _HALF:
      impl, why = "cudnn", f"GPU, {dtype.name}"
    elif platform == "gpu":
      impl, why = "xla", "GPU in float32: the fused kernels want bfloat16 / float16"
    elif platform == "tpu" and (seq_len is None or seq_len % SPLASH_BLOCK == 0):
      impl, why = "splash", "TPU"
    elif platform == "tpu":
      impl, why = "xla", f"TPU with a length {seq_len} not divisible by {SPLASH_BLOCK}"
    else:
      impl, why = "xla", platform
    logging.info("attention: %s='' -> %r (%s)", _FIELD, impl, why)
    return impl
  if requested not in IMPLS:
    raise ConfigError(f"{_FIELD}={requested!r}: use '' (the fastest the platform allows), "
                      "'xla', 'cudnn' (GPU), 'pallas_gpu' (GPU) or 'splash' (TPU).")
  if bias and requested != "xla":
    raise ConfigError(f"{_FIELD}={requested!r} takes no attention score bias (this "
                      f"model's relative-position terms): use {_FIELD}='' or 'xla'.")
  if dropout and requested != "xla":
    raise ConfigError(f"{_FIELD}={requested!r} has no attention dropout; set "
                      f"config.model.attention_dropout_rate=0.0, or {_FIELD}='' (XLA).")
  own = {"cudnn": ("gpu",), "pallas_gpu": ("gpu", "cpu"), "splash": ("tpu", "cpu")}
  if requested in own and platform not in own[requested]:
    raise ConfigError(f"{_FIELD}={requested!r} runs on {own[requested][0].upper()}s, "
                      f"this run is on {platform}: use '' or 'xla'.")
  if requested == "cudnn" and dtype not in _HALF:
    raise ConfigError(f"{_FIELD}='cudnn' needs config.model.dtype bfloat16 or float16, "
                      f"not {dtype.name}: set it (or '', bfloat16 on a GPU), or {_FIELD}="
                      "'xla'.")
  if requested == "splash" and seq_len is not None:
    _check_splash_length(seq_len)
  logging.info("attention: %s=%r", _FIELD, requested)
  return requested


def attention(q: jax.Array, k: jax.Array, v: jax.Array, padding: jax.Array,
              segment_ids: jax.Array | None = None, *, window: int | None = None,
              bias: jax.Array | None = None, scale: float | None = None,
              impl: str = "xla", dropout_rate: float = 0.0,
              dropout_rng: jax.Array | None = None) -> jax.Array:
  """Bidirectional multi-head attention: q, k, v [B, T, N, D]; padding [B, T] (1 real,
  0 pad; right-padded rows for 'cudnn'); segment_ids [B, T] int >= 0 (the documents of
  packed rows) or None; window None (global) or the half-width w >= 0; bias None or
  [B or 1, N or 1, T, T], added in float32 to the scaled scores (Q K^T * scale +
  bias) before the mask and the softmax ('xla' only); scale the scores' factor, a
  Python float (None: 1/sqrt(D)), on every path; impl a resolved name
  (`resolve_impl`). Attention-probability dropout when dropout_rate > 0 and
  dropout_rng is given ('xla' only). Returns [B, T, N, D] in q's dtype."""
  if impl not in IMPLS:
    raise ConfigError(f"attention impl={impl!r}: use one of {IMPLS} (resolve_impl).")
  if window is not None:
    if not (isinstance(window, (int, np.integer)) and window >= 0):
      raise ConfigError(f"attention window={window!r} must be None or an int >= 0 "
                        "(the half-width: local_attention // 2).")
    window = int(window)
  dropout = dropout_rate > 0 and dropout_rng is not None
  _log_path(impl, segment_ids is not None, window is not None, dropout,
            bias is not None)
  if bias is not None:
    _check_bias(bias, q.shape, impl)
    bias = bias.astype(jnp.float32)
  if impl == "xla":
    mask = xla_mask(padding, segment_ids, window)
    if not dropout:
      if q.dtype == jnp.float32:
        return _xla_float32(q, k, v, bias, mask, scale)
      return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                          implementation="xla")
    if scale is not None:  # flax's attention scales by 1/sqrt(D): q carries the rest.
      q = q * jnp.asarray(scale * q.shape[-1] ** 0.5, q.dtype)
    return nn.dot_product_attention(
        q, k, v, bias=bias, mask=mask, dropout_rng=dropout_rng, dropout_rate=dropout_rate,
        deterministic=False, dtype=q.dtype, force_fp32_for_softmax=True,
        broadcast_dropout=False)  # One draw per example, head, query and key.
  if dropout:
    raise ConfigError(f"{_FIELD}={impl!r} has no attention dropout; set "
                      "config.model.attention_dropout_rate=0.0, or use 'xla'.")
  if impl == "cudnn" and segment_ids is None and window is None:
    lengths = jnp.maximum(jnp.sum(padding, axis=-1, dtype=jnp.int32), 1)  # [B]
    return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                        scale=scale, implementation="cudnn")
  from bertjax.model import flash_gpu  # pylint: disable=g-import-not-at-top
  kernel = _splash if impl == "splash" else flash_gpu.flash_attention
  return _per_shard(functools.partial(kernel, window=window, scale=scale), q, k, v,
                    kernel_ids(padding, segment_ids))


def kernel_path(impl: str, *, packed: bool, windowed: bool) -> str:
  """The kernel that `attention` runs on path `impl` (a resolved name) for packed rows
  (segment ids) or not, and a sliding-window layer or a global one: 'cudnn' sends packed
  rows and windows to the Pallas GPU kernel ('pallas_gpu'); every other path runs the
  kernel it names."""
  return "pallas_gpu" if impl == "cudnn" and (packed or windowed) else impl


KERNELS = {"xla": "XLA (jax.nn.dot_product_attention with the boolean mask)",
           "cudnn": "cuDNN flash attention (key lengths)",
           "pallas_gpu": "the Pallas flash kernel (bertjax.model.flash_gpu)",
           "splash": "the Pallas splash kernel"}


@functools.cache
def _log_path(impl: str, packed: bool, windowed: bool, dropout: bool, bias: bool) -> None:
  """Logs once per process (at the first trace: start-up) what each kind of row and
  layer runs."""
  kernel = KERNELS[kernel_path(impl, packed=packed, windowed=windowed)]
  logging.info("attention: %s rows, %s layers -> %s%s (path %r)",
               "packed" if packed else "padded",
               "sliding-window" if windowed else "global", kernel,
               (" with attention dropout (flax)" if dropout else "")
               + (" with a score bias" if bias else ""), impl)


def _check_bias(bias: jax.Array, shape: tuple[int, ...], impl: str) -> None:
  """A one-line ConfigError unless `bias` is [B or 1, N or 1, T, T] for q's `shape`
  [B, T, N, D] and `impl` takes a bias ('xla')."""
  B, T, N, _ = shape
  if bias.ndim != 4 or bias.shape[0] not in (1, B) or bias.shape[1] not in (1, N) or (
      tuple(bias.shape[2:]) != (T, T)):
    raise ConfigError(f"attention bias of shape {tuple(bias.shape)}: give [B or 1, N or "
                      f"1, T, T] = [{B} or 1, {N} or 1, {T}, {T}].")
  if impl != "xla":
    raise ConfigError(f"{_FIELD}={impl!r} takes no attention score bias: use '' or "
                      "'xla' (resolve_impl(..., bias=True) picks it).")


def xla_mask(padding: jax.Array, segment_ids: jax.Array | None = None,
             window: int | None = None) -> jax.Array:
  """[B, 1, 1 or T, T] bool, True where query i may attend key j: a real key, of the
  same segment, within the window."""
  mask = padding.astype(bool)[:, None, None, :]
  if segment_ids is not None:
    mask = mask & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
  if window is not None:
    pos = jnp.arange(padding.shape[1])
    mask = mask & (jnp.abs(pos[:, None] - pos[None, :]) <= window)
  return mask


def _xla_float32(q, k, v, bias, mask, scale):
  """`jax.nn.dot_product_attention(implementation='xla')` for float32 q, k, v, as it
  computes it (scaled scores, plus the bias, the masked ones at -0.7 x float32's
  largest, a float32 softmax), as two einsums over [B, N, T, S] without its
  grouped-query vmap (which broadcasts the mask to [B, 1, 1, T, S] and batches the
  dots over a group axis of 1): modernbert_tiny's train step on one CPU core takes
  388-400 ms against 422-435 with it (five runs each, side by side). Lower precisions
  keep jax's function, whose dot algorithms they need."""
  scores = jnp.einsum("btnh,bsnh->bnts", q, k)
  scores = scores * jnp.float32(q.shape[-1] ** -0.5 if scale is None else scale)
  if bias is not None:
    scores = scores + bias
  scores = jnp.where(mask, scores, jnp.float32(-0.7 * np.finfo(np.float32).max))
  return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, axis=-1), v)


def kernel_ids(padding: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
  """[B, T] int32 ids for the kernels that take segment ids: a real token's segment (0
  when unpacked), -1 for padding. A real query attends the real keys of its segment,
  as with `xla_mask`; a padding query attends padding keys only (never an empty row)."""
  ids = jnp.zeros_like(padding) if segment_ids is None else segment_ids
  return jnp.where(padding.astype(bool), ids, -1).astype(jnp.int32)


def _check_splash_length(T: int) -> None:
  if T % SPLASH_BLOCK:
    raise ConfigError(f"{_FIELD}='splash' needs a sequence length divisible by "
                      f"{SPLASH_BLOCK}, got {T}; pad the rows or use '' / 'xla'.")


def _splash(q, k, v, ids, *, window, scale=None):
  """The splash kernel on [b, T, n, D] x3 and [b, T] ids (one shard); the scores
  scaled by `scale` (None: 1/sqrt(D))."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=g-import-not-at-top

  _, T, n, D = q.shape
  _check_splash_length(T)
  # The kernel does not scale the logits.
  q = q * jnp.asarray(D ** -0.5 if scale is None else scale, q.dtype)
  block = min(T, 512)
  sizes = splash.BlockSizes(
      block_q=block, block_kv=block, block_kv_compute=SPLASH_BLOCK,
      block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=SPLASH_BLOCK,
      block_q_dq=block, block_kv_dq=block)
  head = (splash.FullMask((T, T)) if window is None
          else splash.LocalMask((T, T), (window, window), offset=0))
  mask = splash.MultiHeadMask([head] * n)

  def run(interpret):
    def apply(q, k, v, ids):
      kernel = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1,
                                      q_seq_shards=1, interpret=interpret)
      one = lambda q, k, v, s: kernel(q, k, v, splash.SegmentIds(s, s))  # noqa: E731
      out = jax.vmap(one)(*(t.swapaxes(1, 2) for t in (q, k, v)), ids)  # [b, n, T, D]
      return out.swapaxes(1, 2)
    return apply

  return jax.lax.platform_dependent(q, k, v, ids, tpu=run(False), default=run(True))


def _per_shard(kernel, q, k, v, ids):
  """`kernel(q, k, v, ids)` on each device's shard under a context mesh (batch and heads
  split as the logical-axis rules say, where they divide), else on the whole arrays."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return kernel(q, k, v, ids)
  batch, heads = (_dividing(nn.logical_to_mesh_axes((name,))[0], size, mesh)
                  for name, size in ((BATCH, q.shape[0]), (HEADS, q.shape[2])))
  qkv = PartitionSpec(batch, None, heads, None)
  return jax.shard_map(kernel, mesh=mesh, in_specs=(qkv, qkv, qkv, PartitionSpec(batch)),
                       out_specs=qkv, check_vma=False)(q, k, v, ids)


def _dividing(axes, size: int, mesh):
  """The leading mesh axes of `axes` (a rule's value) whose product divides `size`."""
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
  while axes and size % int(np.prod([mesh.shape[a] for a in axes])):
    axes = axes[:-1]
  return axes or None
