"""What the two training programs (`python -m bertjax.main` and `bertjax.finetune`)
share: their flags (--config with every field overridable as --config.a.b=v,
--workdir, the multi-process ones), a parser that reports a misspelt config field in
one line, and the start-up. Importing this module defines the flags.
"""

import logging as std_logging
import re

from absl import flags, logging
from ml_collections import config_flags

from bertjax.console import cli

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


def start() -> None:
  """What a training program does after flag parsing: quiet the libraries' INFO lines
  (bertjax's own and every library's warnings still reach the console), then join the
  other processes (`--multihost`, `--coordinator_address`; nothing for one process).
  The run checks its config once, first thing (`pretrain.run`, `sweep.run`). Compiled
  programs are kept in `config.compilation_cache_dir`
  (`compilation.use_persistent_cache`)."""
  from bertjax.parallel import distributed  # pylint: disable=g-import-not-at-top
  from bertjax.train import compilation  # pylint: disable=g-import-not-at-top

  logging.get_absl_handler().addFilter(
      lambda r: r.levelno >= std_logging.WARNING or "bertjax" in r.pathname)
  timeouts = CONFIG.value.distributed
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                         auto=_MULTIHOST.value, timeout_s=timeouts.initialization_timeout_s,
                         heartbeat_timeout_s=timeouts.heartbeat_timeout_s)
  compilation.use_persistent_cache(CONFIG.value.compilation_cache_dir)
