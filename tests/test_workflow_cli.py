"""The eval / average / translate modes and the Translator API on a tiny trained workdir."""

import json
import os
import subprocess
import sys

import pytest

from tests.common import DATA_DIR, requires_data
from tests.test_train_reliability import _env, FLAGS, REPO

# One xdist worker runs the module, so the trained workdir is built once (conftest).
pytestmark = [requires_data, pytest.mark.slow, pytest.mark.xdist_group(__name__)]


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
  from transformer_jax.training import checkpoint  # pylint: disable=g-import-not-at-top
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
  assert report["decoder_steps"] > 0 and report["decode_seconds"] > 0
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
  from transformer_jax.inference.translate import Translator  # pylint: disable=g-import-not-at-top
  t = Translator.from_workdir(workdir)
  out = t.translate(["A man rides a bike.", "", "Two dogs play."])
  assert len(out) == 3 and out[1] == "" and all(isinstance(x, str) for x in out)
  assert t.translate(["A man rides a bike."]) == out[:1]  # batch-independent
  # one search (one batch) runs a step per output token, EOS included, until its longest is done
  # (each sentence within its own limit, source length + max_extra_len)
  before, sources = t.decoder_steps, t.encode(["A man rides a bike.", "Two dogs play."])
  ids = t.translate_ids(sources)
  ran = t.decoder_steps - before
  assert max(map(len, ids)) + 1 <= ran <= max(map(len, sources)) + t.config.decode.max_extra_len
  assert DATA_DIR


def test_eval_honours_decode_overrides_and_rejects_model_ones(workdir):
  outputs = {}
  for beam in (1, 4):
    result = _main("--mode=eval", f"--workdir={workdir}", "--split=validation",
                   "--bleu_sentences=60", f"--config.decode.beam_size={beam}")
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    stem = os.path.join(workdir, "eval", f"validation_step4_beam{beam}_bleu60")
    report = json.load(open(stem + ".json"))
    assert report["decode"]["beam_size"] == beam and report["sentences"] == 60
    assert report["overrides"] == {"decode.beam_size": beam}
    outputs[beam] = open(stem + ".txt", encoding="utf-8").read().split("\n")
  assert len(outputs[1]) == len(outputs[4]) == 61
  assert outputs[1] != outputs[4]  # the setting reached the search
  # fewer sentences with the same settings: a report of its own, the 60-sentence one untouched
  result = _main("--mode=eval", f"--workdir={workdir}", "--split=validation",
                 "--bleu_sentences=20", "--config.decode.beam_size=1")
  assert result.returncode == 0, result.stderr.decode()[-2000:]
  stem = os.path.join(workdir, "eval", "validation_step4_beam1")
  assert json.load(open(stem + "_bleu20.json"))["sentences"] == 20
  assert json.load(open(stem + "_bleu60.json"))["sentences"] == 60
  assert open(stem + "_bleu60.txt", encoding="utf-8").read().split("\n") == outputs[1]
  result = _main("--mode=eval", f"--workdir={workdir}", "--config.model.num_heads=4")
  assert result.returncode == 2
  last = result.stderr.decode().strip().splitlines()[-1]
  assert last.startswith("error: --config.model.num_heads cannot change"), last


