"""Commands of a sweep run on this host: a subprocess per command (its log, its error line, a
timeout that ends in SIGTERM), the CPU cores each may use, SIGTERM passed on to them all, and the
vocabulary the runs of one OUT folder share."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading

from experiments.harness import resolve
from transformer_jax.runtime import files
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import REPO

_CHILD: set = set()            # the running subprocesses, for SIGTERM forwarding
_CHILD_LOCK = threading.Lock()
STOP = {"requested": False}  # set by forward_sigterm: no further run starts
ONE_CORE_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false"


def run_workdir(out: str, row_id: str, seed: int) -> str:
  """OUT/<row>/seed<k>: where one (row, seed) trains."""
  return os.path.join(os.path.abspath(out), row_id, f"seed{seed}")


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


def cpu_shares(parallel: int, cores: str = "") -> list[list[int]]:
  """This process's CPU cores, or the comma-separated `cores` of them (e.g. '0' beside another
  sweep that keeps core 1), in `parallel` contiguous shares; ConfigError for too few cores or a
  core this process may not use."""
  mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
  chosen = mine
  if cores:
    chosen = []
    for item in (t.strip() for t in cores.split(",")):
      if not item.isdigit() or int(item) not in mine or int(item) in chosen:
        raise ConfigError(f"--cores={cores}: {item!r} is not one of this process's cores, once "
                          f"each (it may use {','.join(map(str, mine)) or 'an unknown set'})")
      chosen.append(int(item))
    chosen.sort()
  if parallel > 1 and len(chosen) < parallel:
    raise ConfigError(f"--parallel={parallel}: this process may use {len(chosen) or 'an unknown number of'} "
                      f"CPU cores; give at most one run per core")
  return [chosen[i * len(chosen) // parallel:(i + 1) * len(chosen) // parallel]
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


# ----------------------------------------------------------------------------- the shared vocabulary

def vocab_cache(out: str, config) -> str:
  """OUT/_vocab/<key>: the vocabulary of every run whose data settings and size are these."""
  data = config.data.to_dict()
  data.pop("data_dir", None)
  key = hashlib.sha1(json.dumps([data, config.model.vocab_size], sort_keys=True,
                                default=str).encode()).hexdigest()[:12]
  return os.path.join(out, "_vocab", key)


def prepare_vocab(res: resolve.Resolved, seed: int, out: str, runner, log) -> None:
  """Trains the shared vocabulary before runs start side by side (`--mode=vocab`, on every core,
  in the first run's workdir, then stashed in OUT/_vocab), so that none of them trains its own.
  On failure the first run trains it, alone on every core, before the others start."""
  if os.path.isdir(vocab_cache(out, res.config)):
    return
  workdir = run_workdir(out, res.trained_as or res.row_id, seed)
  os.makedirs(workdir, exist_ok=True)
  log(f"the shared vocabulary ({res.config.model.vocab_size} pieces): training it first, log "
      f"{workdir}/vocab.log")
  cmd = resolve.train_command(res, workdir, python=sys.executable, seed=seed) + ["--mode=vocab"]
  rc, error = runner(cmd, os.path.join(workdir, "vocab.log"), 0.0)
  if rc:
    log(f"  the shared vocabulary: FAILED: {error}; the first run trains it alone")
  else:
    share_vocab(out, workdir, res.config, "out")


def share_vocab(out: str, workdir: str, config, direction: str) -> None:
  """One vocabulary for all runs: copied into a new workdir, or stashed from a trained one."""
  cache, run_vocab = vocab_cache(out, config), os.path.join(workdir, "vocab")
  if direction == "in" and os.path.isdir(cache) and not os.path.exists(run_vocab):
    shutil.copytree(cache, run_vocab)
  elif direction == "out" and os.path.isdir(run_vocab) and not os.path.isdir(cache):
    tmp = files.temp_path(cache)
    shutil.copytree(run_vocab, tmp)
    try:
      os.replace(tmp, cache)
    except OSError:  # another run stashed its copy meanwhile: keep that one
      if not os.path.isdir(cache):
        raise
      shutil.rmtree(tmp)
