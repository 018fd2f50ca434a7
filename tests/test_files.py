"""Object-store workdirs (gs://): URLs stay URLs, and the workdir's own files (lock, metrics,
TensorBoard events, vocabulary, config.json, eval outputs) go through files.py.

A fake `gs` filesystem (fsspec's DirFileSystem over a temporary folder, registered under the
names gcsfs would take) stands in for GCS; checkpoints on GCS are Orbax's (tensorstore's GCS
driver) and are not exercised here. Without gcsfs, a gs:// workdir is one line.
"""

import json
import os
import subprocess
import sys

import importlib
import importlib.util

import fsspec
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

from transformer_jax.data import tokenizer
from transformer_jax.runtime import exceptions, files
from transformer_jax.runtime.config import default_config
from transformer_jax.training import checkpoint, metrics, workdir as workdir_lib

from tests.common import REPO

_REGISTRY = importlib.import_module("fsspec.registry")._registry  # pylint: disable=protected-access


@pytest.fixture(scope="module")
def fake_gcs(tmp_path_factory):
  """The store's root folder (one per module: etils.epath keeps the filesystem it made first, so
  every test here uses its own gs://bucket/<name>)."""
  root = tmp_path_factory.mktemp("bucket-store")

  class FakeGCS(DirFileSystem):
    protocol = ("gs", "gcs")

    def __init__(self, *args, **kwargs):  # pylint: disable=unused-argument
      super().__init__(path=str(root), fs=LocalFileSystem(auto_mkdir=True))

  saved = {n: _REGISTRY.get(n) for n in ("gs", "gcs")}
  for name in ("gs", "gcs"):
    fsspec.register_implementation(name, FakeGCS, clobber=True)
  yield root
  for name, cls in saved.items():
    _REGISTRY.pop(name, None)
    if cls is not None:
      fsspec.register_implementation(name, cls, clobber=True)


def test_urls_stay_urls_and_local_paths_become_absolute(fake_gcs):
  assert files.resolve("gs://bucket/run/") == "gs://bucket/run"
  assert checkpoint.checkpoint_dir("gs://bucket/run") == "gs://bucket/run/checkpoints"
  assert files.resolve("run") == os.path.join(os.getcwd(), "run")
  assert not os.path.exists("gs:")  # nothing was created locally under a folder named 'gs:'


def test_file_operations_in_the_store(fake_gcs):
  d = "gs://bucket/ops"
  files.makedirs(d + "/eval")
  files.write_text(d + "/a.txt", "one\n")
  files.append_lines(d + "/a.txt", ["two\n", "three\n"])
  assert files.read_text(d + "/a.txt") == "one\ntwo\nthree\n"
  assert (fake_gcs / "bucket" / "ops" / "a.txt").read_text() == "one\ntwo\nthree\n"
  assert files.listdir(d) == ["a.txt", "eval"] and files.isdir(d + "/eval")
  files.rename(d + "/a.txt", d + "/b.txt")
  assert not files.exists(d + "/a.txt") and files.read_bytes(d + "/b.txt").startswith(b"one")
  assert files.mtime(d + "/b.txt") > 0
  files.remove(d + "/b.txt")
  assert files.listdir(d) == ["eval"]


def test_lock_in_the_store_refuses_a_second_run_and_is_released(fake_gcs):
  with workdir_lib.claim("gs://bucket/lock", "training") as path:
    assert path == "gs://bucket/lock"
    held = json.loads(files.read_text(path + "/workdir.lock"))
    assert held["pid"] == os.getpid() and held["purpose"] == "training"
    with pytest.raises(exceptions.WorkdirBusy, match=f"in use by pid {os.getpid()}"):
      workdir_lib.WorkdirLock(path, "another run").acquire()
  assert not files.exists("gs://bucket/lock/workdir.lock")


def test_a_dead_holders_lock_in_the_store_is_taken_over(fake_gcs, capsys):
  files.makedirs("gs://bucket/stale")
  dead = {"host": workdir_lib.socket.gethostname(), "pid": 2**22 + 12345, "token": "old"}
  files.write_text("gs://bucket/stale/workdir.lock", json.dumps(dead))
  with workdir_lib.claim("gs://bucket/stale", "training"):
    assert json.loads(files.read_text("gs://bucket/stale/workdir.lock"))["pid"] == os.getpid()
  assert "took over the stale lock" in capsys.readouterr().err


