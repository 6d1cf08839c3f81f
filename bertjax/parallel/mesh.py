"""The device mesh ('data', 'fsdp', 'tensor') and the shardings derived from logical axes.

`config.mesh.{data,fsdp,tensor}` size the mesh inside one slice (ICI); with several
TPU slices (or GPU hosts joined by a slower network) `config.mesh.dcn_{data,fsdp,tensor}`
give the split across slices (DCN) and the mesh comes from
`mesh_utils.create_hybrid_device_mesh`. Each mesh axis has size ici * dcn.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from bertjax.errors import ConfigError

AXES = ("data", "fsdp", "tensor")


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, int, int]:
  """Resolves `config.mesh` sizes (per slice); one may be -1 (fills the devices left)."""
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


def dcn_shape(mesh_cfg) -> tuple[int, int, int]:
  """`config.mesh.dcn_*`: the split of each axis across slices (1, 1, 1: one slice)."""
  sizes = tuple(int(mesh_cfg[f"dcn_{a}"]) for a in AXES)
  if any(s < 1 for s in sizes):
    raise ConfigError(f"config.mesh.dcn_*={dict(zip(AXES, sizes))}: sizes must be >= 1.")
  return sizes


def create_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The one place the mesh is built; axis types Auto (Linen partitioning needs it)."""
  devices = list(devices if devices is not None else jax.devices())
  dcn = dcn_shape(mesh_cfg)
  slices = int(np.prod(dcn))
  if len(devices) % slices:
    raise ConfigError(f"config.mesh.dcn_*={dict(zip(AXES, dcn))} asks for {slices} slices "
                      f"but {len(devices)} devices do not split evenly into them.")
  ici = mesh_shape(mesh_cfg, len(devices) // slices)
  types = (AxisType.Auto,) * len(AXES)
  if slices == 1:
    return jax.make_mesh(ici, AXES, axis_types=types, devices=devices)
  # Multi-slice TPU devices know their slice; where all devices report one slice (GPU
  # hosts, CPU processes) each process is a slice.
  by_process = len({getattr(d, "slice_index", 0) for d in devices}) == 1
  try:
    grid = mesh_utils.create_hybrid_device_mesh(
        ici, dcn, devices, process_is_granule=by_process, allow_split_physical_axes=True)
  except ValueError as e:
    unit = "processes" if by_process else "slices"
    raise ConfigError(f"config.mesh.dcn_*={dict(zip(AXES, dcn))} does not match the "
                      f"{unit} of the {len(devices)} devices ({e}); set dcn sizes whose "
                      f"product is the number of {unit}.") from e
  return Mesh(grid, AXES, axis_types=types)


def _fit(sharding: NamedSharding, shape: tuple[int, ...]) -> NamedSharding:
  """Drops mesh axes from any dimension they do not divide (that dimension is then
  replicated over them), e.g. BERT's 30522-token vocabulary over tensor=4."""
  spec = []
  for dim, axes in zip(shape, tuple(sharding.spec) + (None,) * len(shape)):
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    while axes and dim % int(np.prod([sharding.mesh.shape[a] for a in axes])):
      axes = axes[:-1]
    spec.append(axes[0] if len(axes) == 1 else (axes or None))
  return NamedSharding(sharding.mesh, PartitionSpec(*spec))


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules) -> Any:
  """NamedShardings for a tree of abstract (`nn.Partitioned`-boxed) variables, via the
  rules. Unboxed leaves (optimizer counters, the step) are replicated; mesh axes that
  do not divide a dimension are left out for that dimension (logged once per shape)."""
  specs = nn.get_partition_spec(boxed_tree)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, tuple(map(tuple, rules)))
  fitted = jax.tree.map(lambda s, x: _fit(s, x.shape), shardings, nn.unbox(boxed_tree))
  uneven = {(x.shape, tuple(s.spec)) for s, f, x in zip(
      jax.tree.leaves(shardings), jax.tree.leaves(fitted), jax.tree.leaves(nn.unbox(boxed_tree)))
            if tuple(s.spec) + (None,) * (len(x.shape) - len(s.spec)) != tuple(f.spec)}
  for shape, spec in sorted(uneven, key=str):
    logging.warning("Mesh %s does not divide a %s parameter as %s; it is replicated over "
                    "the axes that do not divide it.", dict(mesh.shape), list(shape), spec)
  return fitted


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
  """This process's rows of the global batch -> global arrays sharded over the mesh
  (each process passes only its own [b, ...] rows; the global batch is b * processes)."""
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
