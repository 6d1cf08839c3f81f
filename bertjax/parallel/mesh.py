"""The device mesh ('data', 'fsdp', 'tensor') and the shardings derived from logical axes."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from bertjax.errors import ConfigError

AXES = ("data", "fsdp", "tensor")


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, int, int]:
  """Resolves `config.mesh` sizes; one of them may be -1 (fills the devices left)."""
  sizes = [int(mesh_cfg[a]) for a in AXES]
  fill = [a for a, s in zip(AXES, sizes) if s == -1]
  if len(fill) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ConfigError(f"config.mesh={dict(zip(AXES, sizes))}: sizes must be positive, "
                      "with at most one -1 (fills the rest).")
  known = int(np.prod([s for s in sizes if s != -1]))
  if fill:
    if num_devices % known:
      raise ConfigError(f"config.mesh: {num_devices} devices are not divisible by "
                        f"{known} (the fixed mesh sizes {dict(zip(AXES, sizes))}).")
    sizes[AXES.index(fill[0])] = num_devices // known
  if int(np.prod(sizes)) != num_devices:
    raise ConfigError(f"config.mesh={dict(zip(AXES, sizes))} needs {int(np.prod(sizes))} "
                      f"devices but {num_devices} are available; set one size to -1.")
  return tuple(sizes)


def create_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The one place the mesh is built; axis types Auto (Linen partitioning needs it)."""
  devices = list(devices if devices is not None else jax.devices())
  shape = mesh_shape(mesh_cfg, len(devices))
  return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES),
                       devices=devices)


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules) -> Any:
  """NamedShardings for a tree of `nn.Partitioned` (abstract) variables, via the rules.
  Unboxed leaves (optimizer counters, the step) are replicated."""
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, tuple(map(tuple, rules)))


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """Sharding of a batch's leading dimension (the 'activation_batch' rule)."""
  spec = nn.logical_to_mesh_axes(("activation_batch",), tuple(map(tuple, rules)))
  return NamedSharding(mesh, PartitionSpec(*spec))


def data_parallel_size(mesh: Mesh, rules) -> int:
  """How many ways the batch dimension is split."""
  axes = batch_sharding(mesh, rules).spec[0]
  axes = (axes,) if isinstance(axes, str) else (axes or ())
  return int(np.prod([mesh.shape[a] for a in axes]))


def put_batch(batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
  """This process's rows of the global batch -> global arrays sharded over the mesh."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
