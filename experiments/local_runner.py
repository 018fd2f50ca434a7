"""Commands of a sweep run on this host: a subprocess per command (its log, its error line, a
timeout that ends in SIGTERM), the CPU cores each may use, and SIGTERM passed on to them all."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import signal
import subprocess
import threading

from transformer_jax.config import ConfigError
from transformer_jax.overrides import REPO

_CHILD: set = set()            # the running subprocesses, for SIGTERM forwarding
_CHILD_LOCK = threading.Lock()
STOP = {"requested": False}  # set by forward_sigterm: no further run starts
ONE_CORE_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false"


def latest_step(workdir: str):
  """The newest finished checkpoint's step (Orbax renames a checkpoint to its step when done)."""
  d = os.path.join(workdir, "checkpoints")
  steps = [int(n) for n in os.listdir(d) if n.isdigit()] if os.path.isdir(d) else []
  return max(steps) if steps else None


def trained_seconds(workdir: str, step: int) -> float:
  """The training time a checkpoint records (its JSON 'progress' item, checkpoint.py); 0 when
  it cannot be read."""
  path = os.path.join(workdir, "checkpoints", str(step), "progress", "metadata")
  try:
    with open(path, encoding="utf-8") as f:
      return float(json.load(f).get("train_seconds", 0.0))
  except (OSError, ValueError, AttributeError):
    return 0.0


def training_done(workdir: str, config) -> bool:
  """A run's training is over: its newest checkpoint is at train.num_steps, or (with
  train.max_train_minutes) records that much training time."""
  step = latest_step(workdir)
  if step is None:
    return False
  budget = config.train.max_train_minutes * 60.0
  return step >= config.train.num_steps or bool(budget and trained_seconds(workdir, step) >= budget)


def error_line(log_text: str, returncode: int) -> str:
  """The line that says why a subprocess failed: 'error: ...', else the exception, else the last."""
  lines = [l.strip() for l in log_text.splitlines() if l.strip()]
  for line in reversed(lines):
    if line.startswith("error:"):
      return line[len("error:"):].strip()
  for line in reversed(lines):
    head = line.split(":", 1)[0]
    if head.endswith(("Error", "Exception", "Interrupt")) and " " not in head:
      return line
  return (lines[-1] if lines else "") + f" (exit status {returncode})"


def cpu_shares(parallel: int) -> list[list[int]]:
  """This process's CPU cores in `parallel` contiguous shares (ConfigError if too few cores)."""
  cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
  if parallel > 1 and len(cores) < parallel:
    raise ConfigError(f"--parallel={parallel}: this process may use {len(cores) or 'an unknown number of'} "
                      f"CPU cores; give at most one run per core")
  return [cores[i * len(cores) // parallel:(i + 1) * len(cores) // parallel]
          for i in range(parallel)]


def subprocess_runner(cmd: list[str], log_path: str, timeout_s: float = 0.0,
                      cpus: list[int] | None = None):
  """Runs cmd from the repository root, output to log_path; (returncode, error line or '').
  After timeout_s it gets SIGTERM (the training CLI saves a checkpoint and exits). `cpus`: the
  cores it may use (Linux: the calling thread's affinity, which the child inherits)."""
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  if cpus:
    os.sched_setaffinity(0, cpus)  # this thread only; every command of the run inherits it
    if len(cpus) == 1:
      env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {ONE_CORE_XLA_FLAGS}".strip()
  with open(log_path, "a") as log:
    log.write(f"\n# {datetime.datetime.now().isoformat(timespec='seconds')}: {shlex.join(cmd)}"
              + (f" (cores {','.join(map(str, cpus))})" if cpus else "") + "\n")
    log.flush()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    with _CHILD_LOCK:
      _CHILD.add(proc)
    timed_out = False
    try:
      proc.wait(timeout=timeout_s or None)
    except subprocess.TimeoutExpired:
      timed_out = True
      proc.send_signal(signal.SIGTERM)
      try:
        proc.wait(timeout=180)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
      with _CHILD_LOCK:
        _CHILD.discard(proc)
  if timed_out:
    return 1, f"timed out after {timeout_s / 60:g} minutes (rerun to resume from its checkpoint)"
  if proc.returncode == 0:
    return 0, ""
  with open(log_path, errors="replace") as f:
    return proc.returncode, error_line(f.read()[-20000:], proc.returncode)


def forward_sigterm(signum, frame):  # pylint: disable=unused-argument
  """SIGTERM handler: passes the signal to the running subprocess, and no further run starts."""
  STOP["requested"] = True
  with _CHILD_LOCK:
    for proc in _CHILD:
      proc.send_signal(signal.SIGTERM)
