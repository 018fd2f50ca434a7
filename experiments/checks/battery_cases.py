"""How the battery's cases run (the real CLI on a tiny model in a scratch folder: what the user
saw, the workdirs it works on), and the refusals, as data.

Most cases are refusals (`REFUSALS`): a command that must stop with exit status 2 in one line
`error: ...` holding given words, with no traceback and nothing written in the case's folder (a
workdir it names never appears; the trained run it may work on stays as it was). The cases with
checks of their own are in experiments/checks/battery_faults.py; experiments/checks/battery.py runs them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from typing import Callable

from transformer_jax.runtime.overrides import REPO
from transformer_jax.training import metrics

TRACEBACK_MARKS = ("Traceback", "Event loop is closed", "IndexError", "FileExistsError")
TINY = "<tiny flags>"  # in a refusal's arguments: tests/common.py's TINY_CLI_FLAGS
PARSER = "<parser flags>"  # ... the parsing task's tiny flags on tree files with a bad dev file


def tiny_flags() -> list[str]:
  sys.path.insert(0, REPO)
  from tests.common import TINY_CLI_FLAGS  # pylint: disable=g-import-not-at-top
  return list(TINY_CLI_FLAGS)


def _env(**extra) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", **extra)
  env.pop("XLA_FLAGS", None)
  return env


def _cli(*args: str, module: str = "transformer_jax.main") -> list[str]:
  return [sys.executable, "-m", module, *args]


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

  @property
  def clean(self) -> bool:
    return not any(m in self.output for m in TRACEBACK_MARKS)

  def one_line_error(self, *needles: str) -> bool:
    return (self.returncode == 2 and "Traceback" not in self.output
            and self.last.startswith("error: ") and all(n in self.last for n in needles))


def run(cmd, env=None, stdin=None, cwd=REPO) -> Run:
  p = subprocess.run(cmd, cwd=cwd, env=env or _env(), input=stdin, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True, timeout=600)
  return Run(cmd, p.returncode, p.stdout)


def _start(cmd, output=subprocess.PIPE) -> subprocess.Popen:
  return subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=output, stderr=subprocess.STDOUT,
                          text=True)


def _finish(proc: subprocess.Popen, cmd, seen: str = "") -> Run:
  out = proc.communicate(timeout=600)[0]
  return Run(cmd, proc.returncode, seen + out)


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


def _tree(folder) -> list[tuple]:
  """Every folder (by name) and file (with its modification time) below `folder`."""
  out = []
  for root, dirs, names in os.walk(folder):
    out += [(os.path.relpath(os.path.join(root, d), folder) + "/",) for d in dirs]
    out += [(os.path.relpath(os.path.join(root, f), folder),  # lstat: a dangling link too
             os.lstat(os.path.join(root, f)).st_mtime_ns) for f in names]
  return sorted(out)


def _folder(name: str) -> str:
  """A folder name for a case (letters, digits and '_' only: no flag text in the paths a
  message repeats, which would satisfy a check by itself)."""
  return "".join(c if c.isalnum() else "_" for c in name).strip("_")


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


def _trained(scratch, name: str) -> str:
  """A copy (scratch/name) of one finished 6-step run (checkpoints 2, 4, 6), trained once."""
  source = os.path.join(scratch, "_trained6")
  if not os.path.isdir(os.path.join(source, "checkpoints")):
    shutil.rmtree(source, ignore_errors=True)
    r = run(_train_cmd(_with_vocab(scratch, "_trained6"), "--config.train.num_steps=6"))
    if r.returncode != 0:
      raise RuntimeError(f"the 6-step run failed: {r.last}")
  workdir = os.path.join(scratch, name)
  shutil.copytree(source, workdir)
  return workdir


def _garble(workdir: str, step: int = 6) -> None:
  """Checkpoint `step`'s state metadata garbled (its data position intact), as a bad disk does."""
  for r, _, fs in os.walk(os.path.join(workdir, "checkpoints", str(step), "state")):
    for f in fs:
      if f.endswith(("_METADATA", "manifest.ocdbt")):
        with open(os.path.join(r, f), "wb") as g:
          g.write(b"\x00garbage")


def _result(shown: Run | None, checks: dict, *others: Run) -> dict:
  return {"ok": all(checks.values()), "run": shown, "checks": checks, "others": list(others)}


