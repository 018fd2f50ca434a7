"""The device mesh and the one place that maps logical axis names to mesh axes.

Mesh axes: 'data' (pure data parallel), 'fsdp' (data parallel with parameters and optimizer
state sharded, ZeRO-3 style), 'tensor' (Megatron tensor parallel: heads and d_ff split).
Model code names its axes logically ('batch', 'embed', 'heads', 'mlp', ...); LOGICAL_RULES
decides where each goes. A single device is the 1x1x1 mesh: the same code path everywhere.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from transformer_jax.config import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axes. A mesh axis used by an earlier dimension of the same array is not
# reused (flax skips it), so activations ('batch', 'length', 'embed') put batch on data+fsdp and
# leave embed whole, while kernels ('embed', 'mlp') put embed on fsdp and mlp on tensor.
LOGICAL_RULES = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("kv", None),
    ("length", None),
    ("pos", None),
)


def mesh_shape(mesh_config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
  """Resolves the -1 axis ('the rest') and checks the sizes multiply to the device count."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if num_devices % known:
      raise ConfigError(f"config key 'mesh': fixed axis sizes multiply to {known}, which does not "
                        f"divide the {num_devices} devices")
    sizes[sizes.index(-1)] = num_devices // known
  if int(np.prod(sizes)) != num_devices:
    raise ConfigError(f"config key 'mesh': data*fsdp*tensor = {'*'.join(map(str, sizes))} = "
                      f"{int(np.prod(sizes))}, but there are {num_devices} devices")
  return tuple(sizes)


def make_mesh(mesh_config: ml_collections.ConfigDict, devices=None) -> Mesh:
  """A mesh over all devices of all processes, axes ('data', 'fsdp', 'tensor')."""
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_config, len(devices))
  try:
    device_array = jax.experimental.mesh_utils.create_device_mesh(shape, devices=devices)
  except Exception:  # noqa: BLE001 - unusual topologies (e.g. CPU) fall back to plain order
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, MESH_AXES)


def check_divisibility(config: ml_collections.ConfigDict, mesh: Mesh):
  """Tensor parallelism must split heads and d_ff evenly: fail before anything compiles."""
  tp = mesh.shape["tensor"]
  m = config.model
  for key, value in (("num_heads", m.num_heads), ("d_ff", m.d_ff)):
    if value % tp:
      raise ConfigError(f"config key 'model.{key}'={value} is not divisible by the tensor-parallel "
                        f"size mesh.tensor={tp}")


def batch_parallelism(mesh: Mesh) -> int:
  """Rows of every batch must be a multiple of this (data * fsdp)."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def logical_shardings(mesh: Mesh, boxed_tree):
  """NamedShardings for a tree whose leaves may carry logical names (LogicallyPartitioned)."""
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, LOGICAL_RULES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches are split over rows along data and fsdp, replicated along tensor."""
  return NamedSharding(mesh, P(("data", "fsdp")))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(mesh: Mesh, local_batch: dict) -> dict:
  """Assembles the global batch from each process's rows (multi-host safe)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}
