"""Nothing silently wrong (#55), as a user meets it: real processes on the tiny config.

A run whose checkpoints are all unreadable starts again with the data of step 0 (the dev loss of
the clean run) and keeps the old logs; a branch from an unreadable step is refused before it is
made; a resume with another vocabulary or dropout is refused, and one with more steps is recorded
with its step; translating into a missing folder fails before anything is decoded; Ctrl-C saves
a checkpoint and the resumed run is bit for bit the uninterrupted one.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from sentencepiece import sentencepiece_model_pb2

from tests.common import REPO, requires_data
from tests.test_train_reliability import (STEPS, _assert_params_equal, _branch, _cmd, _env,  # noqa: F401
                                          _last_error, _metric_steps, _run, _snapshot, _steps,
                                          _workdir, reference, vocab_dir)
from transformer_jax.training import metrics

pytestmark = [requires_data, pytest.mark.slow, pytest.mark.xdist_group(__name__)]


def _garble(workdir, step):
  """Makes checkpoint `step` unreadable the way a bad disk does: its state's metadata garbled,
  its other items (the data position) intact."""
  state = os.path.join(workdir, "checkpoints", str(step), "state")
  for r, _, fs in os.walk(state):
    for f in fs:
      if f.endswith(("_METADATA", "manifest.ocdbt")):
        with open(os.path.join(r, f), "wb") as g:
          g.write(b"\x00garbage")


def _dev_loss(rows, step):
  [row] = [r for r in rows if r["step"] == step and r.get("split", "dev") == "dev" and "loss" in r]
  return row["loss"]


def test_a_run_whose_checkpoints_are_all_unreadable_restarts_with_the_data_of_step_0(
    tmp_path, vocab_dir):
  run = _workdir(tmp_path, vocab_dir, "all_unreadable")
  assert _run(run, "--config.train.num_steps=6").returncode == 0
  clean = _dev_loss(metrics.read_rows(run, "dev"), 6)
  old_rows = open(os.path.join(run, "metrics.jsonl")).read()
  for step in _steps(run):
    _garble(run, step)
  result = _run(run, "--config.train.num_steps=6")
  out = result.stdout + result.stderr
  assert result.returncode == 0, out[-3000:]
  assert "starting again from step 0" in out and "Traceback" not in out
  # The data of step 0, not of the unreadable checkpoint's position: the clean run's dev loss.
  assert _dev_loss(metrics.read_rows(run, "dev"), 6) == pytest.approx(clean, rel=1e-6)
  assert _metric_steps(run) == [2, 4, 6]
  [aside] = [n for n in os.listdir(run) if n.startswith("metrics.jsonl.before_restart_")]
  assert open(os.path.join(run, aside)).read() == old_rows  # the old record kept, not dropped
  assert sorted(n.split("_")[1] for n in os.listdir(os.path.join(run, "checkpoints"))
                if n.startswith("corrupt_")) == ["2", "4", "6"]


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, vocab_dir):
  """A finished 2-step run, copied by each test that changes it."""
  run = _workdir(tmp_path_factory.mktemp("two"), vocab_dir, "two")
  result = _run(run, "--config.train.num_steps=2")
  assert result.returncode == 0, result.stderr[-3000:]
  return run


def _copy(two_steps, tmp_path, name):
  shutil.copytree(two_steps, tmp_path / name)
  return str(tmp_path / name)


def test_a_branch_from_an_unreadable_step_is_refused(tmp_path, two_steps):
  source = _copy(two_steps, tmp_path, "source")
  _garble(source, 2)
  snapshot = _snapshot(source)
  branch = str(tmp_path / "branch")
  last = _last_error(_branch(branch, source, 2, "--config.train.num_steps=4"))
  assert last.startswith("error: cannot branch from step 2: checkpoint") and "cannot be read" in last
  assert not os.path.exists(branch) and _snapshot(source) == snapshot


def test_a_resume_with_another_vocabulary_or_dropout_is_refused_and_more_steps_recorded(
    tmp_path, two_steps):
  run = _copy(two_steps, tmp_path, "resumed")
  snapshot = _snapshot(run)
  last = _last_error(_run(run, "--config.train.num_steps=4", "--config.model.dropout_rate=0.3"))
  assert "config key 'model.dropout_rate' is 0.3 but the checkpoint at step 2" in last, last
  assert "was trained with 0.1" in last
  assert _snapshot(run) == snapshot

  other = str(tmp_path / "other_vocab")  # the same size, other pieces
  made = subprocess.run(_cmd(other, "--mode=vocab", "--config.data.vocab_train_sentences=3000"),
                        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
  assert made.returncode == 0, made.stderr[-3000:]
  shutil.rmtree(os.path.join(run, "vocab"))
  shutil.copytree(os.path.join(other, "vocab"), os.path.join(run, "vocab"))
  last = _last_error(_run(run, "--config.train.num_steps=4"))
  assert "vocab is not the vocabulary the checkpoint at step 2 was trained with" in last, last
  shutil.rmtree(os.path.join(run, "vocab"))
  shutil.copytree(os.path.join(two_steps, "vocab"), os.path.join(run, "vocab"))
  # The same pieces in other bytes (another machine's trainer record) are the same vocabulary.
  model = sentencepiece_model_pb2.ModelProto()
  with open(os.path.join(run, "vocab", "spm.model"), "rb") as f:
    model.ParseFromString(f.read())
  model.trainer_spec.num_threads = 3
  with open(os.path.join(run, "vocab", "spm.model"), "wb") as f:
    f.write(model.SerializeToString())

  result = _run(run, "--config.train.num_steps=4")  # more steps: a change a resume may make
  out = result.stdout + result.stderr
  assert result.returncode == 0, out[-3000:]
  assert "resuming with train.num_steps=4 (was 2)" in out
  with open(os.path.join(run, "config_changes.jsonl")) as f:
    [record] = [json.loads(line) for line in f]
  assert record["step"] == 2 and record["changes"] == {"train.num_steps": [2, 4]}
  with open(os.path.join(run, "config.json")) as f:
    assert json.load(f)["train"]["num_steps"] == 4


def test_translate_into_a_missing_folder_fails_before_decoding(tmp_path, two_steps):
  output = tmp_path / "missing" / "out.txt"
  start = time.time()
  result = subprocess.run(
      [sys.executable, "-m", "transformer_jax.main", "--mode=translate", f"--workdir={two_steps}",
       f"--output={output}"], input="A man rides a bike.\n" * 50, cwd=REPO, env=_env(),
      capture_output=True, text=True, timeout=300)
  last = _last_error(result)
  assert f"--output {output}: the folder {output.parent} does not exist" in last, last
  assert "translate" not in result.stderr.replace(last, "")  # no decoding progress before it
  assert not output.parent.exists() and time.time() - start < 60


def test_ctrl_c_saves_a_checkpoint_and_the_resume_is_bit_identical(tmp_path, vocab_dir, reference):
  """Interrupted in a long run, resumed to STEPS (a change a resume may make: with no cool-down
  the schedule does not depend on the step count): the uninterrupted STEPS-step run."""
  run = _workdir(tmp_path, vocab_dir, "interrupted")
  cadence = "--config.train.checkpoint_every_steps=1000"
  proc = subprocess.Popen(_cmd(run, "--config.train.num_steps=100000", cadence), cwd=REPO,
                          env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None and not _metric_steps(run):
    time.sleep(0.02)  # training's loop has started: it logged step 2
  proc.send_signal(signal.SIGINT)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 0 and "Traceback" not in out, out[-3000:]
  assert "Ctrl-C: saving a checkpoint after this step" in out
  assert "SIGINT: saved a checkpoint at step" in out
  saved = int(out.split("SIGINT: saved a checkpoint at step")[1].split()[0].rstrip(";"))
  assert _steps(run) == [saved] and 2 <= saved < STEPS

  result = _run(run, f"--config.train.num_steps={STEPS}", cadence)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"resuming from the checkpoint at step {saved}" in result.stdout + result.stderr
  _assert_params_equal(run, reference)
  logged = _metric_steps(run)
  assert len(logged) == len(set(logged)) and set(range(2, STEPS + 1, 2)) <= set(logged)
