"""The training CLI as a user runs it: real processes on real data with a tiny model.

Kill -9 and restart gives the bit-identical result of an uninterrupted run, with each step once
in metrics.jsonl; SIGTERM saves and exits 0; a corrupted newest checkpoint is set aside; a second
run on a held workdir is refused and the first is unaffected; a full disk stops the run with the
previous checkpoint intact; the wall-time limit counts across resumes; a branch (--branch_from)
of a shorter run equals the longer run and leaves its source alone; user mistakes are one line,
no traceback.
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.common import DATA_DIR, REPO, requires_data, TINY_CLI_FLAGS, xla_flags
from transformer_jax.training import metrics

# One xdist worker runs the module, so its vocabulary and reference run are built once (conftest).
pytestmark = [requires_data, pytest.mark.slow, pytest.mark.xdist_group(__name__)]

FLAGS = TINY_CLI_FLAGS


def _cmd(workdir, *extra):
  return [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}", *FLAGS, *extra]


def _env():
  env = dict(os.environ, TRANSFORMER_JAX_DATA_DIR=DATA_DIR, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = xla_flags()  # none of the caller's (a device count, say)
  return env


def _run(workdir, *extra, timeout=300):
  return subprocess.run(_cmd(workdir, *extra), cwd=REPO, env=_env(), capture_output=True,
                        text=True, timeout=timeout)


def _steps(workdir):
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _params(workdir):
  from transformer_jax.training import checkpoint  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  params, _, step = checkpoint.load_params(checkpoint.checkpoint_dir(workdir))
  return step, [np.asarray(x) for x in jax.tree.leaves(params)]


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory):
  """One vocabulary for every run of this module (each run then only reads it)."""
  work = tmp_path_factory.mktemp("vocab_run")
  result = _run(work, "--config.train.num_steps=1")
  assert result.returncode == 0, result.stderr[-3000:]
  return os.path.join(work, "vocab")


def _workdir(tmp_path, vocab_dir, name):
  w = tmp_path / name
  w.mkdir()
  shutil.copytree(vocab_dir, w / "vocab")
  return str(w)


def _metric_steps(workdir, split="train"):
  return [r["step"] for r in metrics.read_rows(workdir, split)]


STEPS = 12


@pytest.fixture(scope="module")
def reference(tmp_path_factory, vocab_dir):
  """The parameters of an uninterrupted, unshared run of STEPS steps."""
  ref = _workdir(tmp_path_factory.mktemp("ref"), vocab_dir, "ref")
  result = _run(ref, f"--config.train.num_steps={STEPS}")
  assert result.returncode == 0, result.stderr[-3000:]
  return _params(ref)


def _assert_params_equal(workdir, reference):
  ref_step, ref_params = reference
  run_step, run_params = _params(workdir)
  assert ref_step == run_step == STEPS
  for a, b in zip(ref_params, run_params):
    np.testing.assert_array_equal(a, b)  # bit for bit


def test_kill_9_and_restart_equals_an_uninterrupted_run(tmp_path, vocab_dir, reference):
  run = _workdir(tmp_path, vocab_dir, "killed")
  kill_after = random.Random(os.getpid()).choice([4, 8])
  flags = [f"--config.train.num_steps={STEPS}", "--config.train.checkpoint_every_steps=4"]
  proc = subprocess.Popen(_cmd(run, *flags), cwd=REPO, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:  # logged past the newest checkpoint
    if _steps(run) and max(_steps(run)) >= kill_after and max(_metric_steps(run)) > max(_steps(run)):
      break
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert _steps(run), "no checkpoint was written before the kill"
  assert max(_steps(run)) < STEPS, "the run finished before it could be killed"
  assert max(_metric_steps(run)) > max(_steps(run))  # lines the resumed run must drop

  result = _run(run, *flags)
  out = result.stdout + result.stderr
  assert result.returncode == 0, out[-3000:]
  assert "resuming from the checkpoint at step" in out
  assert "warning: took over the stale lock" in out and "is no longer running" in out
  assert _metric_steps(run) == list(range(2, STEPS + 1, 2))  # each step once
  _assert_params_equal(run, reference)


def _snapshot(folder):
  """Every file under `folder` with its modification time: equal snapshots, nothing written."""
  return sorted((r, f, os.stat(os.path.join(r, f)).st_mtime_ns)
                for r, _, fs in os.walk(folder) for f in fs)


def _branch(workdir, source, step, *extra):
  cmd = [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}",
         f"--branch_from={source}", f"--step={step}", *extra]
  return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)


def _last_error(result):
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
  return result.stderr.strip().splitlines()[-1]


def test_a_branch_of_a_shorter_run_equals_the_longer_run(tmp_path, vocab_dir, reference):
  """Train 8 steps, branch at step 4 to STEPS: bit for bit the uninterrupted STEPS-step run, with
  the curve whole and the source untouched; changes that would alter steps 1..4 are refused."""
  source = _workdir(tmp_path, vocab_dir, "source")
  result = _run(source, "--config.train.num_steps=8")
  assert result.returncode == 0, result.stderr[-3000:]
  snapshot = _snapshot(source)
  branch = str(tmp_path / "branch")
  result = _branch(branch, source, 4, f"--config.train.num_steps={STEPS}")
  out = result.stdout + result.stderr
  assert result.returncode == 0, out[-3000:]
  assert f"branched {source} at step 4 into {branch}" in out
  assert "resuming from the checkpoint at step 4" in out
  _assert_params_equal(branch, reference)
  assert _metric_steps(branch) == list(range(2, STEPS + 1, 2))  # the copied 6, 8 dropped
  assert _snapshot(source) == snapshot
  again = _branch(branch, source, 4, f"--config.train.num_steps={STEPS}")  # resumes, copies nothing
  assert again.returncode == 0 and "branched" not in again.stdout, again.stderr[-3000:]

  fresh = str(tmp_path / "refused")
  assert "--config.seed: a branch continues" in _last_error(
      _branch(fresh, source, 4, "--config.seed=1", f"--config.train.num_steps={STEPS}"))
  last = _last_error(_branch(fresh, source, 4, f"--config.train.num_steps={STEPS}",
                             "--config.train.cooldown_steps=10"))
  assert "learning rate at step 3 would differ" in last, last
  assert "must train past it" in _last_error(
      _branch(fresh, source, 4, "--config.train.num_steps=4"))
  assert "no checkpoint for step 5" in _last_error(
      _branch(fresh, source, 5, f"--config.train.num_steps={STEPS}"))
  assert "already holds files and is not a branch" in _last_error(
      _branch(source + "/vocab", source, 4, f"--config.train.num_steps={STEPS}"))
  assert "is a branch of" in _last_error(
      _branch(branch, source, 2, f"--config.train.num_steps={STEPS}"))
  assert not os.path.exists(fresh)
  assert _snapshot(source) == snapshot


def _lock_holds_pid(lock: str, pid: int) -> bool:
  try:
    with open(lock) as f:
      return json.load(f).get("pid") == pid
  except (FileNotFoundError, ValueError):
    return False


def test_a_second_run_on_a_held_workdir_is_refused_and_the_first_is_unaffected(
    tmp_path, vocab_dir, reference):
  run = _workdir(tmp_path, vocab_dir, "shared")
  lock = os.path.join(run, "workdir.lock")
  first = subprocess.Popen(_cmd(run, f"--config.train.num_steps={STEPS}"), cwd=REPO, env=_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 240
  # Wait for the lock's content, not just the file: O_EXCL creates it empty and the holder's JSON
  # follows (workdir.py); stopped in between, the holder would be reported as unknown.
  while not _lock_holds_pid(lock, first.pid) and time.time() < deadline and first.poll() is None:
    time.sleep(0.02)
  first.send_signal(signal.SIGSTOP)  # hold it mid-run while the second one tries
  try:
    snapshot = _snapshot(run)
    second = _run(run, f"--config.train.num_steps={STEPS}")
    after = _snapshot(run)
  finally:
    first.send_signal(signal.SIGCONT)
  assert second.returncode == 2, second.stderr[-3000:]
  lines = second.stderr.strip().splitlines()
  assert "Traceback" not in second.stderr and lines[-1].startswith("error: workdir"), lines
  assert f"in use by pid {first.pid} on host" in lines[-1] and "since" in lines[-1]
  assert after == snapshot  # the refused run touched nothing
  out, _ = first.communicate(timeout=240)
  assert first.returncode == 0, out[-3000:]
  _assert_params_equal(run, reference)
  assert _metric_steps(run) == list(range(2, STEPS + 1, 2))


def test_sigterm_saves_the_current_step_and_exits_0(tmp_path, vocab_dir):
  run = _workdir(tmp_path, vocab_dir, "term")
  flags = ["--config.train.num_steps=100000", "--config.train.checkpoint_every_steps=1000"]
  proc = subprocess.Popen(_cmd(run, *flags), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  log = os.path.join(run, "metrics.jsonl")
  deadline = time.time() + 240
  while time.time() < deadline and not (os.path.exists(log) and os.path.getsize(log)):
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 0, out[-3000:]
  assert "SIGTERM: saved a checkpoint at step" in out
  saved = int(out.split("SIGTERM: saved a checkpoint at step")[1].split()[0].rstrip(";"))
  assert _steps(run) == [saved] and saved >= 2

  result = _run(run, f"--config.train.num_steps={saved + 2}",
                "--config.train.checkpoint_every_steps=1000")
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"resuming from the checkpoint at step {saved}" in result.stdout + result.stderr
  assert max(_steps(run)) == saved + 2


def _corrupt(step_dir):
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "state")) for f in fs]
  biggest = max(files, key=os.path.getsize)
  with open(biggest, "r+b") as f:
    f.truncate(os.path.getsize(biggest) // 3)
  for f in files:  # and garble the metadata too
    if f.endswith(("_METADATA", "manifest.ocdbt")):
      with open(f, "wb") as g:
        g.write(b"\x00garbage")


def test_corrupted_newest_checkpoint_falls_back_to_the_previous(tmp_path, vocab_dir):
  run = _workdir(tmp_path, vocab_dir, "corrupt")
  assert _run(run, "--config.train.num_steps=6").returncode == 0
  assert _steps(run) == [2, 4, 6]
  _corrupt(os.path.join(run, "checkpoints", "6"))
  result = _run(run, "--config.train.num_steps=8")
  out = result.stdout + result.stderr
  assert result.returncode == 0, out[-3000:]
  assert "checkpoint at step 6 is unreadable" in out
  assert "resuming from the checkpoint at step 4" in out
  assert any(n.startswith("corrupt_6_") for n in os.listdir(os.path.join(run, "checkpoints")))
  assert max(_steps(run)) == 8


def test_incompatible_checkpoint_is_one_line_and_nothing_is_written(tmp_path, vocab_dir):
  run = _workdir(tmp_path, vocab_dir, "incompatible")
  assert _run(run, "--config.train.num_steps=2").returncode == 0
  before = sorted(os.listdir(os.path.join(run, "checkpoints")))
  result = _run(run, "--config.train.num_steps=4", "--config.model.d_ff=96")
  assert result.returncode == 2
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: config key 'model.d_ff' is 96 but the checkpoint at step 2")
  assert "(64,) there but (96,)" in last
  assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == before


@pytest.mark.parametrize("extra,expected", [
    (["--config.model.d_modle=64"], "did you mean 'd_model'"),
    (["--config.train.num_steps=many"], "num_steps"),
    (["--config.model.num_heads=0"], "model.num_heads"),
    (["--config.data.local_corpus=no_such_corpus"], "no_such_corpus"),
    (["--step=3"], "--step is not for --mode=train"),
])
def test_user_mistakes_are_one_line(tmp_path, vocab_dir, extra, expected):
  run = _workdir(tmp_path, vocab_dir, "mistake")
  result = _run(run, "--config.train.num_steps=2", *extra)
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error:") and expected in last, last


def test_unwritable_workdir_is_one_line(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  result = _run(str(blocker / "workdir"), "--config.train.num_steps=2")
  assert result.returncode == 2
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: workdir") and "not writable" in last, last


def test_non_finite_loss_stops_with_the_step_and_keeps_the_checkpoint(tmp_path, vocab_dir):
  """Step 1 (from the initial parameters) is finite and saved; a rate of 1e30 makes a later step
  non-finite, which stops the run before anything of it is saved. (Resuming a good run with that
  rate is refused before training: another learning rate would change its finished steps.)"""
  run = _workdir(tmp_path, vocab_dir, "nan")
  result = _run(run, "--config.train.num_steps=40", "--config.train.learning_rate_scale=1e30",
                "--config.train.checkpoint_every_steps=1")
  last = result.stderr.strip().splitlines()[-1]
  assert result.returncode == 2 and last.startswith("error: non-finite"), result.stderr[-2000:]
  assert "at step" in last and "Traceback" not in result.stderr
  bad_step = int(last.split("at step")[1].split(";")[0])
  assert _steps(run) and all(s < bad_step for s in _steps(run))
  config_json = open(os.path.join(run, "config.json")).read()
  again = _run(run, "--config.train.num_steps=40")  # the usual rate on that run: refused
  last = _last_error(again)
  assert "config key 'train.learning_rate_scale'" in last and "trained with 1e+30" in last, last
  assert open(os.path.join(run, "config.json")).read() == config_json


def _progress_seconds(workdir, step):
  with open(os.path.join(workdir, "checkpoints", str(step), "progress", "metadata")) as f:
    return json.load(f)["train_seconds"]


def test_the_wall_time_limit_counts_across_resumes(tmp_path, vocab_dir):
  run = _workdir(tmp_path, vocab_dir, "budget")
  flags = ["--config.train.num_steps=100000", "--config.train.checkpoint_every_steps=1000",
           "--config.train.max_train_minutes=0.05"]
  first = _run(run, *flags)
  assert first.returncode == 0, first.stderr[-3000:]
  assert "max_train_minutes reached" in first.stdout + first.stderr
  [stopped] = _steps(run)
  assert _progress_seconds(run, stopped) >= 3.0
  again = _run(run, *flags)  # the same command: the budget is spent
  assert again.returncode == 0, again.stderr[-3000:]
  assert "already used up" in again.stdout + again.stderr
  assert _steps(run) == [stopped]
  used = _progress_seconds(run, stopped)  # >= 3 s; more when a slow step overshot the budget
  # `budget` in all, not `budget` more: 0.01 s left, so the third run stops after its first step
  # whatever the machine's load (with `budget` more it would train for `used` seconds again)
  budget = used + 0.01
  more = _run(run, *flags[:2], f"--config.train.max_train_minutes={budget / 60.0}")
  assert more.returncode == 0, more.stderr[-3000:]
  assert max(_steps(run)) == stopped + 1
  assert budget <= _progress_seconds(run, stopped + 1)
  out = more.stdout + more.stderr
  left = re.search(r"\(([0-9.]+) of train\.max_train_minutes=([0-9.]+) left\)", out)
  assert left, out[-3000:]
  assert float(left.group(1)) == pytest.approx(0.0, abs=0.006)
  assert float(left.group(2)) == pytest.approx(budget / 60, abs=0.006)


def _mount_tmpfs(path, size):
  os.makedirs(path, exist_ok=True)
  try:
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                            capture_output=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return False
  return result.returncode == 0


def test_a_full_disk_stops_the_run_in_one_line_with_the_last_checkpoint_intact(tmp_path, vocab_dir):
  run = str(tmp_path / "full")
  if not _mount_tmpfs(run, "4m"):
    pytest.skip("cannot mount a tmpfs here (needs root); the failing-save path is covered "
                "in-process by test_workdir.py")
  try:
    shutil.copytree(vocab_dir, os.path.join(run, "vocab"))
    result = _run(run, "--config.train.num_steps=100")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(lines) <= 3, lines
    assert lines[-1].startswith("error: ") and "No space left on device" in lines[-1], lines
    assert "MiB free" in lines[-1] and "is kept" in lines[-1]
    names = os.listdir(os.path.join(run, "checkpoints"))
    assert not [n for n in names if "tmp" in n], names
    good = _steps(run)
    assert good and f"step {good[-1]}) is kept" in lines[-1]
    step, _ = _params(run)  # the newest checkpoint loads
    assert step == good[-1]
  finally:
    subprocess.run(["umount", "-l", run], check=False)


def test_mfu_divides_by_the_peak_of_every_device(tmp_path):
  """8 simulated devices, a given per-device peak: the logged MFU is the global model FLOP/s over
  8 x the peak (it used to be over one device's peak: 8x too high)."""
  env = dict(_env(), XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8"))
  result = subprocess.run(_cmd(str(tmp_path / "run"), "--config.train.num_steps=4",
                               "--config.train.peak_flops=1e9"),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  train = metrics.read_rows(str(tmp_path / "run"), "train")
  assert train
  for r in train:
    assert r["mfu"] == pytest.approx(r["model_flops_per_second"] / (1e9 * 8), rel=1e-6)


def test_profile_window_writes_a_trace_of_the_asked_steps(tmp_path, vocab_dir):
  run = _workdir(tmp_path, vocab_dir, "profiled")
  p = _run(run, "--config.train.num_steps=6", "--config.train.profile_steps=2",
           "--config.train.profile_after_steps=2")
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"profile of steps 3-4 written to {run}/profile" in p.stdout + p.stderr
  traces = [os.path.join(r, f) for r, _, files in os.walk(os.path.join(run, "profile"))
            for f in files if f.endswith(".xplane.pb")]
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0
  quiet = _workdir(tmp_path, vocab_dir, "unprofiled")  # off by default: nothing written
  assert _run(quiet, "--config.train.num_steps=2").returncode == 0
  assert not os.path.exists(os.path.join(quiet, "profile"))
