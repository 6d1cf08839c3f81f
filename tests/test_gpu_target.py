"""Compiling for an H200 on this CPU (bertjax/benchmarks/gpu_target.py): `benchmark plan
--topology=h200 --init` and `benchmarks levers --topology=h200` run XLA's GPU compiler
through JAX's CUDA plugin, in an environment of its own (the `gpu-plan` extra,
tests/extra_env.py: the plugin stays out of the test processes). The levers' GPU
program says what issue 46's changes do to it: the rematerialised GELU keeps fewer
bytes, one-hot positions drop the scatter-add, the threefry kernel drops the
unrolled rounds; the initialisation's program has the kernel's custom calls."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest

from bertjax.benchmarks import gpu_target
from bertjax.errors import ConfigError
from tests import extra_env

REPO = extra_env.REPO
# One layer (each compile for the GPU is mostly LLVM's, per fusion), hidden dropout (its
# masks drawn by threefry), cuDNN attention (no attention dropout).
TINY = ["--config=configs/bert_tiny.py", "--config.model.num_layers=1",
        "--config.model.dropout_rate=0.1", "--config.model.attention_dropout_rate=0.0"]


@pytest.fixture(scope="module")
def gpu_python():
  return extra_env.fixture_python(
      "gpu-plan", "import json, importlib.metadata as m; print(json.dumps({'plugin': "
      "m.version('jax-cuda13-plugin'), 'jax': m.version('jax')}))")


def _run(python, tmp_path, program, *args) -> dict:
  """`python -m PROGRAM ARGS --json=...` from the repository root: its JSON."""
  out = tmp_path / "result.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([python, "-m", program, *args, f"--json={out}"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(out.read_text())


def test_without_the_plugin_compiling_for_a_gpu_says_what_to_install():
  if importlib.util.find_spec("jax_plugins") and importlib.util.find_spec(
      "jax_plugins.xla_cuda13"):
    pytest.skip("JAX's CUDA plugin is installed in this environment")
  with pytest.raises(ConfigError, match=r"pip install -e '\.\[gpu-plan\]'"):
    gpu_target.devices("h200", 1, 1)


def test_gpu_topology_names():
  assert gpu_target.parse("h200") == ("h200", 1, 1)
  assert gpu_target.parse("h100:8") == ("h100", 1, 8)
  assert gpu_target.parse("h200:2x8") == ("h200", 2, 8)
  assert gpu_target.parse("v5p-8") is None and gpu_target.parse("h300") is None
  with pytest.raises(ConfigError, match="at least 1"):
    gpu_target.parse("h200:0")
  config = gpu_target.target_config("h200")
  assert 'device_description_str: "NVIDIA H200"' in config and "core_count: 132" in config


@pytest.mark.slow
def test_plan_compiles_the_step_and_the_init_for_an_h200(gpu_python, tmp_path):
  r = _run(gpu_python, tmp_path, "bertjax.benchmark", "plan", *TINY, "--topology=h200",
           "--init", "--mesh=-1,1,1", "--config.data.max_seq_length=128",
           "--config.data.max_predictions_per_seq=20")
  assert r["chip"]["name"] == "H200 SXM" and r["chips"] == 1
  (c,) = r["candidates"]
  assert c["fits"] and c["temp"] > 0 and c["bytes_accessed"] > 0  # the kernels' bytes
  assert c["compile_s"] > 0 and c["init_compile_s"] > 0
  # The initialisation draws its bits with JAX's kernel: custom calls, no rounds.
  init = c["init_instructions"]
  assert init["custom-call"] > 0 and init["threefry ops (shift, xor, or)"] < 100


@pytest.mark.slow
def test_levers_compare_the_h200_programs(gpu_python, tmp_path):
  r = _run(gpu_python, tmp_path, "benchmarks", "levers", *TINY, "--topology=h200",
           "--batch=16", "--seq=128",
           "--variants=base,activations_saved,position_gather,threefry_kernel")
  assert r["compile_only"] and r["device"] == "NVIDIA H200" and r["dtype"] == "bfloat16"
  v = r["variants"]
  base, saved, gather, kernel = (v[k] for k in ("base", "activations_saved",
                                                "position_gather", "threefry_kernel"))
  assert base["custom-call"] >= 2  # cuDNN attention forward and backward
  gelu = lambda x: sum(g["GB"] for k, g in x["kernel_GB"].items() if "GELU" in k)  # noqa: E731
  assert gelu(saved) > 1.2 * gelu(base) and saved["temp_GiB"] > base["temp_GiB"]
  assert gather["scatter"] == base["scatter"] + 1  # the position table's gradient
  ops = "threefry ops (shift, xor, or)"
  assert kernel[ops] < base[ops] / 10 and kernel["custom-call"] > base["custom-call"]
