"""Every split's files are read and checked before anything is written for a run (its workdir,
its vocabulary), and text and tree files may start with a UTF-8 byte-order mark."""

import codecs
import os
import subprocess
import sys

import pytest

from tests.common import REPO
from tests.test_parsing import _fixture_trees, _mrg, _parser_flags
from transformer_jax.data import sources
from transformer_jax.tasks.parsing import treebank as trees

BOM = codecs.BOM_UTF8.decode("utf-8")


def _train(workdir, data_dir, *extra, mode="train"):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  return subprocess.run([sys.executable, "-m", "transformer_jax.main", f"--mode={mode}",
                         f"--workdir={workdir}", *_parser_flags(data_dir), *extra], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("bad_split,flag", [("dev", []), ("test", ["--config.data.test_files=f_04"])])
@pytest.mark.parametrize("mode", ["train", "vocab"])
def test_a_bad_dev_or_test_tree_file_is_refused_with_nothing_written(tmp_path, bad_split, flag,
                                                                     mode):
  for k, (n, offset) in enumerate(((24, 0), (24, 24), (6, 48), (6, 54))):
    _mrg(tmp_path, f"f_0{k + 1}.mrg", _fixture_trees(n, offset))
  bad = "f_03.mrg" if bad_split == "dev" else "f_04.mrg"
  with open(os.path.join(tmp_path, "tb", bad), "a", encoding="utf-8") as f:
    f.write("( (S (NP (NN a)) )\n")  # not closed
  workdir = tmp_path / "run"
  result = _train(workdir, tmp_path, *flag, mode=mode)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
  assert lines[0].startswith("error: ") and bad in lines[0] and "line" in lines[0], lines[0]
  assert not workdir.exists()


def test_a_tree_file_may_start_with_a_byte_order_mark(tmp_path):
  text = _fixture_trees(3, 0)
  folder = _mrg(tmp_path, "x_01.mrg", BOM + text)
  _mrg(tmp_path, "x_02.mrg", text)
  with_bom, without = (trees.split_records(folder, stem, "train split").examples
                       for stem in ("x_01", "x_02"))
  assert [e.words for e in with_bom] == [e.words for e in without]
  assert [e.line for e in with_bom] == [e.line for e in without]


def test_a_text_file_may_start_with_a_byte_order_mark(tmp_path):
  src, ref = tmp_path / "a.en", tmp_path / "a.de"
  src.write_bytes(codecs.BOM_UTF8 + "A man.\nTwo dogs.\n".encode())
  ref.write_bytes(codecs.BOM_UTF8 + "Ein Mann.\nZwei Hunde.\n".encode())
  assert sources.read_parallel_files(str(src), str(ref)) == (["A man.", "Two dogs."],
                                                             ["Ein Mann.", "Zwei Hunde."])
  assert list(sources.open_lines(str(src)))[1] == b"Two dogs."  # only the file's start


def _trees(tmp_path):
  tmp_path.mkdir(exist_ok=True)
  for k, (n, offset) in enumerate(((24, 0), (24, 24), (6, 48), (6, 54))):
    _mrg(tmp_path, f"f_0{k + 1}.mrg", _fixture_trees(n, offset))


@pytest.mark.slow
def test_a_branch_with_a_bad_dev_file_writes_no_branch_workdir(tmp_path):
  """--branch_from checks every split (data/sources.check_splits) before it copies anything: the
  branch's data folder (data.data_dir may change in a branch) has a dev file that does not parse."""
  good, bad = tmp_path / "good", tmp_path / "bad"
  _trees(good)
  _trees(bad)
  with open(bad / "tb" / "f_03.mrg", "a", encoding="utf-8") as f:
    f.write("( (S (NP (NN a)) )\n")  # not closed
  source = tmp_path / "source"
  result = _train(source, good, "--config.train.num_steps=2", "--config.train.checkpoint_every_steps=2")
  assert result.returncode == 0, result.stderr[-2000:]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  existing = tmp_path / "existing"
  existing.mkdir()
  for branch in (tmp_path / "branch", existing):  # new, and an empty folder that exists
    result = subprocess.run([sys.executable, "-m", "transformer_jax.main", f"--workdir={branch}",
                             f"--branch_from={source}", "--step=2", "--config.train.num_steps=4",
                             f"--config.data.data_dir={bad}"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("error: ") and "f_03.mrg" in lines[0], lines[0]
    assert "branched" not in result.stdout
    assert not (tmp_path / "branch").exists() and list(existing.iterdir()) == []
    assert not [p for p in tmp_path.iterdir() if ".branching-" in p.name]
