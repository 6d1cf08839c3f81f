"""`python -m benchmarks finetune`: the generated task, and the whole benchmark
(bertjax.finetune, bucketed and by default, next to the Hugging Face reference, one
seed) on a tiny BERT."""

import json
import os
import subprocess

import pytest

from benchmarks import finetune
from tests.test_readme import documented

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


def _run(tiny_hf_bert, tmp_path, snippet, *extra):
  """reports/finetuning_speed.md's command holding `snippet` on the tiny BERT and 24 sentences of 2
  labels, one epoch: (what it printed, its JSON)."""
  out = tmp_path / "bench.json"
  cmd = documented("reports/finetuning_speed.md", snippet, f"--model={tiny_hf_bert}", "--labels=2",
                   "--train_per_label=8", "--dev_per_label=4", "--epochs=1", "--batch=8",
                   "--max_seq_length=32", f"--json={out}", *extra)
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO,
                        env={**os.environ, "JAX_NUM_CPU_DEVICES": "1"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout, json.loads(out.read_text())


@pytest.mark.slow
def test_the_documented_commands_in_one_run(tiny_hf_bert, tmp_path):
  """reports/finetuning_speed.md's three commands differ only in their seeds, batchings and
  torch's threads: one run with all of them (two seeds of bucketed and default batching,
  torch on one thread) covers each. Wall times, dev accuracies, the ratio to Hugging
  Face and the table."""
  commands = [documented("reports/finetuning_speed.md", s) for s in (
      "--batching=bucket,auto", "--seeds=0,1 --cache=cold", "--hf_threads=1")]
  rest = lambda cmd: [w for w in cmd if not w.startswith(  # noqa: E731
      ("--seeds", "--batching", "--hf_threads"))]
  assert rest(commands[0]) == rest(commands[1]) == rest(commands[2])
  printed, result = _run(tiny_hf_bert, tmp_path, "--batching=bucket,auto", "--seeds=0,1",
                         "--hf_threads=1")
  assert "| bertjax_bucket |" in printed and "| hf |" in printed
  assert "| bertjax_auto |" in printed
  assert result["config"]["train"] == 16 and result["config"]["dev"] == 8
  assert result["config"]["hf_threads"] == 1
  for name in ("bertjax_bucket", "bertjax_auto", "hf"):
    assert len(result["runs"][name]) == 2
    for run in result["runs"][name]:
      assert run["wall_s"] > 0 and run["cpu_s"] > 0 and 0 <= run["accuracy"] <= 1
      assert len(run["load"]) == 2
      # Compilation timed apart (cold cache: every program compiled; none for PyTorch).
      assert (0 < run["compile_s"] < run["wall_s"] and run["programs"] > 0) == (name != "hf")
  walls = lambda name: [run["wall_s"] for run in result["runs"][name]]  # noqa: E731
  ratio = result["bertjax_bucket"]["wall_ratio_vs_hf"]["mean"]
  assert ratio == pytest.approx(sum(
      a / b for a, b in zip(walls("bertjax_bucket"), walls("hf"))) / 2, rel=1e-12)
