"""experiments/harness/run_report.py: a finished training run turned into its results record."""

import subprocess
import sys

from experiments.harness import run_report as report_run
from tests.common import table_row

TRANSLATION = {"score_name": "sacreBLEU", "score_key": "sacrebleu", "test_split": "test",
               "score_metrics": [["bleu", "sacrebleu"], ["bleu_tokenized", "tokenized_bleu"]]}


def test_report_run_markdown_and_curve_points():
  assert report_run.curve_steps([200, 400, 600, 800, 1000], 3) == [200, 600, 1000]
  assert report_run.curve_steps([5, 1], 6) == [1, 5]
  assert report_run.curve_steps([200, 400, 600], 1) == [600]
  score = {"sacrebleu": 30.123, "tokenized_bleu": 31.5, "sacrebleu_signature": "nrefs:1|x",
           "decode": {"beam_size": 4, "alpha": 0.6}}
  md = report_run.report_markdown({
      "name": "m", "date": "2024-01-01", "machine": "x86_64", "command": "train", "report_command": "rep",
      "final_step": 1000, "train_wall_minutes": 12.34, "dev_metrics": [{"perplexity": 7.5}],
      **TRANSLATION, "averaged_checkpoints": 3, "test_averaged": score,
      "test_last_checkpoint": None,
      "curve": [{"step": 500, "wall_minutes": 6.0, "dev_score": 20.0,
                 "dev_scores": {"bleu_tokenized": 21.0}, "dev_perplexity": 9.0}],
      "curve_sentences": 0,
      "samples": [{"hypothesis": "Ein Mann."}], "api_translations": [("A man.", "Ein Mann.")],
      "notes": ""})
  assert table_row(md, "test sacreBLEU, average of last 3") == ["test sacreBLEU, average of last 3", "**30.12**"]
  assert table_row(md, "beam, alpha")[1] == "4, 0.6" and table_row(md, "dev perplexity (last eval)")[1] == "7.50"
  assert table_row(md, "test bleu_tokenized, average of last 3")[1] == "31.50"
  assert table_row(md, "500") == ["500", "6.0", "20.00", "21.00", "9.00"]
  assert "last checkpoint only" not in md and "- **hyp** Ein Mann." in md
  assert "test sacreBLEU" not in md.split("## Dev sacreBLEU")[1] and "wall time to" not in md
  assert "sacreBLEU signature: `nrefs:1|x`" in md


def test_a_parser_run_is_reported_by_its_bracket_f1_on_dev():
  """A task without a test split (the treebank sample) is reported on `validation`, by the task's
  own scores: no BLEU, no signature."""
  score = {"f1": 74.256, "precision": 72.0, "recall": 76.6, "decode": {"beam_size": 21, "alpha": 0.3}}
  md = report_run.report_markdown({
      "name": "p", "date": "2024-01-01", "machine": "x86_64", "command": "train", "report_command": "rep",
      "final_step": 3000, "train_wall_minutes": 50.0, "dev_metrics": [{"perplexity": 1.6}],
      "score_name": "bracket F1", "score_key": "f1",
      "score_metrics": [["f1", "f1"], ["precision", "precision"], ["recall", "recall"]],
      "test_split": "validation", "averaged_checkpoints": 0, "test_averaged": score,
      "test_last_checkpoint": None, "curve_sentences": 0,
      "curve": [{"step": 3000, "wall_minutes": 50.0, "dev_score": 74.256,
                 "dev_scores": {"precision": 72.0, "recall": 76.6}, "dev_perplexity": 1.6}],
      "samples": [], "api_translations": [], "notes": ""})
  assert table_row(md, "validation bracket F1, last checkpoint") == [
      "validation bracket F1, last checkpoint", "**74.26**"]
  assert table_row(md, "validation recall, last checkpoint")[1] == "76.60"
  assert table_row(md, "3000") == ["3000", "50.0", "74.26", "72.00", "76.60", "1.60"]
  assert "BLEU" not in md and "signature" not in md


