"""TPU without a TPU: the pod plan compiles the real step with the TPU compiler (libtpu,
the `tpu` and `test` extras) for abstract devices of a topology, its per-chip figures
agree with the shardings and the compiler, the chip table agrees with the compiler's
HBM, the splash-attention kernel equals the plain path (Pallas interpret mode on the
CPU) and compiles for TPU, and a CPU-only run stays on the CPU with libtpu installed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.benchmarks import flops
from bertjax.benchmarks import plan as plan_lib
from bertjax.errors import ConfigError
from bertjax.model import ModelConfig, bert
from tests.helpers import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
splash_here = pytest.mark.skipif(jax.default_backend() not in ("cpu", "tpu"),
                                 reason="config.model.attention_impl='splash' runs on a "
                                 "TPU, or on the CPU in Pallas's interpreter")
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="the TPU compiler (libtpu: the test extra, Linux x86)")


def _tiny(layout, **model):
  config = tiny_config()
  config.model.update(dtype="bfloat16", **model)
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = layout
  return config


@pytest.fixture(scope="module")
def v5e_4():
  return plan_lib.topology("v5e-4")


@needs_libtpu
def test_topology_names():
  assert plan_lib._torus_dims(64, True) == (4, 4, 4)  # v5p-128
  assert plan_lib._torus_dims(16, True) == (2, 2, 4)  # v5p-32
  assert plan_lib._torus_dims(4, True) == (2, 2, 1)  # v4-8
  assert plan_lib._torus_dims(256, False) == (16, 16)  # v5e-256
  assert plan_lib._torus_dims(8, False) == (2, 4)  # v5e-8
  with pytest.raises(ConfigError, match="v5p:4x4x8"):
    plan_lib._torus_dims(48, True)
  topo = plan_lib.topology("v4-8", num_slices=2)
  assert len(topo.devices) == 8 and topo.chip.name == "TPU v4"
  assert {d.slice_index for d in topo.devices} == {0, 1}
  with pytest.raises(ConfigError, match="accelerator type"):
    plan_lib.topology("v7-8")


@pytest.mark.slow
@needs_libtpu
def test_plan_figures_match_the_shardings_and_the_compiler(v5e_4):
  """Per chip: params and optimizer bytes equal those of real arrays placed on 4 CPU
  devices with the same layout (data parallel: everything; FSDP: about a quarter);
  the TPU compiler's argument bytes are the state's and the batch's (plus its tile
  padding: 2% at these sizes, 0.02% for BERT-large); its FLOPs bound the model FLOPs."""
  from bertjax.parallel import mesh as mesh_lib
  from bertjax.train import state as state_lib
  results = {}
  for layout in ((4, 1, 1), (1, 4, 1)):
    config = _tiny(layout, hidden_size=256, num_heads=2, intermediate_size=512,
                   vocab_size=512, num_layers=1)
    r = results[layout] = plan_lib.plan(config, v5e_4, 8)
    trainer = state_lib.build_trainer(config, mesh_lib.create_mesh(config.mesh,
                                                                   jax.devices()[:4]))
    live = trainer.init_state(config)
    for key in ("params", "opt_state"):
      on_device_0 = sum(s.data.nbytes for x in jax.tree.leaves(getattr(live, key))
                        for s in x.addressable_shards if s.device == jax.devices()[0])
      assert r[key] == on_device_0, key
    logical = r["params"] + r["opt_state"] + 4 + r["batch"]  # + the step counter
    assert logical <= r["arguments"] < 1.03 * logical, (r["arguments"], logical)
    assert r["fits"] and r["per_chip_batch"] == 2 and r["peak"] >= r["arguments"]
    # The compiler counts every op (optimizer, softmax, ...); model FLOPs the matmuls.
    assert r["model_flops"] <= r["flops"] < 2 * r["model_flops"], r
    assert r["roofline_s"] > 0 and r["compile_s"] > 0
  dp, fsdp = results[(4, 1, 1)], results[(1, 4, 1)]
  assert dp["params"] / 4 < fsdp["params"] < dp["params"] / 3


@pytest.mark.slow
@needs_libtpu
def test_largest_batch_bisects_to_the_limit(v5e_4, monkeypatch):
  """A program over HBM: the TPU compiler refuses it and the plan says it does not fit.
  The search doubles, then bisects, to the last batch that fits (a stand-in for the
  compiles here: fits up to 52 rows, in steps of 4)."""
  huge = plan_lib.plan(_tiny((4, 1, 1)), v5e_4, 4 << 20)
  assert not huge["fits"] and "HBM" in huge["error"]
  tried = []

  def fake_plan(config, topo, batch_size):
    tried.append(batch_size)
    return {"batch_size": batch_size, "fits": batch_size <= 52}

  monkeypatch.setattr(plan_lib, "plan", fake_plan)
  best, tries = plan_lib.largest_batch(None, v5e_4, {"batch_size": 8}, unit=4)
  assert best == 52 and [t["batch_size"] for t in tries] == tried
  assert tried[:3] == [16, 32, 64] and 52 in tried and 56 in tried and len(tried) <= 7
  best, tries = plan_lib.largest_batch(None, v5e_4, {"batch_size": 8}, unit=4,
                                       max_per_unit=8)
  assert (best, len(tries)) == (32, 2)  # Capped: 32 fits, the search stops.
  # A coarser search stops within 25%; the row names the batch that did not fit.
  best, tries = plan_lib.largest_batch(None, v5e_4, {"batch_size": 8}, unit=4,
                                       tolerance=0.25)
  row = {"max_batch": best, "max_batch_tries": tries, "capped": False, "batch_unit": 4}
  assert (best, plan_lib._max_batch(row)) == (48, "48 (< 56)"), tries
  assert plan_lib._max_batch({**row, "capped": True}) == ">= 48"


@needs_libtpu
def test_chip_table_hbm_is_what_the_compiler_offers():
  """An over-sized program makes the TPU compiler name the HBM it offers a program;
  the table's figure for each generation is that (libtpu updates may change it)."""
  from jax.sharding import SingleDeviceSharding
  from jax.experimental import topologies
  for name, topology in (("TPU v4", "v4-8"), ("TPU v5e", "v5e-4"), ("TPU v5p", "v5p-8"),
                         ("TPU v6e", "v6e-4"), ("TPU v3 (per TensorCore)", "v3:2x2")):
    device = (topologies.get_topology_desc(topology, platform="tpu").devices[0]
              if topology == "v3:2x2" else plan_lib.topology(topology).devices[0])
    x = jax.ShapeDtypeStruct((1 << 20,), jnp.float32, sharding=SingleDeviceSharding(device))
    huge = jax.jit(lambda x: jnp.cumsum(jnp.outer(x, x), axis=0)[::7].sum(0))  # 4 TiB
    with pytest.raises(Exception, match="available HBM") as error:
      huge.lower(x).compile()
    offered = float(re.search(r"available HBM \(([\d.]+)G\)", str(error.value))[1])
    chip = flops.chip(device)
    assert chip.name == name and chip.hbm_bytes == offered * 2.0 ** 30, (name, offered)


