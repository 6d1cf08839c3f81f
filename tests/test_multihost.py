"""A 2-process x 4-CPU-device job on localhost (gloo collectives) through the real CLI:
training proceeds with each process feeding its own disjoint rows, checkpoints are
written, SIGTERM to one process makes both save at the same step, and the restart
resumes from it. Run as `python -m tests.test_multihost ARGS` this file is the worker:
`bertjax.main` with each fed training batch's rows recorded."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import portpicker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 240


def _worker_main() -> None:
  """bertjax.main, recording a hash of every training row this process feeds."""
  from absl import app

  from bertjax import main
  from bertjax.parallel import mesh as mesh_lib

  put_batch = mesh_lib.put_batch
  record = open(os.environ["BERTJAX_TEST_RECORD"], "a")

  def recording_put_batch(batch, sharding):
    if "example_weights" not in batch:  # Training batches (eval batches carry it).
      rows = [hashlib.sha1(batch["input_ids"][i].tobytes()
                           + batch["masked_lm_positions"][i].tobytes()).hexdigest()
              for i in range(len(batch["input_ids"]))]
      record.write(json.dumps(rows) + "\n")
      record.flush()
    return put_batch(batch, sharding)

  mesh_lib.put_batch = recording_put_batch
  app.run(main.main, flags_parser=main._parse_flags)


def _launch(workdir, tmp, run, extra):
  port = portpicker.pick_unused_port()
  procs = []
  for i in range(2):
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="4", JAX_PLATFORMS="cpu",
               BERTJAX_TEST_RECORD=os.path.join(tmp, f"rows_{run}_{i}.jsonl"))
    cmd = [sys.executable, "-m", "tests.test_multihost", "--config=configs/bert_tiny.py",
           f"--workdir={workdir}", f"--coordinator_address=127.0.0.1:{port}",
           "--num_processes=2", f"--process_id={i}", *extra]
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


def _rows(tmp, run, i):
  with open(os.path.join(tmp, f"rows_{run}_{i}.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_two_processes_train_preempt_and_resume(tmp_path):
  from tests.test_loop import e2e_config, overrides, train_losses
  config = e2e_config()
  config.train.num_steps = 10_000  # Stopped by SIGTERM.
  config.train.eval_every = config.train.checkpoint_every = 10_000
  extra = [*overrides(config), "--config.mesh.data=-1", "--config.mesh.fsdp=2",
           "--config.mesh.dcn_data=2"]  # Each process one "slice": data 2x2, fsdp 2.
  workdir, tmp = str(tmp_path / "wd"), str(tmp_path)
  metrics = os.path.join(workdir, "metrics.jsonl")

  procs = _launch(workdir, tmp, 1, extra)
  deadline = time.time() + TIMEOUT
  while time.time() < deadline and all(p.poll() is None for p in procs):
    if os.path.exists(metrics) and len(train_losses(workdir)) >= 3:
      procs[1].send_signal(signal.SIGTERM)  # Not the coordinator: it must propagate.
      break
    time.sleep(0.05)
  outs = _finish(procs)
  saved = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints"))
                 if s.isdigit())
  assert len(saved) == 1 and 3 <= saved[0] < 10_000, (saved, outs[0][-2000:])
  step = saved[0]
  assert f"SIGTERM: saved step {step}" in outs[0]  # Only process 0 logs.
  assert "SIGTERM: saved step" not in outs[1]
  fed = [_rows(tmp, 1, i) for i in range(2)]
  assert [len(f) for f in fed] == [step, step]  # Both stopped after the same step.
  assert all(len(batch) == 4 for f in fed for batch in f)  # 4 of the 8 rows each.
  rows = [{r for batch in f for r in batch} for f in fed]
  assert not rows[0] & rows[1]  # The processes saw disjoint examples.

  config.train.num_steps = step + 3
  extra = [*overrides(config), *extra[len(overrides(config)):]]
  outs = _finish(_launch(workdir, tmp, 2, extra))
  assert f"Resumed from step {step}" in outs[0]
  assert [len(_rows(tmp, 2, i)) for i in range(2)] == [3, 3]
  assert sorted(train_losses(workdir))[-4:] == [step, step + 1, step + 2, step + 3]
  assert "held-out MLM accuracy" in outs[0]  # Evaluated with the rows of both ...
  assert "held-out MLM accuracy" not in outs[1]  # ... printed by process 0 only.


if __name__ == "__main__":
  _worker_main()