def test_report_run_test_curve_reach_and_dev_chosen_average():
  curve = [{"step": s, "wall_minutes": m, "dev_score": d, "dev_scores": {"bleu_tokenized": d},
            "dev_perplexity": 7.0, "test_score": t} for s, m, d, t in [(100, 5.0, 20.0, 19.0), (200, 10.0, 30.0, 35.2),
                                               (300, 15.0, 31.0, 34.9), (400, 20.0, 33.0, 36.0)]]
  assert report_run.first_reaching(curve, 35.0)["step"] == 200  # the first at or above, not the best
  assert report_run.first_reaching(curve, 36.0)["step"] == 400
  assert report_run.first_reaching(curve, 36.5) is None
  score = {"sacrebleu": 36.5, "tokenized_bleu": 36.6, "sacrebleu_signature": "nrefs:1|x",
           "decode": {"beam_size": 4, "alpha": 0.6}, "sentences_per_second": 41.08,
           "sentences": 1000, "decode_seconds": 24.34}
  md = report_run.report_markdown({
      "name": "m", "date": "2024-01-01", "machine": "x86_64", "command": "train", "report_command": "rep",
      "final_step": 400, "train_wall_minutes": 20.0, "dev_metrics": [], **TRANSLATION,
      "averaged_checkpoints": 3, "dev_score_by_average": {"1": 33.0, "3": 33.4, "10": 33.1},
      "reach": {"35": report_run.first_reaching(curve, 35), "37.67": None},
      "test_averaged": score, "test_last_checkpoint": None, "curve": curve, "curve_sentences": 500,
      "samples": [], "api_translations": [], "notes": ""})
  assert table_row(md, "200")[-1] == "35.20"
  assert table_row(md, "wall time to test sacreBLEU 35")[1].startswith("10.0 min (step 200")
  assert table_row(md, "wall time to test sacreBLEU 37.67")[1] == "not reached"
  assert table_row(md, "checkpoints averaged, chosen on dev (dev sacreBLEU, all sentences)")[1] == "1: 33.00, 3: 33.40, 10: 33.10"
  assert table_row(md, "test decoding speed (averaged model)")[1] == (
      "41.1 sentences/s (1000 sentences in 24.3 s, compilation included)")


def _report_run_error(*args):
  result = subprocess.run([sys.executable, "-m", "experiments.harness.run_report", "--workdir=/nonexistent",
                           "--name=x", *args], capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  return result.stderr.strip().splitlines()[-1]


def test_report_run_rejects_bad_number_lists():
  assert _report_run_error("--average_choices=1,0") == (
      "error: --average_choices=1,0: expected positive whole numbers, comma-separated")
  assert _report_run_error("--curve_test", "--reach=35,x") == (
      "error: --reach=35,x: expected numbers, comma-separated")
  assert _report_run_error("--reach=35") == (
      "error: --reach needs --curve_test (the wall time is read off the test curve)")


def test_a_run_without_training_rows_is_one_clear_error(tmp_path):
  import pytest  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.exceptions import ConfigError  # pylint: disable=g-import-not-at-top
  (tmp_path / "metrics.jsonl").write_text('{"step": 500, "split": "dev", "perplexity": 9.0}\n{"step"')
  with pytest.raises(ConfigError, match=r"metrics.jsonl: no training rows to report on"):
    report_run.read_metrics(str(tmp_path), log_every_steps=50)


def test_an_earlier_evaluation_is_reused_only_when_it_still_stands(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  decode = {"beam_size": 4, "alpha": 0.6, "batch_size": 64}
  ckpt, report = tmp_path / "checkpoints" / "500", tmp_path / "test_step500.json"
  ckpt.mkdir(parents=True)
  report.write_text(json.dumps({"sacrebleu": 30.0, "decode": decode, "overrides": {}}))
  os.utime(ckpt, (1000, 1000))
  os.utime(report, (2000, 2000))
  assert report_run.finished(str(report), str(ckpt), decode)["sacrebleu"] == 30.0
  assert report_run.finished(str(report), str(ckpt), dict(decode, alpha=1.0)) is None
  assert report_run.finished(str(report), str(tmp_path / "checkpoints" / "600"), decode) is None
  os.utime(ckpt, (3000, 3000))  # the checkpoint was written again after the evaluation
  assert report_run.finished(str(report), str(ckpt), decode) is None
  os.utime(ckpt, (1000, 1000))
  report.write_text(json.dumps({"sacrebleu": 30.0, "decode": decode, "overrides": {"decode.beam_size": 1}}))
  os.utime(report, (2000, 2000))
  assert report_run.finished(str(report), str(ckpt), decode) is None
  report.write_text("{not json")
  assert report_run.finished(str(report), str(ckpt), decode) is None
  assert report_run.finished(str(tmp_path / "missing.json"), str(ckpt), decode) is None
