"""Checkpoint averaging (paper §6.1): the mean of the parameters of the last k checkpoints.

The paper averages the last 5 checkpoints (written at 10-minute intervals) for the base model
and the last 20 for big. `average_workdir(workdir, k)` writes the average as an ordinary
checkpoint in `WORKDIR/averaged/last<k>/<step>` (step = the newest averaged step), with the run
config and the vocabulary's fingerprint, so it loads like any other (`checkpoint.load_params`,
`Translator`, `--mode=eval`). The workdir's vocabulary is checked against the checkpoints'
before anything is written (checked_progress).
An existing average of the same checkpoints is reused, never rewritten. Writing a new one holds
the workdir lock (workdir.claim), so it never races a training run deleting old checkpoints or
another averaging of the same workdir.
"""

from __future__ import annotations

import contextlib
import json

import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp

from transformer_jax.data import tokenizer as tok_lib
from transformer_jax.model import sharding
from transformer_jax.runtime import files
from transformer_jax.runtime.exceptions import CheckpointError
from transformer_jax.training import checkpoint, step as step_lib, workdir as workdir_lib


def averaged_dir(workdir: str, k: int) -> str:
  return files.join(files.resolve(workdir), "averaged", f"last{k}")


def average_workdir(workdir: str, k: int, step: int | None = None) -> str:
  """Averages the newest k checkpoints of `workdir` (those up to `step` when given); returns the
  folder of the new checkpoint."""
  if k < 1:
    raise CheckpointError(f"cannot average {k} checkpoints; ask for at least 1")
  source = checkpoint.checkpoint_dir(workdir)
  if not files.isdir(source):
    raise CheckpointError(f"no checkpoints in {source}: the folder does not exist")
  reader = checkpoint.make_manager(source, read_only=True, with_data=False)
  steps = sorted(reader.all_steps())
  if step is not None:
    if step not in steps:
      raise CheckpointError(f"no checkpoint for step {step} in {source} (steps: "
                            f"{', '.join(map(str, steps)) or 'none'})")
    steps = [s for s in steps if s <= step]
  if len(steps) < k:
    raise CheckpointError(f"asked to average the last {k} checkpoints but {source} holds "
                          f"{len(steps)} ({', '.join(map(str, steps)) or 'none'}); nothing written")
  chosen = steps[-k:]
  progress = checked_progress(workdir, source, chosen[-1])
  out_dir = averaged_dir(workdir, k)
  if files.isdir(out_dir) and chosen[-1] in checkpoint.make_manager(
      out_dir, read_only=True, with_data=False).all_steps():
    return out_dir
  with workdir_lib.claim(workdir, f"averaging the last {k} checkpoints"):
    try:
      return _write_average(reader, source, chosen, out_dir, steps, progress)
    except BaseException:
      for folder in (out_dir, files.parent(out_dir)):  # no empty folders left behind
        files.remove_empty_dir(folder)
      raise
    finally:
      with contextlib.suppress(Exception):
        reader.close()  # Orbax's threads stop here, not in callbacks after the error is shown


def checked_progress(workdir: str, directory: str, step: int) -> dict:
  """The 'progress' item of checkpoint `step` in `directory`, once WORKDIR's vocabulary is found
  to be the one it was trained with (checkpoint.check_vocabulary): an average is checked before
  it is written, as any loaded checkpoint is."""
  _, _, progress = checkpoint.saved_run(directory, step)
  checkpoint.check_vocabulary(progress, tok_lib.load_tokenizer(workdir), tok_lib.vocab_path(workdir),
                              step)
  return progress


def _write_average(reader, source: str, chosen: list[int], out_dir: str, steps: list[int],
                   progress: dict) -> str:
  k = len(chosen)
  existing = checkpoint.make_manager(out_dir, with_data=False, async_save=False)
  if chosen[-1] in existing.all_steps():  # written by another process meanwhile
    return out_dir
  config, _ = checkpoint.saved_config(source, chosen[-1])
  mesh = sharding.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}))
  abstract, _ = step_lib.state_shardings(config, mesh)
  total, last_state = None, None
  for s in chosen:
    try:
      state = reader.restore(s, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
    except Exception as e:  # noqa: BLE001
      existing.close()
      error = checkpoint.unreadable(source, s, steps, e)
      raise CheckpointError(f"{error}; nothing written") from None
    params32 = jax.tree.map(lambda x: x.astype(jnp.float32), state.params)
    total = params32 if total is None else jax.tree.map(jnp.add, total, params32)
    last_state = state
  mean = jax.tree.map(lambda t, p: (t / k).astype(p.dtype), total, last_state.params)
  averaged = last_state.replace(params=mean)
  vocab = {k: v for k, v in progress.items() if k.startswith("vocab_")}  # checked on each load
  checkpoint.save(existing, chosen[-1], averaged, config,
                  train_seconds=progress.get("train_seconds", 0.0), progress=vocab)
  existing.wait_until_finished()
  existing.close()
  # beside the checkpoint folder: which steps
  files.write_text(out_dir + ".json", json.dumps({"steps": chosen, "source": source}))
  return out_dir
