"""The one loader of a trained workdir, for evaluation, translation, ensembles and comparisons: a
checkpoint (or the average of the last k) with the user's evaluation overrides on top of its
config, and the workdir's vocabulary, refused unless it is the one the checkpoint was trained
with (checkpoint.check_vocabulary, the comparison a resume makes). Below evaluate.py and
translate.py, which both need it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

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


class Trained(NamedTuple):
  """A loaded workdir: its (resolved) path, parameters (None from `open_workdir`), the config
  with the overrides applied, the checkpoint's step, the overrides and the vocabulary."""
  workdir: str
  params: Any
  config: ml_collections.ConfigDict
  step: int
  overrides: dict
  tokenizer: tok_lib.Tokenizer


def _checked_vocabulary(workdir: str, directory: str, step: int | None, what: str):
  """(stored config, step, vocabulary) of checkpoint `step` (None: the newest) in `directory`,
  once WORKDIR's vocabulary is found to be the one it was trained with, of its size."""
  config, step, progress = checkpoint.saved_run(directory, step)
  try:
    tok = tok_lib.load_tokenizer(workdir)  # never trains one: a workdir without vocab/ is an error
  except DataError as e:
    if what == "--workdir":
      raise
    raise DataError(f"{what}: its vocabulary cannot be used ({e})") from None
  try:
    checkpoint.check_vocabulary(progress, tok, tok_lib.vocab_path(workdir), step)
  except ConfigError as e:  # a member or a baseline: which flag named it
    if what == "--workdir":
      raise
    raise ConfigError(f"{what}: {e}") from None
  size = config.model.vocab_size
  if tok.vocab_size != size:
    raise ConfigError(f"{what}: the vocabulary {tok_lib.vocab_path(workdir)} has "
                      f"{tok.vocab_size} pieces but the checkpoint at step {step} was trained "
                      f"with model.vocab_size={size}")
  return config, step, tok


def open_workdir(workdir: str, *, step: int | None = None, what: str = "--workdir") -> Trained:
  """A trained workdir checked as `load` checks it (its checkpoint's config and its vocabulary),
  without reading the parameters: for a workdir whose outputs are used, not its model."""
  workdir = files_lib.resolve(workdir)
  files_lib.check_exists(workdir, what)
  config, step, tok = _checked_vocabulary(workdir, checkpoint.checkpoint_dir(workdir), step, what)
  return Trained(workdir, None, config, step, {}, tok)


def load(workdir: str, override_args: Sequence[str] = (), *, average: int = 0,
         step: int | None = None, what: str = "--workdir") -> Trained:
  """A checkpoint (or the average of the last `average`, written when not there yet) with the
  user's evaluation overrides applied to its config and validated, and the workdir's vocabulary,
  checked against the checkpoint's before its parameters are read."""
  workdir = files_lib.resolve(workdir)
  files_lib.check_exists(workdir, what)
  overrides = parse_overrides(override_args)
  for key in overrides:
    section = key.split(".")[0]
    if section not in EVAL_OVERRIDABLE:
      raise ConfigError(f"--config.{key} cannot change a trained model's evaluation; only "
                        f"{', '.join(s + '.*' for s in EVAL_OVERRIDABLE)} may be overridden here")
  if average:
    directory = averaging.average_workdir(workdir, average, step=step)  # holds `step` too
    step = None  # the average's one step
  else:
    directory = checkpoint.checkpoint_dir(workdir)
  _, step, tok = _checked_vocabulary(workdir, directory, step, what)
  params, config, step = checkpoint.load_params(directory, step)
  config = ml_collections.ConfigDict(config.to_dict())
  apply_overrides(config, overrides)
  validate(config)
  registry.get(config)  # the task's checks of the overridden config
  attention.check_backend(ModelConfig.from_config(config.model))
  return Trained(workdir, params, config, step, overrides, tok)


def ensemble_members(workdir: str, others: Sequence[str], *, average: int = 0,
                     step: int | None = None, tok: tok_lib.Tokenizer | None = None) -> list[dict]:
  """The models of the `others` workdirs that decode together with WORKDIR's (`--ensemble`),
  each loaded as `load` does (its newest checkpoint, or the average of its last `average`), as
  {workdir, step, averaged_checkpoints, model (ModelConfig), params}. Their vocabularies must be
  WORKDIR's (`tok` when given), the same pieces in the same order (tokenizer.vocab_fingerprint;
  train the members from one copied vocab/)."""
  if not others:
    return []
  if step is not None:
    raise ConfigError("--step picks one run's checkpoint; with --ensemble every run uses its "
                      "newest (or the average of its last --average)")
  mine = (tok or tok_lib.load_tokenizer(workdir)).fingerprint
  members = []
  for other in others:
    what = f"--ensemble={other}"
    files_lib.check_exists(files_lib.resolve(other), what)
    try:
      member = load(other, average=average, what=what)
    except DataError as e:  # none there, or not a SentencePiece model
      raise ConfigError(f"{e}; ensemble members share one vocabulary (copy one run's vocab/ "
                        "into each workdir before training)") from None
    if member.tokenizer.fingerprint != mine:
      raise ConfigError(f"{what}: its vocabulary {tok_lib.vocab_path(member.workdir)} is not the "
                        f"one in {tok_lib.vocab_path(files_lib.resolve(workdir))}; ensemble "
                        "members share one vocabulary (copy one run's vocab/ into each workdir "
                        "before training)")
    members.append(dict(workdir=member.workdir, step=member.step, averaged_checkpoints=average,
                        model=ModelConfig.from_config(member.config.model), params=member.params))
  return members