def _attention(impl, x, pad, segments, variables):
  cfg = ModelConfig(hidden_size=32, num_heads=2, num_layers=1, vocab_size=64,
                    attention_dropout_rate=0.0, dropout_rate=0.0, attention_impl=impl)
  return bert.SelfAttention(cfg).apply(variables, x, (pad, segments),
                                         True)


@pytest.mark.slow
@splash_here
@pytest.mark.parametrize("packed", [False, True])
def test_splash_attention_equals_the_plain_path(packed):
  """The Pallas splash kernel (interpret mode on the CPU) against XLA's attention,
  fp32, right-padded rows (one nearly empty) and, packed, two documents a row:
  outputs at real positions and gradients (inputs and weights) within 1e-5."""
  B, T = 3, 128
  x = jax.random.normal(jax.random.key(0), (B, T, 32))
  lengths = jnp.array([128, 100, 7])
  pad = (jnp.arange(T)[None] < lengths[:, None]).astype(jnp.int32)
  segments = ((jnp.arange(T)[None] >= lengths[:, None] // 2).astype(jnp.int32)
              if packed else None)
  cfg = ModelConfig(hidden_size=32, num_heads=2, num_layers=1, vocab_size=64)
  variables = bert.SelfAttention(cfg).init(jax.random.key(1), x,
                                             (pad, segments), True)
  real = pad[..., None] > 0

  def loss(impl, x, variables):
    out = _attention(impl, x, pad, segments, variables)
    return jnp.sum(jnp.where(real, out, 0.0) ** 2), out

  grads = {}
  for impl in ("xla", "splash"):
    (_, out), grads[impl] = jax.value_and_grad(
        lambda x, v: loss(impl, x, v), argnums=(0, 1), has_aux=True)(x, variables)
    grads[impl + "_out"] = jnp.where(real, out, 0.0)
  np.testing.assert_allclose(grads["splash_out"], grads["xla_out"], atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4),
               grads["splash"], grads["xla"])
  if packed:  # The documents are isolated: the packed result differs from the plain.
    plain = _attention("xla", x, pad, None, variables)
    assert not np.allclose(jnp.where(real, plain, 0.0), grads["xla_out"], atol=1e-3)


