"""A run's workdir: created, held by one writer at a time, and left without empty folders.

`claim(workdir, purpose)` wraps everything that writes into a workdir (training, averaging): it
creates the folder, takes the lock `WORKDIR/workdir.lock` and, on the way out, releases it and
removes the folders the run left empty, so a run that fails before training leaves nothing.

The lock is a file made by exclusive create, refreshed by a heartbeat, and taken over when its
holder is gone or its heartbeat stale: on the shared storage the launch scripts use (NFS,
Lustre, gcsfuse, gs://) fcntl/flock locks are unreliable, while exclusive create, mtime and rename
work. A second process stops with `WorkdirBusy`, naming the holder. The scheme's rules and its
limits per storage: docs/workflow.md, "The workdir lock". In a multi-host run only process 0
takes the lock and broadcasts its decision.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import socket
import sys
import threading
import time
import uuid
from typing import Iterator

from transformer_jax.runtime import files
from transformer_jax.runtime.exceptions import ConfigError, WorkdirBusy

LOCK_FILE = "workdir.lock"
HEARTBEAT_SECONDS = 30.0
STALE_AFTER_SECONDS = 300.0   # ten missed heartbeats
UNWRITTEN_GRACE_SECONDS = 60.0  # an empty/unreadable lock older than this is a crashed creator
RUN_FOLDERS = ("checkpoints", "tb")  # removed at exit when the run left them empty
EVAL_FOLDER = "eval"  # what --mode=eval writes (transformer_jax/inference/evaluate.py)


def prepare_workdir(workdir: str) -> str:
  """The absolute path (or URL, files.resolve) of `workdir`, created if needed; ConfigError if it
  cannot be."""
  workdir = files.resolve(workdir)
  target = files.dangling_symlink(workdir)
  if target is not None:
    raise ConfigError(f"workdir {workdir} is a dangling symlink to {target}; create {target} "
                      "or give another --workdir")
  try:
    files.makedirs(workdir)
  except OSError as e:
    raise ConfigError(f"workdir {workdir} is not writable ({e.strerror})") from None
  return workdir


def eval_stem(workdir: str, set_name: str, step: int, average: int = 0, settings: str = "",
              bleu_sentences: int = 0) -> str:
  """WORKDIR/eval/<set>_step<N>[_avg<k>][<settings>][_bleu<n>]: the stem of the report (.json)
  and translations (.txt, .jsonl) that `--mode=eval` writes for step N's checkpoint, or for the
  average of the last k (k <= 1: the checkpoint itself, no suffix); `settings` tags decode
  overrides and ensembles (settings_tag, evaluate.ensemble_tag); `bleu_sentences`
  n > 0: only the first n sentences translated, so such a report never overwrites one of the
  whole set. The one place that names them, for evaluate.py and for the
  experiments that read them."""
  name = (f"{set_name}_step{step}" + (f"_avg{average}" if average > 1 else "") + settings
          + (f"_bleu{bleu_sentences}" if bleu_sentences > 0 else ""))
  return files.join(workdir, EVAL_FOLDER, name)


def settings_tag(overrides: dict) -> str:
  """'_beam1_alpha1.0' (or '_constrained', '_free', '_unary5') for decode settings that differ
  from the checkpoint's ({'decode.alpha': 1.0, ...}): reports made with other settings never
  overwrite each other."""
  short = {"beam_size": lambda v: f"beam{v}", "alpha": lambda v: f"alpha{v}",
           "max_extra_len": lambda v: f"extra{v}",
           "parse_constraint": lambda v: "constrained" if v else "free",
           "parse_max_opens_in_a_row": lambda v: f"opens{v}",
           "parse_max_unary_chain": lambda v: f"unary{v}"}
  return "".join(f"_{short[k.split('.')[1]](v)}" for k, v in sorted(overrides.items())
                 if k.startswith("decode.") and k.split(".")[1] in short)


def free_space(path: str) -> str:
  """'12.3 MiB free' on the file system holding `path` (or its nearest existing parent)."""
  if files.is_remote(path):
    return "an object store"
  while path and not os.path.exists(path):
    path = os.path.dirname(path)
  try:
    return f"{shutil.disk_usage(path or '/').free / 2**20:.1f} MiB free"
  except OSError:
    return "free space unknown"


def _describe(holder: dict | None) -> str:
  if not holder:
    return "an unknown process (the lock file is empty or unreadable)"
  command = str(holder.get("command", "?"))
  command = command if len(command) <= 80 else command[:77] + "..."
  return (f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('started')} "
          f"({holder.get('purpose', '?')}: {command})")


def _pid_alive(pid) -> bool:
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, ValueError, TypeError, OverflowError):
    return True
  return True


class WorkdirLock:
  """The lock file of one workdir (see the module docstring)."""

  def __init__(self, workdir: str, purpose: str):
    self.path = files.join(workdir, LOCK_FILE)
    self.workdir = workdir
    self.info = {"host": socket.gethostname(), "pid": os.getpid(),
                 "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                 "command": " ".join([os.path.basename(sys.argv[0] or "python")] + sys.argv[1:])[:2000],
                 "purpose": purpose, "token": uuid.uuid4().hex}
    self._stop = threading.Event()
    self._thread = None

  def _read(self) -> tuple[str | None, float | None]:
    try:
      return files.read_text(self.path), files.mtime(self.path)
    except FileNotFoundError:
      return None, None

  def _stale_reason(self, holder: dict | None, mtime: float) -> str | None:
    age = time.time() - mtime
    if holder is None:
      return f"empty for {age:.0f} s" if age > UNWRITTEN_GRACE_SECONDS else None
    if holder.get("host") == self.info["host"] and not _pid_alive(holder.get("pid")):
      return f"pid {holder.get('pid')} is no longer running on this host"
    if age > STALE_AFTER_SECONDS:
      return f"no heartbeat for {age:.0f} s"
    return None

  def acquire(self) -> None:
    for _ in range(5):
      try:
        fd = self._create()
      except FileExistsError:
        text, mtime = self._read()
        if text is None:
          continue  # released meanwhile: try again
        holder = _parse(text)
        reason = self._stale_reason(holder, mtime)
        if reason is None:
          raise WorkdirBusy(f"workdir {self.workdir} is in use by {_describe(holder)}; wait for "
                            f"it to finish, stop it, or use another --workdir (lock: {self.path})"
                            ) from None
        if self._take_over(text):
          print(f"warning: took over the stale lock of {self.workdir} left by {_describe(holder)}: "
                f"{reason}", file=sys.stderr, flush=True)
        continue
      except OSError as e:
        raise ConfigError(f"workdir {self.workdir} is not writable ({e.strerror})") from None
      if fd is None:  # an object store: written whole
        files.write_text(self.path, json.dumps(self.info))
      else:
        with os.fdopen(fd, "w") as f:
          json.dump(self.info, f)
          f.flush()
          os.fsync(f.fileno())
      text, _ = self._read()  # on stores without atomic exclusive creation the last writer wins
      holder = _parse(text) if text else None
      if not holder or holder.get("token") != self.info["token"]:
        raise WorkdirBusy(f"workdir {self.workdir} is in use by {_describe(holder)} (it took the "
                          "lock at the same moment); use another --workdir")
      self._thread = threading.Thread(target=self._heartbeat, name="workdir-lock", daemon=True)
      self._thread.start()
      return
    raise WorkdirBusy(f"workdir {self.workdir}: could not take the lock {self.path} (other "
                      "processes keep taking it); use another --workdir")

  def _create(self):
    """An O_EXCL file descriptor for the new lock; None in an object store, which has no
    exclusive create: there the lock is written whole and read back (the last writer wins)."""
    if files.is_remote(self.path):
      if files.exists(self.path):
        raise FileExistsError(self.path)
      return None
    return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

  def _take_over(self, stale_text: str) -> bool:
    aside = f"{self.path}.stale-{self.info['host']}-{self.info['pid']}"
    try:
      files.rename(self.path, aside)
    except FileNotFoundError:
      return False  # another process moved it first
    moved = files.read_text(aside)
    if moved != stale_text and not files.exists(self.path):
      files.rename(aside, self.path)  # a fresh lock taken meanwhile: put it back
      return False
    files.remove(aside)
    return moved == stale_text

  def _heartbeat(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS):
      text, _ = self._read()
      holder = _parse(text) if text else None
      if not holder or holder.get("token") != self.info["token"]:
        print(f"warning: the lock {self.path} was removed or taken over by {_describe(holder)}; "
              "another process may now write into this workdir", file=sys.stderr, flush=True)
        return
      try:  # a new mtime: touched locally, rewritten in an object store
        if files.is_remote(self.path):
          files.write_text(self.path, text)
        else:
          os.utime(self.path)
      except OSError:
        pass  # a transient network file system error: the next beat tries again

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
    text, _ = self._read()
    if text and (_parse(text) or {}).get("token") == self.info["token"]:
      files.remove(self.path)


def _parse(text: str) -> dict | None:
  try:
    value = json.loads(text)
  except ValueError:
    return None
  return value if isinstance(value, dict) else None


def _remove_empty_folders(workdir: str, created: bool) -> None:
  if files.is_remote(workdir):
    return  # an object store has no empty folders
  for name in RUN_FOLDERS:
    with contextlib.suppress(OSError):
      os.rmdir(os.path.join(workdir, name))  # only succeeds when empty
  if created:
    with contextlib.suppress(OSError):
      os.rmdir(workdir)


@contextlib.contextmanager
def claim(workdir: str, purpose: str) -> Iterator[str]:
  """Holds `workdir` (created if needed) for this run; yields its absolute path. A workdir held
  by another live process raises WorkdirBusy before anything in it changes."""
  import jax  # pylint: disable=g-import-not-at-top
  path = files.resolve(workdir)
  created = not files.exists(path)
  lock, error = None, None
  if jax.process_index() == 0:
    path = prepare_workdir(path)
    lock = WorkdirLock(path, purpose)
    try:
      lock.acquire()
    except ConfigError as e:
      lock, error = None, e
  if jax.process_count() > 1:
    import numpy as np  # pylint: disable=g-import-not-at-top
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    ok = int(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
    if not ok and error is None:
      error = WorkdirBusy(f"workdir {path} could not be claimed; process 0 says why")
  if error is not None:
    raise error
  if lock is None:
    prepare_workdir(path)  # the other processes of a multi-host run
  try:
    yield path
  finally:
    if lock is not None:
      lock.release()
      _remove_empty_folders(path, created)
