"""Command-line plumbing shared by every entry point (training CLI, sweep runner, benchmarks).

Flags are parsed with `--config.KEY=VALUE` overrides taken aside. The exception types in
`user_errors()` mean "the user asked for something that cannot be done": they print as one line
`error: ...` and exit with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from absl import app, flags, logging

from transformer_jax.runtime.exceptions import USER_ERRORS
from transformer_jax.runtime.overrides import split_override_args

# The --config.KEY=VALUE arguments of this process's command line (set by parse_flags).
OVERRIDE_ARGS: list[str] = []


def user_errors() -> tuple[type[Exception], ...]:
  return USER_ERRORS  # transformer_jax/runtime/exceptions.py; DataError is a ConfigError


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing with the overrides taken out first (into OVERRIDE_ARGS) and a flag
  mistake reported as one line `error: ...`, exit status 2."""
  overrides, rest = split_override_args(argv[1:])
  OVERRIDE_ARGS[:] = overrides
  try:
    return flags.FLAGS([argv[0]] + rest)
  except flags.Error as e:
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    sys.exit(2)


def run(main: Callable[[list[str]], None], verbosity: int = logging.ERROR) -> None:
  """`app.run(main)` with parse_flags and user errors as one line (exit 2). The console shows
  progress, and log lines from `verbosity` up unless --verbosity asks otherwise."""
  def guarded(argv):
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(verbosity)
    try:
      main(argv)
    except user_errors() as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C outside training's loop, or a second one inside it
      print("error: interrupted (Ctrl-C)", file=sys.stderr)
      # At once, as asked, once the `with` blocks on the way here have closed (the workdir's
      # lock released, metric files flushed): an interpreter's exit would wait for background
      # threads, and one of them (an Orbax save in flight) could fail on the closing interpreter
      # with a traceback under this line (the battery saw it under load). An unfinished save is
      # a temporary folder that the next run removes.
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(130)  # pylint: disable=protected-access
  app.run(guarded, flags_parser=parse_flags)
