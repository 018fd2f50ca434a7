"""Branching a run: continue one of its checkpoints in a new workdir, for more steps or a cool-down.

  python -m transformer_jax.main --workdir=runs/b --branch_from=runs/a --step=2700 \
      --config.train.num_steps=4037

A run resumed from step S is bit for bit the run that never stopped (train.py: on CPU in
float32), and nothing before step S depends on how many steps follow it. So a question about the
steps after S (what do 1300 more steps buy? a cool-down from S?) can be answered without paying
for the first S steps again, and without touching the source run: its checkpoint at S (model,
optimizer and data-iterator state), `vocab/`, `metrics.jsonl` and TensorBoard events are copied
into the new workdir, which then trains with the source's own config (stored with that
checkpoint). The run resumes from the copy and drops the copied curve past S, so the branch's
curve is whole.

A branch continues the same run, so `--config.*` may change only what the steps up to S never
saw: the step count, the cool-down, the wall-time limit, and logging/evaluation/checkpoint
cadence. The learning-rate schedule of the branch must equal the source's at every step up to S
(a cool-down may start at S or later). Anything else (a seed, a rate, dropout) is a new run: a
ConfigError names the key. `WORKDIR/branch.json` records the source and step; the same command
on the same workdir resumes the branch, and a workdir that is not that branch is refused. A source
step that cannot be read, or a split whose files are bad (data/sources.check_splits, as a
training run's start), is refused before anything is copied, and a resume of a branch never
falls back below its step (branch_step).

The same rule holds for every resume of a workdir (train.py): `check_resume` compares the config
with the one stored in the checkpoint, refuses a change outside MAY_CHANGE (or of the schedule up
to the checkpoint's step), and returns the accepted ones, which training records with the step.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
from typing import Any, Mapping

import ml_collections
import numpy as np

from transformer_jax.data import sources
from transformer_jax.runtime import distributed, dotted, exceptions, files
from transformer_jax.runtime.config import validate, with_defaults
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import apply_overrides
from transformer_jax.tasks import registry
from transformer_jax.training import checkpoint, schedule, workdir as workdir_lib

MARKER = "branch.json"
COPIED = ("vocab", "metrics.jsonl", "tb")  # besides checkpoints/S; absent ones are skipped
# Keys a continuation (a branch, or a resume of the same workdir) may change: none of them changes
# steps 0..S (the schedule is checked too); everything else is a new run.
MAY_CHANGE = frozenset((
    "train.num_steps", "train.cooldown_steps", "train.max_train_minutes",
    "train.log_every_steps", "train.eval_every_steps", "train.max_eval_batches",
    "train.eval_bleu_sentences", "train.checkpoint_every_steps", "train.checkpoint_every_minutes",
    "train.keep_checkpoints", "train.keep_every_steps", "train.progress_bar", "train.peak_flops",
    "train.divergence_warn_factor", "train.profile_steps", "train.profile_after_steps",
    "train.loss_chunk_positions", "train.unroll_threefry_on_cpu", "model.remat",  # same results
    "data.data_dir", "data.eval_data_dir", "data.tfds_data_dir", "data.num_workers",
    "decode.beam_size", "decode.alpha", "decode.max_extra_len", "decode.batch_size",
    "decode.average_checkpoints", "mesh.data", "mesh.fsdp", "mesh.tensor"))


def config_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list]:
  """{dotted key: [old, new]} for every value that differs between two run configs."""
  a = dotted.flatten(before.to_dict() if hasattr(before, "to_dict") else before)
  b = dotted.flatten(after.to_dict() if hasattr(after, "to_dict") else after)
  return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _check_schedule(before, after, step: int, source: str) -> None:
  """ConfigError unless the learning rate of `after` equals that of `before` at steps 0..step."""
  steps = np.arange(step + 1)
  old = np.asarray(schedule.make_schedule(before)(steps))
  new = np.asarray(schedule.make_schedule(after)(steps))
  changed = np.flatnonzero(old != new)
  if changed.size:
    raise ConfigError(f"train.num_steps={after.train.num_steps}, train.cooldown_steps="
                      f"{after.train.cooldown_steps}: the learning rate at step {changed[0]} "
                      f"would differ from {source}'s, before step {step} where this continues it (a "
                      "cool-down must start at or after it)")


def check_resume(saved: Mapping[str, Any], config: ml_collections.ConfigDict, step: int,
                 workdir: str) -> dict[str, list]:
  """The changes of a resumed run's config against the one stored with the checkpoint it resumes
  (step `step`): {key: [old, new]}, each in MAY_CHANGE with the schedule up to `step` unchanged;
  anything else is a ConfigError naming the key (the finished steps were trained without it)."""
  saved = with_defaults(saved)
  changes = config_changes(saved, config)
  refused = [k for k in changes if k not in MAY_CHANGE]
  if refused:
    key, (old, new) = refused[0], changes[refused[0]]
    more = f" (and {', '.join(refused[1:])})" if len(refused) > 1 else ""
    raise ConfigError(f"config key '{key}' is {new!r} but the checkpoint at step {step} in "
                      f"{workdir} was trained with {old!r}{more}; a resume continues that run and "
                      "may change only the steps, cool-down, wall-time limit, cadence, decoding, "
                      "mesh and data folders (transformer_jax/training/branch.py); train other settings in "
                      "a new --workdir, or --branch_from it")
  if changes:
    _check_schedule(saved, config, step, workdir)
  return changes


def branch_config(source: str, step: int, overrides: Mapping[str, Any]
                  ) -> ml_collections.ConfigDict:
  """The source run's config at checkpoint `step` with `overrides` applied, validated; a
  ConfigError if an override would change the run before `step`."""
  for key in overrides:
    if key not in MAY_CHANGE:
      raise ConfigError(f"--config.{key}: a branch continues {source} from step {step} and keeps "
                        "its settings; it may change only " + ", ".join(sorted(MAY_CHANGE)))
  source_config, _ = checkpoint.saved_config(checkpoint.checkpoint_dir(source), step)
  config = validate(apply_overrides(ml_collections.ConfigDict(source_config.to_dict()), overrides))
  if config.train.num_steps <= step:
    raise ConfigError(f"train.num_steps={config.train.num_steps}: a branch from step {step} must "
                      "train past it")
  _check_schedule(source_config, config, step, source)
  return config


def branch_step(workdir: str) -> int:
  """The step a branch workdir started from (its branch.json), or 0 for any other workdir: a
  resume of a branch never falls back below it."""
  marker = os.path.join(workdir, MARKER)
  if files.is_remote(workdir) or not os.path.isfile(marker):
    return 0
  with open(marker) as f:
    return int(json.load(f).get("step", 0))


def _marker(source: str, step: int) -> dict:
  return {"source": source, "step": step}


def _is_branch(workdir: str, source: str, step: int) -> bool:
  """Whether `workdir` is already the branch of `source` at `step`; a ConfigError if it is a
  branch of something else."""
  marker = os.path.join(workdir, MARKER)
  if not os.path.isfile(marker):
    return False
  with open(marker) as f:
    found = json.load(f)
  if {k: found.get(k) for k in ("source", "step")} != _marker(source, step):
    raise ConfigError(f"{workdir} is a branch of {found.get('source')} at step "
                      f"{found.get('step')}, not of {source} at step {step}; use another --workdir")
  return True


def prepare(source: str, step: int, workdir: str, overrides: Mapping[str, Any]
            ) -> ml_collections.ConfigDict:
  """Creates the branch workdir from `source`'s checkpoint `step` (unless it is already that
  branch, to be resumed) and returns the config to train it with. Local folders only."""
  if files.is_remote(source) or files.is_remote(workdir):
    raise ConfigError("--branch_from copies a checkpoint between local folders; for object-store "
                      f"workdirs copy {source}/checkpoints/{step} and vocab/ yourself")
  source, workdir = os.path.abspath(source), os.path.abspath(workdir)
  if source == workdir:
    raise ConfigError(f"--workdir={workdir} is the source run itself; a branch needs a new folder")
  config = branch_config(source, step, overrides)
  if _is_branch(workdir, source, step):
    return config  # an existing branch: train.py resumes it from its newest checkpoint
  if os.path.isdir(workdir) and os.listdir(workdir):
    raise ConfigError(f"--workdir={workdir} already holds files and is not a branch; a branch "
                      "needs a new or empty folder (nothing there is overwritten)")
  try:  # an unreadable step is refused here, not found by the run after "branched ... at step"
    checkpoint.load_params(checkpoint.checkpoint_dir(source), step)
  except exceptions.CheckpointError as e:
    raise exceptions.CheckpointError(f"cannot branch from step {step}: {e}") from None
  # Every split's files read and checked before anything is written, as a training run's start
  # does (a bad dev file: one line, no branch workdir); process 0 first, as there.
  task = registry.get(config)
  distributed.process_zero_first("branch inputs",
                                 lambda: sources.check_splits(config, task.read_split))
  staging = f"{workdir}.branching-{os.getpid()}"
  shutil.rmtree(staging, ignore_errors=True)
  try:
    for name in COPIED:
      src = os.path.join(source, name)
      if os.path.isdir(src):
        shutil.copytree(src, os.path.join(staging, name))
      elif os.path.isfile(src):
        os.makedirs(staging, exist_ok=True)
        shutil.copy2(src, staging)
    shutil.copytree(os.path.join(checkpoint.checkpoint_dir(source), str(step)),
                    os.path.join(staging, "checkpoints", str(step)))
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with open(os.path.join(staging, MARKER), "w") as f:
      json.dump({**_marker(source, step), "overrides": dict(overrides), "date": now}, f, indent=1,
                default=str)
    if os.path.isdir(workdir):
      os.rmdir(workdir)  # empty (checked above)
    os.rename(staging, workdir)  # the branch appears whole or not at all
  except OSError as e:
    shutil.rmtree(staging, ignore_errors=True)
    if _is_branch(workdir, source, step):
      return config  # another process (of a multi-process run) made it first
    free = workdir_lib.free_space(os.path.dirname(workdir))
    raise ConfigError(f"cannot create the branch {workdir} from {source} at step {step}: "
                      f"{e.strerror or e} ({free})") from None
  print(f"branched {source} at step {step} into {workdir}")
  return config
