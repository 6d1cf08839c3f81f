"""`python -m benchmarks gpu`, the one-call GPU check, on the CPU: its dry run
(the same parts and flags at tiny sizes) writes the table and the JSON with every part
ok or skipped with its reason; a part that fails, hangs or finds the budget spent is
recorded and the next one runs; the real plan passes no flag the dry run does not
exercise; pytest's counts and the profile's categories are read right."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from benchmarks import gpu, gpu_report
from bertjax.benchmarks import trace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One part of each kind, a train part with the profile and one against Hugging Face
# (the other train parts differ from these only in their flags' values, which
# test_real_plan_passes_the_dry_runs_flags checks).
DRY_PARTS = "smoke,bert_base_128,levers,tests,modernbert_1024_hf,kernels,memory"


@pytest.mark.slow
def test_dry_run_writes_the_table_and_json_with_every_part_accounted(tmp_path):
  out = tmp_path / "out"
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks", "gpu", "--dry_run", f"--out={out}",
       f"--parts={DRY_PARTS}", "--cache_dir=",
       "--tests=tests/test_attention_paths.py::test_kernel_path"],
      cwd=REPO, capture_output=True, text=True, check=False, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((out / "gpu.json").read_text())
  parts = result["parts"]
  assert list(parts) == [p.name for p in gpu.plan(True, [])]
  for name, record in parts.items():
    if name in DRY_PARTS.split(","):
      assert record["status"] == "ok", (name, record.get("reason"))
    else:
      assert record["status"] == "skipped" and record["reason"], name
  table = (out / "gpu.txt").read_text()
  assert proc.stdout.rstrip().endswith(table.rstrip())  # The table is printed last.
  for heading in ("bertjax GPU check (dry run)", "train steps, float32",
                  "attention paths against float32 XLA", "packed rows, bf16 forward",
                  "one train step on cpu", "tests: 6 passed, 0 failed",
                  "levers on cpu, batch 2 x 32, float32"):
    assert heading in table, heading
  train = parts["modernbert_1024_hf"]["result"]
  assert train["docs_per_row"] == 4
  assert train["hf"]["model_class"] == "ModernBertForMaskedLM"
  assert parts["smoke"]["result"]["attention"]["cudnn"] == "skipped: cuDNN needs a GPU"
  assert parts["smoke"]["result"]["init_threefry_kernel"].startswith("the same ")
  ours = parts["bert_base_128"]["result"]["bertjax"]
  assert ours["profile"]["device_ms"]["matmuls"] > 0
  assert set(ours["startup_s"]) == {"setup", "init (compiled and run)", "trace", "compile"}
  assert (out / "tests.log").exists() and (out / "profile.xplane.pb").exists()
  levers = parts["levers"]["result"]["variants"]
  assert levers["activations_saved"]["step_ms_pipelined"] > 0
  assert levers["base"]["kernel_GB"]["total"]["GB"] > 0


@pytest.mark.slow
def test_parts_that_fail_hang_or_lack_time_are_recorded(tmp_path):
  py = lambda code: ["-c", code]  # noqa: E731
  sleep = py("import time; time.sleep(60)")
  parts = [gpu.Part("hangs", "x", sleep, cap_s=2, need_s=1),
           gpu.Part("fails", "x", py("print('step 1'); raise SystemExit('error: boom')"),
                    cap_s=30, need_s=1),
           gpu.Part("writes", "x", py("import json, sys; json.dump({'a': 1}, "
                                      "open(sys.argv[1], 'w'))") + ["{json}"], cap_s=30,
                    need_s=1),
           gpu.Part("takes_the_rest", "x", sleep, cap_s=60, need_s=1),
           gpu.Part("late", "x", py("pass"), cap_s=30, need_s=0.5)]
  records = gpu.run_parts(parts, budget_s=6, out=str(tmp_path), env=dict(os.environ))
  assert records["hangs"]["status"] == "timed out" and records["hangs"]["seconds"] < 5
  assert records["fails"] == {**records["fails"], "status": "failed",
                              "reason": "exit 1: error: boom"}
  assert records["writes"]["status"] == "ok" and records["writes"]["result"] == {"a": 1}
  assert records["takes_the_rest"]["status"] == "timed out"  # At the budget's end.
  assert records["late"]["status"] == "skipped"
  assert re.fullmatch(r"\d+ s of the budget left", records["late"]["reason"])


def _flags(argv: list[str]) -> set[str]:
  return {a.split("=")[0] for a in argv if a.startswith("--")}


def test_real_plan_passes_the_dry_runs_flags():
  """Every flag the GPU run passes is one the dry run passes (only values differ), and
  every recipe it names exists."""
  real, dry = gpu.plan(False, ["tests/test_attention.py"]), gpu.plan(True, [])
  assert [p.name for p in real] == [p.name for p in dry]
  for r, d in zip(real, dry):
    if r.kind != "tests":
      assert _flags(r.argv) <= _flags(d.argv), r.name
    for a in r.argv:
      if a.startswith("--config="):
        assert os.path.exists(os.path.join(REPO, a.split("=", 1)[1])), a
  assert not any(p.skip for p in real)


def test_the_tests_part_runs_its_first_files_then_every_other_once():
  first = ["tests/test_model.py", "tests/test_attention.py"]
  files = gpu.test_files(first)
  assert files[:2] == first and len(files) == len(set(files))
  assert set(files) == {os.path.relpath(p, REPO) for p in
                        glob.glob(os.path.join(REPO, "tests", "test_*.py"))}
  assert all(os.path.exists(os.path.join(REPO, p)) for p in gpu.GPU_TESTS)
  (part,) = [p for p in gpu.plan(False, first) if p.name == "tests"]
  assert part.argv[-len(files):] == files


def test_pytest_counts_of_a_finished_and_a_stopped_run():
  lines = ["tests/test_a.py::test_x PASSED                     [ 25%]",
           "tests/test_a.py::test_y[gpu] FAILED                [ 50%]",
           "tests/test_a.py::test_z SKIPPED (needs a TPU)      [ 75%]"]
  stopped = gpu_report.pytest_counts("\n".join(lines))
  assert (stopped["passed"], stopped["failed"], stopped["skipped"]) == (1, 1, 1)
  assert not stopped["finished"] and not stopped["ok"]
  assert stopped["summary"] == "1 passed, 1 failed, 1 skipped (stopped)"
  done = gpu_report.pytest_counts("\n".join(lines + [
      "FAILED tests/test_a.py::test_y[gpu] - AssertionError: 0.5 < 0.1",
      "=========== 1 failed, 1 passed, 1 skipped in 3.21s ==========="]))
  assert done["finished"] and done["failures"] == [
      {"test": "tests/test_a.py::test_y[gpu]", "reason": "AssertionError: 0.5 < 0.1"}]
  assert gpu_report.pytest_counts("tests/t.py::a PASSED\n== 1 passed in 0.1s ==")["ok"]
  workers = gpu_report.pytest_counts("\n".join([  # pytest-xdist's -v lines
      "[gw0] [ 25%] PASSED tests/test_b.py::test_b ",
      "[gw1] [ 75%] FAILED tests/test_c.py::test_c ",
      "[gw1] [100%] SKIPPED tests/test_c.py::test_d ",
      "FAILED tests/test_c.py::test_c - assert 0"]))
  assert (workers["passed"], workers["failed"], workers["skipped"]) == (1, 1, 1)
  assert workers["failures"] == [{"test": "tests/test_c.py::test_c", "reason": "assert 0"}]


def test_profile_categories_follow_the_model_scopes():
  """An op's category from the scope XLA records for it (BERT's and ModernBERT's module
  names), and a compiled program's matmuls found in its text."""
  step = "jit(train_step)/transpose(jvp(BertForPreTraining))/encoder/layer_3"
  assert trace.category(f"{step}/attention/vmap(BTNH,BSNH->BNTS)/dot_general", True) \
      == "attention"
  assert trace.category(f"{step}/attention/query/BTE,END->BTND/dot_general", True) \
      == "matmuls"
  assert trace.category("jit(train_step)/jvp(M)/encoder/layer_1/attn/pallas_call",
                        False) == "attention"
  assert trace.category("jit(train_step)/jvp(M)/encoder/layer_1/attn/Wo/dot_general",
                        True) == "matmuls"
  assert trace.category("jit(train_step)/jvp(M)/mlm/transform/dense/dot_general",
                        True) == "MLM head + loss"
  assert trace.category("jit(train_step)/jvp()/log", False) == "MLM head + loss"
  assert trace.category(f"{step}/output_norm/rsqrt", False) == "other"
  assert trace.category("jit(train_step)/mul", False) == "optimizer"
  assert trace.kernel_category("cudnn_generated_fort_native_sdpa_sm90") == "attention"
  assert trace.kernel_category("nvjet_hsh_256x128_2x1_v_bz_coopA_NNT") == "matmuls"
  assert trace.kernel_category("MemcpyH2D") == "host input"

  def f(x, w):
    with jax.named_scope("attention"):
      y = jnp.tanh(x @ w)
    return jnp.sum(y * 2.0)

  text = jax.jit(f).lower(jnp.ones((8, 8)), jnp.ones((8, 8))).compile().as_text()
  ops = trace.program_ops(text)
  assert any(op["matmul"] and "/attention/" in "/" + op["op_name"] + "/"
             for op in ops.values())
  assert not all(op["matmul"] for op in ops.values())
