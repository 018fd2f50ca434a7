"""The one loader of a trained workdir (inference/trained.py), as a user meets it: real processes
on the tiny config. A workdir whose vocab/ was replaced by another of the same size is refused in
one line naming the vocabulary and the step by eval, translate, average, an ensemble member and a
--compare workdir, with nothing written; a comparison over other sentences names the first line;
a missing member, a changed model.vocab_size and a dangling workdir symlink say what they are.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.common import REPO, requires_data
from tests.test_train_reliability import _cmd, _env, _last_error, _run, _snapshot

pytestmark = [requires_data, pytest.mark.slow, pytest.mark.xdist_group(__name__)]


def _main(*args, stdin=None):
  return subprocess.run([sys.executable, "-m", "transformer_jax.main", *args], cwd=REPO,
                        env=_env(), capture_output=True, text=True, timeout=300, input=stdin)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """Two steps of the tiny model (checkpoint at 2) and the validation report of its first two
  sentences."""
  run = str(tmp_path_factory.mktemp("loading") / "run")
  result = _run(run, "--config.train.num_steps=2")
  assert result.returncode == 0, result.stderr[-3000:]
  result = _main("--mode=eval", f"--workdir={run}", "--split=validation", "--bleu_sentences=2")
  assert result.returncode == 0, result.stderr[-3000:]
  return run


@pytest.fixture(scope="module")
def swapped(trained, tmp_path_factory):
  """A copy of `trained` whose vocab/ is another valid vocabulary of the same size."""
  other = str(tmp_path_factory.mktemp("other_vocab") / "v")
  made = subprocess.run(_cmd(other, "--mode=vocab", "--config.data.vocab_train_sentences=3000"),
                        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
  assert made.returncode == 0, made.stderr[-3000:]
  run = str(tmp_path_factory.mktemp("swapped") / "run")
  shutil.copytree(trained, run)
  shutil.rmtree(os.path.join(run, "vocab"))
  shutil.copytree(os.path.join(other, "vocab"), os.path.join(run, "vocab"))
  return run


def _refused_vocabulary(result, workdir):
  last = _last_error(result)
  assert (f"{workdir}/vocab is not the vocabulary the checkpoint at step 2 was trained "
          "with (its spm.model has other pieces)") in last, last
  return last


def test_a_swapped_vocabulary_is_refused_by_eval_translate_and_average(swapped):
  snapshot = _snapshot(swapped)
  _refused_vocabulary(_main("--mode=eval", f"--workdir={swapped}", "--split=validation",
                            "--bleu_sentences=2"), swapped)
  _refused_vocabulary(_main("--mode=eval", f"--workdir={swapped}", "--split=validation",
                            "--average=1"), swapped)
  _refused_vocabulary(_main("--mode=translate", f"--workdir={swapped}",
                            stdin="A man rides a bike.\n"), swapped)
  _refused_vocabulary(_main("--mode=average", f"--workdir={swapped}", "--average=1"), swapped)
  assert _snapshot(swapped) == snapshot and not os.path.exists(os.path.join(swapped, "averaged"))


def test_a_swapped_ensemble_member_or_compare_workdir_is_refused(trained, swapped):
  snapshot = _snapshot(trained)
  last = _refused_vocabulary(_main("--mode=eval", f"--workdir={trained}", "--split=validation",
                                   "--bleu_sentences=2", f"--ensemble={swapped}"), swapped)
  assert last.startswith(f"error: --ensemble={swapped}"), last
  last = _refused_vocabulary(_main("--mode=eval", f"--workdir={trained}", "--split=validation",
                                   "--bleu_sentences=2", f"--compare={swapped}"), swapped)
  assert last.startswith(f"error: --compare={swapped}"), last
  assert _snapshot(trained) == snapshot


def test_a_missing_ensemble_member_says_it_does_not_exist(trained, tmp_path):
  missing = str(tmp_path / "no_such_run")
  last = _last_error(_main("--mode=translate", f"--workdir={trained}", f"--ensemble={missing}",
                           stdin="A man rides a bike.\n"))
  assert last == f"error: --ensemble={missing}: {missing} does not exist", last


def test_a_comparison_over_other_sentences_names_the_first_line(trained, tmp_path):
  report = os.path.join(trained, "eval", "validation_step2_bleu2")
  other = str(tmp_path / "other")  # the same outputs, recorded for other second sentence
  for ext in (".txt", ".json"):
    shutil.copy(report + ext, other + ext)
  with open(report + ".jsonl") as f:
    rows = [json.loads(line) for line in f]
  rows[1]["source"] = "Two dogs play in the snow."
  with open(other + ".jsonl", "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))
  snapshot = _snapshot(trained)
  last = _last_error(_main("--mode=eval", f"--workdir={trained}", "--split=validation",
                           "--bleu_sentences=2", f"--compare={other}.json"))
  assert f"({other}.txt): line 2 is the output for another sentence" in last, last
  assert "'Two dogs play in the snow.'" in last
  assert _snapshot(trained) == snapshot


def test_a_parser_baseline_over_other_words_names_the_first_line():
  from transformer_jax.runtime.exceptions import ConfigError  # pylint: disable=g-import-not-at-top
  from transformer_jax.tasks.parsing.task import TASK  # pylint: disable=g-import-not-at-top
  lines = ["(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat))))",
           "(TOP (S (NP (NNS Dogs)) (VP (VBP run))))"]
  assert len(TASK.read_baseline(lines, "--compare=b.txt", sources=["The cat sat", "Dogs run"])) == 2
  with pytest.raises(ConfigError, match=r"^--compare=b.txt: the tree on line 2 is over other "
                     r"words than sentence 2 here \('Dogs run', here 'Cats sleep'\)"):
    TASK.read_baseline(lines, "--compare=b.txt", sources=["The cat sat", "Cats sleep"])


def test_a_resume_with_another_vocab_size_names_the_config_key(trained, tmp_path):
  run = str(tmp_path / "run")
  shutil.copytree(trained, run)
  snapshot = _snapshot(run)
  last = _last_error(_run(run, "--config.train.num_steps=4", "--config.model.vocab_size=320"))
  assert ("error: config key 'model.vocab_size' is 320 but the checkpoint at step 2 in "
          f"{run}/checkpoints was trained with 300") in last, last
  assert _snapshot(run) == snapshot


def test_a_dangling_workdir_symlink_says_so(tmp_path):
  link, target = str(tmp_path / "link"), str(tmp_path / "gone")
  os.symlink(target, link)
  last = _last_error(_run(link, "--config.train.num_steps=2"))
  assert last.startswith(f"error: workdir {link} is a dangling symlink to {target}"), last
  last = _last_error(_main("--mode=eval", f"--workdir={link}"))
  assert last == f"error: --workdir: {link} is a dangling symlink to {target}", last
  assert not os.path.exists(target)
