"""The battery's cases of issue #55, "nothing silently wrong": failed restores, changed resumes,
work lost after the expensive part, values that make no sense, tracebacks beside the right
message, Ctrl-C. Registered into experiments/battery_cases.CASES on import (battery.py imports
this module); each runs the real CLI on the tiny model in the scratch folder."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

from experiments.battery_cases import (Run, _cli, _env, _metric_steps, _result, _steps, _train_cmd,
                                       _tree, _wait_for, _with_vocab, case, run)
from transformer_jax import metrics
from transformer_jax.overrides import REPO

TRACEBACK_MARKS = ("Traceback", "Event loop is closed", "IndexError", "FileExistsError")


def _folder(name: str) -> str:
  """A workdir name for a case (letters, digits and '_' only: no flag text in the paths a
  message repeats, which would satisfy a check by itself)."""
  return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def _clean(r: Run) -> bool:
  return not any(m in r.output for m in TRACEBACK_MARKS)


def _trained(scratch, name: str) -> str:
  """A copy of one finished 6-step run (checkpoints 2, 4, 6), trained once per battery."""
  source = os.path.join(scratch, "_trained6")
  if not os.path.isdir(os.path.join(source, "checkpoints")):
    shutil.rmtree(source, ignore_errors=True)
    made = _with_vocab(scratch, "_trained6")
    r = run(_train_cmd(made, "--config.train.num_steps=6"))
    if r.returncode != 0:
      raise RuntimeError(f"the 6-step run failed: {r.last}")
  workdir = os.path.join(scratch, name)
  shutil.copytree(source, workdir)
  return workdir


def _garble(workdir: str, step: int) -> None:
  """Checkpoint `step`'s state metadata garbled (its data position intact), as a bad disk does."""
  for r, _, fs in os.walk(os.path.join(workdir, "checkpoints", str(step), "state")):
    for f in fs:
      if f.endswith(("_METADATA", "manifest.ocdbt")):
        with open(os.path.join(r, f), "wb") as g:
          g.write(b"\x00garbage")


def _dev_loss(workdir: str, step: int):
  rows = [r for r in metrics.read_rows(workdir, "dev") if r["step"] == step and "loss" in r]
  return rows[-1]["loss"] if rows else None


# ---------------------------------------------------------------------------- failed restores

@case("every checkpoint unreadable", "each moved aside with a warning; the run starts again from "
      "step 0 with step 0's data (the clean run's dev loss); the old metrics.jsonl kept aside")
def all_unreadable(scratch):
  workdir = _trained(scratch, "all_unreadable")
  clean = _dev_loss(workdir, 6)
  for step in _steps(workdir):
    _garble(workdir, step)
  r = run(_train_cmd(workdir, "--config.train.num_steps=6"))
  aside = [n for n in os.listdir(workdir) if n.startswith("metrics.jsonl.before_restart_")]
  checks = {"exit 0, no traceback": r.returncode == 0 and _clean(r),
            "says it starts again from step 0": "starting again from step 0" in r.output,
            "dev loss at step 6 equals the clean run's": clean is not None
            and abs(_dev_loss(workdir, 6) - clean) <= 1e-6 * abs(clean),
            "old metrics kept aside": len(aside) == 1,
            "each step once in metrics.jsonl": _metric_steps(workdir) == [2, 4, 6]}
  return _result(all(checks.values()), r, checks)


@case("branch from an unreadable step", "exit 2, one line before anything is copied; no branch "
      "workdir, the source untouched")
def branch_unreadable(scratch):
  source = _trained(scratch, "branch_src")
  _garble(source, 6)
  before = _tree(source)
  branch = os.path.join(scratch, "branch_dst")
  r = run(_cli(f"--workdir={branch}", f"--branch_from={source}", "--step=6",
               "--config.train.num_steps=8"))
  checks = {"one-line error": r.one_line_error("cannot branch from step 6", "cannot be read"),
            "no 'branched' claim": "branched" not in r.output,
            "no branch workdir": not os.path.exists(branch), "source untouched": _tree(source) == before}
  return _result(all(checks.values()), r, checks)


# ---------------------------------------------------------------------------- changed resumes

