"""Multi-host start-up: JAX's multi-controller runtime (`jax.distributed.initialize`).

One process per host (TPU VM worker, GPU node or, for tests, a local process) runs the
same program; each feeds its own rows of the global batch and process 0 alone writes
logs. The coordinator comes from flags, or from the environment: Cloud TPU pods, SLURM
and Open MPI are detected by JAX itself.
"""

from __future__ import annotations

import jax
from absl import logging

from bertjax.errors import ConfigError, at_least


def initialize(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1,
               auto: bool = False, timeout_s: int = 300, heartbeat_timeout_s: int = 100
               ) -> None:
  """Joins the job's processes. With `coordinator_address` ('host:port' of process 0)
  `num_processes` and `process_id` are required; with `auto` JAX reads them from the
  cluster environment (Cloud TPU metadata, SLURM_*, OMPI_*). Neither: one process.
  CPU processes talk through gloo collectives. `timeout_s` bounds the wait for every
  process to join; a process silent for `heartbeat_timeout_s` (dead, or its host gone)
  makes JAX's coordination service terminate every other process with an error naming
  the missing task, instead of leaving them blocked in a collective forever (the two
  timeouts are `config.distributed`'s fields)."""
  at_least("distributed.initialization_timeout_s", timeout_s, 1)
  at_least("distributed.heartbeat_timeout_s", heartbeat_timeout_s, 1)
  if coordinator_address:
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ConfigError(f"--coordinator_address={coordinator_address} needs "
                        f"--num_processes >= 1 and --process_id in [0, num_processes); got "
                        f"{num_processes} and {process_id}.")
    kwargs = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                  process_id=process_id)
  elif auto:
    kwargs = {}
  else:
    return
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kwargs, initialization_timeout=timeout_s,
                             heartbeat_timeout_seconds=heartbeat_timeout_s)
  logging.info("Process %d of %d; %d local of %d devices.", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
