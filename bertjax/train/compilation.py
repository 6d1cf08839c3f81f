"""XLA compilation in the two training programs: the persistent cache of compiled
programs (`config.compilation_cache_dir`), the time compilation took, logged at the
end of a run (`Compilation: ... s (... programs, ... from the persistent cache;
...)`), and the GPU lowering of the random draws that initialise parameters
(`threefry_kernel`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

import jax

# JAX's compilation events (jax.monitoring) -> the part of compilation each times.
COMPILE_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "tracing",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
                  "/jax/core/compile/backend_compile_duration": "compiling"}


def use_persistent_cache(directory: str) -> None:
  """Keeps XLA's compiled programs in `directory` (a local path, or gs://... shared by
  every host of a pod), so that a restart (preemption, a rerun, another seed with the
  same shapes) loads its steps instead of compiling them. '' leaves JAX's setting as
  it is; the JAX_COMPILATION_CACHE_DIR variable, when set, wins. JAX writes entries
  from process 0 only, and by default only programs that took a second or more to
  compile (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS)."""
  if directory and not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(directory))


# JAX's option: on a GPU, Threefry-2x32 as one CUDA kernel (a custom call) instead of
# its 20 unrolled rounds inlined into every fusion that consumes random bits.
_THREEFRY_KERNEL = "jax_threefry_gpu_kernel_lowering"


@contextlib.contextmanager
def threefry_kernel() -> Iterator[None]:
  """Inside, a jitted function called (traced and lowered) for a GPU draws its
  Threefry bits with JAX's CUDA kernel: the same bits (the same function of key and
  counter), so the same parameters for a seed, and a far smaller program. For the
  initialisation only, which runs once: its unrolled rounds are most of a fresh
  machine's wait (BERT-large's init on the H200 compiler, compiled on this CPU: 71.1
  s unrolled, 6.2 s with the kernel; BERT-base 40.6 s and 3.1 s). Not for the train
  step: there the unrolled rounds fuse into the dropout masks' consumers, and the
  kernel's bits, written out and read back, cost BERT-base 25 GB a step more
  (docs/gpu/2026-12-01-gpu-program.md). Its cost: XLA does not partition the kernel's
  call, so under FSDP each GPU draws whole tables' bits and keeps its shard (BERT-base
  on 8 H200s, FSDP: 0.52 GiB of the init's temporaries a GPU, none with the rounds; the
  same values). Other platforms: no change. A JAX without the option: no change."""
  if not hasattr(jax.config, _THREEFRY_KERNEL):
    yield
    return
  saved = getattr(jax.config, _THREEFRY_KERNEL)
  jax.config.update(_THREEFRY_KERNEL, True)
  try:
    yield
  finally:
    jax.config.update(_THREEFRY_KERNEL, saved)


@contextlib.contextmanager
def clock() -> Iterator[dict[str, float]]:
  """Inside: JAX's compilation time summed by part ('tracing', 'lowering',
  'compiling': XLA's, or reading the persistent cache), with 'programs' (XLA programs
  compiled or loaded) and 'cache_hits' (loaded from the persistent cache)."""
  totals = dict.fromkeys([*COMPILE_EVENTS.values(), "programs", "cache_hits"], 0.0)

  def on_duration(event, seconds, **kwargs):
    del kwargs
    if event in COMPILE_EVENTS:
      totals[COMPILE_EVENTS[event]] += seconds
      totals["programs"] += COMPILE_EVENTS[event] == "compiling"

  def on_event(event, **kwargs):
    del kwargs
    totals["cache_hits"] += event == "/jax/compilation_cache/cache_hits"

  jax.monitoring.register_event_duration_secs_listener(on_duration)
  jax.monitoring.register_event_listener(on_event)
  try:
    yield totals
  finally:
    jax.monitoring.unregister_event_duration_listener(on_duration)
    jax.monitoring.unregister_event_listener(on_event)


@contextlib.contextmanager
def logged(info: Callable[..., None]) -> Iterator[dict[str, float]]:
  """`clock`, whose totals `info` (a trainer's console line) reports on the way out of
  a run that ended without an error."""
  with clock() as totals:
    yield totals
  info("Compilation: %.1f s (%d programs, %d from the persistent cache; tracing %.1f "
       "s, lowering %.1f s, compiling %.1f s).", totals["tracing"] + totals["lowering"]
       + totals["compiling"], totals["programs"], totals["cache_hits"], totals["tracing"],
       totals["lowering"], totals["compiling"])
