"""Every committed result regenerates at HEAD (experiments/provenance.py), and the pinned
protocols do not move when the Multi30k recipe does."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from experiments.harness import provenance, resolve, study
from transformer_jax.runtime.dotted import flatten, nest
from transformer_jax.runtime.overrides import REPO

RESULTS = os.path.join(REPO, "experiments", "results")
TRAIN = "python -m transformer_jax.main --config=configs/tiny.py --workdir=W"


def test_every_committed_result_regenerates_at_head():
  folders = provenance.results_folders()
  assert RESULTS in folders and os.path.join(REPO, "experiments", "table3", "results") in folders
  findings, archived = [], 0
  for folder in folders:
    more, skipped = provenance.check_folder(folder)
    findings, archived = findings + more, archived + skipped
  bad = [f.line(REPO) for f in findings if f.status in provenance.FAILING]
  assert not bad, "\n".join(bad)
  ok = {os.path.relpath(f.path, REPO) for f in findings if f.status == "ok"}
  assert len(ok) >= 109 and archived > 0  # every sweep run and the hours
  # the sweeps' reports record their --report command and its settings, and are checked
  assert {"experiments/table3/results/table3_cpu.json", "experiments/table3/results/table3_cpu_long.json",
          "experiments/head_width/results/head_width_cpu_long.json",
          "experiments/wsj_parsing/results/wsj_parsing_pilot.json"} <= ok


def test_a_report_is_checked_against_what_its_report_command_resolves_to(tmp_path):
  """A sweep report's `settings` against its `--report` command at HEAD; a recorded path that
  moved (a study's FORMER_PATHS) or an old entry point is read as it is now."""
  from experiments.harness import runner  # pylint: disable=g-import-not-at-top
  args = ["--sweep=experiments/head_width", "--scale=cpu_long"]
  settings = runner.report_settings(args)
  assert settings["planned_seeds.base"] == [0, 1] and "scale.description" not in settings
  old = "python -m experiments.run --report --sweep=experiments/head_width.py --scale=cpu_long"
  assert provenance.current(old) == f"python -m {provenance.RUNNER} --report " + " ".join(args)
  _write(tmp_path / "same.json", {"command": old, "settings": settings})
  _write(tmp_path / "drift.json", {"command": old, "settings": dict(settings, **{
      "rows.h1_dk8.overrides.model.num_heads": 2})})
  findings = {os.path.basename(f.path): f for f in provenance.check_folder(str(tmp_path))[0]}
  assert findings["same.json"].status == "ok", findings["same.json"].detail
  assert findings["drift.json"].status == "drift"
  assert "rows.h1_dk8.overrides.model.num_heads: 2 recorded, 1 at HEAD" in findings["drift.json"].detail


def _write(path, obj):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
  return path.read_text()


def test_drift_names_the_key_archive_is_skipped_and_nothing_is_rewritten(tmp_path):
  config = flatten(provenance.load("configs/tiny.py"))
  nested = nest(config).to_dict()
  trained = nest({**config, "model.word_positions": True, "model.word_starts": [5, 9]}).to_dict()
  texts = {
      "same.json": _write(tmp_path / "same.json", {"command": TRAIN, "config": nested}),
      # the ids training filled from its vocabulary are not the command's: the same run
      "filled.json": _write(tmp_path / "filled.json", {
          "command": TRAIN + " --config.model.word_positions=True", "config": trained}),
      "drift.json": _write(tmp_path / "drift.json", {
          "command": TRAIN + " --config.model.dropout_rate=0.3", "config": nested}),
      "archive/old.json": _write(tmp_path / "archive" / "old.json", "{not json"),
  }
  findings, archived = provenance.check_folder(str(tmp_path))
  by_name = {os.path.relpath(f.path, tmp_path): f for f in findings}
  assert set(by_name) == {"same.json", "filled.json", "drift.json"} and archived == 1
  assert by_name["same.json"].status == "ok" and by_name["filled.json"].status == "ok"
  assert by_name["drift.json"].status == "drift"
  assert "model.dropout_rate: 0.1 recorded, 0.3 at HEAD" in by_name["drift.json"].detail
  for name, text in texts.items():
    assert (tmp_path / name).read_text() == text


def test_a_report_scoring_the_average_its_config_now_decodes_with_is_no_drift(tmp_path):
  """run_report scores --average checkpoints whatever the checkpoint's config said: a config that
  later takes that average for its decoding is no drift; another average still is."""
  nested = nest(flatten(provenance.load("configs/tiny.py"))).to_dict()
  command = TRAIN + " --config.decode.average_checkpoints=2"
  for name, k in (("same.json", 2), ("other.json", 3), ("none.json", None)):
    _write(tmp_path / name, {"command": command, "config": nested}
           | ({"averaged_checkpoints": k} if k else {}))
  findings, _ = provenance.check_folder(str(tmp_path))
  status = {os.path.basename(f.path): (f.status, f.detail) for f in findings}
  assert status["same.json"][0] == "ok"
  for name in ("other.json", "none.json"):
    assert status[name][0] == "drift"
    assert "decode.average_checkpoints: 0 recorded, 2 at HEAD" in status[name][1]


@pytest.mark.parametrize("content, status, words", [
    ("{\"command\": ", "error", "does not load as JSON"),
    ({"name": "x", "dev": 1.0}, "unchecked", "records no command"),
    ({"command": "python -m benchmarks --only=train"}, "unchecked", "not the settings"),
    ({"command": TRAIN + " --config.model.no_such_key=1", "config": {"seed": 0}},
     "error", "unknown config key 'model.no_such_key'"),
    ({"command": "python -m transformer_jax.main --config=configs/gone.py", "config": {"seed": 0}},
     "error", "configs/gone.py not found"),
    ({"command": "python -m transformer_jax.main 'unclosed", "config": {"seed": 0}},
     "error", "does not parse as a shell line"),
])
def test_bad_results_get_one_line_naming_the_file(tmp_path, content, status, words):
  _write(tmp_path / "r.json", content)
  (finding,), _ = provenance.check_folder(str(tmp_path))
  line = finding.line(str(tmp_path))
  assert finding.status == status and words in line and line.count("\n") == 0
  assert line.split()[1] == "r.json:"


def test_the_cli_exits_1_on_drift_and_prints_the_summary(tmp_path):
  nested = nest(flatten(provenance.load("configs/tiny.py"))).to_dict()
  _write(tmp_path / "drift.json", {"command": TRAIN + " --config.seed=3", "config": nested})
  run = subprocess.run([sys.executable, "-m", "experiments.harness.provenance", f"--results={tmp_path}"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert run.returncode == 1, run.stderr
  assert "drift     drift.json: the training command at HEAD: seed: 0 recorded, 3 at HEAD" in run.stdout
  assert "1 result files: 0 regenerate at HEAD, 1 drifted" in run.stdout
  missing = subprocess.run([sys.executable, "-m", "experiments.harness.provenance",
                            f"--results={tmp_path / 'nope'}"],
                           capture_output=True, text=True, cwd=REPO, timeout=300)
  assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0


_PROTOCOLS = """
import json
from experiments.harness import resolve, study
out = {}
for spec, scale in (("experiments/table3", "cpu"), ("experiments/table3", "postln_pilot_paper_lr"),
                    ("experiments/multi30k_levers", "at2700")):
  sweep = study.load_sweep(spec)
  for row in study.row_ids(sweep):
    out[f"{spec}:{scale}:{row}"] = resolve.protocol(resolve.resolve(sweep, row, scale), sweep)["hash"]
print(json.dumps(out))
"""


def test_pinned_protocols_do_not_move_when_the_multi30k_recipe_does(tmp_path):
  """A copy of the repository whose configs/multi30k.py trains something else resolves every
  pinned sweep scale to the same protocols."""
  copy = tmp_path / "repo"
  for part in ("configs", "experiments", "transformer_jax"):
    shutil.copytree(os.path.join(REPO, part), copy / part,
                    ignore=shutil.ignore_patterns("results", "__pycache__"))
  recipe = copy / "configs" / "multi30k.py"
  text = recipe.read_text()
  for old, new in (("m.dropout_rate = 0.2", "m.dropout_rate = 0.5"),
                   ("c.decode.alpha = 1.4", "c.decode.alpha = 2.0"),
                   ("d.tokens_per_batch = 2048", "d.tokens_per_batch = 999")):
    assert old in text
    text = text.replace(old, new)
  recipe.write_text(text)

  def protocols(root):
    run = subprocess.run([sys.executable, "-c", _PROTOCOLS], capture_output=True, text=True,
                         cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)

  moved = subprocess.run([sys.executable, "-c", "from configs import multi30k; "
                          "print(multi30k.get_config().model.dropout_rate)"],
                         capture_output=True, text=True, cwd=copy,
                         env={**os.environ, "PYTHONPATH": str(copy)}, timeout=300)
  assert moved.stdout.strip() == "0.5"  # the copy's recipe did change
  ours, theirs = protocols(REPO), protocols(copy)
  assert len(ours) > 20 and ours == theirs


def test_the_levers_sweep_trains_what_the_retired_pilot_script_trained():
  """experiments/multi30k_levers's rows were compared once, key by key, with the commands of
  the retired multi30k_pilots.py (AVX2_RECIPES, *_2700); these are the settings they agreed on."""
  sweep = study.load_sweep("experiments/multi30k_levers")
  expected = {  # row: (dropout, lrate scale, label smoothing, pre_ln, extra train files)
      "base": (0.2, 0.7, 0.1, False, ""), "drop01_lr05": (0.1, 0.5, 0.1, False, ""),
      "ls02": (0.2, 0.7, 0.2, False, ""), "preln": (0.2, 0.7, 0.1, True, ""),
      "lr10": (0.2, 1.0, 0.1, False, ""), "lr05": (0.2, 0.5, 0.1, False, ""),
      "news_x6": (0.2, 0.7, 0.1, False, "wmt-news/train")}
  assert study.row_ids(sweep) == list(expected)
  for row, values in expected.items():
    c = resolve.resolve(sweep, row, "at2700").config
    assert (c.model.dropout_rate, c.train.learning_rate_scale, c.train.label_smoothing,
            c.model.pre_ln, c.data.extra_train_files) == values, row
    assert (c.train.num_steps, c.train.weight_decay, c.decode.alpha, c.model.d_model,
            c.train.checkpoint_every_steps, c.train.max_train_minutes) == (2700, 0.1, 0.6, 256, 90, 0.0)


def test_a_benchmark_setting_the_code_gained_later_at_its_default_is_no_drift(tmp_path):
  command = "python -m benchmarks --only=train --train=tiny:2x8 --steps=2 --warmup=1 --out=B"
  settings = provenance._benchmark_settings(command)  # pylint: disable=protected-access
  key = "train:tiny.decode.drop_finished"
  assert settings[key] is True  # the schema's default, which tiny.py leaves alone

  def check(name, recorded):
    _write(tmp_path / name, {"command": command, "settings": recorded})
    return provenance.check_result(str(tmp_path / name))

  older = check("older.json", {k: v for k, v in settings.items() if k != key})
  assert older.status == "ok", older.detail
  gone = check("gone.json", {k: v for k, v in settings.items() if k != "benchmark.steps"})
  assert gone.status == "drift" and "benchmark.steps: None recorded, 2 at HEAD" in gone.detail
