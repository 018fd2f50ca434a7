"""The eval / average / translate modes and the Translator API on a tiny trained workdir."""

import json
import os
import subprocess
import sys

import pytest

from tests.common import DATA_DIR, requires_data
from tests.test_train_reliability import FLAGS, REPO, _env

pytestmark = [requires_data, pytest.mark.slow]


def _main(*args, stdin=None, timeout=300):
  return subprocess.run([sys.executable, "-m", "transformer_jax.main", *args], cwd=REPO,
                        env=_env(), capture_output=True, timeout=timeout, input=stdin)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """Four steps of a tiny model, checkpoints at 2 and 4."""
  w = str(tmp_path_factory.mktemp("trained"))
  result = _main(f"--workdir={w}", *FLAGS, "--config.train.num_steps=4",
                 "--config.decode.batch_size=8", "--config.decode.max_extra_len=5")
  assert result.returncode == 0, result.stderr[-3000:]
  return w


def test_translate_keeps_alignment_and_warns_once_per_long_line(workdir):
  long_line = " ".join(["word"] * 200)
  text = f"A man rides a bike.\n\n{long_line}\nTwo dogs.\n".encode()
  result = _main("--mode=translate", f"--workdir={workdir}", stdin=text)
  assert result.returncode == 0, result.stderr[-2000:]
  out = result.stdout.decode().split("\n")
  assert len(out) == 5 and out[-1] == ""          # four lines in, four lines out
  assert out[1] == ""                               # an empty line stays empty
  warnings = [l for l in result.stderr.decode().splitlines() if l.startswith("warning: line")]
  assert len(warnings) == 1 and warnings[0].startswith("warning: line 3 ")


def test_translate_rejects_non_utf8_naming_the_line(workdir, tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"fine\nnot \xff fine\n")
  result = _main("--mode=translate", f"--workdir={workdir}", f"--input={bad}")
  assert result.returncode == 2
  last = result.stderr.decode().strip().splitlines()[-1]
  assert last.startswith("error:") and "line 2" in last and "UTF-8" in last


def test_average_too_many_is_an_error_and_writes_nothing(workdir):
  result = _main("--mode=average", f"--workdir={workdir}", "--average=7")
  assert result.returncode == 2
  last = result.stderr.decode().strip().splitlines()[-1]
  assert last.startswith("error: asked to average the last 7") and "nothing written" in last
  assert not os.path.exists(os.path.join(workdir, "averaged", "last7"))


def test_average_then_eval_writes_aligned_outputs_and_both_bleus(workdir):
  result = _main("--mode=average", f"--workdir={workdir}", "--average=2")
  assert result.returncode == 0, result.stderr.decode()[-2000:]
  from transformer_jax import checkpoint  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  avg, _, step = checkpoint.load_params(os.path.join(workdir, "averaged", "last2"))
  p2, _, _ = checkpoint.load_params(checkpoint.checkpoint_dir(workdir), 2)
  p4, _, _ = checkpoint.load_params(checkpoint.checkpoint_dir(workdir), 4)
  assert step == 4
  for a, x, y in zip(jax.tree.leaves(avg), jax.tree.leaves(p2), jax.tree.leaves(p4)):
    np.testing.assert_allclose(a, (np.asarray(x) + np.asarray(y)) / 2, rtol=1e-6, atol=1e-7)

  result = _main("--mode=eval", f"--workdir={workdir}", "--split=validation", "--average=2")
  assert result.returncode == 0, result.stderr.decode()[-2000:]
  stem = os.path.join(workdir, "eval", "validation_step4_avg2")
  report = json.load(open(stem + ".json"))
  assert {"sacrebleu", "sacrebleu_signature", "tokenized_bleu"} <= set(report)
  assert "nrefs:1" in report["sacrebleu_signature"]
  lines = open(stem + ".txt", encoding="utf-8").read().split("\n")
  assert len(lines) == 1014 + 1  # every dev sentence, in order
  rows = [json.loads(l) for l in open(stem + ".jsonl", encoding="utf-8")]
  assert [r["index"] for r in rows] == list(range(1014))


def test_missing_checkpoint_is_one_line(tmp_path):
  result = _main("--mode=eval", f"--workdir={tmp_path}")
  assert result.returncode == 2
  last = result.stderr.decode().strip().splitlines()[-1]
  assert last.startswith("error: no checkpoints in"), last


def test_translator_api(workdir):
  from transformer_jax.translate import Translator  # pylint: disable=g-import-not-at-top
  t = Translator.from_workdir(workdir)
  out = t.translate(["A man rides a bike.", "", "Two dogs play."])
  assert len(out) == 3 and out[1] == "" and all(isinstance(x, str) for x in out)
  assert t.translate(["A man rides a bike."]) == out[:1]  # batch-independent
  assert DATA_DIR
