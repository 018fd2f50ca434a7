"""In-process checks of a run's life in its workdir: the lock (busy, stale, heartbeat), metric
lines that follow the checkpoints, the divergence guard, and a failed save reported in one line.
The same behaviours as a user sees them (real processes) are in test_train_reliability.py."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from transformer_jax import train
from transformer_jax.runtime import exceptions
from transformer_jax.runtime.config import default_config
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.training import checkpoint, metrics, workdir as workdir_lib


def _write_lock(workdir, **holder):
  info = {"host": socket.gethostname(), "pid": os.getpid(), "started": "2026-01-01T00:00:00",
          "command": "main.py --workdir=x", "purpose": "training", "token": "t"}
  info.update(holder)
  path = os.path.join(workdir, workdir_lib.LOCK_FILE)
  with open(path, "w") as f:
    json.dump(info, f)
  return path


def _dead_pid():
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def test_a_held_workdir_is_refused_naming_the_holder_and_left_unchanged(tmp_path):
  with workdir_lib.claim(str(tmp_path), "training") as path:
    lock = os.path.join(path, workdir_lib.LOCK_FILE)
    before = open(lock).read(), os.stat(lock).st_mtime
    with pytest.raises(exceptions.WorkdirBusy) as e:
      with workdir_lib.claim(str(tmp_path), "training"):
        pass
    message = str(e.value)
    assert isinstance(e.value, ConfigError) and "\n" not in message
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in message and "since" in message
    assert (open(lock).read(), os.stat(lock).st_mtime) == before
  assert not os.path.exists(lock)  # released at the end


def test_a_live_lock_on_another_host_with_a_fresh_heartbeat_is_respected(tmp_path):
  _write_lock(str(tmp_path), host="other-host", pid=1)
  with pytest.raises(exceptions.WorkdirBusy, match="on host other-host"):
    with workdir_lib.claim(str(tmp_path), "training"):
      pass


@pytest.mark.parametrize("case", ["dead pid on this host", "old heartbeat on another host",
                                  "empty lock file"])
def test_a_stale_lock_is_taken_over_with_one_line(tmp_path, capsys, case):
  if case == "dead pid on this host":
    path = _write_lock(str(tmp_path), pid=_dead_pid())
  elif case == "old heartbeat on another host":
    path = _write_lock(str(tmp_path), host="other-host", pid=1)
    old = time.time() - workdir_lib.STALE_AFTER_SECONDS - 10
    os.utime(path, (old, old))
  else:
    path = os.path.join(str(tmp_path), workdir_lib.LOCK_FILE)
    open(path, "w").close()
    old = time.time() - workdir_lib.UNWRITTEN_GRACE_SECONDS - 10
    os.utime(path, (old, old))
  with workdir_lib.claim(str(tmp_path), "training"):
    assert json.load(open(path))["pid"] == os.getpid()
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("warning: took over the stale lock"), err
  assert os.listdir(tmp_path) == []  # nothing left: no lock, no renamed copy


def test_the_heartbeat_refreshes_the_lock(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lib, "HEARTBEAT_SECONDS", 0.05)
  with workdir_lib.claim(str(tmp_path), "training") as path:
    lock = os.path.join(path, workdir_lib.LOCK_FILE)
    os.utime(lock, (1000, 1000))
    deadline = time.time() + 10
    while os.stat(lock).st_mtime == 1000 and time.time() < deadline:
      time.sleep(0.05)
    assert os.stat(lock).st_mtime > time.time() - 60


def test_a_run_that_fails_early_leaves_no_empty_folders(tmp_path):
  new = tmp_path / "new_workdir"
  with pytest.raises(RuntimeError):
    with workdir_lib.claim(str(new), "training") as path:
      os.makedirs(os.path.join(path, "checkpoints"))
      os.makedirs(os.path.join(path, "tb"))
      raise RuntimeError("data error")
  assert not new.exists()
  old = tmp_path / "old_workdir"
  (old / "vocab").mkdir(parents=True)
  with pytest.raises(RuntimeError):
    with workdir_lib.claim(str(old), "training") as path:
      os.makedirs(os.path.join(path, "checkpoints"))
      raise RuntimeError("data error")
  assert sorted(os.listdir(old)) == ["vocab"]


def test_metric_lines_past_the_restored_step_are_dropped(tmp_path):
  path = tmp_path / "metrics.jsonl"
  lines = [json.dumps({"step": s, "split": "train"}) + "\n" for s in (2, 4, 6, 8)]
  path.write_text("".join(lines) + '{"step": 10, "spl')  # the last line cut by a kill
  metrics.truncate_jsonl(str(path), 4)
  assert path.read_text() == "".join(lines[:2])
  metrics.truncate_jsonl(str(path), 4)  # nothing to drop: unchanged
  assert path.read_text() == "".join(lines[:2])
  metrics.truncate_jsonl(str(path), 0)  # a run that starts over
  assert not path.exists()


def test_the_metrics_reader_skips_a_line_cut_short_and_filters_by_split(tmp_path):
  assert metrics.read_rows(str(tmp_path)) == []  # no log yet
  rows = [{"step": 2, "split": "train"}, {"step": 2, "split": "dev"}, {"step": 4, "split": "train"}]
  (tmp_path / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "spl')  # a run still writing
  assert metrics.read_rows(str(tmp_path)) == rows
  assert [r["step"] for r in metrics.read_rows(str(tmp_path), "train")] == [2, 4]
  assert metrics.read_rows(str(tmp_path), "dev") == [rows[1]]


def _step_metrics(loss, tokens=10.0, grad_norm=1.0):
  return {"loss_sum": loss * tokens, "nll_sum": loss * tokens, "tokens": tokens,
          "grad_norm": grad_norm, "learning_rate": 1e-3}


def test_a_non_finite_gradient_norm_stops_with_the_step():
  window = train._Window(4.0, print)  # pylint: disable=protected-access
  window.add(_step_metrics(5.0), 1)
  with pytest.raises(exceptions.TrainingError, match=r"non-finite gradient norm \(inf\) at step 7;"):
    window.add(_step_metrics(5.0, grad_norm=float("inf")), 7)
  with pytest.raises(exceptions.TrainingError, match=r"non-finite loss \(nan\) at step 8;"):
    window.add(_step_metrics(float("nan")), 8)


def test_a_loss_far_above_its_minimum_warns_once_with_the_step():
  warnings = []
  window = train._Window(4.0, warnings.append)  # pylint: disable=protected-access
  for step, loss in enumerate([8.0, 6.0, 2.0, 7.9, 8.1, 50.0, 1e9], start=1):
    window.add(_step_metrics(loss), step)
  assert len(warnings) == 1 and "at step 5" in warnings[0] and "4 x" in warnings[0], warnings
  off = train._Window(0.0, warnings.append)  # pylint: disable=protected-access
  for step, loss in enumerate([1.0, 1e9], start=1):
    off.add(_step_metrics(loss), step)
  assert len(warnings) == 1


def test_divergence_warn_factor_is_validated():
  from transformer_jax.runtime.config import validate  # pylint: disable=g-import-not-at-top
  cfg = default_config()
  cfg.train.divergence_warn_factor = 0.5
  with pytest.raises(ConfigError, match="divergence_warn_factor"):
    validate(cfg)


def test_step_time_is_elapsed_over_the_steps_in_the_window():
  window = train._Window(0.0, print)  # pylint: disable=protected-access
  window.start -= 3.0
  window.add(_step_metrics(5.0), 1)
  window.steps = 3  # a short window: three steps where log_every_steps may be 100
  scalars = window.scalars(_step_metrics(5.0), peak=1e12, num_devices=1)
  assert 0.99 <= scalars["step_time"] <= 1.5


class _FailingManager:
  """An Orbax manager whose background save fails (a full disk), leaving its temporary folder."""

  def __init__(self, directory):
    self.directory = directory

  def save(self, step, args=None, force=False):  # pylint: disable=unused-argument
    os.makedirs(os.path.join(self.directory, f"{step}.orbax-checkpoint-tmp-123", "state"))

  def is_saving_in_progress(self):
    return False

  def wait_until_finished(self):
    raise OSError(28, "No space left on device")

  def close(self):
    pass


def test_a_failed_background_save_stops_in_one_line_and_removes_the_partial_folder(tmp_path):
  directory = tmp_path / "checkpoints"
  (directory / "2").mkdir(parents=True)  # the last good checkpoint
  saver = checkpoint.Saver(_FailingManager(str(directory)), default_config(), str(tmp_path))
  saver.save(4, state={"w": 1.0}, train_seconds=1.0)
  with pytest.raises(exceptions.SaveError) as e:
    saver.poll()
  message = str(e.value)
  assert "\n" not in message and "step 4" in message and str(directory) in message
  assert "No space left on device" in message and "MiB free" in message
  assert "last good checkpoint (step 2) is kept" in message
  assert sorted(os.listdir(directory)) == ["2"]
  assert not (tmp_path / "config.json").exists()  # no complete checkpoint of this run
  saver.close()  # no second error


class _LateWritingManager(_FailingManager):
  """A failed save whose other writes are still in flight when its first error surfaces (as
  tensorstore's are in Orbax): they re-create files under the temporary folder after the
  saver's first clean-up has deleted it."""

  def wait_until_finished(self):
    folder = os.path.join(self.directory, "4.orbax-checkpoint-tmp-123")

    def write_late():
      while os.path.exists(folder):
        time.sleep(0.001)
      time.sleep(0.05)
      os.makedirs(os.path.join(folder, "state", "ocdbt.process_0", "d"))
      open(os.path.join(folder, "state", "ocdbt.process_0", "d", "late"), "w").close()

    self.late = threading.Thread(target=write_late, daemon=True)
    self.late.start()
    super().wait_until_finished()


def test_writes_of_a_failed_save_that_land_after_its_clean_up_are_removed_at_close(tmp_path):
  directory = tmp_path / "checkpoints"
  (directory / "2").mkdir(parents=True)
  manager = _LateWritingManager(str(directory))
  saver = checkpoint.Saver(manager, default_config(), str(tmp_path))
  saver.save(4, state={"w": 1.0}, train_seconds=1.0)
  with pytest.raises(exceptions.SaveError, match="step 2"):
    saver.poll()
  saver.close()
  manager.late.join(timeout=30)  # the late write landed 0.05 s after the first clean-up
  assert not manager.late.is_alive()
  assert sorted(os.listdir(directory)) == ["2"]


def _tiny_config():
  from transformer_jax.runtime.overrides import load_config_file  # pylint: disable=g-import-not-at-top
  cfg = load_config_file("configs/tiny.py")
  cfg.model.update(d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, vocab_size=64,
                   num_encoder_layers=1, num_decoder_layers=1)
  return cfg


def test_training_time_is_restored_and_older_checkpoints_without_it_still_load(tmp_path):
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import step
  config = _tiny_config()
  mesh = sharding.make_mesh(config.mesh)
  state = step.create_state(config, mesh)
  abstract, _ = step.state_shardings(config, mesh)
  for name, seconds in (("old", None), ("new", 42.5)):
    manager = checkpoint.make_manager(str(tmp_path / name), async_save=False, with_data=False)
    checkpoint.save(manager, 3, state, config, train_seconds=seconds)  # old: no 'progress' item
    manager.wait_until_finished()
    manager.close()
    reader = checkpoint.make_manager(str(tmp_path / name))
    restored = checkpoint.restore_latest(reader, abstract)
    reader.close()
    assert restored.step == 3 and int(restored.state.step) == 0
    assert restored.train_seconds == (seconds or 0.0)
    assert restored.config["model"]["d_model"] == config.model.d_model and not restored.quarantined


def test_checkpoints_at_multiples_of_keep_every_steps_outlive_keep_checkpoints(tmp_path):
  """train.keep_every_steps (a sweep's checkpoint at two thirds of training, evaluated at the
  end): Orbax's keep_period beside max_to_keep."""
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import step
  config = _tiny_config()
  state = step.create_state(config, sharding.make_mesh(config.mesh))
  manager = checkpoint.make_manager(str(tmp_path), keep=2, keep_every=4, async_save=False,
                                    with_data=False)
  for s in range(1, 11):
    checkpoint.save(manager, s, state, config)
  manager.wait_until_finished()
  assert manager.all_steps() == [4, 8, 9, 10]
  manager.close()


def test_compare_with_a_workdir_picks_its_newest_eval_of_the_same_sentences(tmp_path, monkeypatch):
  """`--compare=<workdir>`: a partial (`--bleu_sentences=n`) report is the baseline only when n
  sentences were translated here; otherwise the newest full one, and none fitting is one line.
  (The workdir's checkpoint and vocabulary checks are tests/test_loading.py's.)"""
  from transformer_jax.inference import evaluate  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(evaluate.trained, "open_workdir", lambda *args, **kwargs: None)
  w = str(tmp_path)
  os.makedirs(os.path.join(w, workdir_lib.EVAL_FOLDER))
  for age, (n, lines) in enumerate([(0, 6), (5, 5), (0, 6), (3, 3)]):
    stem = workdir_lib.eval_stem(w, "validation", 100 * (age + 1), bleu_sentences=n)
    with open(stem + ".txt", "w", encoding="utf-8") as f:
      f.write("".join(f"{stem[-12:]} {i}\n" for i in range(lines)))
    os.utime(stem + ".txt", (1000 + age, 1000 + age))
  full = evaluate._comparison_hypotheses(w, "validation", 6)
  assert full.lines[0].endswith("step300 0")     # the newest with 6 lines, not the newer 3-line one
  assert evaluate._comparison_hypotheses(w, "validation", 3).lines[0].endswith("0_bleu3 0")
  with pytest.raises(ConfigError, match=r"no evaluation of 'validation' with 4 sentences"):
    evaluate._comparison_hypotheses(w, "validation", 4)
  with pytest.raises(ConfigError, match=r"no evaluation of 'test'"):
    evaluate._comparison_hypotheses(w, "test", 6)