def test_metrics_and_tensorboard_events_in_the_store(fake_gcs):
  w = metrics.MetricsWriter("gs://bucket/metrics")
  w.write(1, {"loss": 3.0}, "train")
  w.write(2, {"loss": 2.5}, "train")
  w.close()
  lines = files.read_text("gs://bucket/metrics/metrics.jsonl").splitlines()
  assert [json.loads(l)["step"] for l in lines] == [1, 2]
  events = files.listdir("gs://bucket/metrics/tb")
  assert len(events) == 1 and events[0].startswith("events.out.tfevents")
  assert os.path.getsize(fake_gcs / "bucket" / "metrics" / "tb" / events[0]) > 0
  metrics.MetricsWriter("gs://bucket/metrics", resume_step=1).close()  # a resume at step 1
  assert [json.loads(l)["step"] for l in
          files.read_text("gs://bucket/metrics/metrics.jsonl").splitlines()] == [1]


def test_vocabulary_and_config_in_the_store(fake_gcs):
  proto = tokenizer.train_sentencepiece(
      [f"ein kleiner satz nummer {i} mit worten" for i in range(200)], vocab_type="bpe",
      vocab_size=40)
  path = tokenizer.vocab_path("gs://bucket/vocab")
  files.makedirs(os.path.dirname(path))
  files.write_bytes(path, proto)
  assert tokenizer.load_tokenizer("gs://bucket/vocab").vocab_size == 40
  checkpoint.write_config_json("gs://bucket/vocab", default_config())
  assert json.loads(files.read_text("gs://bucket/vocab/config.json"))["model"]["d_model"] == 512


def test_a_store_without_its_package_is_one_line():
  if importlib.util.find_spec("gcsfs") is not None:
    pytest.skip("gcsfs is installed here")
  p = subprocess.run([sys.executable, "-m", "transformer_jax.main", "--config=configs/tiny.py",
                      "--workdir=gs://b/run"], cwd=REPO, capture_output=True, text=True,
                     timeout=300)
  lines = p.stderr.strip().splitlines()
  assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
  assert lines[0].startswith("error: workdir gs://b/run: gs:// needs the gcsfs package "
                             "(pip install gcsfs)")


def test_threads_writing_one_file_never_share_a_temporary_file(tmp_path):
  # A --parallel sweep's threads write the shared references.json at once (results.
  # write_once); with one temporary name per process, one thread published or deleted the
  # other's half-written file (an intermittent failed run).
  import threading
  from transformer_jax.runtime import results
  path, texts = str(tmp_path / "shared.json"), [{"writer": i, "pad": "x" * 200_000} for i in range(2)]
  errors, start = [], threading.Barrier(2)

  def write(obj):
    try:
      start.wait()
      for _ in range(30):
        files.write_text(path, json.dumps(obj))
        results.write_once(path + ".once", obj)
    except Exception as e:  # pylint: disable=broad-except
      errors.append(repr(e))

  threads = [threading.Thread(target=write, args=(t,)) for t in texts]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert errors == []
  assert json.load(open(path)) in texts and json.load(open(path + ".once")) in texts
  assert sorted(os.listdir(tmp_path)) == ["shared.json", "shared.json.once"]  # no temporary left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
  from transformer_jax.runtime import results
  path = str(tmp_path / "config.json")
  files.write_text(path, "old")
  with pytest.raises(TypeError):
    files.write_bytes(path, "not bytes")  # fails inside the write, as a full disk would
  circular = []
  circular.append(circular)
  with pytest.raises(ValueError, match="Circular"):  # an object json cannot write
    results.write_once(str(tmp_path / "result.json"), {"ok": 1, "circular": circular})
  assert files.read_text(path) == "old" and os.listdir(tmp_path) == ["config.json"]


