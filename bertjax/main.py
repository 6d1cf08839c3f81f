"""Entry point: `python -m bertjax.main --config=configs/bert_tiny.py --workdir=DIR`.

Any config field can be overridden, e.g. `--config.train.batch_size=64`; a misspelt
field fails at start-up. Rerunning the same command resumes from the workdir.
"""

import logging as std_logging
import re

from absl import app, flags, logging
from ml_collections import config_flags

from bertjax.console import cli

# --config and --workdir, and the multi-process flags: also `python -m bertjax.finetune`'s.
CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Recipe file, e.g. configs/bert_tiny.py.", lock_config=True)
WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, logs, tokenizer; resumes.")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "Join a multi-host job via jax.distributed.initialize(), reading "
    "the coordinator from the environment (Cloud TPU pod, SLURM, Open MPI).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", "", "host:port of process 0 for an explicit multi-process "
    "job (with --num_processes and --process_id); implies --multihost.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index, 0-based.")
flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv):
  """absl's parser, with a misspelt `--config.a.b` reported in one line."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as e:  # ml_collections: no such field.
    field = re.search(r"'\\?'?(\w+)", str(e))
    hint = re.search(r'Did you mean "(\w+)"', str(e))
    cli.fail(f"config has no field {field.group(1) if field else str(e)!r}"
             + (f"; did you mean {hint.group(1)!r}?" if hint else "; see the --config file."))
  except flags.Error as e:
    cli.fail(str(e))


def start(check) -> None:
  """What a training program does after flag parsing: quiet the libraries' INFO lines
  (bertjax's own and every library's warnings still reach the console), `check(config)`
  (before joining the other processes), then join them (`--multihost`,
  `--coordinator_address`; nothing for one process)."""
  from bertjax.parallel import distributed  # pylint: disable=g-import-not-at-top

  logging.get_absl_handler().addFilter(
      lambda r: r.levelno >= std_logging.WARNING or "bertjax" in r.pathname)
  check(CONFIG.value)
  timeouts = CONFIG.value.distributed
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                         auto=_MULTIHOST.value, timeout_s=timeouts.initialization_timeout_s,
                         heartbeat_timeout_s=timeouts.heartbeat_timeout_s)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=g-import-not-at-top  (after flag parsing: fast --help)

  from bertjax import config_checks  # pylint: disable=g-import-not-at-top
  from bertjax.train import loop  # pylint: disable=g-import-not-at-top
  start(config_checks.pretraining)
  metrics = loop.train_and_evaluate(CONFIG.value, WORKDIR.value)
  if metrics and jax.process_index() == 0:
    print(f"held-out MLM accuracy {metrics['mlm_accuracy']:.4f} vs "
          f"{metrics['mlm_accuracy_most_frequent_baseline']:.4f} for always predicting the "
          "most frequent token"
          + (f"; NSP accuracy {metrics['nsp_accuracy']:.4f}" if "nsp_accuracy" in metrics
             else ""))


if __name__ == "__main__":
  cli.run(main, flags_parser=parse_flags)
