"""Flash attention for GPUs in Pallas (lowered through Triton), with what an encoder's
packed rows need: segment ids and a symmetric sliding window, forward and backward,
without any [T, T] mask, skipping the key blocks outside the window.

jax ships a Pallas GPU flash-attention kernel with segment ids
(`jax.experimental.pallas.ops.gpu.attention.mha`) but no window, and cuDNN (jax 0.10.2)
has padding lengths and a left-only window but no segment ids in its public API. This
kernel is that jax kernel (Apache 2.0, the same tiling, online softmax in base 2 and
fused dK/dV + dQ backward) with the window added to the masks and to the loop bounds.
Off a CUDA GPU it runs in Pallas's interpreter (slow: the numerics tests on the CPU).

Shapes: B batch, T length, N heads, D head size.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

BLOCK = 128  # Forward tiles along T (queries and keys), as jax's kernel.
BLOCK_BACKWARD = 32  # Backward tiles along T (jax's defaults; not tuned here).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
PAD_ID = -2  # Segment id of the rows added to reach a multiple of the tile.
LOG2_E = math.log2(math.e)


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, ids: jax.Array, *,
                    window: int | None = None, scale: float | None = None) -> jax.Array:
  """q, k, v: [B, T, N, D]; ids: [B, T] int32 (real tokens >= 0, padding -1): query i
  attends key j iff ids[i] == ids[j] and, with a window w, |i - j| <= w (every query
  attends at least itself). Scores scaled by `scale` (None: 1/sqrt(D)), float32
  softmax statistics. Returns [B, T, N, D] in q's dtype. T is padded up to a tile
  multiple here (rows of their own segment), and the result cut back."""
  T, D = q.shape[1], q.shape[3]
  scale = D ** -0.5 if scale is None else float(scale)
  padded = max(16, pl.next_power_of_2(T)) if T <= BLOCK else -(-T // BLOCK) * BLOCK
  if padded != T:
    rows = ((0, 0), (0, padded - T), (0, 0), (0, 0))
    q, k, v = (jnp.pad(t, rows) for t in (q, k, v))
    ids = jnp.pad(ids, ((0, 0), (0, padded - T)), constant_values=PAD_ID)
  ids = ids.astype(jnp.int32)

  def run(interpret):
    return lambda q, k, v, ids: _flash(q, k, v, ids, scale, window, interpret)

  out = lax.platform_dependent(q, k, v, ids, cuda=run(False), default=run(True))
  return out[:, :T]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _flash(q, k, v, ids, scale, window, interpret):
  return _forward(q, k, v, ids, scale, window, interpret)[0]


def _flash_forward(q, k, v, ids, scale, window, interpret):
  out, lse = _forward(q, k, v, ids, scale, window, interpret)
  return out, (q, k, v, ids, out, lse)


def _flash_backward(scale, window, interpret, residuals, d_out):
  q, k, v, ids, out, lse = residuals
  delta = jnp.einsum("btnd,btnd->bnt", out.astype(jnp.float32),
                     d_out.astype(jnp.float32))  # [B, N, T]
  dq, dk, dv = _backward(q, k, v, ids, d_out, lse, delta, scale, window, interpret)
  return dq, dk, dv, None


_flash.defvjp(_flash_forward, _flash_backward)


def _allowed(q_ids, k_ids, q_pos, k_pos, window):
  """[bq, bk] bool: same segment and, with a window, |i - j| <= window."""
  ok = q_ids[:, None] == k_ids[None, :]
  if window is not None:
    offset = q_pos[:, None] - k_pos[None, :]
    ok = ok & (offset <= window) & (-offset <= window)
  return ok


def _block_range(i, size_i: int, size_j: int, count_j: int, window):
  """[lo, hi): the tiles j (of size_j positions) holding a position within `window` of
  a position of tile i (of size_i); all of them without a window."""
  if window is None:
    return 0, count_j
  lo = lax.div(jnp.maximum(i * size_i - window, 0), size_j)
  hi = jnp.minimum(lax.div((i + 1) * size_i - 1 + window, size_j) + 1, count_j)
  return lo, hi


def _forward_kernel(q_ref, k_ref, v_ref, ids_ref, o_ref, lse_ref, *, scale, window,
                    block_q, block_k, head_dim):
  """One tile of queries against its keys: o [block_q, D], lse [block_q] (base 2)."""
  i = pl.program_id(0)
  dims = (jnp.arange(q_ref.shape[-1]) < head_dim)[None, :]
  q = plgpu.load(q_ref, mask=dims, other=0.0)
  q_ids = ids_ref[pl.ds(i * block_q, block_q)]
  q_pos = i * block_q + jnp.arange(block_q)

  def body(j, carry):
    o, m, l = carry
    keys = pl.ds(j * block_k, block_k)
    k = plgpu.load(k_ref.at[keys, :], mask=dims, other=0.0)
    s = plgpu.dot(q, k.T) * (scale * LOG2_E)  # [block_q, block_k], base 2
    s = jnp.where(_allowed(q_ids, ids_ref[keys], q_pos, j * block_k + jnp.arange(block_k),
                           window), s, MASK_VALUE)
    m_next = jnp.maximum(m, jnp.max(s, axis=-1))
    correction = jnp.exp2(m - m_next)
    p = jnp.exp2(s - m_next[:, None])
    v = plgpu.load(v_ref.at[keys, :], mask=dims, other=0.0)
    o = correction[:, None] * o + plgpu.dot(p.astype(v.dtype), v)
    return o, m_next, correction * l + jnp.sum(p, axis=-1)

  init = (jnp.zeros((block_q, q_ref.shape[-1]), jnp.float32),
          jnp.zeros(block_q, jnp.float32) - float("inf"), jnp.zeros(block_q, jnp.float32))
  lo, hi = _block_range(i, block_q, block_k, k_ref.shape[0] // block_k, window)
  o, m, l = lax.fori_loop(lo, hi, body, init)
  lse_ref[...] = m + jnp.log2(l)
  plgpu.store(o_ref.at[:, :o.shape[-1]], (o / l[:, None]).astype(o_ref.dtype), mask=dims)


def _forward(q, k, v, ids, scale, window, interpret):
  """out [B, T, N, D], lse [B, N, T] float32 (base 2)."""
  B, T, N, D = q.shape
  block = min(BLOCK, T)
  padded_d = pl.next_power_of_2(D)
  kernel = functools.partial(_forward_kernel, scale=scale, window=window, block_q=block,
                             block_k=block, head_dim=D)
  whole = pl.BlockSpec((None, T, None, padded_d), lambda _, b, n: (b, 0, n, 0))
  tile = pl.BlockSpec((None, block, None, padded_d), lambda i, b, n: (b, i, n, 0))
  return pl.pallas_call(
      kernel, grid=(T // block, B, N),
      in_specs=[tile, whole, whole, pl.BlockSpec((None, T), lambda _, b, n: (b, 0))],
      out_specs=[tile, pl.BlockSpec((None, None, block), lambda i, b, n: (b, n, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((B, N, T), jnp.float32)],
      compiler_params=plgpu.CompilerParams(num_warps=4 if D <= 64 else 8, num_stages=2),
      interpret=interpret, name="bertjax_flash_forward")(q, k, v, ids)


def _backward_kernel(q_ref, k_ref, v_ref, ids_ref, do_ref, lse_ref, delta_ref, dq_ref,
                     dk_ref, dv_ref, *, scale, window, block, head_dim):
  """Tile j: dK, dV of its keys (over the query tiles that see them), then dQ of its
  queries (over the key tiles they see)."""
  j = pl.program_id(2)
  count = q_ref.shape[0] // block
  padded_d = q_ref.shape[-1]
  dims = (jnp.arange(padded_d) < head_dim)[None, :]
  c = scale * LOG2_E
  span = lambda t: t * block + jnp.arange(block)  # noqa: E731

  def probabilities(q, k, q_ids, k_ids, q_pos, k_pos, lse):
    s = jnp.where(_allowed(q_ids, k_ids, q_pos, k_pos, window),
                  plgpu.dot(q, k.T) * c, MASK_VALUE)
    return jnp.exp2(s - lse[:, None])  # [block, block]

  keys = pl.ds(j * block, block)
  k = plgpu.load(k_ref.at[keys, :], mask=dims, other=0.0)
  v = plgpu.load(v_ref.at[keys, :], mask=dims, other=0.0)
  k_ids = ids_ref[keys]

  def dkdv(i, carry):
    dk, dv = carry
    rows = pl.ds(i * block, block)
    q = plgpu.load(q_ref.at[rows, :], mask=dims, other=0.0)
    do = plgpu.load(do_ref.at[rows, :], mask=dims, other=0.0)
    p = probabilities(q, k, ids_ref[rows], k_ids, span(i), span(j), lse_ref[rows])
    dv = dv + plgpu.dot(p.astype(do.dtype).T, do)
    ds = p * (plgpu.dot(do, v.T) - delta_ref[rows][:, None]) * scale
    return dk + plgpu.dot(ds.astype(q.dtype).T, q), dv

  zeros = jnp.zeros((block, padded_d), jnp.float32)
  dk, dv = lax.fori_loop(*_block_range(j, block, block, count, window), dkdv, (zeros, zeros))
  plgpu.store(dv_ref.at[:, :dv.shape[-1]], dv.astype(dv_ref.dtype), mask=dims)
  plgpu.store(dk_ref.at[:, :dk.shape[-1]], dk.astype(dk_ref.dtype), mask=dims)

  rows = pl.ds(j * block, block)
  q = plgpu.load(q_ref.at[rows, :], mask=dims, other=0.0)
  do = plgpu.load(do_ref.at[rows, :], mask=dims, other=0.0)
  q_ids, lse, delta = ids_ref[rows], lse_ref[rows], delta_ref[rows]

  def dq_body(i, dq):
    keys = pl.ds(i * block, block)
    k = plgpu.load(k_ref.at[keys, :], mask=dims, other=0.0)
    v = plgpu.load(v_ref.at[keys, :], mask=dims, other=0.0)
    p = probabilities(q, k, q_ids, ids_ref[keys], span(j), span(i), lse)
    ds = p * (plgpu.dot(do, v.T) - delta[:, None]) * scale
    return dq + plgpu.dot(ds.astype(k.dtype), k)

  dq = lax.fori_loop(*_block_range(j, block, block, count, window), dq_body, zeros)
  plgpu.store(dq_ref.at[:, :dq.shape[-1]], dq.astype(dq_ref.dtype), mask=dims)


def _backward(q, k, v, ids, d_out, lse, delta, scale, window, interpret):
  """dq, dk, dv [B, T, N, D] in the inputs' dtypes."""
  B, T, N, D = q.shape
  block = min(BLOCK_BACKWARD, T)
  padded_d = pl.next_power_of_2(D)
  whole = pl.BlockSpec((None, T, None, padded_d), lambda b, n, _: (b, 0, n, 0))
  tile = pl.BlockSpec((None, block, None, padded_d), lambda b, n, j: (b, j, n, 0))
  stats = pl.BlockSpec((None, None, T), lambda b, n, _: (b, n, 0))
  kernel = functools.partial(_backward_kernel, scale=scale, window=window, block=block,
                             head_dim=D)
  return pl.pallas_call(
      kernel, grid=(B, N, T // block),
      in_specs=[whole, whole, whole, pl.BlockSpec((None, T), lambda b, n, _: (b, 0)),
                whole, stats, stats],
      out_specs=[tile, tile, tile],
      out_shape=[jax.ShapeDtypeStruct(t.shape, t.dtype) for t in (q, k, v)],
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret, name="bertjax_flash_backward")(q, k, v, ids, d_out, lse, delta)
