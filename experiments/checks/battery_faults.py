"""The battery's cases with checks of their own (experiments/checks/battery.py runs them after the
refusals of experiments/checks/battery_cases.py): two runs on one workdir, stale locks, kill -9, a full
disk, divergence, the wall-time budget, unreadable checkpoints, resumes, Ctrl-C, a tree file with
a byte-order mark, a process of a two-process run killed. Each runs the
real CLI on the tiny model in the scratch folder; `FAULTS` lists them in the report's order."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from experiments.checks.battery_cases import (REFUSALS, Run, _cli, _env, _finish, _garble,
                                              _metric_steps, _result, _skipped, _start, _steps,
                                              _tmpfs_copy, _train_cmd, _tree, _trained,
                                              _wait_for, _with_vocab, run, tiny_flags)
from transformer_jax.runtime.overrides import REPO
from transformer_jax.training import metrics

FAULTS: list[tuple[str, str, object]] = []  # (name, expectation, function(scratch) -> result)


def case(name: str, expectation: str):
  def register(fn):
    FAULTS.append((name, expectation, fn))
    return fn
  return register


# ------------------------------------------------------------------------ locks and kills

def _two_runs(scratch, name, prepare_steps: int, second_args=None):
  """A run held mid-way (SIGSTOP) while a second command (the same one by default) tries the
  workdir, as from a second terminal; then the first goes on."""
  workdir = _with_vocab(scratch, name)
  if prepare_steps:
    run(_train_cmd(workdir, f"--config.train.num_steps={prepare_steps}"))
  cmd = _train_cmd(workdir, "--config.train.num_steps=20")
  first = _start(cmd)
  _wait_for(lambda: os.path.exists(os.path.join(workdir, "workdir.lock")), proc=first)
  first.send_signal(signal.SIGSTOP)
  try:
    before = _tree(workdir)
    second = run(_cli(*second_args(workdir)) if second_args else cmd)
    untouched = _tree(workdir) == before and not os.path.exists(os.path.join(workdir, "averaged"))
  finally:
    first.send_signal(signal.SIGCONT)
  first_run = _finish(first, cmd)
  checks = {"second refused in one line naming the holder": second.one_line_error(
                f"in use by pid {first.pid} on host", "since", "training"),
            "nothing in the workdir changed": untouched,
            "first run finished (exit 0)": first_run.returncode == 0,
            "each train step once in metrics.jsonl": _metric_steps(workdir) == list(range(2, 21, 2)),
            "newest checkpoint is step 20": _steps(workdir)[-1:] == [20]}
  return _result(second, checks, first_run)


case("two runs on a fresh workdir", "second: exit 2, one line naming the holder (host, pid, "
     "start); first finishes; workdir untouched by the second")(
         lambda scratch: _two_runs(scratch, "two_fresh", 0))
case("two runs on a workdir with checkpoints", "as above, on a workdir that already has "
     "checkpoints")(lambda scratch: _two_runs(scratch, "two_ckpt", 4))
case("average while training", "--mode=average on a held workdir: exit 2, one line naming the "
     "training run; no averaged/ folder")(lambda scratch: _two_runs(
         scratch, "avg_busy", 4, lambda w: ["--mode=average", f"--workdir={w}", "--average=2"]))


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
  return _result(r, {"exit 0": r.returncode == 0,
                     "one warning line": sum("took over the stale lock" in l for l in r.lines) == 1,
                     "lock released": not os.path.exists(lock)})


@case("kill -9 then resume", "the resume takes over the dead run's lock (one line), drops the "
      "metric lines past the restored step: each step once")
def kill9_resume(scratch):
  workdir = _with_vocab(scratch, "kill9")
  cmd = _train_cmd(workdir, "--config.train.num_steps=12", "--config.train.checkpoint_every_steps=4")
  proc = _start(cmd, output=subprocess.DEVNULL)
  _wait_for(lambda: bool(_steps(workdir)) and max(_metric_steps(workdir) or [0]) > max(_steps(workdir)),
            proc=proc)
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  before = _metric_steps(workdir)
  restored = max(_steps(workdir) or [0])
  r = run(cmd)
  return _result(r, {
      "killed run had logged past its checkpoint": max(before or [0]) > restored,
      "exit 0": r.returncode == 0,
      "stale lock taken over (one line)": sum("took over the stale lock" in l for l in r.lines) == 1,
      f"resumed from step {restored}": f"resuming from the checkpoint at step {restored}" in r.output,
      "each train step once": _metric_steps(workdir) == list(range(2, 13, 2))})


# ------------------------------------------------------------------ faults while training

@case("disk full (4 MB tmpfs workdir)", "exit 2, one line (what, where, free space), last good "
      "checkpoint kept, no partial *-tmp folder")
def disk_full(scratch):
  workdir = os.path.join(scratch, "full")
  with _tmpfs_copy(workdir, "4m", _with_vocab(scratch, "full_vocab_src"), ("vocab",)) as mounted:
    if not mounted:
      return _skipped("mount not permitted")
    r = run(_train_cmd(workdir, "--config.train.num_steps=100"))
    names = os.listdir(os.path.join(workdir, "checkpoints"))
    return _result(r, {
        "one-line error": r.one_line_error("No space left on device", "MiB free", "is kept"),
        "at most 3 lines of output": len(r.lines) <= 3,
        "no partial folder": not [n for n in names if "tmp" in n],
        "good checkpoints remain": bool(_steps(workdir))})


@case("divergence (learning_rate_scale=1e6)", "a warning with the step when the loss exceeds 4x "
      "its minimum (or a non-finite stop); never a silent exit 0")
def divergence(scratch):
  workdir = _with_vocab(scratch, "diverge")
  r = run(_train_cmd(workdir, "--config.train.num_steps=40", "--config.train.learning_rate_scale=1e6"))
  warnings = [l for l in r.lines if l.startswith("warning: loss")]
  warned = r.returncode == 0 and len(warnings) == 1 and "at step" in warnings[0]
  return _result(r, {"warned once with the step, or stopped naming the step":
                     warned or r.one_line_error("non-finite", "at step")})


@case("NaN run (learning_rate_scale=1e30, a checkpoint every step)", "exit 2 naming the step; "
      "only the checkpoints before it (a good run resumed with that rate: refused, see below)")
def nan_run(scratch):
  workdir = _with_vocab(scratch, "nan")
  r = run(_train_cmd(workdir, "--config.train.num_steps=40", "--config.train.learning_rate_scale=1e30",
                     "--config.train.checkpoint_every_steps=1"))
  bad = int(r.last.split("at step")[1].split(";")[0]) if "at step" in r.last else 0
  return _result(r, {"one-line error with the step": r.one_line_error("non-finite", "at step"),
                     "checkpoints only before that step": bool(_steps(workdir))
                     and all(s < bad for s in _steps(workdir))})


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
  return _result(again, checks, first, more)


# --------------------------------------------------------------------- restores and resumes

@case("every checkpoint unreadable", "each moved aside with a warning; the run starts again from "
      "step 0 with step 0's data (the clean run's dev loss); the old metrics.jsonl kept aside")
def all_unreadable(scratch):
  workdir = _trained(scratch, "all_unreadable")

  def dev_loss():
    rows = [r for r in metrics.read_rows(workdir, "dev") if r["step"] == 6 and "loss" in r]
    return rows[-1]["loss"] if rows else None
  clean = dev_loss()
  for step in _steps(workdir):
    _garble(workdir, step)
  r = run(_train_cmd(workdir, "--config.train.num_steps=6"))
  aside = [n for n in os.listdir(workdir) if n.startswith("metrics.jsonl.before_restart_")]
  return _result(r, {"exit 0, no traceback": r.returncode == 0 and r.clean,
                     "says it starts again from step 0": "starting again from step 0" in r.output,
                     "dev loss at step 6 equals the clean run's": clean is not None
                     and abs(dev_loss() - clean) <= 1e-6 * abs(clean),
                     "old metrics kept aside": len(aside) == 1,
                     "each step once in metrics.jsonl": _metric_steps(workdir) == [2, 4, 6]})


@case("resume with more steps", "trains on, prints the change, records it with its step in "
      "config_changes.jsonl; config.json the newest config")
def resume_more_steps(scratch):
  workdir = _trained(scratch, "resume_more")
  r = run(_train_cmd(workdir, "--config.train.num_steps=8"))
  path = os.path.join(workdir, "config_changes.jsonl")
  records = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
  with open(os.path.join(workdir, "config.json")) as f:
    newest = json.load(f)["train"]["num_steps"]
  return _result(r, {"exit 0": r.returncode == 0,
                     "prints the change": "resuming with train.num_steps=8 (was 6)" in r.output,
                     "recorded with step 6": [(x["step"], x["changes"]) for x in records]
                     == [(6, {"train.num_steps": [6, 8]})],
                     "config.json has 8 steps": newest == 8,
                     "trained to 8": _steps(workdir)[-1:] == [8]})


@case("eval on a read-only workdir", "exit 2, one line naming the eval folder, before anything "
      "is decoded")
def eval_read_only(scratch):
  workdir = os.path.join(scratch, "read_only")
  src = _trained(scratch, "read_only_src")
  with _tmpfs_copy(workdir, "64m", src, ("checkpoints", "vocab")) as mounted:
    if not mounted:
      return _skipped("mount not permitted")
    subprocess.run(["mount", "-o", "remount,ro", workdir], check=True)
    r = run(_cli("--mode=eval", f"--workdir={workdir}", "--split=validation"))
    return _result(r, {"one-line error naming the eval folder": r.one_line_error(f"{workdir}/eval"),
                       "nothing decoded first": "translate:" not in r.output})


@case("empty --workdir= (an unset shell variable)", "exit 2, one line; nothing written in the "
      "current folder")
def empty_workdir(scratch):
  cwd = os.path.join(scratch, "cwd")
  os.makedirs(cwd)
  cmd = [sys.executable, "-m", "transformer_jax.main", "--workdir=",
         *[a if not a.startswith("--config=configs/") else f"--config={REPO}/{a.split('=', 1)[1]}"
           for a in _train_cmd("x")[4:]]]
  r = run(cmd, env=dict(_env(), PYTHONPATH=REPO), cwd=cwd)
  return _result(r, {"one-line error": r.one_line_error("--workdir is empty"),
                     "nothing in the current folder": os.listdir(cwd) == []})


@case("config file in a folder named with ':'", "the file is read as a file (not as a variant "
      "of 'folder'); the run trains")
def colon_folder(scratch):
  folder = os.path.join(scratch, "cfg:v2")
  os.makedirs(folder)
  shutil.copy(os.path.join(REPO, "configs", "tiny.py"), folder)
  workdir = _with_vocab(scratch, "colon_cfg")
  r = run([a if not a.startswith("--config=configs/") else f"--config={folder}/tiny.py"
           for a in _train_cmd(workdir, "--config.train.num_steps=2")])
  return _result(r, {"exit 0": r.returncode == 0, "trained": _steps(workdir) == [2]})



@case("Ctrl-C during training and the same command again", "the first Ctrl-C saves the current step "
      "and exits 0 in a few lines; the same command resumes from it; a second Ctrl-C stops at once "
      "in one line")
def ctrl_c(scratch):
  workdir = _with_vocab(scratch, "ctrl_c")
  cmd = _train_cmd(workdir, "--config.train.num_steps=100000",
                   "--config.train.checkpoint_every_steps=1000")
  proc = _start(cmd)
  _wait_for(lambda: bool(_metric_steps(workdir)), proc=proc)
  proc.send_signal(signal.SIGINT)
  first = _finish(proc, cmd)
  saved = _steps(workdir)
  resumed = run(_train_cmd(workdir, f"--config.train.num_steps={(saved or [0])[-1] + 2}",
                           "--config.train.checkpoint_every_steps=1000"))
  other = _with_vocab(scratch, "ctrl_c_twice")  # and twice, once training runs: stop at once
  twice_cmd = _train_cmd(other, "--config.train.num_steps=100000")
  proc = _start(twice_cmd)
  _wait_for(lambda: bool(_metric_steps(other)), proc=proc)
  proc.send_signal(signal.SIGINT)
  seen = []
  for line in proc.stdout:  # the first one is being handled: the second comes as a user's would
    seen.append(line)
    if line.startswith("Ctrl-C: saving"):
      proc.send_signal(signal.SIGINT)
      break
  twice = _finish(proc, twice_cmd, "".join(seen))
  checks = {"exit 0, no traceback": first.returncode == 0 and first.clean,
            "saved the step it names": bool(saved) and
            f"SIGINT: saved a checkpoint at step {saved[-1]}" in first.output,
            "the same command resumes from it": resumed.returncode == 0
            and f"resuming from the checkpoint at step {saved[-1]}" in resumed.output,
            "twice: stops in one line": twice.returncode != 0 and twice.clean
            and twice.last.startswith("error: interrupted")}
  return _result(first, checks, resumed, twice)


@case("resume with num_steps below the checkpoint", "exit 0, one line: nothing to train, the "
      "checkpoint at step 6 is already past train.num_steps=4; nothing written")
def resume_fewer_steps(scratch):
  workdir = _trained(scratch, "resume_fewer_steps")
  before = _tree(workdir)
  r = run(_train_cmd(workdir, "--config.train.num_steps=4"))
  checks = {"exit 0": r.returncode == 0, "no traceback": r.clean,
            "one line saying nothing to train": r.last.startswith("nothing to train")
            and "step 6" in r.last and "train.num_steps=4" in r.last,
            "nothing written": _tree(workdir) == before}
  return _result(r, checks)


@case("a tree file starting with a byte-order mark", "--mode=vocab reads it like the same file "
      "without one: exit 0, the vocabulary written")
def bom_tree_file(scratch):
  from experiments.checks.battery_cases import parser_trees  # pylint: disable=g-import-not-at-top
  folder = os.path.join(scratch, "bom_tree_file")
  flags = parser_trees(folder, bom=True)
  r = run(_cli(f"--workdir={folder}/run", "--mode=vocab", *flags))
  checks = {"exit 0": r.returncode == 0, "no traceback": r.clean,
            "vocabulary written": os.path.isdir(os.path.join(folder, "run", "vocab"))}
  return _result(r, checks)


@case("SIGKILL of one process of a two-process run", "the survivor exits at once (well within "
      "--heartbeat_timeout=10) with status 75 and one line naming the lost process; "
      "both restarted resume from the newest checkpoint both wrote and finish")
def distributed_kill(scratch):
  if (os.cpu_count() or 1) < 2:
    return _skipped("two processes need two CPU cores")
  sys.path.insert(0, REPO)
  from tests import test_distributed_fault as fault  # pylint: disable=g-import-not-at-top
  from tests import test_multihost as multihost  # pylint: disable=g-import-not-at-top
  checks, shown, others = {}, None, []
  for victim in (1, 0):
    workdir = os.path.join(scratch, f"distributed_kill_{victim}", "run")
    seconds, status, output = fault.kill_and_wait(workdir, victim)
    r = Run(["transformer_jax.main", "(two processes; SIGKILL to process", f"{victim})"],
            status, output)
    if shown is None:
      shown = r
    else:
      others.append(r)
    what = f"process {victim} killed:"
    checks[f"{what} survivor exited in {seconds:.2f} s (< 10)"] = seconds < fault.HEARTBEAT_S
    checks[f"{what} exit 75, one line naming it, no traceback"] = (
        status == 75 and r.last.startswith(f"error: lost process {victim}") and r.clean
        and sum(l.startswith("error:") for l in r.lines) == 1)
    if victim == 1:
      saved = _steps(workdir)
      outs = multihost._finish(fault._pair(workdir))  # pylint: disable=protected-access
      checks[f"both restarted resume from step {saved[-1] if saved else None} and finish"] = (
          bool(saved) and all(f"resuming from the checkpoint at step {saved[-1]}" in o
                              for o in outs) and _steps(workdir)[-1] == fault.STEPS)
  return _result(shown, checks, *others)


# (name, expectation, function(scratch) -> result): the faults, then the refusals; the last
# fault registered (the two-process kill, the longest) last.
CASES = FAULTS[:-1] + [(r.name, r.expectation, r) for r in REFUSALS] + FAULTS[-1:]


def settings(only: list[str] | None = None) -> dict:
  """What a battery run fixes about what it checks: its cases (`only`: those), each one's
  expectation, and the tiny model's flags; recorded in battery.json, checked by provenance."""
  return {"tiny_flags": tiny_flags(), **{f"cases.{name}": expectation
                                          for name, expectation, _ in CASES
                                          if not only or name in only}}
