"""The FLOP counter against a hand count (and every family's against XLA's cost
analysis: tests/test_family_conformance.py), and the benchmark's FLOPs and MFU."""

from __future__ import annotations

import json
import os
import subprocess

import jax
import jax.numpy as jnp
import pytest

from bertjax import objectives as objectives_lib
from bertjax.benchmarks import flops
from bertjax.model import ModelConfig
from bertjax.train import optimizer, objective, state as state_lib, step as step_lib
from tests.helpers import synthetic_batch, tiny_config
from tests.rtd_helpers import rtd_config
from tests.test_readme import documented


def _xla_train_step_flops(config):
  """(the run's objectives, XLA's FLOP count of its jitted train step on a batch of 8)."""
  objectives, tx = objectives_lib.from_config(config), optimizer.create_optimizer(config.train)
  state = state_lib.abstract_state(config)[0]
  batch = jax.tree.map(jnp.asarray, synthetic_batch(config, 8))
  train_step = step_lib.make_train_step(
      objective.objective(objectives), tx, optimizer.learning_rate_schedule(config.train))
  return objectives, jax.jit(train_step).lower(state, batch, jnp.int32(0)).compile(
      ).cost_analysis()["flops"]


def test_hand_count_for_a_tiny_config():
  """L=2 E=4 M=8 V=10, B=3 T=5 P=2: every matmul written out, 2*m*k*n forward, x3."""
  cfg = ModelConfig(vocab_size=10, hidden_size=4, num_layers=2, num_heads=2,
                    intermediate_size=8)
  B, T, P = 3, 5, 2
  forward = 0
  for _ in range(2):  # layers
    forward += 4 * (2 * (B * T) * 4 * 4)  # query, key, value, output: [BT,4] @ [4,4]
    forward += 2 * (B * T) * 4 * 8 + 2 * (B * T) * 8 * 4  # intermediate, output
    forward += 2 * B * 2 * (2 * T * 2 * T)  # QK^T and PV, B rows x 2 heads, [T,2]@[2,T]
  forward += 2 * (B * P) * 4 * 4 + 2 * (B * P) * 4 * 10  # MLM transform, tied decoder
  forward += 2 * B * 4 * 4 + 2 * B * 4 * 2  # pooler, NSP
  assert forward == 10896
  assert flops.train_flops(cfg, B, T, P)["total"] == 3 * forward


def test_no_pooler_no_nsp_terms():
  cfg = ModelConfig(vocab_size=10, hidden_size=4, num_layers=1, num_heads=1,
                    intermediate_size=8, pooler=False, nsp=False)
  assert flops.train_flops(cfg, 2, 3, 1)["pooler_nsp"] == 0


