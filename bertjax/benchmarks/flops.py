"""Model FLOPs of a pretraining step, and each accelerator's peak FLOP/s, HBM size and
bandwidth (`CHIPS`, with sources), for MFU and the pod plan.

The FLOPs of a training step are its model's (`Family.train_flops`, the terms every
family shares in `bertjax.model.stack.train_flops`: the matmuls of the forward and
backward passes, attention over the pairs each layer scores, the MLM head at the
predicted positions only, and a family's own heads); element-wise work (softmax, GELU,
LayerNorm, the optimizer) is not model FLOPs, as in the PaLM MFU definition. Hugging
Face's models compute the MLM logits at every position: their FLOPs are
`train_flops(cfg, B, T, predictions=T)`.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model import family_of


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator generation, per JAX device (a chip; a TensorCore on TPU v3)."""

  name: str
  kinds: tuple[str, ...]  # Substrings of `jax.Device.device_kind` (lower case) it matches.
  peak_bf16_tflops: float  # Dense (no sparsity).
  hbm_bytes: float  # Usable HBM per device, bytes (see CHIPS).
  hbm_gbps: float  # HBM bandwidth, 10**9 bytes/s.
  source: str


GIB, GB = 2.0 ** 30, 1e9
# TPU HBM: what the TPU compiler (libtpu 0.0.42) reports as available to a program (its
# out-of-memory error names it; tests/test_plan.py checks it); GPUs: the datasheet (GB
# of 10**9 bytes; dense bf16 = half the "with sparsity" figure, rounded down). GPU
# `kinds` are the CUDA device names JAX reports as `device_kind` (the CUDA device
# properties' name, as nvidia-smi prints it), lower case: a part not listed gets no
# table peak (MFU then measures one).
# Most specific `kinds` first: 'tpu v5' (v5p's device kind) also prefixes 'tpu v5 lite',
# 'nvidia h200' prefixes 'nvidia h200 nvl'.
_H100 = "nvidia.com/en-us/data-center/h100 datasheet (H100 SXM / PCIe / NVL columns)"
_H200 = "nvidia.com/en-us/data-center/h200 datasheet (H200 SXM / NVL columns)"
_A100 = "nvidia.com/en-us/data-center/a100 datasheet (SXM4 / PCIe, 40GB / 80GB columns)"
CHIPS = (
    Chip("TPU v6e", ("tpu v6 lite", "tpu v6e"), 918.0, 31.25 * GIB, 1638.0,
         "cloud.google.com/tpu/docs/v6e: 918 TFLOP/s, 32 GB, 1638 GB/s"),
    Chip("TPU v5e", ("tpu v5 lite", "tpu v5e"), 197.0, 15.75 * GIB, 819.0,
         "cloud.google.com/tpu/docs/v5e: 197 TFLOP/s, 16 GB, 819 GB/s"),
    Chip("TPU v5p", ("tpu v5p", "tpu v5"), 459.0, 95.74 * GIB, 2765.0,
         "cloud.google.com/tpu/docs/v5p: 459 TFLOP/s, 95 GB, 2765 GB/s"),
    Chip("TPU v4", ("tpu v4",), 275.0, 30.75 * GIB, 1200.0,
         "cloud.google.com/tpu/docs/v4: 275 TFLOP/s, 32 GiB, 1200 GB/s"),
    Chip("TPU v3 (per TensorCore)", ("tpu v3",), 61.5, 15.48 * GIB, 450.0,
         "cloud.google.com/tpu/docs/v3: 123 TFLOP/s, 32 GiB, 900 GB/s per 2-core chip"),
    Chip("H200 NVL", ("nvidia h200 nvl",), 835.0, 141 * GB, 4800.0,
         f"{_H200}: 1,671 TFLOP/s bf16 with sparsity, 141 GB HBM3e, 4.8 TB/s"),
    Chip("H200 SXM", ("nvidia h200",), 989.0, 141 * GB, 4800.0,
         f"{_H200}: 1,979 TFLOP/s bf16 with sparsity, 141 GB HBM3e, 4.8 TB/s"),
    Chip("H100 NVL", ("nvidia h100 nvl",), 835.0, 94 * GB, 3900.0,
         f"{_H100}: 1,671 TFLOP/s bf16 with sparsity, 94 GB HBM3, 3.9 TB/s"),
    Chip("H100 PCIe", ("nvidia h100 pcie",), 756.0, 80 * GB, 2000.0,
         f"{_H100}: 1,513 TFLOP/s bf16 with sparsity, 80 GB HBM2e, 2 TB/s"),
    Chip("H100 SXM", ("nvidia h100 80gb hbm3", "nvidia h100 sxm"), 989.0, 80 * GB, 3350.0,
         f"{_H100}: 1,979 TFLOP/s bf16 with sparsity, 80 GB HBM3, 3.35 TB/s"),
    Chip("A100 SXM4 80GB", ("nvidia a100-sxm4-80gb",), 312.0, 80 * GB, 2039.0,
         f"{_A100}: 312 TFLOP/s bf16 dense, 80 GB HBM2e, 2,039 GB/s"),
    Chip("A100 SXM4 40GB", ("nvidia a100-sxm4-40gb",), 312.0, 40 * GB, 1555.0,
         f"{_A100}: 312 TFLOP/s bf16 dense, 40 GB HBM2, 1,555 GB/s"),
    Chip("A100 PCIe 80GB", ("nvidia a100 80gb pcie",), 312.0, 80 * GB, 1935.0,
         f"{_A100}: 312 TFLOP/s bf16 dense, 80 GB HBM2e, 1,935 GB/s"),
    Chip("A100 PCIe 40GB", ("nvidia a100-pcie-40gb",), 312.0, 40 * GB, 1555.0,
         f"{_A100}: 312 TFLOP/s bf16 dense, 40 GB HBM2, 1,555 GB/s"),
)