def test_an_interrupted_result_write_leaves_the_old_files_and_no_part(tmp_path, monkeypatch):
  """Ctrl-C in the middle of writing a result (here: as the finished bytes are renamed into
  place) leaves the previous JSON and Markdown whole and no temporary file beside them."""
  from transformer_jax.runtime import results  # pylint: disable=g-import-not-at-top
  stem = str(tmp_path / "report")
  results.write_result(stem, {"bleu": 1.0}, "# old\n")
  real_replace = os.replace

  def interrupted(src, dst):
    with open(src, encoding="utf-8") as f:
      assert f.read()  # the new bytes were all written before the rename
    raise KeyboardInterrupt
  monkeypatch.setattr(os, "replace", interrupted)
  with pytest.raises(KeyboardInterrupt):
    results.write_result(stem, {"bleu": 2.0}, "# new\n")
  monkeypatch.setattr(os, "replace", real_replace)
  assert results.read_json(stem + ".json") == {"bleu": 1.0}
  assert files.read_text(stem + ".md") == "# old\n"
  assert sorted(os.listdir(tmp_path)) == ["report.json", "report.md"]


def _checkpointed_workdir(url: str, local, steps=(1, 2)):
  """A workdir `url` in the fake store holding checkpoints of a tiny model at `steps`, each
  with its own parameters (state + step)."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.overrides import load_config_file  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import step as step_lib  # pylint: disable=g-import-not-at-top
  config = load_config_file("configs/tiny.py")
  config.model.update(d_model=16, d_ff=32, num_heads=2, d_k=8, d_v=8, vocab_size=64,
                      num_encoder_layers=1, num_decoder_layers=1)
  state = step_lib.create_state(config, sharding.make_mesh(config.mesh))
  manager = checkpoint.make_manager(str(local / "checkpoints"), async_save=False, with_data=False)
  for s in steps:
    checkpoint.save(manager, s, state.replace(params=jax.tree.map(lambda p, s=s: p + s,
                                                                  state.params)), config)
  manager.wait_until_finished()
  manager.close()
  proto = tokenizer.train_sentencepiece(  # the run's vocabulary, which averaging checks
      [f"ein kleiner satz nummer {i} mit worten" for i in range(200)], vocab_type="bpe",
      vocab_size=40)
  files.makedirs(files.parent(tokenizer.vocab_path(url)))
  files.write_bytes(tokenizer.vocab_path(url), proto)
  return state


def _orbax_in_the_store(monkeypatch, fake_gcs):
  """Orbax writes arrays with tensorstore, whose GCS driver the fake store cannot stand in for:
  its checkpoint managers get the store's local folder, every other file goes through files.py
  and the fake gs:// filesystem (the same folder)."""
  make_manager = checkpoint.make_manager

  def local_manager(directory, **kwargs):
    if directory.startswith("gs://"):
      directory = str(fake_gcs / directory[len("gs://"):])
    return make_manager(directory, **kwargs)
  monkeypatch.setattr(checkpoint, "make_manager", local_manager)


def test_averaging_a_workdir_in_the_store(fake_gcs, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import averaging  # pylint: disable=g-import-not-at-top
  _orbax_in_the_store(monkeypatch, fake_gcs)
  url, local = "gs://bucket/average", fake_gcs / "bucket" / "average"
  state = _checkpointed_workdir(url, local)
  out = averaging.average_workdir(url, 2)
  assert out == "gs://bucket/average/averaged/last2"
  assert json.loads(files.read_text(out + ".json")) == {
      "steps": [1, 2], "source": "gs://bucket/average/checkpoints"}
  params, _, step = checkpoint.load_params(out)
  assert step == 2
  for mean, initial in zip(jax.tree.leaves(params), jax.tree.leaves(state.params)):
    np.testing.assert_allclose(np.asarray(mean), np.asarray(initial) + 1.5, rtol=1e-6)
  assert averaging.average_workdir(url, 2) == out  # the same average again: reused


def test_a_failed_average_in_the_store_leaves_no_folder(fake_gcs, monkeypatch):
  import shutil  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import averaging  # pylint: disable=g-import-not-at-top
  _orbax_in_the_store(monkeypatch, fake_gcs)
  url, local = "gs://bucket/broken", fake_gcs / "bucket" / "broken"
  _checkpointed_workdir(url, local)
  shutil.rmtree(local / "checkpoints" / "1" / "state")  # step 1 can no longer be read
  with pytest.raises(exceptions.CheckpointError, match="nothing written"):
    averaging.average_workdir(url, 2)
  assert not files.exists(url + "/averaged")
  assert sorted(files.listdir(url)) == ["checkpoints", "vocab"]

