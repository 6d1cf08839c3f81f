"""A dead peer in a 2-process job on localhost (gloo collectives, the launch of
tests/test_multihost.py): the survivor does not hang, it stops within a bounded time
(config.distributed.heartbeat_timeout_s) with an error naming the dead task, and
restarting both processes resumes from the last checkpoint."""

import signal
import time

from bertjax import checkpoint as ckpt_lib
from tests.test_loop import e2e_config, overrides, train_losses
from tests.test_multihost import _finish, _launch, _wait_for_steps

HEARTBEAT_S = 10


def test_dead_peer_stops_the_survivor_in_bounded_time_and_both_resume(tmp_path):
  """Process 1 is frozen (SIGSTOP) mid-training, then killed: the worst case of a dead
  peer, as its sockets stay open and only its missing heartbeats reveal it (a SIGKILLed
  peer closes them and the survivor stops within a second). Process 0 is blocked in a
  collective; JAX's coordination service ends it after the heartbeat timeout with a
  message naming the unhealthy task. Restarting both resumes from the last checkpoint."""
  config = e2e_config()
  config.train.num_steps = 10_000  # Stopped by the fault.
  config.train.eval_every = 10_000
  config.train.checkpoint_every = 2
  extra = [*overrides(config), f"--config.distributed.heartbeat_timeout_s={HEARTBEAT_S}"]
  workdir, tmp = str(tmp_path / "wd"), str(tmp_path)
  procs = _launch(workdir, tmp, 1, extra)
  _wait_for_steps(procs, workdir, 5)
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
  assert "The following tasks are unhealthy (stopped sending heartbeats):\n1\n" in out
  assert "Terminating process because the JAX distributed service detected fatal" in out

  saved = ckpt_lib.Checkpointer(workdir, read_only=True).complete_steps()
  assert saved, out[-2000:]
  config.train.num_steps = saved[-1] + 2
  outs = _finish(_launch(workdir, tmp, 2, [*overrides(config)]))
  assert f"Resumed from step {saved[-1]}" in outs[0]
  assert max(train_losses(workdir)) == saved[-1] + 2
