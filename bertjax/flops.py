"""Model FLOPs of a pretraining step and the peak FLOP/s of the device, for MFU.

Training FLOPs per step = 3 x forward (the backward pass costs twice the forward):

  6 * N_enc * B * T                 the encoder's matmuls, N_enc = L * (4 E^2 + 2 E M)
                                    (weights only: no embeddings, biases, LayerNorms)
  + 12 * L * B * T^2 * E            attention scores Q K^T and the weighted sum P V
  + 6 * B * P * (E^2 + E V)         the MLM head at the P masked positions only
  + 6 * B * (E^2 + 2 E)             pooler and NSP classifier on [CLS] (when present)

B batch, T length, P masked positions per row, L layers, E hidden, M intermediate,
V vocabulary. Embedding lookups are gathers (no FLOPs); element-wise work (softmax,
GELU, LayerNorm, the optimizer) is not model FLOPs, as in the PaLM MFU definition.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model import ModelConfig

# Dense bf16 peak TFLOP/s per JAX device (substring of `device_kind`, most specific
# first). TPU v3 exposes each of a chip's two cores as a device; v4 and later one per
# chip. GPUs: SXM parts, dense (no sparsity).
PEAK_BF16_TFLOPS = (
    ("TPU v6 lite", 918.0), ("TPU v6e", 918.0),
    ("TPU v5 lite", 197.0), ("TPU v5e", 197.0),
    ("TPU v5p", 459.0), ("TPU v5", 459.0),
    ("TPU v4", 275.0),
    ("TPU v3", 61.5),
    ("H200", 989.0), ("H100", 989.0),
    ("A100", 312.0),
)


def train_flops(cfg: ModelConfig, batch: int, seq: int, predictions: int) -> dict[str, float]:
  """FLOPs of one training step (forward + backward) by term, and their `total`."""
  E, M, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size
  n_enc = L * (4 * E * E + 2 * E * M)
  terms = {
      "encoder_matmuls": 6.0 * n_enc * batch * seq,
      "attention": 12.0 * L * batch * seq * seq * E,
      "mlm_head": 6.0 * batch * predictions * (E * E + E * V),
      "pooler_nsp": 6.0 * batch * ((E * E if cfg.pooler else 0) + (2 * E if cfg.nsp else 0)),
  }
  terms["total"] = sum(terms.values())
  return terms


def device_peak_tflops(device: jax.Device) -> float | None:
  """The table's bf16 peak for `device`, or None (CPUs, unknown parts)."""
  kind = device.device_kind
  for name, peak in PEAK_BF16_TFLOPS:
    if name.lower() in kind.lower():
      return peak
  return None


def measure_matmul_tflops(dtype=jnp.float32, size: int = 2048, repeats: int = 10,
                          device: jax.Device | None = None) -> float:
  """The matmul FLOP/s this device sustains ([size, size] @ [size, size] in `dtype`),
  the best of `repeats` timed calls after a warm-up: the CPU's peak for MFU."""
  device = device or jax.devices()[0]
  a, b = (jax.device_put(jnp.asarray(np.random.default_rng(i).standard_normal(
      (size, size)), dtype), device) for i in range(2))
  matmul = jax.jit(jnp.matmul)
  matmul(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * size**3 / best / 1e12