@pytest.mark.parametrize("recipe", ["bert", "modernbert"])
def test_a_runs_count_is_its_models(recipe):
  """A run's objectives count the FLOPs of its model (`train_flops`; each family's
  count against XLA's: tests/test_family_conformance.py::test_train_flops_agree_with_xla)."""
  config = tiny_config() if recipe == "bert" else _modernbert_tiny(64)
  objectives = objectives_lib.from_config(config)
  for seq in (32, 64):
    ours = objectives.train_flops(8, seq, seq // 8)
    assert ours["total"] == flops.train_flops(objectives.model, 8, seq, seq // 8)["total"]
    assert ours["total"] > 0


@pytest.mark.slow
def test_rtd_agrees_with_xla_cost_analysis():
  """Replaced-token detection's jitted train step (a generator of half the
  discriminator's width, 23% of our count, and the discriminator at every position) as
  XLA counts it: ours is at most XLA's and within 12% of it (XLA's is 1.09x ours here;
  it counts the elementwise work we leave out: GELU, LayerNorm, softmax, the Gumbel
  sampling, AdamW), so a network left out (1.4x) or counted twice (0.9x) fails."""
  config = rtd_config()
  config.model.update(hidden_size=128, embedding_size=128, num_heads=2, intermediate_size=512,
                      vocab_size=512, max_position_embeddings=128, num_layers=2)
  config.generator.update(hidden_size=64, num_heads=1, intermediate_size=256)
  config.data.max_seq_length, config.data.max_predictions_per_seq = 128, 16
  objectives, xla = _xla_train_step_flops(config)
  ours = objectives.train_flops(8, 128, 16)["total"]
  assert 1.0 <= xla / ours < 1.12, (xla, ours)


def test_device_peaks():
  class Fake:
    def __init__(self, kind):
      self.device_kind = kind
  assert flops.device_peak_tflops(Fake("NVIDIA H100 80GB HBM3")) == 989.0
  assert flops.device_peak_tflops(Fake("TPU v5 lite")) == 197.0
  assert flops.device_peak_tflops(Fake("TPU v5")) == 459.0
  assert flops.device_peak_tflops(Fake("cpu")) is None
  # MFU's denominator is the peak of every device the step ran on.
  peak, source = flops.peak_tflops([Fake("NVIDIA H100 80GB HBM3")] * 8)
  assert peak == 8 * 989.0 and "x 8 devices" in source
  one = flops.measure_matmul_tflops(size=256, repeats=2)
  assert one > 0 and flops.measure_matmul_tflops(size=256, repeats=2,
                                                 devices=jax.devices()) > 0


# reports/training_step.md's commands of `benchmark train --compare=hf` on bert_tiny, shrunk (later
# flags win): 2 layers of hidden 32, batches of 8 x 32, 2 timed steps.
TINY = ("--config.model.num_layers=2", "--config.model.hidden_size=32",
        "--config.model.num_heads=2", "--config.model.intermediate_size=64",
        "--config.model.vocab_size=128", "--batch=8", "--seq=32", "--steps=2", "--warmup=1")


@pytest.mark.slow
def test_benchmark_cli_with_hf_comparison(tmp_path):
  """reports/training_step.md's `python -m bertjax.benchmark train --compare=hf` of a 4-layer model
  at hidden 512, shrunk, on 8 CPU devices: the JSON holds both frameworks' timings,
  each one's FLOP count (Hugging Face's with the MLM logits at every position), MFU
  within (0, 1] against the peak of all 8 devices together (measured: they share the
  CPU's cores) and a speed-up."""
  out = tmp_path / "bench.json"
  cmd = documented("reports/training_step.md", "--config.model.num_layers=4 --config.model.hidden_size=512",
                   *TINY, f"--json={out}")
  env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8"}
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300,
                        cwd=os.path.dirname(os.path.dirname(__file__)))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "speed-up vs Hugging Face" in proc.stdout
  result = json.loads(out.read_text())
  cfg = ModelConfig(vocab_size=128, hidden_size=32, num_layers=2, num_heads=2,
                    intermediate_size=64, max_position_embeddings=128)
  assert result["flops_per_step"]["total"] == flops.train_flops(cfg, 8, 32, 5)["total"]
  assert result["hf_flops_per_step"]["total"] == flops.train_flops(cfg, 8, 32, 32)["total"]
  assert result["num_devices"] == 8 and "all 8 devices" in result["peak_source"]
  for name, step_flops in (("bertjax", result["flops_per_step"]),
                           ("hf", result["hf_flops_per_step"])):
    r = result[name]
    assert len(r["step_s"]) == 2 and r["devices"] == 8 and 0 < r["mfu"] <= 1
    achieved = step_flops["total"] / (sorted(r["step_s"])[0] + sorted(r["step_s"])[1]) * 2
    assert r["mfu"] == pytest.approx(achieved / 1e12 / result["peak_tflops"])
  assert result["speedup_vs_hf"] > 0 and result["bertjax"]["compile_s"] > 0
  assert result["speedup_basis"] == "same CPU cores"


# ---- ModernBERT: GeGLU, global and windowed layers ---------------------------------

def _modernbert_tiny(seq: int, **model):
  from configs import modernbert_tiny  # pylint: disable=g-import-not-at-top
  config = modernbert_tiny.get_config()
  config.model.update(hidden_size=128, num_heads=2, intermediate_size=256, vocab_size=512,
                      num_layers=4, local_attention=32, max_position_embeddings=seq,
                      dtype="float32", **model)
  config.data.max_seq_length, config.data.max_predictions_per_seq = seq, seq // 8
  return config


@pytest.mark.parametrize("seq,window", [(7, 2), (7, 3), (7, 6), (7, 9), (128, 16), (5, 0)])
def test_modernbert_attention_pairs_are_the_masks_pairs(seq, window):
  """The pairs a windowed layer scores are the ones attention's reference mask keeps
  (|i - j| <= w, both ends, rows cut at the edges), whatever T against w."""
  from bertjax.model import attention, stack  # pylint: disable=g-import-not-at-top
  mask = attention.xla_mask(jnp.ones((1, seq), jnp.int32), None, window)
  assert stack.attention_pairs(seq, window) == int(jnp.sum(mask))
  assert stack.attention_pairs(seq, None) == seq * seq


def test_modernbert_hand_count():
  """L=3 (block 0 global, 1 and 2 windowed: every 3rd global) E=4 N=2 M=6 V=10,
  B=2 T=7 P=3, window 2 each side: every matmul written out, 2*m*k*n forward, x3."""
  from bertjax.model import modernbert  # pylint: disable=g-import-not-at-top
  cfg = modernbert.ModernBertConfig(vocab_size=10, hidden_size=4, num_layers=3,
                                    num_heads=2, intermediate_size=6, local_attention=4,
                                    pad_token_id=0)
  B, T, P, E, M, V, D = 2, 7, 3, 4, 6, 10, 2
  local_pairs = sum(min(i + 2, T - 1) - max(i - 2, 0) + 1 for i in range(T))  # 29
  forward = 0
  for layer in range(3):
    forward += 2 * (B * T) * E * (3 * E) + 2 * (B * T) * E * E  # Wqkv, Wo
    forward += 2 * (B * T) * E * (2 * M) + 2 * (B * T) * M * E  # GeGLU Wi (input, gate), Wo
    pairs = T * T if layer == 0 else local_pairs
    forward += 2 * B * 2 * (2 * D * pairs)  # QK^T and PV: B rows x 2 heads, 2D a pair
  forward += 2 * (B * P) * E * E + 2 * (B * P) * E * V  # MLM transform, tied decoder
  assert local_pairs == 29 and forward == 15520
  assert flops.train_flops(cfg, B, T, P)["total"] == 3 * forward


@pytest.mark.slow
def test_benchmark_cli_on_bert_tiny(tmp_path):
  """reports/training_step.md's first `benchmark train --compare=hf` (bert_tiny as configured,
  shrunk), on one device as a user's CPU is: both frameworks timed, a speed-up printed.
  (Its one-core `taskset -c 0` form is the same command: test_benchmark_train.py.)"""
  proc = subprocess.run(documented(
      "reports/training_step.md", "python -m bertjax.benchmark train --config=configs/bert_tiny.py "
      "--steps=8 --compare=hf", *TINY), capture_output=True, text=True, timeout=300,
      cwd=os.path.dirname(os.path.dirname(__file__)),
      env={**os.environ, "JAX_NUM_CPU_DEVICES": "1"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "speed-up vs Hugging Face" in proc.stdout
