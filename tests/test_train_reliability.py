"""The training CLI as a user runs it: real processes on real data with a tiny model.

Kill -9 and restart gives the bit-identical result of an uninterrupted run; SIGTERM saves and
exits 0; a corrupted newest checkpoint is set aside; user mistakes are one line, no traceback.
"""

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.common import DATA_DIR, REPO, TINY_CLI_FLAGS, requires_data

pytestmark = [requires_data, pytest.mark.slow]

FLAGS = TINY_CLI_FLAGS


def _cmd(workdir, *extra):
  return [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}", *FLAGS, *extra]


def _env():
  env = dict(os.environ, TRANSFORMER_JAX_DATA_DIR=DATA_DIR, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  return env


def _run(workdir, *extra, timeout=300):
  return subprocess.run(_cmd(workdir, *extra), cwd=REPO, env=_env(), capture_output=True,
                        text=True, timeout=timeout)


def _steps(workdir):
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _params(workdir):
  from transformer_jax import checkpoint  # pylint: disable=g-import-not-at-top
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


def test_kill_9_and_restart_equals_an_uninterrupted_run(tmp_path, vocab_dir):
  steps = 12
  ref = _workdir(tmp_path, vocab_dir, "ref")
  result = _run(ref, f"--config.train.num_steps={steps}")
  assert result.returncode == 0, result.stderr[-3000:]

  run = _workdir(tmp_path, vocab_dir, "killed")
  kill_after = random.Random(os.getpid()).choice([2, 4, 6, 8])
  proc = subprocess.Popen(_cmd(run, f"--config.train.num_steps={steps}"), cwd=REPO, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if any(s >= kill_after for s in _steps(run)):
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert _steps(run), "no checkpoint was written before the kill"
  assert max(_steps(run)) < steps, "the run finished before it could be killed"

  result = _run(run, f"--config.train.num_steps={steps}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resuming from the checkpoint at step" in result.stdout + result.stderr
  ref_step, ref_params = _params(ref)
  run_step, run_params = _params(run)
  assert ref_step == run_step == steps
  for a, b in zip(ref_params, run_params):
    np.testing.assert_array_equal(a, b)  # bit for bit


def test_sigterm_saves_the_current_step_and_exits_0(tmp_path, vocab_dir):
  run = _workdir(tmp_path, vocab_dir, "term")
  flags = ["--config.train.num_steps=100000", "--config.train.checkpoint_every_steps=1000"]
  proc = subprocess.Popen(_cmd(run, *flags), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  metrics = os.path.join(run, "metrics.jsonl")
  deadline = time.time() + 240
  while time.time() < deadline and not (os.path.exists(metrics) and os.path.getsize(metrics)):
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
  assert last.startswith("error: checkpoint") and "incompatible" in last and "(64" in last
  assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == before


@pytest.mark.parametrize("extra,expected", [
    (["--config.model.d_modle=64"], "did you mean 'd_model'"),
    (["--config.train.num_steps=many"], "num_steps"),
    (["--config.model.num_heads=0"], "model.num_heads"),
    (["--config.data.local_corpus=no_such_corpus"], "no_such_corpus"),
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
  run = _workdir(tmp_path, vocab_dir, "nan")
  assert _run(run, "--config.train.num_steps=2").returncode == 0
  result = _run(run, "--config.train.num_steps=40", "--config.train.learning_rate_scale=1e30")
  last = result.stderr.strip().splitlines()[-1]
  assert result.returncode == 2 and last.startswith("error: non-finite loss"), result.stderr[-2000:]
  assert "at step" in last
  bad_step = int(last.split("at step")[1].split(";")[0])
  assert all(s < bad_step for s in _steps(run))