def _skipped(why: str) -> dict:
  return {"ok": None, "run": None, "checks": {f"skipped: {why}": True}, "others": []}


@contextlib.contextmanager
def _tmpfs_copy(folder: str, size: str, src: str, names: tuple[str, ...]):
  """`folder` as a tmpfs of `size` holding a copy of src's `names` (unmounted after); yields
  False, copying nothing, where mounting is not permitted."""
  os.makedirs(folder)
  if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder],
                    capture_output=True).returncode:
    yield False
    return
  try:
    for name in names:
      shutil.copytree(os.path.join(src, name), os.path.join(folder, name))
    yield True
  finally:
    subprocess.run(["umount", "-l", folder], check=False)


# ------------------------------------------------------------------------------ the refusals

@dataclasses.dataclass(frozen=True)
class Refusal:
  """A command that must stop in one line holding `words`, with no traceback, no `absent` text
  and nothing written in the case's folder. In `args`, {dir} is that folder, {new} a workdir in
  it that must not appear, {w} (with `trained`) a copy there of the 6-step run, TINY the tiny
  model's flags. `prepare(dir)` sets the folder up before the command runs."""
  name: str
  expectation: str
  args: tuple[str, ...]
  words: tuple[str, ...]
  trained: bool = False
  module: str = "transformer_jax.main"
  prepare: Callable[[str], object] | None = None
  stdin: str | None = None
  env: dict | None = None
  absent: tuple[str, ...] = ()

  def __call__(self, scratch: str) -> dict:
    folder = os.path.join(scratch, _folder(self.name))
    workdir = os.path.join(folder, "run")
    if self.trained:
      _trained(scratch, os.path.relpath(workdir, scratch))
    else:
      os.makedirs(folder)
    if self.prepare:
      self.prepare(folder)
    args = [a.format(dir=folder, new=os.path.join(folder, "new"), w=workdir) for a in self.args]
    if PARSER in args:  # the parsing task's flags on folder/tb, written here
      parser = parser_trees(folder, bad_dev=True)
      args = [f for a in args for f in (parser if a == PARSER else [a])]
    before = _tree(folder)
    cmd = _cli(*[f for a in args for f in (tiny_flags() if a == TINY else [a])],
               module=self.module)
    r = run(cmd, env=_env(**(self.env or {})), stdin=self.stdin)
    checks = {"one-line error": r.one_line_error(*self.words), "no traceback": r.clean,
              "nothing written": _tree(folder) == before}
    checks.update({f"no '{text}' in the output": text not in r.output for text in self.absent})
    return _result(r, checks)


def _file(name: str):
  """prepare: an empty file `name` in the case's folder."""
  return lambda folder: open(os.path.join(folder, name), "w").close()


def _garbled(folder: str) -> None:
  _garble(os.path.join(folder, "run"))


def _without_checkpoints(folder: str) -> None:
  for name in ("checkpoints", "tb"):
    shutil.rmtree(os.path.join(folder, "run", name))


def _other_vocab(folder: str) -> None:
  """The trained run's vocabulary replaced by another of the same size (trained once)."""
  other = os.path.join(os.path.dirname(folder), "_other_vocab")
  if not os.path.isdir(other):
    r = run(_train_cmd(other, "--mode=vocab", "--config.data.vocab_train_sentences=3000"))
    if r.returncode != 0:
      raise RuntimeError(f"the other vocabulary failed: {r.last}")
  shutil.rmtree(os.path.join(folder, "run", "vocab"))
  shutil.copytree(os.path.join(other, "vocab"), os.path.join(folder, "run", "vocab"))


def _other_vocab_and_member(folder: str) -> None:
  """The trained run's vocabulary replaced (as _other_vocab) beside an untouched copy of the run
  (folder/member), for an ensemble of the two."""
  shutil.copytree(os.path.join(folder, "run"), os.path.join(folder, "member"))
  _other_vocab(folder)


def _hypotheses(count: int):
  """prepare: folder/hyps.txt, a system's output of `count` lines (not the split's length)."""
  def write(folder):
    with open(os.path.join(folder, "hyps.txt"), "w") as f:
      f.write("Ein Mann.\n" * count)
  return write


