"""One pretraining job on 1 process x 8 CPU devices and on 2 processes x 4 (each
process one slice: `--config.mesh.dcn_data=2`; started by docs/scaling.md's
`launch/local.sh` command, resumed by the launch of tests/test_multihost.py) is fed
the same global batches, masks included: process p of P feeds block p of every
global batch, each row masked by its index in the global stream.

The arithmetic then differs only where the collectives add the devices' partial sums
(gradients, losses): a job of several processes runs them on gloo, a lone process
without a coordinator on XLA's in-process collectives, which add in another order.
Joined through a coordinator as well (gloo), the lone process logs the 2-process job's
metrics and ends in its state bit for bit, and a checkpoint of either resumes on the
other bit for bit against the uninterrupted runs. Without (`python -m bertjax.main`
alone) the numbers agree to float32 rounding: bounded here. The jobs keep their
compiled programs in `config.compilation_cache_dir` (the suite's own cache variable
removed): a resumed job loads every program the uninterrupted one compiled."""

import os
import re
import shutil
import subprocess
import sys

import portpicker
import pytest

from bertjax.checkpoint import files
from bertjax.train import pretrain
from tests import faults
from tests.test_loop import overrides
from tests.test_multihost import REPO, TIMEOUT, _finish, _launch
from tests.test_readme import documented
from tests.test_reliability import TOKENIZER, rel_config

STEPS, RESUME_AT = 8, 4
# |difference| / |value| of any metric between in-process and gloo collectives, over
# STEPS steps (measured: 1.4e-7, a float32 ulp or two).
ROUNDING = 1e-5


def _config():
  """A tiny model (dropout on) on the embedded corpus, the stored tokenizer; every
  step logged, a checkpoint every RESUME_AT steps, evaluation at the end."""
  return rel_config(num_steps=STEPS, log_every=1, checkpoint_every=RESUME_AT,
                    eval_every=STEPS)


# The jobs' environment: without the suite's JAX_COMPILATION_CACHE_DIR, which would win
# over config.compilation_cache_dir.
ENVIRON = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}


def _extra(xla) -> list[str]:
  return [*overrides(_config()), f"--config.data.tokenizer.path={TOKENIZER}",
          f"--config.compilation_cache_dir={xla}"]


def _job(workdir, tmp, processes: int, run: str, xla) -> list[str]:
  """The job on `processes` x 8 / `processes` devices joined through a coordinator
  (gloo collectives), its compiled programs kept in `xla`; returns what each process
  printed."""
  extra = _extra(xla)
  if processes > 1:
    extra.append(f"--config.mesh.dcn_data={processes}")
  return _finish(_launch(str(workdir), str(tmp), run, extra, module="bertjax.main",
                         processes=processes, environ=ENVIRON))


def _local_sh(workdir, xla) -> None:
  """docs/scaling.md's pod rehearsal, `DEVICES_PER_PROCESS=4 launch/local.sh 2
  configs/bert_tiny.py DIR --config.mesh.dcn_data=2`, with this module's config."""
  words = documented("docs/scaling.md", "launch/local.sh 2 configs/bert_tiny.py", *_extra(xla))
  env, words = dict(ENVIRON), [str(workdir) if w.startswith("/tmp/") else w for w in words]
  while "=" in words[0]:  # VAR=value before the command
    k, v = words.pop(0).split("=", 1)
    env[k] = v
  env.update(PYTHON=sys.executable, PORT=str(portpicker.pick_unused_port()))
  proc = subprocess.run(words, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=TIMEOUT)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def xla(tmp_path_factory):
  """The jobs' compilation cache (config.compilation_cache_dir)."""
  return tmp_path_factory.mktemp("xla")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, xla):
  """The uninterrupted job: {1: 1 process, 2: 2 processes launched by docs/scaling.md's
  launch/local.sh} (gloo), workdirs."""
  tmp = tmp_path_factory.mktemp("exact")
  _job(tmp / "1", tmp, 1, "1", xla)
  _local_sh(tmp / "2", xla)
  return {p: tmp / str(p) for p in (1, 2)}


@pytest.mark.slow
def test_one_and_two_processes_log_the_same_numbers(runs):
  rows = faults.metrics(runs[1])
  assert [r["step"] for r in rows if r["split"] == "train"] == list(range(1, STEPS + 1))
  assert any(r["split"] == "eval" for r in rows)
  faults.assert_same_metrics(runs[2], runs[1])  # every record, every number: equal
  faults.assert_same_arrays(faults.saved_state(runs[2]), faults.saved_state(runs[1]))


@pytest.mark.slow
def test_a_lone_process_differs_by_the_collectives_rounding_only(runs, tmp_path):
  """The same job in this process, no coordinator (XLA's in-process collectives)."""
  pretrain.run(_config(), str(tmp_path))
  ours, theirs = faults.metrics(tmp_path), faults.metrics(runs[2])
  assert [(r["step"], r["split"]) for r in ours] == [(r["step"], r["split"]) for r in theirs]
  for a, b in zip(ours, theirs):
    if a["split"] != "perf":
      for k in set(a) - {"split"}:
        assert abs(a[k] - b[k]) <= ROUNDING * abs(b[k]), (a, b, k)


def _resumable_copy(source, target):
  """`source`'s workdir as it was after step RESUME_AT (its later checkpoints gone; the
  metrics it logged after that step are dropped by the resumed run)."""
  shutil.copytree(source, target)
  for step in os.listdir(target / files.CHECKPOINT_DIR):
    if int(step) > RESUME_AT:
      shutil.rmtree(target / files.CHECKPOINT_DIR / step)


@pytest.mark.slow
@pytest.mark.parametrize("written, resumed", [(2, 1), (1, 2)])
def test_resume_on_another_process_count_is_bit_exact(runs, xla, tmp_path, written,
                                                      resumed):
  workdir = tmp_path / f"{written}to{resumed}"
  _resumable_copy(runs[written], workdir)
  out = _job(workdir, tmp_path, resumed, "resumed", xla)[0]
  assert f"Resumed from step {RESUME_AT}" in out
  compiled = re.search(r"Compilation: .* \((\d+) programs, (\d+) from the persistent", out)
  assert int(compiled.group(2)) == int(compiled.group(1)) > 0  # All loaded, none compiled.
  assert (f"Checkpoint step {RESUME_AT} was written by {written} processes, resuming on "
          f"{resumed}") in out
  faults.assert_same_metrics(workdir, runs[written])
  faults.assert_same_arrays(faults.saved_state(workdir), faults.saved_state(runs[written]))
