"""NVIDIA GPUs to compile for on a machine without one: XLA's GPU compiler, run on the
CPU by JAX's CUDA plugin (`pip install -e ".[gpu-plan]"`: the plugin of the installed
jax, ~130 MB, no CUDA libraries), given a device description (`TARGETS`). `benchmark
plan --topology=h200` and `benchmarks levers --topology=h200` compile bertjax's real
programs with it: the GPU program's fusions, kernels, buffers and compile time, with
no GPU and nothing run.

What such a compile is not: XLA picks its GEMM kernels without autotuning (that needs
the device), so GEMM fusions may differ from a GPU's run, compile seconds omit the
autotuner's, and XLA's cost analysis answers nothing: `kernel_bytes` reads the bytes
each kernel moves off the compiled program instead. The non-GEMM fusions are the GPU
run's own: BERT-base's step compiled here holds the 2026-11-28 H200 trace's GELU,
LayerNorm and scatter fusions, names and sizes included
(docs/gpu/2026-12-01-gpu-program.md).

Shapes of names: `h200` one GPU; `h200:8` one host of 8; `h200:2x8` 2 hosts of 8.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from typing import Iterator

from bertjax.errors import ConfigError

# name -> (device_description_str, SMs, device memory bytes, HBM bytes/s, clock GHz):
# what XLA's cost model and tiling read (NVIDIA's datasheets; memory as the device
# reports it: H100 SXM 80 GB, H200 141 GB).
TARGETS = {
    "h100": ("NVIDIA H100 80GB HBM3", 132, 85_520_809_984, 3.35e12, 1.98),
    "h200": ("NVIDIA H200", 132, 150_754_820_096, 4.8e12, 1.98),
}
_CUDNN = (9, 10)  # the cuDNN release a target says it has (cuDNN attention's checks)
_PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def target_config(name: str) -> str:
  """XLA's GpuTargetConfig (text proto) of `name` (a key of TARGETS): Hopper, CUDA 13."""
  kind, sms, memory, bandwidth, clock = TARGETS[name]
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: {sms}
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: {int(bandwidth)} l2_cache_size: 52428800
  clock_rate_ghz: {clock} device_memory_size: {memory}
  shared_memory_per_block_optin: 232448 cuda_compute_capability {{ major: 9 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
runtime_version {{ major: 13 minor: 0 patch: 0 }}
platform_name: "CUDA"
dnn_version_info {{ major: {_CUDNN[0]} minor: {_CUDNN[1]} }}
device_description_str: "{kind}"
"""


def parse(name: str) -> tuple[str, int, int] | None:
  """(target, hosts, GPUs a host) of a --topology such as h200, h200:8, h100:2x8; None
  when `name` names no GPU."""
  m = re.fullmatch(rf"({'|'.join(TARGETS)})(?::(?:(\d+)x)?(\d+))?", name)
  if not m:
    return None
  hosts, gpus = int(m[2] or 1), int(m[3] or 1)
  if hosts < 1 or gpus < 1:
    raise ConfigError(f"--topology={name}: hosts and GPUs a host must be at least 1.")
  return m[1], hosts, gpus


def before_jax_starts() -> None:
  """Lets the CUDA plugin register on a machine without CUDA libraries (it checks
  their versions before registering, unless told not to): call before JAX's first
  backend use. It changes nothing where a GPU is attached."""
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


def devices(name: str, hosts: int, gpus: int) -> list:
  """Compile-only devices of `hosts` x `gpus` GPUs of TARGETS[name]."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if not any(importlib.util.find_spec(p.split(".")[0]) and importlib.util.find_spec(p)
             for p in _PLUGINS):
    raise ConfigError(f"--topology={name}: compiling for a GPU needs JAX's CUDA plugin "
                      "(no GPU, no CUDA libraries): pip install -e '.[gpu-plan]'.")
  before_jax_starts()
  try:
    return list(topologies.get_topology_desc(
        name, "cuda", target_config=target_config(name),
        topology=f"1x{hosts}x{gpus}").devices)
  except NotImplementedError as e:
    raise ConfigError(
        f"--topology={name}: JAX's CUDA plugin did not register ({e}): it checks the "
        "CUDA libraries unless JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 is set before JAX "
        "starts (or JAX_PLATFORMS=cpu).") from e


def compile_only(device) -> bool:
  """Whether `device` is a GPU to compile for on a machine without one attached."""
  import jax  # pylint: disable=g-import-not-at-top
  return device.platform == "gpu" and jax.default_backend() != "gpu"


@contextlib.contextmanager
def cudnn_checks(device) -> Iterator[None]:
  """Inside, JAX's cuDNN attention asks `device` (a compile-only GPU) what it would ask
  the attached GPU and the local cuDNN library (versions, compute capability), which
  a machine without them cannot answer. Outside a compile for such a device: no
  change."""
  if not compile_only(device):
    yield
    return
  try:
    from jax._src.cudnn import fused_attention_stablehlo as fa  # pylint: disable=g-import-not-at-top,line-too-long
    names = ("check_cudnn_version", "check_compute_capability",
             "is_cuda_compute_capability_equal")
    saved = {n: getattr(fa, n) for n in names}
  except (ImportError, AttributeError):  # Another JAX: its own errors say what to do.
    yield
    return
  have = tuple(int(x) for x in device.compute_capability.split("."))
  want = lambda c: tuple(int(x) for x in c.split("."))  # noqa: E731
  fa.check_cudnn_version = lambda: _CUDNN[0] * 10000 + _CUDNN[1] * 100
  fa.check_compute_capability = lambda c: have >= want(c)
  fa.is_cuda_compute_capability_equal = lambda c: have == want(c)
  try:
    yield
  finally:
    for n, f in saved.items():
      setattr(fa, n, f)
