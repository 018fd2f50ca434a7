"""Orbax checkpoints of a workdir: save (async), resume from the newest good one, load for use.

Layout: `WORKDIR/checkpoints/<step>/` holds three items:
- 'state': the TrainState (parameters, optimizer state, step counters), sharded arrays;
- 'data': the input iterator's state (grain), so a resumed run sees the same batches;
- 'config': the run config as JSON, so a checkpoint can be loaded without its config file.

Orbax writes each checkpoint to a temporary folder and renames it when complete, so a killed
save never looks finished. A checkpoint that still fails to load (truncated or corrupted
files) is moved aside to `WORKDIR/checkpoints/corrupt_<step>_<time>` and the previous one is
used; nothing is deleted.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging

from transformer_jax.config import ConfigError


class CheckpointError(ValueError):
  """A checkpoint that cannot be used; the message is one line."""


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def make_manager(directory: str, *, keep: int | None = None, async_save: bool = True,
                 read_only: bool = False, with_data: bool = True) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, enable_async_checkpointing=async_save, create=not read_only,
      read_only=read_only, cleanup_tmp_directories=not read_only)
  items = ("state", "data", "config") if with_data else ("state", "config")
  handlers = {"state": ocp.StandardCheckpointHandler(), "config": ocp.JsonCheckpointHandler()}
  if with_data:
    import grain  # pylint: disable=g-import-not-at-top
    handlers["data"] = grain.checkpoint.CheckpointHandler()
  return ocp.CheckpointManager(directory, options=options, item_names=items,
                               item_handlers=handlers)


def save(manager: ocp.CheckpointManager, step: int, state, config: ml_collections.ConfigDict,
         data_iterator=None) -> None:
  args = {"state": ocp.args.StandardSave(state), "config": ocp.args.JsonSave(config.to_dict())}
  if data_iterator is not None:
    import grain  # pylint: disable=g-import-not-at-top
    args["data"] = grain.checkpoint.CheckpointSave(data_iterator)
  manager.save(step, args=ocp.args.Composite(**args), force=True)


def _key_name(entry) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  return str(entry)


def _flat_shapes(tree) -> dict[str, tuple]:
  """'params/decoder/layer_0/...' -> shape, the same for a dataclass state and its metadata."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(_key_name(k) for k in path): tuple(getattr(leaf, "shape", ()))
          for path, leaf in flat}


def check_compatible(manager: ocp.CheckpointManager, step: int, abstract_state) -> None:
  """Raises CheckpointError naming the first parameter whose saved shape differs."""
  try:
    meta = manager.item_metadata(step)["state"]
  except Exception:  # noqa: BLE001 - unreadable metadata: let the restore report it
    return
  if meta is None:
    return
  saved = _flat_shapes(getattr(meta, "tree", meta))
  wanted = _flat_shapes(abstract_state)
  for key, shape in wanted.items():
    if key in saved and saved[key] != shape:
      raise CheckpointError(
          f"checkpoint {manager.directory}/{step} is from an incompatible config: parameter "
          f"{key} has shape {saved[key]} there but {shape} in this config; use another --workdir")
    if key not in saved and key.startswith("params/"):
      raise CheckpointError(
          f"checkpoint {manager.directory}/{step} is from an incompatible config: it has no "
          f"parameter {key}; use another --workdir")


def restore_latest(manager: ocp.CheckpointManager, abstract_state, data_iterator=None):
  """Restores the newest loadable checkpoint: (state, step) or (None, None) if there is none.

  Incompatible checkpoints raise CheckpointError (nothing is touched); unreadable ones are
  moved aside with a warning and the next older one is tried.
  """
  for step in sorted(manager.all_steps(), reverse=True):
    check_compatible(manager, step, abstract_state)
    args = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      import grain  # pylint: disable=g-import-not-at-top
      args["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    try:
      restored = manager.restore(step, args=ocp.args.Composite(**args))
      return restored["state"], step
    except Exception as e:  # noqa: BLE001 - any failure to read means this one is unusable
      _quarantine(manager, step, e)
  return None, None


def _quarantine(manager: ocp.CheckpointManager, step: int, error: Exception) -> None:
  src = os.path.join(str(manager.directory), str(step))
  dst = os.path.join(str(manager.directory), f"corrupt_{step}_{int(time.time())}")
  first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
  logging.warning("checkpoint at step %d cannot be read (%s: %s); moved it to %s and trying the "
                  "previous one", step, type(error).__name__, first_line, dst)
  print(f"warning: checkpoint at step {step} is unreadable ({type(error).__name__}); "
        f"moved aside to {dst}; resuming from the previous one", flush=True)
  if jax.process_index() == 0 and os.path.isdir(src):
    os.rename(src, dst)
  from transformer_jax import distributed  # pylint: disable=g-import-not-at-top
  distributed.barrier(f"quarantine_{step}")  # every process sees the rename before reloading
  manager.reload()


def saved_config(directory: str, step: int | None = None) -> tuple[ml_collections.ConfigDict, int]:
  """The run config stored with a checkpoint (the newest when step is None), and its step."""
  if not os.path.isdir(directory):
    raise CheckpointError(f"no checkpoints in {directory}: the folder does not exist")
  manager = make_manager(directory, read_only=True, with_data=False)
  steps = manager.all_steps()
  if not steps:
    raise CheckpointError(f"no checkpoints in {directory}")
  step = max(steps) if step is None else step
  if step not in steps:
    raise CheckpointError(f"no checkpoint for step {step} in {directory} (steps: {sorted(steps)})")
  cfg = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
  return ml_collections.ConfigDict(cfg), step


def load_params(directory: str, step: int | None = None, mesh=None) -> tuple[Any, ml_collections.ConfigDict, int]:
  """(params, run config, step) of a checkpoint, for evaluation and translation."""
  from transformer_jax import sharding, step as step_lib  # pylint: disable=g-import-not-at-top
  config, step = saved_config(directory, step)
  try:
    from transformer_jax.config import validate  # pylint: disable=g-import-not-at-top
    validate(config)
  except ConfigError as e:
    raise CheckpointError(f"checkpoint {directory}/{step} holds an invalid config: {e}") from None
  mesh = mesh or sharding.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}))
  abstract, _ = step_lib.state_shardings(config, mesh)
  manager = make_manager(directory, read_only=True, with_data=False)
  try:
    state = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
  except Exception as e:  # noqa: BLE001
    raise CheckpointError(f"checkpoint {directory}/{step} cannot be read: {type(e).__name__}") from None
  return state.params, config, step


def write_config_json(workdir: str, config: ml_collections.ConfigDict) -> None:
  """WORKDIR/config.json: the config of the run, for people and tools (atomic write)."""
  path = os.path.join(workdir, "config.json")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(config.to_dict(), f, indent=2, sort_keys=True)
  os.replace(tmp, path)
