"""How multi-process jobs are launched and tested: 2 processes x 4 CPU devices on
localhost (gloo collectives) through the real CLI (`_launch`, used by
test_reliability_multihost.py and test_reliability_finetune.py), the explicit
coordinator flags, and the launch/ scripts. Run as `python -m tests.test_multihost
ARGS` this file is the worker: `bertjax.main` with each fed training batch's rows
recorded."""

import functools
import hashlib
import json
import os
import subprocess
import sys
import time

import portpicker
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 240


def _worker_main() -> None:
  """bertjax.main, recording a hash of every training row this process feeds."""
  from bertjax.console import cli
  from bertjax import main
  from bertjax.train import program
  from bertjax.train import trainer

  put_batch = trainer.put_train_batch
  record = open(os.environ["BERTJAX_TEST_RECORD"], "a")

  def recording_put_batch(batch, sharding):
    rows = [hashlib.sha1(batch["input_ids"][i].tobytes()
                         + batch["masked_lm_positions"][i].tobytes()).hexdigest()
            for i in range(len(batch["input_ids"]))]
    record.write(json.dumps(rows) + "\n")
    record.flush()
    return put_batch(batch, sharding)

  trainer.put_train_batch = recording_put_batch
  cli.run(main.main, flags_parser=program.parse_flags)


def _launch(workdir, tmp, run, extra, config="configs/bert_tiny.py",
            module="tests.test_multihost", processes=2, environ=None):
  """Starts the processes of a job (2 x 4 CPU devices, or 1 x 8 joined the same way:
  gloo collectives): `python -m MODULE --config=CONFIG EXTRA...`, in `environ` (this
  process's environment when None)."""
  port = portpicker.pick_unused_port()
  procs = []
  for i in range(processes):
    env = dict(os.environ if environ is None else environ,
               JAX_NUM_CPU_DEVICES=str(8 // processes), JAX_PLATFORMS="cpu",
               BERTJAX_TEST_RECORD=os.path.join(tmp, f"rows_{run}_{i}.jsonl"))
    cmd = [sys.executable, "-m", module, f"--config={config}",
           f"--workdir={workdir}", f"--coordinator_address=127.0.0.1:{port}",
           f"--num_processes={processes}", f"--process_id={i}", *extra]
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  return procs


def _finish(procs):
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=TIMEOUT)[0])
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  return outs


def _wait_for_steps(procs, workdir, n: int) -> None:
  """Until the job's metrics.jsonl holds `n` train records (or a process ended, or
  TIMEOUT passed)."""
  from tests.faults import losses
  deadline = time.time() + TIMEOUT
  while time.time() < deadline and all(p.poll() is None for p in procs):
    if os.path.exists(os.path.join(workdir, "metrics.jsonl")) and len(losses(workdir)) >= n:
      return
    time.sleep(0.05)