@splash_here
def test_splash_refuses_dropout_and_odd_lengths():
  cfg = ModelConfig(hidden_size=32, num_heads=2, num_layers=1, vocab_size=64,
                    attention_impl="splash")
  x, pad = jnp.ones((1, 128, 32)), jnp.ones((1, 128), jnp.int32)
  variables = bert.SelfAttention(cfg).init(jax.random.key(1), x,
                                             (pad, None), True)
  with pytest.raises(ConfigError, match="attention_dropout_rate=0.0"):
    bert.SelfAttention(cfg).apply(variables, x, (pad, None), False,
                                    rngs={"dropout": jax.random.key(0)})
  with pytest.raises(ConfigError, match="divisible by 128"):
    bert.SelfAttention(cfg).apply(variables, x[:, :96], (pad[:, :96], None),
                                    True)


@pytest.mark.slow
@needs_libtpu
@splash_here
def test_splash_compiles_for_tpu_per_shard(v5e_4):
  """The train step with splash attention, batch over 'data' and heads over 'tensor':
  the TPU compiler gets the Pallas kernels (forward, dq, dkv per layer) and no
  [B, heads, T, T] buffer."""
  config = _tiny((2, 1, 2), attention_impl="splash", attention_dropout_rate=0.0,
                 max_position_embeddings=256, num_layers=1)
  config.data.max_seq_length = 256
  _, compiled, _ = plan_lib.compile_step(config, v5e_4.devices, 8)
  text = compiled.as_text()
  assert text.count("tpu_custom_call") >= 3 * config.model.num_layers
  # Per shard: 4 rows, 1 head; the XLA path has f32[4,1,256,256] scores and masks.
  assert not re.search(r"\[4,1,256,256\]", text)


@pytest.mark.skipif(any(importlib.util.find_spec(p) for p in CUDA_PLUGINS)
                    or os.environ.get("BERTJAX_TEST_PLATFORM", "cpu") != "cpu",
                    reason="an accelerator host (a CUDA jax plugin installed, or "
                    "BERTJAX_TEST_PLATFORM set): without JAX_PLATFORMS, JAX rightly "
                    "picks the accelerator")