def chip(device: jax.Device) -> Chip | None:
  """The table's row for `device`, or None (CPUs, unknown parts)."""
  kind = device.device_kind.lower()
  for row in CHIPS:
    if any(k in kind for k in row.kinds):
      return row
  return None


def train_flops(cfg, batch: int, seq: int, predictions: int) -> dict[str, float]:
  """FLOPs of one training step (forward + backward) by term, and their `total`, of
  the model config `cfg` (any family)."""
  return family_of(cfg).train_flops(cfg, batch, seq, predictions)


def device_peak_tflops(device: jax.Device) -> float | None:
  """The table's bf16 peak for `device`, or None (CPUs, unknown parts)."""
  row = chip(device)
  return row.peak_bf16_tflops if row else None


def peak_tflops(devices, dtype=jnp.float32, measure_tries: int = 3) -> tuple[float, str]:
  """The peak TFLOP/s of all `devices` together, for MFU, and where it comes from: the
  table's dense bf16 peak times the number of devices; on CPUs (fake devices share the
  host's cores) the best of `measure_tries` matmul measurements on all of them at once."""
  devices = list(devices)
  per_device = device_peak_tflops(devices[0])
  if per_device is not None:
    return per_device * len(devices), (f"table, {per_device:g} TFLOP/s bf16 dense x "
                                       f"{len(devices)} devices")
  size = max(128, round(2048 / len(devices) ** (1 / 3) / 128) * 128)  # 2048^3 in all
  measured = max(measure_matmul_tflops(jnp.dtype(dtype), size, devices=devices)
                 for _ in range(measure_tries))
  return measured, (f"measured: {jnp.dtype(dtype).name} {size}^3 matmuls on all "
                    f"{len(devices)} devices at once, this run")


def measure_matmul_tflops(dtype=jnp.float32, size: int = 2048, repeats: int = 10,
                          devices=None) -> float:
  """The matmul FLOP/s `devices` sustain together (each a [size, size] @ [size, size]
  in `dtype`, all at once), the best of `repeats` timed calls after a warm-up: the
  CPU's peak for MFU."""
  devices = list(devices or jax.devices()[:1])
  mesh = jax.sharding.Mesh(np.array(devices), ("d",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  a, b = (jax.device_put(jnp.asarray(np.random.default_rng(i).standard_normal(
      (len(devices), size, size)), dtype), sharding) for i in range(2))
  matmul = jax.jit(jnp.matmul, out_shardings=sharding)
  matmul(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2.0 * len(devices) * size**3 / best / 1e12