def _dangling_link(folder: str) -> None:
  os.symlink(os.path.join(folder, "no_such_target"), os.path.join(folder, "link"))


def _garbage_newest(folder: str) -> None:
  """A newest checkpoint folder holding only garbage (a copy gone wrong), after step 6."""
  os.makedirs(os.path.join(folder, "run", "checkpoints", "8"))
  with open(os.path.join(folder, "run", "checkpoints", "8", "junk"), "wb") as f:
    f.write(b"\x00garbage")


def _short_dev(folder: str) -> None:
  """folder/data/multi30k: the real corpus with a dev source file of half its lines."""
  import gzip  # pylint: disable=g-import-not-at-top
  source = os.path.join(os.environ.get("TRANSFORMER_JAX_DATA_DIR", ""), "multi30k")
  data = os.path.join(folder, "data", "multi30k")
  os.makedirs(data)
  for name in os.listdir(source):
    if not name.startswith("val.en"):
      os.symlink(os.path.join(source, name), os.path.join(data, name))
  with gzip.open(os.path.join(source, "val.en.gz"), "rt", encoding="utf-8") as f:
    lines = f.readlines()
  with gzip.open(os.path.join(data, "val.en.gz"), "wt", encoding="utf-8") as f:
    f.writelines(lines[: len(lines) // 2])


def parser_trees(folder: str, bad_dev: bool = False, bom: bool = False) -> list[str]:
  """folder/tb: four small Penn-style tree files (train f_01-f_02, dev f_03, test f_04); returns
  the parsing task's tiny flags on them. `bad_dev`: f_03 ends in an unclosed tree; `bom`: f_01
  starts with a UTF-8 byte-order mark."""
  sys.path.insert(0, REPO)
  from tests.test_parsing import _fixture_trees, _parser_flags  # pylint: disable=g-import-not-at-top
  os.makedirs(os.path.join(folder, "tb"))
  for k, (n, offset) in enumerate(((24, 0), (24, 24), (6, 48), (6, 54))):
    text = _fixture_trees(n, offset)
    if bad_dev and k == 2:
      text += "( (S (NP (NN a)) )\n"
    if bom and k == 0:
      text = "\ufeff" + text
    with open(os.path.join(folder, "tb", f"f_0{k + 1}.mrg"), "w", encoding="utf-8") as f:
      f.write(text)
  return _parser_flags(folder)


_SWEEP = ("--sweep=experiments/table3", "--scale=tiny", "--rows=base")
_GARBLED = "exit 2, the one line with the cause and --step=4; no 'Event loop is closed' tracebacks"
REFUSALS = [
    Refusal("config file missing", "one line naming the file",
            ("--config=configs/nope.py", "--workdir={new}"), ("configs/nope.py", "not found")),
    Refusal("unknown config variant", "one line with the config's own reason",
            ("--config=configs/multi30k.py:long", "--workdir={new}"), ("multi30k.py:long", "long")),
    Refusal("unknown key", "one line with did-you-mean",
            ("--workdir={new}", TINY, "--config.model.d_modle=64"), ("did you mean 'd_model'",)),
    Refusal("bad value", "one line naming the key",
            ("--workdir={new}", TINY, "--config.train.num_steps=many"), ("train.num_steps",)),
    Refusal("missing --workdir", "one line", (TINY,), ("--workdir is required",)),
    Refusal("unwritable workdir", "one line naming the workdir",
            ("--workdir={dir}/a_file/workdir", TINY), ("not writable",), prepare=_file("a_file")),
    Refusal("missing data dir", "one line naming the folder", ("--workdir={new}", TINY),
            ("/no/such/data",), env={"TRANSFORMER_JAX_DATA_DIR": "/no/such/data"}),
    Refusal("data error on a workdir with a run", "exit 2, one line; config.json untouched; no "
            "empty checkpoints/ or tb/", ("--workdir={w}", TINY,
                                          "--config.data.train_files=no_such_split"),
            ("no_such_split",), trained=True, prepare=_without_checkpoints),
    Refusal("branch from an unreadable step", "exit 2, one line before anything is copied; no "
            "branch workdir, the source untouched",
            ("--workdir={new}", "--branch_from={w}", "--step=6", "--config.train.num_steps=8"),
            ("cannot branch from step 6", "cannot be read"), trained=True, prepare=_garbled,
            absent=("branched",)),
    Refusal("resume with dropout 0.3 (trained with 0.1)", "exit 2, one line naming the key and "
            "both values; nothing written",
            ("--workdir={w}", TINY, "--config.train.num_steps=8",
             "--config.model.dropout_rate=0.3"),
            ("config key 'model.dropout_rate'", "0.3", "trained with 0.1"), trained=True),
    Refusal("resume with learning_rate_scale=1e30 after a good run", "exit 2 before training: "
            "another rate would change the finished steps; config.json and checkpoints untouched",
            ("--workdir={w}", TINY, "--config.train.num_steps=8",
             "--config.train.learning_rate_scale=1e30"),
            ("config key 'train.learning_rate_scale'", "trained with"), trained=True),
    Refusal("resume with a replaced vocabulary of the same size", "exit 2, one line: not the "
            "vocabulary the checkpoint was trained with",
            ("--workdir={w}", TINY, "--config.train.num_steps=8"),
            ("is not the vocabulary the checkpoint at step 6",), trained=True,
            prepare=_other_vocab),
    Refusal("translate into a missing folder", "exit 2, one line naming the folder, before the "
            "model is loaded or anything decoded",
            ("--mode=translate", "--workdir={w}", "--output={dir}/no_such_dir/x.txt"),
            ("no_such_dir", "does not exist"), trained=True, stdin="A man rides a bike.\n" * 20,
            absent=("translate:",)),
    Refusal("eval --bleu_sentences=-1", "exit 2, one line; no partial report under the "
            "whole-set name", ("--workdir={w}", "--mode=eval", "--split=validation",
                               "--bleu_sentences=-1"), ("bleu_sentences",), trained=True),
    Refusal("eval --config.decode.alpha=nan", "exit 2, one line naming the key",
            ("--workdir={w}", "--mode=eval", "--split=validation", "--config.decode.alpha=nan"),
            ("decode.alpha", "finite"), trained=True),
    Refusal("average --average=0", "exit 2, one line about K=0 (not silently 5)",
            ("--workdir={w}", "--mode=average", "--average=0"), ("--average=0", "K >= 1"),
            trained=True),
    Refusal("translate --step=-1", "exit 2, one line naming the flag",
            ("--workdir={w}", "--mode=translate", "--step=-1"), ("--step=-1",), trained=True,
            stdin="A man.\n"),
    Refusal("negative seed", "exit 2, one line naming the key and its range",
            ("--workdir={new}", TINY, "--config.seed=-1"), ("'seed'", "-1")),
    Refusal("oversized seed (2**40)", "exit 2, one line naming the key and its range",
            ("--workdir={new}", TINY, f"--config.seed={2**40}"), ("'seed'", str(2**40))),
    Refusal("train.peak_flops=inf", "exit 2, one line: a finite number",
            ("--workdir={new}", TINY, "--config.train.peak_flops=inf"),
            ("train.peak_flops", "finite")),
    Refusal("eval with a garbled newest checkpoint", _GARBLED + " (it suggests --average too)",
            ("--workdir={w}", "--mode=eval", "--split=validation", "--bleu_sentences=4"),
            ("cannot be read (", "--step=4", "--average"), trained=True, prepare=_garbled),
    Refusal("translate with a garbled newest checkpoint", _GARBLED,
            ("--workdir={w}", "--mode=translate"), ("cannot be read", "--step=4"), trained=True,
            prepare=_garbled, stdin="A man.\n"),
    Refusal("average with a garbled newest checkpoint", _GARBLED,
            ("--workdir={w}", "--mode=average", "--average=2"), ("cannot be read", "--step=4"),
            trained=True, prepare=_garbled),
    Refusal("eval on empty --source/--reference files", "exit 2, one line naming the files (no "
            "IndexError)", ("--workdir={w}", "--mode=eval", "--source={dir}/empty.en",
                            "--reference={dir}/empty.en"), ("empty.en", "no lines"),
            trained=True, prepare=_file("empty.en")),
    Refusal("eval with a replaced vocabulary", "exit 2, one line: not the vocabulary the "
            "checkpoint was trained with (its fingerprint), before anything is decoded",
            ("--workdir={w}", "--mode=eval", "--split=validation", "--bleu_sentences=4"),
            ("vocab",), trained=True, prepare=_other_vocab),
    Refusal("translate with a replaced vocabulary", "exit 2, one line (the fingerprint "
            "refusal), nothing translated", ("--workdir={w}", "--mode=translate"), ("vocab",),
            trained=True, prepare=_other_vocab, stdin="A man.\n"),
    Refusal("average with a replaced vocabulary", "exit 2, one line (the fingerprint refusal); "
            "no averaged/ folder", ("--workdir={w}", "--mode=average", "--average=2"), ("vocab",),
            trained=True, prepare=_other_vocab),
    Refusal("ensemble of runs with different vocabularies", "exit 2, one line naming the member "
            "whose vocabulary differs", ("--workdir={w}", "--mode=translate",
                                         "--ensemble={dir}/member"), ("vocab",), trained=True,
            prepare=_other_vocab_and_member, stdin="A man.\n"),
    Refusal("attention_maps with a replaced vocabulary", "exit 2, one line (the fingerprint "
            "refusal); no output folder", ("--workdir={w}", "--out={new}", "--sentence=A man."),
            ("vocab",), trained=True, prepare=_other_vocab,
            module="transformer_jax.tools.attention_maps"),
    Refusal("eval --compare with another number of sentences", "exit 2, one line: the other "
            "system's output does not cover the same sentences",
            ("--workdir={w}", "--mode=eval", "--split=validation", "--bleu_sentences=4",
             "--compare={dir}/hyps.txt"), ("hyps.txt",), trained=True, prepare=_hypotheses(3)),
    Refusal("tools.params with a missing config", "exit 2, one line naming the file",
            ("--config=configs/nope.py",), ("configs/nope.py",),
            module="transformer_jax.tools.params"),
    Refusal("tools.params with a bad override", "exit 2, one line naming the key",
            ("--config=configs/tiny.py", "--config.model.d_modle=64"), ("d_modle",),
            module="transformer_jax.tools.params"),
    Refusal("translate with a missing --ensemble workdir", "exit 2, one line naming it, before "
            "any model is loaded", ("--workdir={w}", "--mode=translate",
                                    "--ensemble={dir}/no_such_run"), ("no_such_run",),
            trained=True, stdin="A man.\n"),
    Refusal("resume with another model.vocab_size", "exit 2, one line naming the key and both "
            "values; nothing written", ("--workdir={w}", TINY, "--config.train.num_steps=8",
                                        "--config.model.vocab_size=200"),
            ("model.vocab_size", "200"), trained=True),
    Refusal("a dangling symlink as --workdir", "exit 2, one line naming the link; nothing "
            "created at its target", ("--workdir={dir}/link", TINY), ("link",),
            prepare=_dangling_link),
    Refusal("eval with a garbage newest checkpoint folder", "exit 2, one line (no asyncio or "
            "Orbax traceback)", ("--workdir={w}", "--mode=eval", "--split=validation",
                                 "--bleu_sentences=4"), (), trained=True, prepare=_garbage_newest),
    Refusal("vocab with a malformed dev .mrg", "exit 2, one line naming the file and line; no "
            "workdir, no vocabulary", ("--workdir={new}", "--mode=vocab", PARSER),
            ("f_03.mrg", "line")),
    Refusal("branch with a bad dev file", "exit 2, one line naming the file, before anything "
            "is copied: no branch workdir", ("--workdir={new}", "--branch_from={w}", "--step=6",
                                             "--config.train.num_steps=8",
                                             "--config.data.data_dir={dir}/data"), ("val.en",),
            trained=True, prepare=_short_dev, absent=("branched",)),
    Refusal("sweep runner --out naming a file", "exit 2, one line naming the flag; nothing "
            "written (no sweep.json)", (*_SWEEP, "--out={dir}/file", "--results_dir={new}"),
            ("--out", "is a file"), module="experiments.harness.runner", prepare=_file("file")),
    Refusal("sweep runner --results_dir naming a file", "exit 2, one line naming the flag; "
            "nothing written (no sweep.json)", (*_SWEEP, "--out={new}", "--results_dir={dir}/file"),
            ("--results_dir", "is a file"), module="experiments.harness.runner", prepare=_file("file")),
]
