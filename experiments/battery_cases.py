"""The battery's cases (experiments/battery.py runs them and writes the report): each runs the real
CLI on a tiny model in a scratch folder and returns what the user saw and whether every check
held. `case` registers one; `CASES` lists them in order."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable

from transformer_jax import metrics
from transformer_jax.overrides import REPO

CASES: list[tuple[str, str, Callable]] = []  # (name, expectation, function(scratch) -> result)


def case(name: str, expectation: str):
  def register(fn):
    CASES.append((name, expectation, fn))
    return fn
  return register


def tiny_flags() -> list[str]:
  sys.path.insert(0, REPO)
  from tests.common import TINY_CLI_FLAGS  # pylint: disable=g-import-not-at-top
  return list(TINY_CLI_FLAGS)


def _env(**extra) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", **extra)
  env.pop("XLA_FLAGS", None)
  return env


def _cli(*args: str) -> list[str]:
  return [sys.executable, "-m", "transformer_jax.main", *args]


def _train_cmd(workdir: str, *extra: str) -> list[str]:
  return _cli(f"--workdir={workdir}", *tiny_flags(), *extra)


class Run:
  """One finished command: what the user saw."""

  def __init__(self, cmd, returncode, output):
    self.cmd, self.returncode, self.output = cmd, returncode, output
    self.lines = [l for l in output.splitlines() if l.strip()]

  @property
  def last(self) -> str:
    return self.lines[-1] if self.lines else ""

  def one_line_error(self, *needles: str) -> bool:
    return (self.returncode == 2 and "Traceback" not in self.output
            and self.last.startswith("error: ") and all(n in self.last for n in needles))


def run(cmd, env=None, timeout=600) -> Run:
  p = subprocess.run(cmd, cwd=REPO, env=env or _env(), stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True, timeout=timeout)
  return Run(cmd, p.returncode, p.stdout)


def _wait_for(predicate, timeout=240.0, proc=None) -> bool:
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return True
    if proc is not None and proc.poll() is not None:
      return predicate()
    time.sleep(0.02)
  return False


def _steps(workdir) -> list[int]:
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _metric_steps(workdir, split="train") -> list[int]:
  return [r["step"] for r in metrics.read_rows(workdir, split)]


def _tree(workdir) -> list[tuple]:
  return sorted((os.path.relpath(os.path.join(r, f), workdir), os.stat(os.path.join(r, f)).st_mtime_ns)
                for r, _, fs in os.walk(workdir) for f in fs)


def _with_vocab(scratch, name) -> str:
  """A workdir holding the shared vocabulary (trained once by the first case that needs it)."""
  vocab = os.path.join(scratch, "_vocab_run", "vocab")
  if not os.path.isdir(vocab):
    r = run(_train_cmd(os.path.dirname(vocab), "--config.train.num_steps=1"))
    if r.returncode != 0:
      raise RuntimeError(f"the vocabulary run failed: {r.last}")
  workdir = os.path.join(scratch, name)
  os.makedirs(workdir)
  shutil.copytree(vocab, os.path.join(workdir, "vocab"))
  return workdir


def _result(ok: bool, shown: Run, checks: dict, *others: Run) -> dict:
  return {"ok": bool(ok), "run": shown, "checks": checks, "others": list(others)}


# ----------------------------------------------------------------------------------------- cases

def _two_runs(scratch, name, prepare_steps: int, second_args=None):
  """A run held mid-way (SIGSTOP) while a second command (the same one by default) tries the
  workdir, as from a second terminal; then the first goes on."""
  workdir = _with_vocab(scratch, name)
  if prepare_steps:
    run(_train_cmd(workdir, f"--config.train.num_steps={prepare_steps}"))
  cmd = _train_cmd(workdir, "--config.train.num_steps=20")
  first = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
  _wait_for(lambda: os.path.exists(os.path.join(workdir, "workdir.lock")), proc=first)
  first.send_signal(signal.SIGSTOP)
  try:
    before = _tree(workdir)
    second = run(_cli(*second_args(workdir)) if second_args else cmd)
    untouched = _tree(workdir) == before and not os.path.exists(os.path.join(workdir, "averaged"))
  finally:
    first.send_signal(signal.SIGCONT)
  first_run = Run(cmd, None, first.communicate(timeout=600)[0])
  first_run.returncode = first.returncode
  checks = {"second refused in one line naming the holder": second.one_line_error(
                f"in use by pid {first.pid} on host", "since", "training"),
            "nothing in the workdir changed": untouched,
            "first run finished (exit 0)": first_run.returncode == 0,
            "each train step once in metrics.jsonl": _metric_steps(workdir) == list(range(2, 21, 2)),
            "newest checkpoint is step 20": _steps(workdir)[-1:] == [20]}
  return _result(all(checks.values()), second, checks, first_run)


@case("two runs on a fresh workdir", "second: exit 2, one line naming the holder (host, pid, start); "
      "first finishes; workdir untouched by the second")
def two_runs_fresh(scratch):
  return _two_runs(scratch, "two_fresh", 0)


@case("two runs on a workdir with checkpoints", "as above, on a workdir that already has checkpoints")
def two_runs_with_checkpoints(scratch):
  return _two_runs(scratch, "two_ckpt", 4)


@case("average while training", "--mode=average on a held workdir: exit 2, one line naming the "
      "training run; no averaged/ folder")
def average_while_training(scratch):
  return _two_runs(scratch, "avg_busy", 4,
                   lambda w: ["--mode=average", f"--workdir={w}", "--average=2"])


@case("stale lock of another host", "a lock whose heartbeat is an hour old is taken over with "
      "one warning line; the run trains")
def stale_lock_other_host(scratch):
  workdir = _with_vocab(scratch, "stale_other")
  lock = os.path.join(workdir, "workdir.lock")
  with open(lock, "w") as f:
    json.dump({"host": "gone-host", "pid": 1, "started": "2026-01-01T00:00:00+00:00",
               "command": "main.py", "purpose": "training", "token": "x"}, f)
  os.utime(lock, (time.time() - 3600,) * 2)
  r = run(_train_cmd(workdir, "--config.train.num_steps=2"))
  checks = {"exit 0": r.returncode == 0,
            "one warning line": sum("took over the stale lock" in l for l in r.lines) == 1,
            "lock released": not os.path.exists(lock)}
  return _result(all(checks.values()), r, checks)


@case("kill -9 then resume", "the resume takes over the dead run's lock (one line), drops the "
      "metric lines past the restored step: each step once")
def kill9_resume(scratch):
  workdir = _with_vocab(scratch, "kill9")
  cmd = _train_cmd(workdir, "--config.train.num_steps=12", "--config.train.checkpoint_every_steps=4")
  proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  _wait_for(lambda: bool(_steps(workdir)) and max(_metric_steps(workdir) or [0]) > max(_steps(workdir)),
            proc=proc)
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  before = _metric_steps(workdir)
  restored = max(_steps(workdir) or [0])
  r = run(cmd)
  checks = {"killed run had logged past its checkpoint": max(before or [0]) > restored,
            "exit 0": r.returncode == 0,
            "stale lock taken over (one line)": sum("took over the stale lock" in l for l in r.lines) == 1,
            f"resumed from step {restored}": f"resuming from the checkpoint at step {restored}" in r.output,
            "each train step once": _metric_steps(workdir) == list(range(2, 13, 2))}
  return _result(all(checks.values()), r, checks)


@case("disk full (4 MB tmpfs workdir)", "exit 2, one line (what, where, free space), last good "
      "checkpoint kept, no partial *-tmp folder")
def disk_full(scratch):
  workdir = os.path.join(scratch, "full")
  os.makedirs(workdir)
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", workdir],
                           capture_output=True).returncode == 0
  if not mounted:
    return {"ok": None, "run": None, "checks": {"skipped: mount not permitted": True}, "others": []}
  try:
    src = _with_vocab(scratch, "full_vocab_src")
    shutil.copytree(os.path.join(src, "vocab"), os.path.join(workdir, "vocab"))
    r = run(_train_cmd(workdir, "--config.train.num_steps=100"))
    names = os.listdir(os.path.join(workdir, "checkpoints"))
    checks = {"one-line error": r.one_line_error("No space left on device", "MiB free", "is kept"),
              "at most 3 lines of output": len(r.lines) <= 3,
              "no partial folder": not [n for n in names if "tmp" in n],
              "good checkpoints remain": bool(_steps(workdir))}
    return _result(all(checks.values()), r, checks)
  finally:
    subprocess.run(["umount", "-l", workdir], check=False)


@case("divergence (learning_rate_scale=1e6)", "a warning with the step when the loss exceeds 4x "
      "its minimum (or a non-finite stop); never a silent exit 0")
def divergence(scratch):
  workdir = _with_vocab(scratch, "diverge")
  r = run(_train_cmd(workdir, "--config.train.num_steps=40", "--config.train.learning_rate_scale=1e6"))
  warned = any(l.startswith("warning: loss") and "at step" in l for l in r.lines)
  stopped = r.one_line_error("non-finite", "at step")
  checks = {"warned once with the step, or stopped naming the step": (warned and r.returncode == 0
                                                                      and sum(l.startswith("warning: loss") for l in r.lines) == 1) or stopped}
  return _result(all(checks.values()), r, checks)


@case("NaN run (learning_rate_scale=1e30, a checkpoint every step)", "exit 2 naming the step; "
      "only the checkpoints before it (a good run resumed with that rate: refused, see below)")
def nan_run(scratch):
  workdir = _with_vocab(scratch, "nan")
  r = run(_train_cmd(workdir, "--config.train.num_steps=40", "--config.train.learning_rate_scale=1e30",
                     "--config.train.checkpoint_every_steps=1"))
  bad = int(r.last.split("at step")[1].split(";")[0]) if "at step" in r.last else 0
  checks = {"one-line error with the step": r.one_line_error("non-finite", "at step"),
            "checkpoints only before that step": bool(_steps(workdir))
            and all(s < bad for s in _steps(workdir))}
  return _result(all(checks.values()), r, checks)


@case("data error on a workdir with a run", "exit 2, one line; config.json untouched; no empty "
      "checkpoints/ or tb/")
def data_error(scratch):
  workdir = _with_vocab(scratch, "data_error")
  run(_train_cmd(workdir, "--config.train.num_steps=2"))
  shutil.rmtree(os.path.join(workdir, "checkpoints"))
  shutil.rmtree(os.path.join(workdir, "tb"))
  before = _tree(workdir)
  r = run(_train_cmd(workdir, "--config.data.train_files=no_such_split"))
  checks = {"one-line error": r.one_line_error("no_such_split"),
            "workdir unchanged (config.json, metrics, no empty folders)": _tree(workdir) == before
            and sorted(os.listdir(workdir)) == ["config.json", "metrics.jsonl", "vocab"]}
  return _result(all(checks.values()), r, checks)


@case("max_train_minutes across a resume", "the second identical run finds the budget spent and "
      "trains nothing; a budget 0.01 s above the time used adds one step, not the budget again")
def wall_time(scratch):
  workdir = _with_vocab(scratch, "budget")
  flags_ = ["--config.train.num_steps=100000", "--config.train.checkpoint_every_steps=1000"]
  first = run(_train_cmd(workdir, *flags_, "--config.train.max_train_minutes=0.05"))
  stopped = _steps(workdir)
  again = run(_train_cmd(workdir, *flags_, "--config.train.max_train_minutes=0.05"))

  def seconds(step):
    with open(os.path.join(workdir, "checkpoints", str(step), "progress", "metadata")) as f:
      return json.load(f)["train_seconds"]
  # `budget` in all, not `budget` more: whatever the machine's load, the third run stops after
  # its first step (as tests/test_train_reliability.py checks it)
  budget = seconds(stopped[0]) + 0.01 if stopped else 6.0
  more = run(_train_cmd(workdir, *flags_, f"--config.train.max_train_minutes={budget / 60}"))
  final = _steps(workdir)[-1]
  checks = {"first stopped on time": first.returncode == 0 and "max_train_minutes reached" in first.output,
            "second: already used up, nothing trained": again.returncode == 0
            and "already used up" in again.output and _steps(workdir)[:1] == stopped[:1],
            "third: one step more, the budget counted in all": bool(stopped)
            and final == stopped[0] + 1 and seconds(final) >= budget}
  return _result(all(checks.values()), again, checks, first, more)


@case("eval with a corrupt newest checkpoint", "exit 2, one line naming the cause and suggesting "
      "--step=N (or --average)")
def corrupt_eval(scratch):
  workdir = _with_vocab(scratch, "corrupt")
  run(_train_cmd(workdir, "--config.train.num_steps=6"))
  state = os.path.join(workdir, "checkpoints", "6", "state")
  files = [os.path.join(r, f) for r, _, fs in os.walk(state) for f in fs]
  for f in files:
    if f.endswith(("_METADATA", "manifest.ocdbt")):
      with open(f, "wb") as g:
        g.write(b"\x00garbage")
  r = run(_cli("--mode=eval", f"--workdir={workdir}", "--split=validation", "--bleu_sentences=4"))
  checks = {"one line with the cause and --step=4": r.one_line_error("cannot be read (", "--step=4",
                                                                     "--average")}
  return _result(all(checks.values()), r, checks)


def _mistake(name, expectation, args, *needles, env=None, setup=None):
  @case(name, expectation)
  def fn(scratch):
    extra = setup(scratch) if setup else []
    cmd = _cli(*args(scratch), *extra)
    r = run(cmd, env=env)
    workdirs = [a.split("=", 1)[1] for a in cmd if a.startswith("--workdir=")]
    checks = {"one-line error": r.one_line_error(*needles),
              "no workdir left behind": not any(os.path.exists(w) for w in workdirs)}
    return _result(all(checks.values()), r, checks)
  return fn


_mistake("config file missing", "one line naming the file",
         lambda s: ["--config=configs/nope.py", f"--workdir={s}/nope"], "configs/nope.py", "not found")
_mistake("unknown config variant", "one line with the config's own reason",
         lambda s: ["--config=configs/multi30k.py:long", f"--workdir={s}/long"], "multi30k.py:long", "long")
_mistake("unknown key", "one line with did-you-mean",
         lambda s: [f"--workdir={s}/k", *tiny_flags(), "--config.model.d_modle=64"], "did you mean 'd_model'")
_mistake("bad value", "one line naming the key",
         lambda s: [f"--workdir={s}/v", *tiny_flags(), "--config.train.num_steps=many"], "train.num_steps")
_mistake("missing --workdir", "one line",
         lambda s: tiny_flags(), "--workdir is required")
_mistake("unwritable workdir", "one line naming the workdir",
         lambda s: [f"--workdir={s}/a_file/workdir", *tiny_flags()], "not writable",
         setup=lambda s: open(os.path.join(s, "a_file"), "w").close() or [])
_mistake("missing data dir", "one line naming the folder",
         lambda s: [f"--workdir={s}/nodata", *tiny_flags()], "/no/such/data",
         env=_env(TRANSFORMER_JAX_DATA_DIR="/no/such/data"))
