"""Orbax checkpoints of a workdir: save (async), resume from the newest good one, load for use.

`WORKDIR/checkpoints/<step>/` holds the train state, the input iterator's state (so a resumed run
sees the same batches), the run config (so a checkpoint loads without its config file) and the
progress (training wall time, so `train.max_train_minutes` counts across resumes, and the
vocabulary's fingerprint, so a resume with another vocabulary is refused).

A checkpoint that fails to load is moved aside (`checkpoints/corrupt_<step>_<time>`) and the
previous one used; nothing is deleted. `Saver` is a training run's writer: a save that fails, in
the foreground or in Orbax's background thread, stops the run in one line (`SaveError`), the
older checkpoints kept. It writes `WORKDIR/config.json` once the first checkpoint is complete, so
that file always describes a checkpoint that exists, and `config_changes.jsonl` for a resume.
"""

from __future__ import annotations

import json
import logging as std_logging
import os
import re
import sys
import time
import warnings
from typing import Any, NamedTuple

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging

from transformer_jax.model import sharding
from transformer_jax.runtime import distributed, dotted, files, orbax_logs
from transformer_jax.runtime.config import validate, with_defaults
from transformer_jax.runtime.exceptions import CheckpointError, ConfigError, SaveError
from transformer_jax.training import step as step_lib
from transformer_jax.training.workdir import free_space


TMP_MARKER = ".orbax-checkpoint-tmp"  # in the names of Orbax's unfinished checkpoint folders


def checkpoint_dir(workdir: str) -> str:
  return files.join(files.resolve(workdir), "checkpoints")