def test_cpu_only_runs_stay_on_the_cpu_with_libtpu_installed():
  """Without JAX_PLATFORMS and without an accelerator, importing bertjax keeps JAX on
  the CPU: no TPU runtime starts, so none of libtpu's warnings."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  proc = subprocess.run([sys.executable, "-c", "import bertjax, jax; "
                         "print(jax.default_backend())"],
                        capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
  assert proc.returncode == 0 and proc.stdout.strip() == "cpu", proc.stderr
  assert "TPU" not in proc.stderr and "libtpu" not in proc.stderr, proc.stderr


@pytest.mark.slow
@needs_libtpu
@splash_here
def test_modernbert_scanned_splash_compiles_for_tpu(v5e_4):
  """ModernBERT's scanned blocks pick global / windowed attention with `lax.cond`: the
  TPU compiler gets splash kernels in both branches (block 0: forward, dq, dkv; the
  scanned body: those of the global and of the windowed branch) with packed rows'
  segment ids, and no [T, T] buffer at a length 4x the window."""
  from configs import modernbert_tiny  # pylint: disable=g-import-not-at-top
  config = modernbert_tiny.get_config()
  config.model.update(hidden_size=128, num_heads=2, intermediate_size=192, vocab_size=512,
                      num_layers=4, local_attention=128, max_position_embeddings=512,
                      dtype="bfloat16", attention_impl="splash", scan_layers=True)
  config.data.max_seq_length, config.data.max_predictions_per_seq = 512, 64
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
  assert plan_lib.batch_spec(config, 4)["segment_ids"][0] == (4, 512)  # Packed rows.
  _, compiled, _ = plan_lib.compile_step(config, v5e_4.devices, 4)
  text = compiled.as_text()
  assert text.count(" conditional(") == 2  # The scanned body's forward and backward.
  assert text.count('custom_call_target="tpu_custom_call"') == 3 + 2 * 3
  assert not re.search(r"\b512,512\]", text)


@pytest.mark.slow
@needs_libtpu
@splash_here
@pytest.mark.parametrize("family", ["gte", "nomic_bert"])
def test_post_ln_rotary_families_compile_for_tpu(v5e_4, family):
  """GTE's and NomicBERT's tiny recipes (post-LN blocks, rotary q / k, gated MLPs),
  scanned, with splash attention: the scanned body's forward, dq and dkv kernels, and
  no [T, T] buffer at 512 tokens (GTE's rows packed with documents isolated)."""
  import importlib  # pylint: disable=g-import-not-at-top
  config = importlib.import_module(f"configs.{family}_tiny").get_config()
  config.model.update(hidden_size=128, num_heads=2, intermediate_size=192, vocab_size=512,
                      num_layers=2, max_position_embeddings=512, dtype="bfloat16",
                      attention_impl="splash", scan_layers=True)
  config.data.max_seq_length, config.data.max_predictions_per_seq = 512, 64
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
  assert ("segment_ids" in plan_lib.batch_spec(config, 4)) == (family == "gte")
  _, compiled, _ = plan_lib.compile_step(config, v5e_4.devices, 4)
  text = compiled.as_text()
  assert text.count('custom_call_target="tpu_custom_call"') == 3
  assert not re.search(r"\b512,512\]", text)


@needs_libtpu
def test_a_rerankers_plan_compiles_its_groups_for_tpu(v5e_4):
  """configs/finetune/rerank.py plans as fine-tuning trains it: a batch of groups of
  task.group_size (query, document) pairs [B, G, T] on the TPU compiler, whose FLOPs
  bound the model FLOPs of B * G pairs; without a group size, one line."""
  from configs.finetune import rerank as rerank_config
  config = rerank_config.get_config("bert_tiny")
  config.model.update(dtype="bfloat16", num_layers=1)
  config.task.update(group_size=4, max_seq_length=32)
  spec = plan_lib.batch_spec(config, 8)
  assert spec["input_ids"] == ((8, 4, 32), np.int32) and spec["pair_mask"][0] == (8, 4)
  assert plan_lib.row_length(config) == 32
  r = plan_lib.plan(config, v5e_4, 8)
  assert r["fits"] and r["per_chip_batch"] == 2
  assert r["model_flops"] <= r["flops"] < 2 * r["model_flops"], r
  config.task.group_size = 0
  with pytest.raises(ConfigError, match="group_size") as e:
    plan_lib.batch_spec(config, 8)
  assert "\n" not in str(e.value)
