"""A trained workdir's model as evaluation and translation use it: a checkpoint (or the average of
the last k) with the user's evaluation overrides on top of its config, and the other workdirs'
models of an ensemble. Below evaluate.py and translate.py, which both need it.
"""

from __future__ import annotations

from typing import Sequence

import ml_collections

from transformer_jax.data import tokenizer as tok_lib
from transformer_jax.model import attention
from transformer_jax.runtime import files as files_lib
from transformer_jax.runtime.config import ModelConfig, validate
from transformer_jax.runtime.exceptions import ConfigError, DataError
from transformer_jax.runtime.overrides import apply_overrides, parse_overrides
from transformer_jax.tasks import registry
from transformer_jax.training import averaging, checkpoint

# Config sections an evaluation may override on top of the checkpoint's config.
EVAL_OVERRIDABLE = ("decode", "data", "mesh")


def checkpoint_config(workdir: str, override_args: Sequence[str] = (), *, average: int = 0,
                      step: int | None = None):
  """(params, config, step, checkpoint folder): a checkpoint (or the average of the last
  `average`) with the user's evaluation overrides applied to its config and validated."""
  overrides = parse_overrides(override_args)
  for key in overrides:
    section = key.split(".")[0]
    if section not in EVAL_OVERRIDABLE:
      raise ConfigError(f"--config.{key} cannot change a trained model's evaluation; only "
                        f"{', '.join(s + '.*' for s in EVAL_OVERRIDABLE)} may be overridden here")
  if average:
    directory = averaging.average_workdir(workdir, average, step=step)  # holds `step` too
  else:
    directory = checkpoint.checkpoint_dir(workdir)
  params, config, step = checkpoint.load_params(directory, step)
  config = ml_collections.ConfigDict(config.to_dict())
  apply_overrides(config, overrides)
  validate(config)
  registry.get(config)  # the task's checks of the overridden config
  attention.check_backend(ModelConfig.from_config(config.model))
  return params, config, step, overrides


def ensemble_members(workdir: str, others: Sequence[str], *, average: int = 0,
                     step: int | None = None) -> list[dict]:
  """The models of the `others` workdirs that decode together with WORKDIR's (`--ensemble`):
  each one's newest checkpoint, or the average of its last `average`, as {workdir, step,
  averaged_checkpoints, model (ModelConfig), params}. Their vocabularies must be WORKDIR's, the
  same pieces in the same order (tokenizer.vocab_fingerprint; train the members from one copied
  vocab/)."""
  if not others:
    return []
  if step is not None:
    raise ConfigError("--step picks one run's checkpoint; with --ensemble every run uses its "
                      "newest (or the average of its last --average)")
  mine = tok_lib.load_tokenizer(workdir).fingerprint
  members = []
  for other in others:
    other = files_lib.resolve(other)
    theirs = tok_lib.vocab_path(other)
    try:
      same = tok_lib.load_tokenizer(other).fingerprint == mine
    except DataError:  # none there, or not a SentencePiece model
      same = False
    if not same:
      raise ConfigError(f"--ensemble={other}: its vocabulary {theirs} is not the one in "
                        f"{tok_lib.vocab_path(workdir)}; "
                        "ensemble members share one vocabulary (copy one run's vocab/ into each "
                        "workdir before training)")
    params, config, other_step, _ = checkpoint_config(other, average=average)
    members.append(dict(workdir=other, step=other_step, averaged_checkpoints=average,
                        model=ModelConfig.from_config(config.model), params=params))
  return members