def _refused_resume(name, args, *needles, prepare=None):
  def fn(scratch):
    workdir = _trained(scratch, _folder(name))
    if prepare:
      prepare(scratch, workdir)
    before = _tree(workdir)
    r = run(_train_cmd(workdir, "--config.train.num_steps=8", *args))
    checks = {"one-line error naming the key": r.one_line_error(*needles),
              "workdir untouched (config.json, checkpoints, metrics)": _tree(workdir) == before}
    return _result(all(checks.values()), r, checks)
  return fn


case("resume with dropout 0.3 (trained with 0.1)", "exit 2, one line naming the key and both "
     "values; nothing written")(_refused_resume(
         "resume dropout", ["--config.model.dropout_rate=0.3"], "config key 'model.dropout_rate'",
         "0.3", "trained with 0.1"))
case("resume with learning_rate_scale=1e30 after a good run", "exit 2 before training: another "
     "rate would change the finished steps; config.json and checkpoints untouched")(_refused_resume(
         "resume rate", ["--config.train.learning_rate_scale=1e30"],
         "config key 'train.learning_rate_scale'", "trained with"))


def _other_vocab(scratch, workdir):
  other = os.path.join(scratch, "_other_vocab")
  if not os.path.isdir(other):
    r = run(_train_cmd(other, "--mode=vocab", "--config.data.vocab_train_sentences=3000"))
    if r.returncode != 0:
      raise RuntimeError(f"the other vocabulary failed: {r.last}")
  shutil.rmtree(os.path.join(workdir, "vocab"))
  shutil.copytree(os.path.join(other, "vocab"), os.path.join(workdir, "vocab"))


case("resume with a replaced vocabulary of the same size", "exit 2, one line: not the vocabulary "
     "the checkpoint was trained with")(_refused_resume(
         "resume vocab", [], "is not the vocabulary the checkpoint at step 6", prepare=_other_vocab))


@case("resume with more steps", "trains on, prints the change, records it with its step in "
      "config_changes.jsonl; config.json the newest config")
def resume_more_steps(scratch):
  workdir = _trained(scratch, "resume_more")
  r = run(_train_cmd(workdir, "--config.train.num_steps=8"))
  path = os.path.join(workdir, "config_changes.jsonl")
  records = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
  with open(os.path.join(workdir, "config.json")) as f:
    newest = json.load(f)["train"]["num_steps"]
  checks = {"exit 0": r.returncode == 0,
            "prints the change": "resuming with train.num_steps=8 (was 6)" in r.output,
            "recorded with step 6": [(x["step"], x["changes"]) for x in records]
            == [(6, {"train.num_steps": [6, 8]})],
            "config.json has 8 steps": newest == 8, "trained to 8": _steps(workdir)[-1:] == [8]}
  return _result(all(checks.values()), r, checks)


# ---------------------------------------------------------------- work lost after the decoding

@case("translate into a missing folder", "exit 2, one line naming the folder, before the model is "
      "loaded or anything decoded")
def translate_missing_dir(scratch):
  workdir = _trained(scratch, "translate_out")
  out = os.path.join(scratch, "no_such_dir", "x.txt")
  cmd = _cli("--mode=translate", f"--workdir={workdir}", f"--output={out}")
  p = subprocess.run(cmd, cwd=REPO, env=_env(), input="A man rides a bike.\n" * 20,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
  r = Run(cmd, p.returncode, p.stdout)
  checks = {"one-line error naming the folder": r.one_line_error("no_such_dir", "does not exist"),
            "nothing decoded first": "translate:" not in r.output}
  return _result(all(checks.values()), r, checks)


@case("eval on a read-only workdir", "exit 2, one line naming the eval folder, before anything "
      "is decoded")
def eval_read_only(scratch):
  workdir = os.path.join(scratch, "read_only")
  os.makedirs(workdir)
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", workdir],
                    capture_output=True).returncode != 0:
    return {"ok": None, "run": None, "checks": {"skipped: mount not permitted": True}, "others": []}
  try:
    src = _trained(scratch, "read_only_src")
    for name in ("checkpoints", "vocab"):
      shutil.copytree(os.path.join(src, name), os.path.join(workdir, name))
    subprocess.run(["mount", "-o", "remount,ro", workdir], check=True)
    r = run(_cli("--mode=eval", f"--workdir={workdir}", "--split=validation"))
    checks = {"one-line error naming the eval folder": r.one_line_error(f"{workdir}/eval"),
              "nothing decoded first": "translate:" not in r.output}
    return _result(all(checks.values()), r, checks)
  finally:
    subprocess.run(["umount", "-l", workdir], check=False)