def _rows(tmp, run, i):
  with open(os.path.join(tmp, f"rows_{run}_{i}.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_explicit_coordinator_needs_process_count_and_index():
  from bertjax.errors import ConfigError
  from bertjax.parallel import distributed
  with pytest.raises(ConfigError, match="needs --num_processes >= 1 and --process_id"):
    distributed.initialize("127.0.0.1:1234", num_processes=2, process_id=2)
  distributed.initialize()  # No coordinator, no --multihost: one process, nothing joined.
  import jax
  assert jax.process_count() == 1

# --- launch/ scripts, with fake gcloud / srun / python on PATH that record their argv.

FAKE = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
  f.write(json.dumps({"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
                      "devices": os.environ.get("JAX_NUM_CPU_DEVICES")}) + "\\n")
"""


def _run_script(tmp_path, args, env=None):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  for tool in ("gcloud", "srun", "fakepython"):
    (bin_dir / tool).write_text(FAKE)
    (bin_dir / tool).chmod(0o755)
  log = tmp_path / "calls.jsonl"
  log.unlink(missing_ok=True)
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(log),
             **(env or {}))
  proc = subprocess.run(["bash", *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  return [json.loads(line) for line in log.read_text().splitlines()]


@functools.cache
def _main_flags() -> set[str]:
  """The flags bertjax.main takes, `bertjax.train.program`'s (in a subprocess: absl
  flags are process-global)."""
  code = ("from absl import flags; import bertjax.main; from bertjax.train import program "
          "as m; print(' '.join(f.name for f in flags.FLAGS.get_flags_for_module(m)))")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                       text=True, timeout=60, check=True).stdout
  return set(out.split())


def _check_main_command(argv):
  """`... -m bertjax.main FLAGS`: every flag is one of bertjax.main's, the config file
  exists and every --config.a.b override names a field of it. Returns the flags."""
  import importlib.util
  import shlex

  argv = shlex.split(argv) if isinstance(argv, str) else argv
  args = argv[argv.index("bertjax.main") + 1:]
  args = args[:next((i for i, a in enumerate(args) if a in (">", "&&", ";")), len(args))]
  known = _main_flags()
  values = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in args)
  assert all(a.startswith("--") for a in args), args
  spec = importlib.util.spec_from_file_location("recipe", os.path.join(REPO, values["config"]))
  recipe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(recipe)
  config = recipe.get_config()
  for name in values:
    if name.startswith("config."):
      node = config
      for part in name.split(".")[1:]:
        assert part in node, f"{name}: no such config field"
        node = node[part]
    else:
      assert name in known, f"--{name} is not a flag of bertjax.main"
  return values


def test_tpu_pod_script_creates_installs_runs_and_deletes(tmp_path):
  calls = _run_script(tmp_path, [
      "launch/tpu_pod.sh", "all", "bert-large", "us-central2-b", "v4-32",
      "configs/bert_large.py", "gs://bucket/bert_large", "--config.mesh.fsdp=-1",
      "--config.mesh.data=1", "--config.data.corpus=/data/wiki/*.txt"])
  verbs = [c["argv"][4] for c in calls]
  assert [c["argv"][:4] for c in calls] == [["gcloud", "compute", "tpus", "tpu-vm"]] * 5
  assert verbs == ["create", "scp", "ssh", "ssh", "delete"]
  assert "--accelerator-type=v4-32" in calls[0]["argv"]
  assert all("--worker=all" in c["argv"] for c in calls[1:4])
  run = calls[3]["argv"][calls[3]["argv"].index("--command") + 1]
  values = _check_main_command(run)
  assert values["workdir"] == "gs://bucket/bert_large" and "multihost" in values
  assert values["config.data.corpus"] == "/data/wiki/*.txt"


def test_slurm_script_runs_one_process_per_gpu(tmp_path):
  calls = _run_script(tmp_path, ["launch/slurm_gpu.sbatch", "configs/bert_base.py",
                                 "/shared/bert_base", "--config.mesh.dcn_data=2"])
  (srun,) = calls
  assert srun["argv"][0] == "srun"
  values = _check_main_command(srun["argv"])
  assert "multihost" in values and values["config.mesh.dcn_data"] == "2"
  script = open(os.path.join(REPO, "launch", "slurm_gpu.sbatch")).read()
  assert "#SBATCH --ntasks-per-node=8" in script and "#SBATCH --gpus-per-node=8" in script


def test_local_script_starts_every_process(tmp_path):
  calls = _run_script(tmp_path, ["launch/local.sh", "3", "configs/bert_tiny.py",
                                 str(tmp_path / "wd"), "--config.train.num_steps=5"],
                      env={"PYTHON": "fakepython", "DEVICES_PER_PROCESS": "2"})
  assert len(calls) == 3 and all(c["devices"] == "2" for c in calls)
  values = [_check_main_command(c["argv"]) for c in calls]
  assert sorted(v["process_id"] for v in values) == ["0", "1", "2"]
  assert all(v["num_processes"] == "3" and v["coordinator_address"].startswith("127.0.0.1:")
             for v in values)


if __name__ == "__main__":
  _worker_main()
