"""Orbax's log noise after a failure that is already reported in one line.

Filters the tracebacks its threads log for a failed save or read, asyncio's orphaned futures and
tensorstore's 'Event loop is closed' after the loop is gone, so the user sees the one line.
Used by checkpoint.py, and by runtime/cli.py for the late callbacks.
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


def _closed_loop(exc_type, exc_value, tb) -> bool:
  """Whether an exception is a late callback of an aborted read: 'Event loop is closed' raised
  in asyncio's call_soon_threadsafe, which tensorstore calls once a read completes."""
  if exc_type is not RuntimeError or str(exc_value) != "Event loop is closed":
    return False
  while tb is not None:
    if tb.tb_frame.f_code.co_name == "call_soon_threadsafe":
      return True
    tb = tb.tb_next
  return False


def unraisablehook(previous):
  """Tensorstore reports each read or write that completes after a failed load or save closed its
  event loop (through sys.unraisablehook); those are dropped, everything else goes to
  `previous`."""
  def hook(unraisable):
    if _closed_loop(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback):
      return
    previous(unraisable)
  hook._quiet_orbax = True  # pylint: disable=protected-access
  return hook


def excepthook(previous):
  """The same late callbacks as printed tracebacks: tensorstore reports some through
  PyErr_Print, which calls sys.excepthook, from its own threads."""
  def hook(exc_type, exc_value, tb):
    if _closed_loop(exc_type, exc_value, tb):
      return
    previous(exc_type, exc_value, tb)
  hook._quiet_orbax = True  # pylint: disable=protected-access
  return hook


def closed_loops() -> None:
  """Drops the late callbacks of aborted reads and writes (_closed_loop) for the rest of the
  process. Entry points install it at their start (runtime/cli.py): those callbacks can come
  before the failure that aborted them is caught, and no other exception is dropped."""
  if not getattr(sys.unraisablehook, "_quiet_orbax", False):
    sys.unraisablehook = unraisablehook(sys.unraisablehook)
  if not getattr(sys.excepthook, "_quiet_orbax", False):
    sys.excepthook = excepthook(sys.excepthook)


def failed_reads() -> None:
  """After a checkpoint failed to load: the late callbacks of Orbax's aborted reads ('Event loop is
  closed' from its asyncio threads, once per pending read, often at exit) are dropped for the rest
  of the process (closed_loops), and so are Orbax's error logs, since the failure itself is
  reported in one line (CheckpointError). Other exceptions and log records still show."""
  closed_loops()
  for name in ("absl", "asyncio"):
    logger = std_logging.getLogger(name)
    if not any(isinstance(f, OrbaxErrorFilter) for f in logger.filters):
      logger.addFilter(OrbaxErrorFilter())