def _on_trained(name, expectation, args, *needles, stdin=None, prepare=None):
  """A command on a copy of the trained run that must stop in one line and write nothing."""
  @case(name, expectation)
  def fn(scratch):
    workdir = _trained(scratch, _folder(name))
    extra = prepare(scratch, workdir) if prepare else []
    before = _tree(workdir)
    cmd = _cli(f"--workdir={workdir}", *args, *extra)
    p = subprocess.run(cmd, cwd=REPO, env=_env(), input=stdin, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    r = Run(cmd, p.returncode, p.stdout)
    checks = {"one-line error": r.one_line_error(*needles), "no traceback": _clean(r),
              "nothing written": _tree(workdir) == before}
    return _result(all(checks.values()), r, checks)
  return fn


_on_trained("eval --bleu_sentences=-1", "exit 2, one line; no partial report under the whole-set "
            "name", ["--mode=eval", "--split=validation", "--bleu_sentences=-1"], "bleu_sentences")

# ----------------------------------------------------------------- values that make no sense

_on_trained("eval --config.decode.alpha=nan", "exit 2, one line naming the key",
            ["--mode=eval", "--split=validation", "--config.decode.alpha=nan"], "decode.alpha",
            "finite")
_on_trained("average --average=0", "exit 2, one line about K=0 (not silently 5)",
            ["--mode=average", "--average=0"], "--average=0", "K >= 1")
_on_trained("translate --step=-1", "exit 2, one line naming the flag",
            ["--mode=translate", "--step=-1"], "--step=-1", stdin="A man.\n")


def _fresh_mistake(name, expectation, args, *needles):
  @case(name, expectation)
  def fn(scratch):
    workdir = os.path.join(scratch, _folder(name))
    r = run(_train_cmd(workdir, *args))
    checks = {"one-line error": r.one_line_error(*needles), "no workdir left": not os.path.exists(workdir)}
    return _result(all(checks.values()), r, checks)
  return fn


_fresh_mistake("negative seed", "exit 2, one line naming the key and its range",
               ["--config.seed=-1"], "'seed'", "-1")
_fresh_mistake("oversized seed (2**40)", "exit 2, one line naming the key and its range",
               [f"--config.seed={2**40}"], "'seed'", str(2**40))
_fresh_mistake("train.peak_flops=inf", "exit 2, one line: a finite number",
               ["--config.train.peak_flops=inf"], "train.peak_flops", "finite")


@case("empty --workdir= (an unset shell variable)", "exit 2, one line; nothing written in the "
      "current folder")
def empty_workdir(scratch):
  cwd = os.path.join(scratch, "cwd")
  os.makedirs(cwd)
  cmd = [sys.executable, "-m", "transformer_jax.main", "--workdir=",
         *[a if not a.startswith("--config=configs/") else f"--config={REPO}/{a.split('=', 1)[1]}"
           for a in _train_cmd("x")[4:]]]
  p = subprocess.run(cmd, cwd=cwd, env=dict(_env(), PYTHONPATH=REPO), stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True, timeout=600)
  r = Run(cmd, p.returncode, p.stdout)
  checks = {"one-line error": r.one_line_error("--workdir is empty"),
            "nothing in the current folder": os.listdir(cwd) == []}
  return _result(all(checks.values()), r, checks)


@case("config file in a folder named with ':'", "the file is read as a file (not as a variant "
      "of 'folder'); the run trains")
def colon_folder(scratch):
  folder = os.path.join(scratch, "cfg:v2")
  os.makedirs(folder)
  shutil.copy(os.path.join(REPO, "configs", "tiny.py"), folder)
  workdir = _with_vocab(scratch, "colon_cfg")
  cmd = [a if not a.startswith("--config=configs/") else f"--config={folder}/tiny.py"
         for a in _train_cmd(workdir, "--config.train.num_steps=2")]
  r = run(cmd)
  checks = {"exit 0": r.returncode == 0, "trained": _steps(workdir) == [2]}
  return _result(all(checks.values()), r, checks)


# ------------------------------------------------------------------ tracebacks beside the line

for _mode, _args in (("eval", ["--split=validation", "--bleu_sentences=4"]),
                     ("translate", []), ("average", ["--average=2"])):
  def _prepare_garbled(scratch, workdir):
    _garble(workdir, 6)
    return []
  _on_trained(f"{_mode} with a garbled newest checkpoint", "exit 2, the one line with the cause "
              "and --step=4; no 'Event loop is closed' tracebacks", [f"--mode={_mode}", *_args],
              "cannot be read", "--step=4", stdin="A man.\n", prepare=_prepare_garbled)


def _empty_files(scratch, workdir):
  del workdir
  path = os.path.join(scratch, "empty.en")
  open(path, "w").close()
  return [f"--source={path}", f"--reference={path}"]


_on_trained("eval on empty --source/--reference files", "exit 2, one line naming the files (no "
            "IndexError)", ["--mode=eval"], "empty.en", "no lines", prepare=_empty_files)


def _sweep_into_a_file(flag):
  @case(f"sweep runner {flag} naming a file", "exit 2, one line naming the flag; nothing written "
        "(no sweep.json)")
  def fn(scratch):
    blocker = os.path.join(scratch, f"file_{flag.strip('-')}")
    with open(blocker, "w") as f:
      f.write("x")
    out = blocker if flag == "--out" else os.path.join(scratch, "sweep_out")
    args = [f"--out={out}"] + ([f"--results_dir={blocker}"] if flag == "--results_dir" else
                               [f"--results_dir={os.path.join(scratch, 'sweep_results')}"])
    cmd = [sys.executable, "-m", "experiments.run", "--sweep=experiments/table3.py",
           "--scale=tiny", "--rows=base", *args]
    r = run(cmd)
    checks = {"one-line error": r.one_line_error(flag, "is a file"),
              "no sweep.json": not os.path.exists(os.path.join(scratch, "sweep_out", "sweep.json"))}
    return _result(all(checks.values()), r, checks)
  return fn


_sweep_into_a_file("--out")
_sweep_into_a_file("--results_dir")


# ------------------------------------------------------------------------------------ Ctrl-C

@case("Ctrl-C during training and the same command again", "the first Ctrl-C saves the current step "
      "and exits 0 in a few lines; the same command resumes from it; a second Ctrl-C stops at once "
      "in one line")
def ctrl_c(scratch):
  workdir = _with_vocab(scratch, "ctrl_c")
  cmd = _train_cmd(workdir, "--config.train.num_steps=100000",
                   "--config.train.checkpoint_every_steps=1000")
  proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  _wait_for(lambda: bool(_metric_steps(workdir)), proc=proc)
  proc.send_signal(signal.SIGINT)
  first = Run(cmd, None, proc.communicate(timeout=600)[0])
  first.returncode = proc.returncode
  saved = _steps(workdir)
  resume_cmd = _train_cmd(workdir, f"--config.train.num_steps={(saved or [0])[-1] + 2}",
                          "--config.train.checkpoint_every_steps=1000")
  resumed = run(resume_cmd)
  other = _with_vocab(scratch, "ctrl_c_twice")  # and twice, once training runs: stop at once
  twice_cmd = _train_cmd(other, "--config.train.num_steps=100000")
  proc = subprocess.Popen(twice_cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  _wait_for(lambda: bool(_metric_steps(other)), proc=proc)
  proc.send_signal(signal.SIGINT)
  seen = []
  for line in proc.stdout:  # the first one is being handled: the second comes as a user's would
    seen.append(line)
    if line.startswith("Ctrl-C: saving"):
      proc.send_signal(signal.SIGINT)
      break
  twice = Run(twice_cmd, None, "".join(seen) + proc.communicate(timeout=600)[0])
  twice.returncode = proc.returncode
  checks = {"exit 0, no traceback": first.returncode == 0 and _clean(first),
            "saved the step it names": bool(saved) and
            f"SIGINT: saved a checkpoint at step {saved[-1]}" in first.output,
            "the same command resumes from it": resumed.returncode == 0
            and f"resuming from the checkpoint at step {saved[-1]}" in resumed.output,
            "twice: stops in one line": twice.returncode != 0 and _clean(twice)
            and twice.last.startswith("error: interrupted")}
  return _result(all(checks.values()), first, checks, resumed, twice)