def make_manager(directory: str, *, keep: int | None = None, keep_every: int = 0,
                 async_save: bool = True, read_only: bool = False,
                 with_data: bool = True) -> ocp.CheckpointManager:
  """`keep`: the newest checkpoints kept; `keep_every`: those at its multiples are kept too."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, keep_period=keep_every or None, enable_async_checkpointing=async_save,
      create=not read_only,
      read_only=read_only, cleanup_tmp_directories=not read_only)
  items = ("state", "config", "progress") + (("data",) if with_data else ())
  handlers = {"state": ocp.StandardCheckpointHandler(), "config": ocp.JsonCheckpointHandler(),
              "progress": ocp.JsonCheckpointHandler()}
  if with_data:
    import grain  # pylint: disable=g-import-not-at-top
    handlers["data"] = grain.checkpoint.CheckpointHandler()
  return ocp.CheckpointManager(directory, options=options, item_names=items,
                               item_handlers=handlers)


def save(manager: ocp.CheckpointManager, step: int, state, config: ml_collections.ConfigDict,
         data_iterator=None, train_seconds: float | None = None, progress: dict | None = None) -> None:
  """`progress`: more of the 'progress' item (e.g. the vocabulary's hash) beside train_seconds."""
  args = {"state": ocp.args.StandardSave(state), "config": ocp.args.JsonSave(config.to_dict())}
  if data_iterator is not None:
    import grain  # pylint: disable=g-import-not-at-top
    args["data"] = grain.checkpoint.CheckpointSave(data_iterator)
  if train_seconds is not None:
    args["progress"] = ocp.args.JsonSave({**(progress or {}), "train_seconds": float(train_seconds)})
  manager.save(step, args=ocp.args.Composite(**args), force=True)


def _reason(error: BaseException) -> str:
  """'Type: first line of the message', without tensorstore's trailing [key=value] notes and
  with the middle of a long line elided (the end holds the OS error, e.g. no space left)."""
  lines = str(error).strip().splitlines()
  if not lines:
    return type(error).__name__
  text = re.split(r"\s\[[a-z_]+=", lines[0])[0]  # tensorstore appends [key='value'] notes
  if len(text) > 300:
    text = text[:120] + " ... " + text[-170:]
  return f"{type(error).__name__}: {text}"


def _steps_on_disk(directory: str) -> list[int]:
  try:
    return sorted(int(n) for n in files.listdir(directory) if n.isdigit())
  except OSError:
    return []


def _close_quietly(manager) -> None:
  try:
    manager.close()
  except Exception:  # noqa: BLE001 - closing after a failed read: the read's error is the one shown
    pass


class Saver:
  """Checkpoints of a training run (see the module docstring): save, poll, finish, close."""

  def __init__(self, manager: ocp.CheckpointManager, config: ml_collections.ConfigDict,
               workdir: str, data_iterator=None):
    self.manager, self.config, self.workdir = manager, config, workdir
    self.data_iterator = data_iterator
    self.progress: dict = {}    # saved in each checkpoint's 'progress' item (the vocabulary's hash)
    self.resumed: tuple[int, dict] | None = None  # (step, config changes) of a resumed run
    self._pending = None        # the step of a save that may still be running
    self._failed = False
    self._config_written = False
    self._quiet = orbax_logs.OrbaxErrorFilter()
    for name in ("absl", "asyncio"):
      std_logging.getLogger(name).addFilter(self._quiet)
    self._unraisablehook = sys.unraisablehook
    sys.unraisablehook = orbax_logs.unraisablehook(sys.unraisablehook)

  def save(self, step: int, state, train_seconds: float) -> None:
    self.finish()  # the previous save's failure belongs to its own step
    try:
      save(self.manager, step, state, self.config, self.data_iterator, train_seconds, self.progress)
    except Exception as e:  # noqa: BLE001 - any failure to write stops the run in one line
      self._fail(step, e)
    self._pending = step

  def poll(self) -> None:
    """Without blocking: raises SaveError if a background save has failed. A single process
    only; with several, failures surface at the next save, where every process waits."""
    if self._pending is not None and jax.process_count() == 1 and not self.manager.is_saving_in_progress():
      self.finish()

  def finish(self) -> None:
    """Waits for the running save; raises SaveError if it failed."""
    if self._pending is None:
      return
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001
      self._fail(self._pending, e)
    self._pending = None
    if not self._config_written and jax.process_index() == 0:
      write_config_json(self.workdir, self.config)
      if self.resumed is not None:
        record_changes(self.workdir, *self.resumed)
    self._config_written = True

  def close(self) -> None:
    """Finishes the last save (SaveError if it failed) and stops Orbax's threads."""
    try:
      if not self._failed:
        self.finish()
    finally:
      try:
        self.manager.close()
      except Exception as e:  # noqa: BLE001
        if not self._failed:
          self._fail(self._pending or -1, e)
      finally:
        if not self._failed:  # after a failure, late callbacks of the dead save may still come
          for name in ("absl", "asyncio"):
            std_logging.getLogger(name).removeFilter(self._quiet)
          sys.unraisablehook = self._unraisablehook
        else:  # Orbax's threads have stopped; writes of the dead save may have re-created files
          _remove_unfinished(str(self.manager.directory), settle_seconds=0.5)

  def _fail(self, step: int, error: BaseException):
    self._failed, self._pending = True, None
    warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
    directory = str(self.manager.directory)
    _remove_unfinished(directory)
    raise SaveError(f"saving the checkpoint of step {step} to {directory} failed ({_reason(error)}; "
                    f"{free_space(directory)}); {kept_note(directory)}; stopping") from None


def _remove_unfinished(directory: str, settle_seconds: float = 0.0, max_seconds: float = 10.0) -> None:
  """Deletes the unfinished (TMP_MARKER) folders of a failed save, on process 0: they hold no
  usable checkpoint and take the space a full disk needs. A failed save's first error surfaces
  while its other tensorstore writes are still in flight, and those can re-create files under
  the folder after it is deleted; so with `settle_seconds`, it deletes, waits that long and
  deletes again until a wait ends with none there (at most `max_seconds`)."""
  if jax.process_index() != 0:
    return
  def unfinished():
    return [n for n in (files.listdir(directory) if files.isdir(directory) else []) if TMP_MARKER in n]
  deadline = time.monotonic() + max_seconds
  while True:
    for name in unfinished():
      files.rmtree(files.join(directory, name))
    if settle_seconds <= 0 or time.monotonic() > deadline:
      return
    time.sleep(settle_seconds)  # writes still in flight show up again within this
    if not unfinished():
      return


def kept_note(directory: str) -> str:
  """'the last good checkpoint (step N) is kept', for the message of a run that stops."""
  good = _steps_on_disk(directory)
  return f"the last good checkpoint (step {good[-1]}) is kept" if good else "no checkpoint was written"


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


def check_compatible(manager: ocp.CheckpointManager, step: int, abstract_state,
                     config: ml_collections.ConfigDict | None = None) -> None:
  """Raises CheckpointError naming the first parameter whose saved shape differs, and with
  `config` (the run's) the model key whose change made it, as every forbidden change is named."""
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
      why = f"parameter {key} has shape {saved[key]} there but {shape} in this config"
    elif key not in saved and key.startswith("params/"):
      why = f"it has no parameter {key}"
    else:
      continue
    named = _changed_model_key(manager, step, config, saved.get(key, ()), shape)
    if named:
      changed, (old, new) = named
      raise CheckpointError(
          f"config key '{changed}' is {new!r} but the checkpoint at step {step} in "
          f"{manager.directory} was trained with {old!r} ({why}); a resume cannot change the "
          "model's shapes: train it in a new --workdir")
    raise CheckpointError(f"checkpoint {manager.directory}/{step} is from an incompatible "
                          f"config: {why}; use another --workdir")


def _changed_model_key(manager: ocp.CheckpointManager, step: int,
                       config: ml_collections.ConfigDict | None, saved_shape: tuple,
                       shape: tuple) -> tuple[str, tuple] | None:
  """The `model.*` key (dotted, with its (saved, new) values) whose value in `config` differs
  from the one stored with checkpoint `step`: the one whose values are among the two shapes'
  sizes when there is one, else the first; None without a config or a stored one."""
  if config is None:
    return None
  try:
    stored = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
  except Exception:  # noqa: BLE001 - no readable config: the shape alone is named
    return None
  if not stored:
    return None
  before = dotted.flatten(with_defaults(stored).to_dict().get("model", {}))
  after = dotted.flatten(config.to_dict().get("model", {}))
  changed = [(f"model.{k}", (before.get(k), after.get(k))) for k in sorted(set(before) | set(after))
             if before.get(k) != after.get(k)]
  for name, (old, new) in changed:
    if isinstance(old, int) and not isinstance(old, bool) and old in saved_shape and new in shape:
      return name, (old, new)
  return changed[0] if changed else None


class Restored(NamedTuple):
  """What restore_latest found: the state (None: no loadable checkpoint), its step, the training
  seconds up to it, the run config stored with it, its 'progress' item, and the steps of the
  checkpoints it had to move aside as unreadable."""
  state: Any
  step: int | None
  train_seconds: float
  config: dict | None
  progress: dict
  quarantined: tuple[int, ...]


def restore_latest(manager: ocp.CheckpointManager, abstract_state, data_iterator=None,
                   floor: int = 0) -> Restored:
  """Restores the newest loadable checkpoint at or above step `floor` (a branch's start).

  Incompatible checkpoints raise CheckpointError (nothing is touched); unreadable ones are
  moved aside with a warning and the next older one is tried. A failed attempt leaves
  `data_iterator` where it was (Orbax may have restored its position before another item failed),
  so a run that falls back, to an older checkpoint or to step 0, reads the data of that step.
  Nothing loadable at or above a `floor` > 0 is a CheckpointError.
  """
  initial = data_iterator.get_state() if data_iterator is not None else None
  quarantined = []
  for step in sorted(manager.all_steps(), reverse=True):
    if step < floor:
      break
    check_compatible(manager, step, abstract_state)
    args = {"state": ocp.args.StandardRestore(abstract_state), "config": ocp.args.JsonRestore()}
    if data_iterator is not None:
      import grain  # pylint: disable=g-import-not-at-top
      args["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    if files.isdir(files.join(str(manager.directory), str(step), "progress")):
      args["progress"] = ocp.args.JsonRestore()
    try:
      restored = manager.restore(step, args=ocp.args.Composite(**args))
      progress = dict((restored["progress"] if "progress" in args else None) or {})
      return Restored(restored["state"], step, float(progress.get("train_seconds", 0.0)),
                      restored["config"], progress, tuple(quarantined))
    except Exception as e:  # noqa: BLE001 - any failure to read means this one is unusable
      if data_iterator is not None:
        data_iterator.set_state(initial)  # back to where it was before this attempt
      _quarantine(manager, step, e)
      quarantined.append(step)
  if floor > 0:
    raise CheckpointError(f"no readable checkpoint at or after step {floor} in {manager.directory}"
                          f" (unreadable ones moved aside: {', '.join(map(str, quarantined)) or 'none'})")
  return Restored(None, None, 0.0, None, {}, tuple(quarantined))


def _quarantine(manager: ocp.CheckpointManager, step: int, error: Exception) -> None:
  src = os.path.join(str(manager.directory), str(step))
  dst = os.path.join(str(manager.directory), f"corrupt_{step}_{int(time.time())}")
  orbax_logs.failed_reads()
  first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
  logging.warning("checkpoint at step %d cannot be read (%s: %s); moved it to %s and trying the "
                  "previous one", step, type(error).__name__, first_line, dst)
  print(f"warning: checkpoint at step {step} is unreadable ({_reason(error)}); "
        f"moved aside to {dst}; trying the previous one", flush=True)
  if jax.process_index() == 0 and files.isdir(src):
    files.rename(src, dst)
  distributed.barrier(f"quarantine_{step}")  # every process sees the rename before reloading
  manager.reload()


def saved_config(directory: str, step: int | None = None) -> tuple[ml_collections.ConfigDict, int]:
  """The run config stored with a checkpoint (the newest when step is None), and its step."""
  config, step, _ = saved_run(directory, step)
  return config, step


def saved_run(directory: str, step: int | None = None
              ) -> tuple[ml_collections.ConfigDict, int, dict]:
  """(run config, step, 'progress' item) of a checkpoint (the newest when step is None), without
  its parameters; the progress is {} for a checkpoint written without one."""
  if not files.isdir(directory):
    raise CheckpointError(f"no checkpoints in {directory}: the folder does not exist")
  manager = make_manager(directory, read_only=True, with_data=False)
  steps = manager.all_steps()
  if not steps or (step is not None and step not in steps):
    _close_quietly(manager)
  if not steps:
    raise CheckpointError(f"no checkpoints in {directory}")
  step = max(steps) if step is None else step
  if step not in steps:
    raise CheckpointError(f"no checkpoint for step {step} in {directory} (steps: "
                          f"{', '.join(map(str, sorted(steps)))})")
  args = {"config": ocp.args.JsonRestore()}
  if files.isdir(files.join(directory, str(step), "progress")):
    args["progress"] = ocp.args.JsonRestore()
  try:
    restored = manager.restore(step, args=ocp.args.Composite(**args))
  except Exception as e:  # noqa: BLE001
    raise unreadable(directory, step, sorted(steps), e) from None
  finally:
    _close_quietly(manager)
  progress = dict((restored["progress"] if "progress" in args else None) or {})
  return with_defaults(restored["config"]), step, progress


def check_vocabulary(progress: dict, tok, vocab_file: str, step: int) -> None:
  """ConfigError unless `tok` (read from `vocab_file`) is the vocabulary that the checkpoint at
  `step` was trained with, as its 'progress' item records it: the same pieces (the fingerprint;
  older checkpoints: the same file bytes; the oldest record neither). Token ids of another
  vocabulary mean other pieces, so its scores, translations and gradients would be garbage. The
  one comparison of every path that loads a trained workdir (resume, branch, eval, translate,
  average, ensemble members)."""
  by_pieces = "vocab_fingerprint" in progress
  saved = progress.get("vocab_fingerprint" if by_pieces else "vocab_sha256")
  if saved and saved != (tok.fingerprint if by_pieces else tok.sha256):
    folder, name = os.path.split(vocab_file)
    raise ConfigError(f"{folder} is not the vocabulary the checkpoint at step {step} was trained "
                      f"with (its {name} {'has other pieces' if by_pieces else 'differs'}): "
                      "token ids would mean other pieces; put the run's own vocab/ back, or "
                      "train in a new --workdir")


def unreadable(directory: str, step: int, steps: list[int], error: BaseException) -> CheckpointError:
  """The error for a checkpoint that fails to load: the cause, and the other steps to pick."""
  orbax_logs.failed_reads()
  others = [s for s in steps if s != step]
  if others:
    hint = (f"pick another with --step={others[-1]} (steps: {', '.join(map(str, others))}), or "
            f"--average=K --step={others[-1]} to average the ones up to it")
  else:
    hint = "it is the only checkpoint there"
  return CheckpointError(f"checkpoint {directory}/{step} cannot be read ({_reason(error)}); {hint}")


def load_params(directory: str, step: int | None = None, mesh=None) -> tuple[Any, ml_collections.ConfigDict, int]:
  """(params, run config, step) of a checkpoint, for evaluation and translation."""
  config, step = saved_config(directory, step)
  try:
    validate(config)
  except ConfigError as e:
    raise CheckpointError(f"checkpoint {directory}/{step} holds an invalid config: {e}") from None
  mesh = mesh or sharding.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}))
  abstract, _ = step_lib.state_shardings(config, mesh)
  manager = make_manager(directory, read_only=True, with_data=False)
  try:
    state = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
  except Exception as e:  # noqa: BLE001
    raise unreadable(directory, step, sorted(manager.all_steps()), e) from None
  finally:
    _close_quietly(manager)
  return state.params, config, step


CHANGES_FILE = "config_changes.jsonl"


def record_changes(workdir: str, step: int, changes: dict) -> None:
  """WORKDIR/config_changes.jsonl: one line per resume that changed the config, {"step": S,
  "changes": {key: [old, new]}, "date": ...}, the change in effect from step S + 1 on. Lines of
  steps at or past S (of checkpoints that a fallback left behind) are dropped first, so the file
  describes the steps behind the checkpoints, as metrics.jsonl does."""
  path = files.join(workdir, CHANGES_FILE)
  lines = files.read_text(path).splitlines() if files.exists(path) else []
  kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) < step]
  if changes:
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    kept.append(json.dumps({"step": step, "changes": changes, "date": now}, default=str))
  if kept and kept != lines:
    files.write_text(path, "".join(line + "\n" for line in kept))
  elif lines and not kept:
    files.remove(path)


def write_config_json(workdir: str, config: ml_collections.ConfigDict) -> None:
  """WORKDIR/config.json: the config of the run, for people and tools (atomic write)."""
  files.write_text(files.join(workdir, "config.json"),
                   json.dumps(config.to_dict(), indent=2, sort_keys=True))
