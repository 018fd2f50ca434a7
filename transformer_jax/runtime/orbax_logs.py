"""Orbax's log noise after a failure that is already reported in one line.

Filters the tracebacks its threads log for a failed save or read, asyncio's orphaned futures and
tensorstore's 'Event loop is closed' after the loop is gone, so the user sees the one line.
Used by checkpoint.py.
"""

from __future__ import annotations

import logging as std_logging
import os
import sys

from absl import logging


class OrbaxErrorFilter(std_logging.Filter):
  """Orbax logs a failed save with tracebacks from each of its threads, and asyncio the futures
  it left behind; Saver reports the failure as one line (SaveError), so those records are dropped
  unless the log verbosity asks for INFO."""

  def filter(self, record):
    if logging.get_verbosity() >= logging.INFO:
      return True
    orbax = f"{os.sep}orbax{os.sep}" in record.pathname and record.levelno >= std_logging.ERROR
    orphan = record.name == "asyncio" and "exception was never retrieved" in record.getMessage()
    return not (orbax or orphan)


def unraisablehook(previous):
  """Tensorstore reports (through sys.unraisablehook) each write that completes after a failed
  save closed its event loop; those are dropped, everything else goes to `previous`."""
  def hook(unraisable):
    tb = unraisable.exc_traceback
    if (unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == "Event loop is closed"
        and tb is not None and tb.tb_frame.f_code.co_name == "call_soon_threadsafe"):
      return
    previous(unraisable)
  hook._quiet_orbax = True  # pylint: disable=protected-access
  return hook


def failed_reads() -> None:
  """After a checkpoint failed to load: the late callbacks of Orbax's aborted reads ('Event loop is
  closed' from its asyncio threads, once per pending read, often at exit) are dropped for the rest
  of the process, since the failure itself is reported in one line (CheckpointError). Other
  unraisable exceptions and log records still show."""
  if getattr(sys.unraisablehook, "_quiet_orbax", False):
    return
  sys.unraisablehook = unraisablehook(sys.unraisablehook)
  quiet = OrbaxErrorFilter()
  for name in ("absl", "asyncio"):
    std_logging.getLogger(name).addFilter(quiet)