def test_ensembles_evaluate_and_translate_and_need_one_vocabulary(workdir, tmp_path):
  """--ensemble decodes with other workdirs' models (decode.ensemble_step_fn, tested in
  test_decode; its perplexity: step.ensemble_eval_step, test_train_step): the report names the
  members; a member with another vocabulary is one error line."""
  import shutil  # pylint: disable=g-import-not-at-top
  twin = tmp_path / "twin"
  for sub in ("checkpoints", "vocab"):
    shutil.copytree(os.path.join(workdir, sub), twin / sub)
  result = _main("--mode=eval", f"--workdir={workdir}", "--split=validation", "--bleu_sentences=20",
                 "--average=2", f"--ensemble={twin}")
  assert result.returncode == 0, result.stderr.decode()[-2000:]
  folder = os.path.join(workdir, "eval")
  [name] = [f for f in os.listdir(folder) if f.startswith("validation_step4_avg2_ensemble-twin-")
            and f.endswith("_bleu20.json")]
  report = json.load(open(os.path.join(folder, name)))
  assert report["ensemble"] == [{"workdir": str(twin), "step": 4, "averaged_checkpoints": 2}]
  assert report["perplexity"] > 1 and report["sentences"] == 20 and "sacrebleu" in report
  result = _main("--mode=translate", f"--workdir={workdir}", f"--ensemble={twin}",
                 stdin=b"A man rides a bike.\nTwo dogs.\n")
  assert result.returncode == 0, result.stderr.decode()[-2000:]
  assert len(result.stdout.decode().split("\n")) == 3
  (twin / "vocab" / "spm.model").write_bytes(b"another vocabulary")
  result = _main("--mode=eval", f"--workdir={workdir}", f"--ensemble={twin}")
  assert result.returncode == 2
  last = result.stderr.decode().strip().splitlines()[-1]
  assert last.startswith(f"error: --ensemble={twin}: its vocabulary") and "share one" in last, last


def test_eval_on_any_parallel_files_with_comparison(workdir, tmp_path):
  import gzip  # pylint: disable=g-import-not-at-top
  src, ref = tmp_path / "set.en", tmp_path / "set.de.gz"
  src.write_text("A man rides a bike.\nTwo dogs play in the snow.\nA woman reads.\n", encoding="utf-8")
  with gzip.open(ref, "wt", encoding="utf-8") as f:
    f.write("Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\nEine Frau liest.\n")
  other = tmp_path / "other.txt"
  other.write_text("Ein Mann.\nHunde.\nFrau.\n", encoding="utf-8")
  result = _main("--mode=eval", f"--workdir={workdir}", f"--source={src}", f"--reference={ref}",
                 f"--compare={other}")
  assert result.returncode == 0, result.stderr.decode()[-2000:]
  report = json.load(open(os.path.join(workdir, "eval", "set_step4.json")))
  assert report["sentences"] == 3 and report["tokens"] > 3
  assert {"bleu", "chrf"} <= set(report["compare"])
  assert 0 <= report["compare"]["bleu"]["p_value"] <= 1
  # Another system's file of another length: one line, before anything is translated.
  short_other = tmp_path / "short_other.txt"
  short_other.write_text("Ein Mann.\n", encoding="utf-8")
  result = _main("--mode=eval", f"--workdir={workdir}", f"--source={src}", f"--reference={ref}",
                 f"--compare={short_other}")
  err = result.stderr.decode()
  assert result.returncode == 2 and "has 1 lines but 3 sentences" in err.strip().splitlines()[-1]
  assert "translate:" not in err, err[-2000:]  # tqdm's bar of the decode: nothing was decoded
  # The paper's BLEU against an already tokenized reference file, as get_ende_bleu.sh.
  from transformer_jax.tasks.translation import bleu  # pylint: disable=g-import-not-at-top
  tok_ref = tmp_path / "set.tok.de"
  tok_ref.write_text("Ein Mann fährt Fahrrad .\nZwei Hunde spielen im Schnee .\nEine Frau liest .\n",
                     encoding="utf-8")
  result = _main("--mode=eval", f"--workdir={workdir}", f"--source={src}", f"--reference={ref}",
                 f"--tokenized_reference={tok_ref}")
  assert result.returncode == 0, result.stderr.decode()[-2000:]
  report = json.load(open(os.path.join(workdir, "eval", "set_step4.json")))
  hyps = open(os.path.join(workdir, "eval", "set_step4.txt"), encoding="utf-8").read().split("\n")[:3]
  expected = bleu.tokenized_bleu(hyps, None, "de", tokenized_references=tok_ref.read_text(
      encoding="utf-8").split("\n")[:3])
  assert report["tokenized_bleu"] == pytest.approx(expected["score"])
  # Mismatched line counts: one line naming both files.
  short = tmp_path / "short.de"
  short.write_text("Ein Mann.\n", encoding="utf-8")
  result = _main("--mode=eval", f"--workdir={workdir}", f"--source={src}", f"--reference={short}")
  assert result.returncode == 2
  last = result.stderr.decode().strip().splitlines()[-1]
  assert last.startswith("error:") and "set.en" in last and "short.de" in last, last


