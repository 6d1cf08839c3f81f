"""A 2-process pretraining job on localhost (gloo collectives, the launch of
tests/test_multihost.py) through three faults in a row: SIGTERM to the process that is
not the coordinator (both save the same step, having fed disjoint rows), a frozen peer
(the survivor stops within the heartbeat timeout with an error naming it, instead of
hanging), and the restart of both, which resumes from the last checkpoint."""

import signal
import time

import pytest

from bertjax.checkpoint import manager as ckpt_lib
from tests.test_loop import e2e_config, overrides, train_losses
from tests.test_multihost import _finish, _launch, _rows, _wait_for_steps

HEARTBEAT_S = 10


@pytest.mark.slow
def test_two_processes_preempt_resume_and_survive_a_dead_peer(tmp_path):
  config = e2e_config()
  config.train.num_steps = config.train.eval_every = 10_000  # Stopped by the faults.
  config.train.checkpoint_every = 10_000
  mesh = ["--config.mesh.data=-1", "--config.mesh.fsdp=2",  # Each process one "slice":
          "--config.mesh.dcn_data=2",  # data 2x2, fsdp 2.
          f"--config.distributed.heartbeat_timeout_s={HEARTBEAT_S}"]
  workdir, tmp = str(tmp_path / "wd"), str(tmp_path)

  # 1. SIGTERM to process 1 (not the coordinator: it must propagate) after 3 steps.
  procs = _launch(workdir, tmp, 1, [*overrides(config), *mesh])
  _wait_for_steps(procs, workdir, 3)
  procs[1].send_signal(signal.SIGTERM)
  outs = _finish(procs)
  saved = ckpt_lib.Checkpointer(workdir, read_only=True).complete_steps()
  assert len(saved) == 1 and saved[0] >= 3, (saved, outs[0][-2000:])
  step = saved[0]
  assert f"SIGTERM: saved step {step}" in outs[0]  # Only process 0 logs.
  assert "SIGTERM: saved step" not in outs[1]
  fed = [_rows(tmp, 1, i) for i in range(2)]
  assert [len(f) for f in fed] == [step, step]  # Both stopped after the same step.
  assert all(len(batch) == 4 for f in fed for batch in f)  # 4 of the 8 rows each.
  rows = [{r for batch in f for r in batch} for f in fed]
  assert not rows[0] & rows[1]  # The processes saw disjoint examples.

  # 2. Resumed, then process 1 frozen (SIGSTOP) after 4 more steps: the worst case of a
  # dead peer, as its sockets stay open and only its missing heartbeats reveal it (a
  # SIGKILLed peer closes them and the survivor stops within a second). Process 0,
  # blocked in a collective, is ended by JAX's coordination service.
  config.train.checkpoint_every = 2
  procs = _launch(workdir, tmp, 2, [*overrides(config), *mesh])
  _wait_for_steps(procs, workdir, step + 4)
  assert all(p.poll() is None for p in procs), [p.communicate()[0][-2000:] for p in procs]
  procs[1].send_signal(signal.SIGSTOP)
  frozen = time.time()
  try:
    out = procs[0].communicate(timeout=HEARTBEAT_S * 3)[0]  # A hang: TimeoutExpired.
  finally:
    for p in procs:
      p.kill()
    procs[1].communicate()
  assert time.time() - frozen < HEARTBEAT_S * 3
  assert procs[0].returncode != 0
  assert f"Resumed from step {step}" in out
  assert "The following tasks are unhealthy (stopped sending heartbeats):\n1\n" in out
  assert "Terminating process because the JAX distributed service detected fatal" in out

  # 3. Both restarted: they resume from the last complete checkpoint and finish.
  saved = ckpt_lib.Checkpointer(workdir, read_only=True).complete_steps()
  assert saved[-1] > step, out[-2000:]
  config.train.num_steps = saved[-1] + 2
  outs = _finish(_launch(workdir, tmp, 3, [*overrides(config), *mesh]))
  assert f"Resumed from step {saved[-1]}" in outs[0]
  assert [len(_rows(tmp, 3, i)) for i in range(2)] == [2, 2]
  assert sorted(train_losses(workdir))[-3:] == [saved[-1], saved[-1] + 1, saved[-1] + 2]
  assert "held-out MLM accuracy" in outs[0]  # Evaluated with the rows of both ...
  assert "held-out MLM accuracy" not in outs[1]  # ... printed by process 0 only.
