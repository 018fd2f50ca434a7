"""The device mesh and the one table that maps logical axis names to mesh axes.

Mesh axes (`config.mesh`; one may be -1, "all remaining devices"): 'data' splits batch rows,
'fsdp' also shards parameters, gradients and optimizer state (ZeRO-3), 'tensor' splits heads,
d_ff and the vocabulary (Megatron). Model code names every parameter and main activation
dimension logically ('batch', 'embed', 'heads', ...); `LOGICAL_RULES` decides where each goes.
A single device is the 1x1x1 mesh, so every run takes the same code path.

The compiled steps take everything from here: `make_mesh`, `mesh_context` (trace under the mesh
and the rules), `logical_shardings`, `global_batch` and `param_shardings` for inference. The
rules, array by array: docs/scaling.md.
"""

from __future__ import annotations

import contextlib
import functools
import math

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime.config import check_sharded_dims, ModelConfig
from transformer_jax.runtime.exceptions import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # batch rows are split over both data-parallel axes

# Logical axis -> mesh axes, in priority order. Within one array a mesh axis is used at most once
# (flax skips a rule whose mesh axis an earlier dimension took), so:
#   activations [batch, length, embed]      -> (('data', 'fsdp'), None, None)      DP
#   activations [batch, length, heads, kv]  -> (('data', 'fsdp'), None, 'tensor', None)
#   q/k/v kernels [embed, heads, kv]        -> ('fsdp', 'tensor', None)   TP column-parallel
#   out kernel [heads, kv, embed]           -> ('tensor', None, 'fsdp')   TP row-parallel
#   FFN wi [embed, mlp] / wo [mlp, embed]   -> ('fsdp', 'tensor') / ('tensor', 'fsdp')
#   embedding [vocab, embed]                -> ('tensor', 'fsdp')         vocab-parallel
#   logits [batch, length, vocab]           -> (('data', 'fsdp'), None, 'tensor')
#   LayerNorm scale/bias, biases [embed]    -> ('fsdp',); [mlp] -> ('tensor',)
# Adam's moments have the parameters' boxes, hence the same shardings (FSDP shards them too).
LOGICAL_RULES = (
    ("batch", BATCH_AXES),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("kv", None),
    ("length", None),
    ("pos", None),
    ("layers", None),  # the stacked axis of model.scan_layers: every device holds every layer
)

# For decoding: parameters sharded only along 'tensor' (replicated over data and fsdp), so a
# decode step never all-gathers weights. Use when the parameters fit on tensor-many devices.
INFERENCE_RULES = tuple((name, None) if name == "embed" else (name, axes)
                        for name, axes in LOGICAL_RULES)


# ----------------------------------------------------------------------------- the mesh


def mesh_shape(mesh_config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor): resolves the -1 axis and checks the product is the device count."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ConfigError("config key 'mesh': at most one axis may be -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      axis = MESH_AXES[sizes.index(-1)]
      raise ConfigError(f"config key 'mesh': the fixed axis sizes multiply to {known}, which does "
                        f"not divide the {num_devices} devices, so mesh.{axis}=-1 has no size")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    shown = ", ".join(f"{a}={s}" for a, s in zip(MESH_AXES, sizes))
    raise ConfigError(f"config key 'mesh': {shown} multiply to {math.prod(sizes)}, but there are "
                      f"{num_devices} devices; make the product {num_devices} or set one axis "
                      "to -1")
  return tuple(sizes)


def _num_slices(devices) -> int:
  return len({getattr(d, "slice_index", 0) for d in devices})


