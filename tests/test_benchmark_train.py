"""`benchmark train`'s parts for the GPU comparison, on the CPU: token types and packed
rows per family, the Hugging Face class and FLOPs per family (RoBERTa / XLM-R: one
token type, finite losses on both sides; ModernBERT: the whole CLI against
ModernBertForMaskedLM; ELECTRA's generator and discriminator against transformers'
pair), the largest-batch search, the command of a try in its own
process, and the GPU peaks per exact device kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from bertjax.benchmarks import flops
from bertjax.benchmarks import train as bench
from bertjax import model as model_lib, objectives as objectives_lib
from bertjax.errors import ConfigError
from configs import bert_tiny, deberta_tiny, electra_tiny, modernbert_tiny, roberta_base
from tests.test_readme import documented

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny(module):
  c = module.get_config()
  c.model.update(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                 vocab_size=128, dtype="float32")
  return c


def test_token_types_and_packed_rows_follow_the_family():
  bert, roberta = _tiny(bert_tiny), _tiny(roberta_base)
  b = bench.synthetic_batch(bert, 2, 12, 3, ("next_sentence_labels",))
  assert b["token_type_ids"].tolist() == [[0] * 6 + [1] * 6] * 2  # Segments A and B.
  r = bench.synthetic_batch(roberta, 2, 12, 3, docs_per_row=3)
  assert not r["token_type_ids"].any() and "next_sentence_labels" not in r
  assert r["segment_ids"][0].tolist() == [1] * 4 + [2] * 4 + [3] * 4
  offset = roberta.model.position_offset  # Positions restart past the padding index.
  assert r["position_ids"][0].tolist() == [offset + i for i in range(4)] * 3
  assert "segment_ids" not in b and r["input_ids"].min() >= 5  # No padding id.
  m = bench.synthetic_batch(_tiny(modernbert_tiny), 2, 12, 3, docs_per_row=2)
  assert not m["token_type_ids"].any()  # ModernBERT has none (its model ignores them).
  assert m["position_ids"][0].tolist() == list(range(6)) * 2  # Rotary: from 0.


def test_hugging_face_class_and_flops_per_family():
  bert, roberta = _tiny(bert_tiny), _tiny(roberta_base)
  assert bench.hf_model_class(bert) == "BertForPreTraining"
  assert bench.hf_model_class(roberta) == "RobertaForMaskedLM"
  bert.objectives = ("mlm",)
  assert bench.hf_model_class(bert) == "BertForMaskedLM"
  cfg = objectives_lib.from_config(roberta).model  # MLM alone: no NSP head.
  hf = bench.hf_flops(roberta, 4, 16)  # MLM logits everywhere, no pooler.
  assert hf == flops.train_flops(cfg, 4, 16, 16) and hf["pooler_nsp"] == 0
  modern = _tiny(modernbert_tiny)
  assert bench.hf_model_class(modern) == "ModernBertForMaskedLM"
  assert bench.hf_flops(modern, 4, 16) == flops.train_flops(
      model_lib.config_from(modern.model), 4, 16, 16)


@pytest.mark.slow
def test_roberta_steps_are_finite_on_both_sides():
  """type_vocab_size=1: token types all 0 (1s gave NaN here and an index error in
  PyTorch)."""
  config = _tiny(roberta_base)
  config.train.batch_size = 4
  config.model.max_position_embeddings = 16 + config.model.position_offset
  for name, (step, finish) in (
      ("bertjax", bench.bench_bertjax(config, 4, 16, 3, jax.devices()[:1])),
      ("hf", bench.bench_hf(config, 4, 16, 3, bf16=False))):
    step()
    assert np.isfinite(finish()["loss"]), name


@pytest.mark.slow
def test_electra_pair_against_transformers_pair():
  """'rtd': ELECTRA's generator and discriminator on both sides, the embeddings tied
  the same way (equal parameter counts), finite losses; Hugging Face's FLOPs are both
  networks' with the generator's logits at every position. DeBERTa-v3's pair has no
  transformers class: one line."""
  config = electra_tiny.get_config()
  config.model.dtype = "float32"
  config.train.batch_size = 4
  assert bench.hf_model_class(config) == "ElectraForPreTraining"
  assert bench.hf_flops(config, 4, 16) == objectives_lib.from_config(
      config).train_flops(4, 16, 16)
  runs = {name: (step(), finish())[1] for name, (step, finish) in (
      ("bertjax", bench.bench_bertjax(config, 4, 16, 3, jax.devices()[:1])),
      ("hf", bench.bench_hf(config, 4, 16, 3, bf16=False)))}
  assert runs["hf"]["model_class"] == "ElectraForMaskedLM + ElectraForPreTraining"
  assert runs["hf"]["params"] == runs["bertjax"]["params"]
  assert all(np.isfinite(r["loss"]) for r in runs.values())
  with pytest.raises(ConfigError, match=r"transformers has no class that pretrains the "
                     r"deberta discriminator"):
    bench.hf_model_class(deberta_tiny.get_config())


def test_largest_batch_doubles_then_bisects():
  tried = []

  def fits(batch):
    tried.append(batch)
    return batch <= 52

  best, tries = bench.largest_batch(fits, 8, unit=4, tolerance=0.0, cap=4096)
  assert best == 52 and [b for b, _ in tries] == tried and tried[:4] == [8, 16, 32, 64]
  assert len(tried) <= 8
  best, _ = bench.largest_batch(fits, 256, unit=4, tolerance=0.0, cap=4096)  # Halving.
  assert best == 52
  assert bench.largest_batch(fits, 8, unit=4, tolerance=0.0, cap=32)[0] == 32  # Capped.
  assert bench.largest_batch(lambda b: False, 8, unit=4, tolerance=0.0, cap=64)[0] == 0
  best, tries = bench.largest_batch(fits, 8, unit=4, tolerance=0.25, cap=4096)
  assert 48 <= best <= 52 and len(tries) < len(tried)


def test_a_try_runs_one_framework_with_this_runs_recipe(monkeypatch):
  monkeypatch.setattr(sys, "argv", ["benchmark.py", "train", "--config=configs/bert_base.py",
                                    "--config.model.attention_dropout_rate=0.0",
                                    "--compare=hf", "--max_batch", "--batch=64"])
  cmd = bench.probe_command("hf", 128, 512, bf16=True, docs_per_row=4)
  assert cmd[1:4] == ["-m", "bertjax.benchmark", "train"]
  assert cmd[4:6] == ["--config=configs/bert_base.py",
                      "--config.model.attention_dropout_rate=0.0"]
  assert {"--only=hf", "--batch=128", "--seq=512", "--dtype=bf16", "--docs_per_row=4"} <= set(
      cmd)
  assert not {"--compare=hf", "--max_batch", "--batch=64"} & set(cmd)


@pytest.mark.parametrize("kind,name,peak", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", "H100 NVL", 835.0),
    ("NVIDIA H200", "H200 SXM", 989.0),
    ("NVIDIA H200 NVL", "H200 NVL", 835.0),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB", 312.0),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 312.0),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB", 312.0),
    ("NVIDIA GH200 480GB", None, None),  # Not listed: no H200 figures for it.
])
def test_gpu_peaks_per_exact_device_kind(kind, name, peak):
  device = type("Device", (), {"device_kind": kind})()
  chip = flops.chip(device)
  assert (chip and chip.name) == name and flops.device_peak_tflops(device) == peak
  if chip:
    assert "datasheet" in chip.source and chip.hbm_bytes >= 40e9


@pytest.mark.slow
def test_modernbert_cli_against_hugging_face(tmp_path):
  """reports/training_step.md's `taskset -c 0 ... benchmark train --compare=hf` on modernbert_tiny,
  shrunk (4 blocks: 0 and 3 global, a 16-token half-window in 1 and 2, T=64):
  ModernBertForMaskedLM with our parameters' shapes, finite losses, ModernBERT's FLOPs
  (Hugging Face's with the MLM logits at every position), the recipe's 30% masked
  positions, a speed-up."""
  out = tmp_path / "bench.json"
  cmd = documented("reports/training_step.md", "--config=configs/modernbert_tiny.py --steps=8 --compare=hf",
                   "--config.model.hidden_size=32", "--config.model.num_heads=2",
                   "--config.model.intermediate_size=48", "--config.model.vocab_size=128",
                   "--batch=4", "--seq=64", "--steps=2", "--warmup=1", f"--json={out}")
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                        env={**os.environ, "JAX_NUM_CPU_DEVICES": "1"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "speed-up vs Hugging Face" in proc.stdout
  result = json.loads(out.read_text())
  c = modernbert_tiny.get_config()
  c.model.update(hidden_size=32, num_heads=2, intermediate_size=48, vocab_size=128)
  cfg = model_lib.config_from(c.model)
  assert result["config"]["family"] == "modernbert" and result["masked_positions"] == 19
  assert result["flops_per_step"] == flops.train_flops(cfg, 4, 64, 19)
  assert result["hf_flops_per_step"] == flops.train_flops(cfg, 4, 64, 64)
  assert result["hf"]["model_class"] == "ModernBertForMaskedLM"
  assert result["hf"]["params"] == result["bertjax"]["params"]
  for name in ("bertjax", "hf"):
    assert np.isfinite(result[name]["loss"]) and 0 < result[name]["mfu"] <= 1
  assert result["speedup_vs_hf"] > 0


def test_bert_tiny_one_core_command_is_the_first_one_pinned():
  """reports/training_step.md's one-core `taskset -c 0 ... benchmark train` of bert_tiny is its first
  `benchmark train --compare=hf` pinned to core 0: the same program and flags, which
  tests/test_flops.py's test_benchmark_cli_on_bert_tiny runs on one device."""
  one_core = documented("reports/training_step.md", "taskset -c 0 python -m bertjax.benchmark train "
                        "--config=configs/bert_tiny.py --steps=8 --compare=hf")
  assert one_core[:3] == ["taskset", "-c", "0"]
  assert one_core[3:] == documented("reports/training_step.md", "python -m bertjax.benchmark train "
                                    "--config=configs/bert_tiny.py --steps=8 --compare=hf")