def test_eval_without_vocabulary_is_an_error_and_trains_nothing(workdir, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  copy = tmp_path / "novocab"
  shutil.copytree(os.path.join(workdir, "checkpoints"), copy / "checkpoints")
  for mode in ("eval", "translate"):
    result = _main(f"--mode={mode}", f"--workdir={copy}", stdin=b"A man.\n")
    assert result.returncode == 2
    last = result.stderr.decode().strip().splitlines()[-1]
    assert last.startswith("error:") and "no vocabulary" in last, last
  assert not (copy / "vocab").exists()


def test_translate_takes_average_and_decode_overrides(workdir):
  result = _main("--mode=translate", f"--workdir={workdir}", "--average=2", "--step=4",
                 "--config.decode.beam_size=1", stdin=b"A man rides a bike.\n")
  assert result.returncode == 0, result.stderr.decode()[-2000:]
  assert len(result.stdout.decode().split("\n")) == 2


def test_progress_bar_of_a_wall_time_run_shows_the_time_budget(capsys):
  from configs import multi30k  # pylint: disable=g-import-not-at-top
  from transformer_jax.training.metrics import Progress  # pylint: disable=g-import-not-at-top
  t = multi30k.get_config("short").train
  bar = Progress(True, t.num_steps, 0, t.max_train_minutes)
  assert bar._bar.total == 180 and bar._bar.unit == "s"  # pylint: disable=protected-access
  bar.update(10, loss="3.2")
  bar.close()
  line = capsys.readouterr().err.strip().splitlines()[-1]
  assert "of the time budget" in line and "/180 s" in line and "step=10" in line, line
  steps = Progress(True, 500, 20)  # no time limit: a bar of steps
  assert steps._bar.total == 500 and steps._bar.n == 20  # pylint: disable=protected-access
  steps.close()


def test_vocab_mode_writes_the_vocabulary_training_starts_with_and_nothing_else(workdir, tmp_path):
  """--mode=vocab (what a --parallel sweep runs first): the same SentencePiece model a training
  run of that config trains, alone in the new workdir; without --config, one line."""
  from transformer_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
  w = str(tmp_path / "vocab_only")
  result = _main("--mode=vocab", f"--workdir={w}", *FLAGS)
  assert result.returncode == 0, result.stderr.decode()[-2000:]
  assert os.listdir(w) == [tokenizer.VOCAB_SUBDIR]
  with open(tokenizer.vocab_path(w), "rb") as a, open(tokenizer.vocab_path(workdir), "rb") as b:
    assert a.read() == b.read()
  result = _main("--mode=vocab", f"--workdir={w}")
  assert result.returncode == 2
  last = result.stderr.decode().strip().splitlines()[-1]
  assert last == "error: --config is required for --mode=vocab", last


def test_report_names_tag_each_decode_setting_that_changes_the_outputs():
  """Eval reports made with other decode settings never overwrite each other (file names)."""
  from transformer_jax.training import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  assert workdir_lib.settings_tag({
      "decode.beam_size": 1, "decode.batch_size": 8, "decode.parse_constraint": True,
      "decode.parse_max_opens_in_a_row": 6, "decode.parse_max_unary_chain": 5,
      "train.seed": 3}) == "_beam1_constrained_opens6_unary5"
