"""The exception types that mean "the user asked for something that cannot be done".

The command line prints these as one line (`error: ...`) without a traceback; anything else is
a bug and keeps its traceback.
"""

from transformer_jax.checkpoint import CheckpointError
from transformer_jax.config import ConfigError
from transformer_jax.train import TrainingError

USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, CheckpointError, TrainingError)
try:  # the data package defines its own error type for corpus problems
  from transformer_jax.data import DataError  # pylint: disable=g-import-not-at-top
  USER_ERRORS += (DataError,)
except ImportError:
  pass