def make_mesh(mesh_config: ml_collections.ConfigDict, devices=None) -> Mesh:
  """A mesh over all devices of all processes, axes ('data', 'fsdp', 'tensor').

  Device order follows the physical topology (`mesh_utils.create_device_mesh`: the tensor axis
  on the closest devices). On a multi-slice TPU job the slices go along 'data' (or 'fsdp'), the
  only axes whose traffic (one gradient all-reduce per step) tolerates the slower DCN links.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_config, len(devices))
  slices = _num_slices(devices)
  if slices > 1:
    device_array = _hybrid_device_array(shape, slices, devices)
  else:
    device_array = _device_array(shape, devices)
  return Mesh(device_array, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def _device_array(shape, devices) -> np.ndarray:
  """Topology-aware order; a logical axis may span part of a physical one only if it must."""
  error = None
  for allow_split in (False, True):
    try:
      return mesh_utils.create_device_mesh(shape, devices=devices,
                                           allow_split_physical_axes=allow_split)
    except (ValueError, NotImplementedError, AssertionError) as e:
      error = e
  logging.warning("no topology-aware device order for mesh %s (%s); using enumeration order",
                  shape, error)
  return np.asarray(devices).reshape(shape)


def _hybrid_device_array(shape, slices: int, devices) -> np.ndarray:
  """Multi-slice: ICI mesh inside each slice, the slices stacked along 'data' (else 'fsdp')."""
  for axis in (0, 1):
    if shape[axis] % slices == 0:
      ici = list(shape)
      ici[axis] //= slices
      dcn = [1, 1, 1]
      dcn[axis] = slices
      return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices,
                                                  allow_split_physical_axes=True)
  raise ConfigError(f"config key 'mesh': {slices} TPU slices need mesh.data or mesh.fsdp to be a "
                    f"multiple of {slices} (got data={shape[0]}, fsdp={shape[1]})")


@contextlib.contextmanager
def mesh_context(mesh: Mesh, rules=LOGICAL_RULES):
  """Trace under this: the mesh is current (flax's logical constraints apply) and so are the rules.

  `jax.set_mesh` (not the deprecated `with mesh:`) is what makes `nn.with_logical_constraint`
  take effect: flax only constrains when an abstract mesh is set.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


# ----------------------------------------------------------------------------- checks


def batch_parallelism(mesh: Mesh) -> int:
  """Rows of every batch must be a multiple of this (data * fsdp)."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def check_divisibility(config: ml_collections.ConfigDict, mesh: Mesh) -> None:
  """Every sharded model dimension must split evenly over the mesh as built (axes of -1 now have
  their size): config.check_sharded_dims, before anything compiles."""
  check_sharded_dims(ModelConfig.from_config(config.model), dict(mesh.shape))


def check_batch_rows(global_rows: int, mesh: Mesh, what: str = "global batch") -> None:
  """Batch rows split over data*fsdp devices: the row count must be a multiple of that."""
  dp = batch_parallelism(mesh)
  if global_rows % dp:
    raise ConfigError(f"the {what} has {global_rows} rows, not divisible by the data-parallel size "
                      f"mesh.data*mesh.fsdp={dp}; pad batches to a multiple of {dp} rows")


def padded_rows(rows: int, mesh: Mesh) -> int:
  """The smallest multiple of the data-parallel size that holds `rows` (for decode batches)."""
  dp = batch_parallelism(mesh)
  return -(-rows // dp) * dp


# ----------------------------------------------------------------------------- shardings


def logical_sharding(mesh: Mesh, logical_axes, rules=LOGICAL_RULES) -> NamedSharding:
  """NamedSharding of one array from its logical axis names, e.g. ('batch', 'length')."""
  return NamedSharding(mesh, nn.logical_to_mesh_axes(logical_axes, rules))


def logical_shardings(mesh: Mesh, boxed_tree, rules=LOGICAL_RULES):
  """NamedShardings for a tree whose leaves may carry logical names (LogicallyPartitioned).

  Leaves without names (step counters, Adam's count) are replicated.
  """
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches are split over rows along data and fsdp, replicated along tensor."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(mesh: Mesh, local_batch: dict) -> dict:
  """Assembles the global batch from each process's rows (multi-host safe).

  Every process passes its own equal share of rows (rows [p*n, (p+1)*n) for process p, in
  mesh order); the global batch has n * process_count rows.
  """
  sharding = batch_sharding(mesh)
  out = {}
  for key, value in local_batch.items():
    value = np.asarray(value)
    check_batch_rows(value.shape[0] * jax.process_count(), mesh, f"global batch ('{key}')")
    out[key] = jax.make_array_from_process_local_data(sharding, value)
  return out


@functools.lru_cache(maxsize=16)
def _abstract_params(model_cfg):
  ids_1x8 = jax.ShapeDtypeStruct((1, 8), np.int32)
  init = Transformer(model_cfg).init
  return jax.eval_shape(lambda rng, ids: init(rng, ids, ids)["params"], jax.random.key(0), ids_1x8)


def param_shardings(config: ml_collections.ConfigDict, mesh: Mesh, *, inference: bool = False):
  """(abstract params with shardings, NamedSharding tree) of the model, nothing allocated.

  For decode/eval steps: `jax.jit(step, in_shardings=(shardings, batch_sharding(mesh)))` and
  `checkpoint` restores straight into them. `inference=True` uses INFERENCE_RULES (weights
  replicated over data and fsdp, still split over tensor). The training state's `params` have
  the same shardings as `inference=False`.
  """
  boxed = _abstract_params(ModelConfig.from_config(config.model))
  shardings = logical_shardings(mesh, boxed, INFERENCE_RULES if inference else LOGICAL_RULES)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          nn.meta.unbox(boxed), shardings)
  return abstract, shardings
