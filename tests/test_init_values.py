"""A seed's initial parameters stay what they were: every tiny recipe's, drawn by
`Setup.init_params` with XLA's default settings (a process of its own: the suite's
faster-compiling settings, tests/conftest.py, round the truncated normal's erf_inv
otherwise), equal the recorded fingerprints (tests/golden/init_fingerprints.json) bit
for bit, on one device, and on 8 (the recipe's mesh over them) for MESH_RECIPES: one
post-norm and one pre-norm layer kit (a mesh changes no value of any family: the key
is split by position, not by device, `jax_threefry_partitionable`; the other six
families' 8-device draws took 15 s of the test's 23.5 alone on the 2-core machine, with
the compilation cache warm); on a GPU
(`BERTJAX_TEST_PLATFORM=gpu`) the draw with JAX's threefry kernel
(`compilation.threefry_kernel`, what `init_params` uses: a fresh machine's init
compiles 13x faster) equals the unrolled rounds' draw."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from bertjax.parallel import mesh as mesh_lib
from bertjax.train import compilation, state as state_lib

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "init_fingerprints.json")
MESH_RECIPES = ("bert_tiny", "modernbert_tiny")  # Also drawn on 8 devices.
with open(GOLDEN) as f:
  RECORDED = json.load(f)["fingerprints"]


def _config(name: str):
  config = importlib.import_module(f"configs.{name}").get_config()
  with config.unlocked():
    config.compilation_cache_dir = ""
  return config


def fingerprint(params) -> str:
  """sha256 over the leaves in path order: each path, then its bytes."""
  digest = hashlib.sha256()
  leaves = jax.tree_util.tree_leaves_with_path(jax.device_get(params))
  for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
    digest.update(jax.tree_util.keystr(path).encode())
    digest.update(np.ascontiguousarray(leaf).tobytes())
  return digest.hexdigest()


def fingerprints(names, devices=None) -> dict[str, str]:
  """{name: the fingerprint of configs/<name>.py's initial parameters at its seed},
  drawn on its mesh over `devices` (default: all)."""
  out = {}
  for name in names:
    config = _config(name)
    trainer = state_lib.build_trainer(config, mesh_lib.create_mesh(config.mesh, devices))
    out[name] = fingerprint(trainer.init_params(config))
  return out


@pytest.mark.slow
def test_a_seeds_initial_parameters_are_the_recorded_ones():
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_DISABLE_MOST_OPTIMIZATIONS", "XLA_FLAGS")}
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, "-m", "tests.test_init_values", *RECORDED],
                        cwd=repo, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  drawn = json.loads(proc.stdout.strip().splitlines()[-1])
  assert sorted(drawn, key=int) == ["1", "8"]  # devices
  assert set(drawn["1"]) == set(RECORDED) and set(drawn["8"]) == set(MESH_RECIPES)
  changed = sorted(f"{n} on {d} device(s)" for d, got in drawn.items() for n in got
                   if got[n] != RECORDED[n])
  assert not changed, (
      f"the initial parameters of {changed} changed: a change to the initialisation "
      "(or to jax's random numbers) moves every figure trained from it; if it is "
      "meant, say so and record the new fingerprints (python -m tests.test_init_values "
      "NAME... prints them on 1 device and on all)")


def test_threefry_kernel_sets_the_option_inside_only():
  name = "jax_threefry_gpu_kernel_lowering"
  before = getattr(jax.config, name)
  with pytest.raises(RuntimeError):
    with compilation.threefry_kernel():
      assert getattr(jax.config, name) is True
      raise RuntimeError("the context restores the option on the way out")
  assert getattr(jax.config, name) == before


@pytest.mark.skipif(jax.default_backend() != "gpu",
                    reason="the threefry kernel is a GPU lowering (elsewhere the same "
                           "program): BERTJAX_TEST_PLATFORM=gpu runs it")
def test_the_threefry_kernel_draws_the_unrolled_rounds_parameters_on_a_gpu():
  config = _config("bert_tiny")
  trainer = state_lib.build_trainer(config)
  seed = state_lib.seed_scalar(config.seed)
  unrolled = trainer.init_program()(seed)
  with compilation.threefry_kernel():
    kernel = trainer.init_program()(seed)
    lowered = trainer.init_program().lower(seed).as_text()
  assert "threefry2x32_ffi" in lowered  # JAX's CUDA kernel, not the unrolled rounds
  assert "threefry2x32_ffi" not in trainer.init_program().lower(seed).as_text()
  assert fingerprint(kernel) == fingerprint(unrolled)


if __name__ == "__main__":  # {devices: {name: fingerprint}}: on one device, and on all
  # for those of MESH_RECIPES
  print(json.dumps({1: fingerprints(sys.argv[1:], jax.devices()[:1]),
                    len(jax.devices()): fingerprints(
                        [n for n in sys.argv[1:] if n in MESH_RECIPES])}))
