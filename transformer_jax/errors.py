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


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing (`app.run(main, flags_parser=parse_flags)`) with a flag mistake reported
  as one line `error: ...` and exit status 2."""
  import sys  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    sys.exit(2)
