"""The project's exception types, in one module that imports nothing of ours.

Each means "the user asked for something that cannot be done" and prints as one line `error: ...`
with exit status 2 (cli.run); anything else is a bug and keeps its traceback. Every module imports
them from here, never through the module that raises them.
"""

from __future__ import annotations


class ConfigError(ValueError):
  """A user mistake in the configuration or the command line; one line naming the key."""


class DataError(ConfigError):
  """Unusable input data (a missing file, bad bytes, misaligned files); one line naming it."""


class WorkdirBusy(ConfigError):
  """Another live process holds the workdir; the message names it."""


class CheckpointError(ValueError):
  """A checkpoint that cannot be used; the message is one line."""


class SaveError(CheckpointError):
  """A checkpoint could not be written; the run stops (one line, exit 2)."""


class TrainingError(RuntimeError):
  """The run cannot go on (e.g. a non-finite loss); the message is one line."""


# What cli.run prints as one line (DataError and WorkdirBusy are ConfigErrors).
USER_ERRORS = (ConfigError, CheckpointError, TrainingError)
