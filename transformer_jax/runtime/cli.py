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

from transformer_jax.runtime import orbax_logs
from transformer_jax.runtime.exceptions import ConfigError, USER_ERRORS
from transformer_jax.runtime.overrides import split_override_args

# The --config.KEY=VALUE arguments of this process's command line (set by parse_flags).
OVERRIDE_ARGS: list[str] = []


def user_errors() -> tuple[type[Exception], ...]:
  return USER_ERRORS  # transformer_jax/runtime/exceptions.py; DataError is a ConfigError


def parse_flags(argv: list[str], flag_values: flags.FlagValues | None = None,
                overrides: bool = True) -> list[str]:
  """absl flag parsing with the overrides taken out first (into OVERRIDE_ARGS) and a flag
  mistake reported as one line `error: ...`, exit status 2.

  `flag_values`: an entry point's own flag set (absl's global one is then parsed without
  arguments); `overrides=False`: the entry point reads no run config, so an override is refused.
  """
  try:
    return parse_or_raise(argv, flag_values, overrides)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def parse_or_raise(argv: list[str], flag_values: flags.FlagValues | None = None,
                   overrides: bool = True) -> list[str]:
  """parse_flags for a caller that handles the mistake itself: a one-line ConfigError."""
  taken, rest = split_override_args(argv[1:])
  if taken and not overrides:
    raise ConfigError(f"{taken[0]}: this command reads no run config; it takes no "
                      "--config.KEY=VALUE overrides")
  OVERRIDE_ARGS[:] = taken
  try:
    if flag_values is None:
      return flags.FLAGS([argv[0]] + rest)
    if not flags.FLAGS.is_parsed():  # absl's own flags at their defaults; no validators run,
      flags.FLAGS.mark_as_parsed()   # since another module's required flags are not ours
    flag_values.unparse_flags()  # each call parses its own arguments only
    return flag_values([argv[0]] + rest)
  except flags.Error as e:
    raise ConfigError(str(e).splitlines()[0]) from None


def run(main: Callable[[list[str]], None], verbosity: int = logging.ERROR,
        flag_values: flags.FlagValues | None = None, overrides: bool = True) -> None:
  """`app.run(main)` with parse_flags and user errors as one line (exit 2). The console shows
  progress, and log lines from `verbosity` up unless --verbosity asks otherwise. `flag_values`
  and `overrides`: as parse_flags."""
  def guarded(argv):
    orbax_logs.closed_loops()
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
  app.run(guarded, flags_parser=lambda argv: parse_flags(argv, flag_values, overrides))
