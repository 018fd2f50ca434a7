"""The Multi30k recipe pilot's commands and summary (experiments/multi30k_recipe.py), and the
cool-down branches of the hour's run (experiments/multi30k_cooldown.py)."""

import json
import shlex

import pytest

from experiments import multi30k_cooldown, multi30k_pilots, multi30k_recipe
from transformer_jax import branch, config as config_lib, overrides


@pytest.mark.parametrize("pilot_name", ["recipe", "room", "avx2"])  # the pilots that run one at a time
def test_every_recipe_command_is_a_valid_training_command(pilot_name):
  pilot = multi30k_pilots.PILOTS[pilot_name]
  for name, (_, changes) in pilot.recipes.items():
    argv = shlex.split(multi30k_recipe.command(name, "runs/m30k", pilot_name))
    assert argv[:4] == ["python", "-m", "transformer_jax.main", "--config=configs/multi30k.py"]
    assert f"--workdir=runs/m30k/{name}" in argv
    given, _ = overrides.split_override_args(argv)
    parsed = overrides.parse_overrides(given)  # keys and values checked against the schema
    c = overrides.apply_overrides(overrides.load_config_file("configs/multi30k.py"), parsed)
    config_lib.validate(c)
    minutes = changes.get("train.max_train_minutes", pilot.minutes)
    assert c.train.max_train_minutes == minutes
    if not minutes:  # compared at equal steps instead: it must say how many
      assert "train.num_steps" in changes, name
    for key, value in changes.items():  # each recipe states its batch and rate explicitly
      assert _key(c, key) == value


@pytest.mark.parametrize("pilot_name", sorted(multi30k_pilots.PILOTS))
def test_every_pilot_command_states_the_settings_the_recipe_changed_since(pilot_name):
  """configs/multi30k.py's rate, weight decay and alpha changed after pilots ran: their commands
  must state the values they trained with, or rerunning one would train the new recipe."""
  for name in multi30k_pilots.PILOTS[pilot_name].recipes:
    cmd = multi30k_recipe.command(name, "runs", pilot_name)
    for key in (*multi30k_pilots.BEFORE_WD, *multi30k_pilots.BEFORE_ALPHA):
      assert f"--config.{key}=" in cmd, (pilot_name, name, key)


def _metrics(path, rows):
  with open(path / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def test_summary_compares_at_equal_minutes(tmp_path):
  start = 1000.0
  for name, s_per_step in (("P0", 2.0), ("P1", 1.0)):
    (tmp_path / name).mkdir()
    rows = []
    for step in range(50, 401, 50):
      t = start + step * s_per_step
      rows.append({"step": step, "split": "train", "time": t, "step_time": s_per_step, "perplexity": 50.0})
      if step % 100 == 0:
        rows.append({"step": step, "split": "dev", "time": t + 1, "perplexity": 1000.0 / step})
    _metrics(tmp_path / name, rows)
  data = multi30k_recipe.summarize(str(tmp_path))
  assert set(data) == {"P0", "P1"}  # recipes without a run are left out
  # P0 (2 s/step) has evaluated step 100 by minute 4 (200 s after start + 1 s); P1 step 200.
  assert data["P0"]["dev_at"]["4"]["perplexity"] == 10.0
  assert data["P1"]["dev_at"]["4"]["perplexity"] == 5.0
  assert data["P1"]["dev_end"]["perplexity"] == 2.5 and data["P0"]["steps"] == 400
  assert data["P0"]["dev_at_step"]["perplexity"] == data["P1"]["dev_at_step"]["perplexity"] == 2.5
  assert data["P0"]["s_per_step"] == 2.0
  files = multi30k_recipe.write(str(tmp_path), str(tmp_path))
  text = open(files[0]).read()
  assert "| P1 | half the batch" in text and "P2" not in text.split("Commands:")[0]
  assert "P0 1970-01-01 00:16 to 1970-01-01 00:30" in text  # when each run trained, from its log


def _key(config, key):
  for part in key.split("."):
    config = config[part]
  return config


@pytest.mark.parametrize("name", ["batch", "vocab", "bf16", "ensemble"])
def test_the_hour_pilots_run_together_on_separate_cores(name):
  pilot = multi30k_pilots.PILOTS[name]
  cores = []
  for recipe, (_, changes) in pilot.recipes.items():
    argv = shlex.split(multi30k_recipe.command(recipe, "runs/pair", name))
    if recipe in pilot.cores:
      assert argv[0] == multi30k_recipe.ONE_CORE and argv[1:3] == ["taskset", "-c"]
      cores.append(argv[3])
      argv = argv[4:]
    else:  # the ensemble pilot's one-model hour: both cores, by itself
      assert name == "ensemble" and argv[0] == "python"
    given, _ = overrides.split_override_args(argv)
    c = overrides.apply_overrides(overrides.load_config_file("configs/multi30k.py"),
                                  overrides.parse_overrides(given))
    config_lib.validate(c)
    for key, value in changes.items():
      assert _key(c, key) == value
    assert c.train.max_train_minutes == pilot.minutes  # the pilots run together: all for the hour
  assert len(set(cores)) == len(cores) == 2  # each on its own core


def test_the_vocab_pilot_compares_the_dev_split_in_nats(tmp_path):
  """Per-token perplexities of two vocabularies do not compare: the table shows nll x pieces."""
  for name, nll, tokens in (("v8000", 1.70, 16541), ("v12000", 1.80, 15000)):
    (tmp_path / name).mkdir()
    _metrics(tmp_path / name,
             [{"step": s, "split": "train", "time": 1000.0 + s, "step_time": 1.0, "perplexity": 9.0}
              for s in range(50, 2001, 50)]
             + [{"step": 2000, "split": "dev", "time": 3001.0, "nll": nll, "tokens": tokens,
                 "perplexity": 2.718281828 ** nll}])
  data = multi30k_recipe.summarize(str(tmp_path), "vocab")
  assert data["v8000"]["dev_end"]["nats"] == pytest.approx(1.70 * 16541)
  text = open(multi30k_recipe.write(str(tmp_path), str(tmp_path), "vocab")[0]).read()
  assert "dev NLL of the split (nats) at the end" in text and "dev PPL" not in text
  assert "| 28120 |" in text and "| 27000 |" in text  # 1.70 x 16541, 1.80 x 15000, whole nats


def test_the_batch_pilot_reads_dev_bleu_per_average(tmp_path):
  for name, decoded in (("b1024", (("", 38.5), ("_avg3", 40.1), ("_beam8_alpha1.0", 99.0))),
                        ("b2048", (("", 37.25),))):
    run = tmp_path / name
    run.mkdir()
    _metrics(run, [{"step": s, "split": "train", "time": 1000.0 + s, "step_time": 1.0,
                    "perplexity": 9.0} for s in range(50, 2001, 50)]
             + [{"step": 2000, "split": "dev", "time": 3001.0, "perplexity": 6.0}])
    (run / "eval").mkdir()
    for suffix, score in decoded:
      (run / "eval" / f"validation_step2000{suffix}.json").write_text(json.dumps({"sacrebleu": score}))
  data = multi30k_recipe.summarize(str(tmp_path), "batch")
  assert set(data) == {"b1024", "b2048"}
  assert data["b1024"]["dev_bleu_by_average"] == {"1": 38.5, "3": 40.1}  # other decode settings: not read
  text = open(multi30k_recipe.write(str(tmp_path), str(tmp_path), "batch")[0]).read()
  assert "dev sacreBLEU, avg 3" in text and "40.1" in text and "run together" in text
  b2048 = next(line for line in text.splitlines() if line.startswith("| b2048 |"))
  assert b2048.endswith("| 37.25 | not decoded |")  # an average another run has, this one lacks


def test_the_ensemble_pilot_adds_the_ensembles_dev_bleu(tmp_path):
  """The two runs' rows, and one for their ensemble read from the reports that its printed
  evaluation command writes (file names tagged with the other member, evaluate.ensemble_tag)."""
  from transformer_jax import evaluate, files  # pylint: disable=g-import-not-at-top
  for name in ("s0", "s1"):
    run = tmp_path / name
    (run / "eval").mkdir(parents=True)
    _metrics(run, [{"step": s, "split": "train", "time": 1000.0 + s, "step_time": 1.0,
                    "perplexity": 9.0} for s in range(50, 1501, 50)]
             + [{"step": 1500, "split": "dev", "time": 2501.0, "perplexity": 7.0}])
    (run / "eval" / "validation_step1500_avg3.json").write_text(json.dumps({"sacrebleu": 36.0}))
  tag = evaluate.ensemble_tag([files.resolve(str(tmp_path / "s1"))])
  (tmp_path / "s0" / "eval" / f"validation_step1500_avg3{tag}.json").write_text(
      json.dumps({"sacrebleu": 37.5}))
  (tmp_path / "s0" / "eval" / f"validation_step1500{tag}.json").write_text(
      json.dumps({"sacrebleu": 37.0, "perplexity": 6.5}))
  data = multi30k_recipe.summarize(str(tmp_path), "ensemble")
  assert data["s0"]["dev_bleu_by_average"] == data["s1"]["dev_bleu_by_average"] == {"3": 36.0}
  assert data["s0 + s1"]["dev_bleu_by_average"] == {"1": 37.0, "3": 37.5}
  assert data["s0 + s1"]["dev_end"]["perplexity"] == 6.5  # the last checkpoints' ensemble
  argv = shlex.split(data["s0 + s1"]["command"])
  assert f"--workdir={tmp_path / 's0'}" in argv and f"--ensemble={tmp_path / 's1'}" in argv
  text = open(multi30k_recipe.write(str(tmp_path), str(tmp_path), "ensemble")[0]).read()
  row = next(line for line in text.splitlines() if line.startswith("| s0 + s1 |"))
  assert row.endswith("| 6.50 |  | 37.00 | 37.50 |")
  assert "--ensemble=" not in text.split("The ensemble's dev evaluation")[0]  # not a training run
  assert "Commands (run together):" in text  # s0 and s1 (no run of `alone` here)
  (tmp_path / "s1" / "metrics.jsonl").unlink()  # a member missing: no ensemble row
  assert set(multi30k_recipe.summarize(str(tmp_path), "ensemble")) == {"s0"}


def test_rows_of_runs_not_here_are_carried_from_the_last_summary(tmp_path):
  """A pilot's hours run in different sessions: a recipe whose workdir is gone keeps its row from
  the summary already written (its words and command as the recipe now reads), a run that is
  here is read from its workdir, and the page names the carried rows."""
  runs, out = tmp_path / "runs", tmp_path / "out"
  out.mkdir()
  old = {"f32": {"changes": "old words", "command": "stale", "steps": 3773, "s_per_step": 0.93,
                 "trained": ["2026-11-25 23:14", "2026-11-26 00:14"],
                 "dev_at": {"15": None, "30": None, "45": None}, "dev_end": {"perplexity": 5.82},
                 "dev_at_step": {"perplexity": 7.66}, "dev_bleu_by_average": {"3": 39.3},
                 "dev_curve": [{"minutes": 60.0, "step": 3773, "perplexity": 5.82, "nats": None}]},
         "wd02": {"changes": "replaced by the run that is here", "steps": 1}}
  (out / "multi30k_avx2.json").write_text(json.dumps(old))
  (runs / "wd02").mkdir(parents=True)
  _metrics(runs / "wd02", [{"step": s, "split": "train", "time": 1000.0 + s, "step_time": 1.0,
                            "perplexity": 9.0} for s in range(50, 2001, 50)]
           + [{"step": 2000, "split": "dev", "time": 3001.0, "perplexity": 6.0}])
  data = multi30k_recipe.summarize(str(runs), "avx2", old)
  assert list(data) == ["f32", "wd02"]  # the recipes' order; drop01 and wd01 are in neither
  assert data["f32"]["carried"] and data["f32"]["dev_bleu_by_average"] == {"3": 39.3}
  assert "--config.train.weight_decay=0.0" in data["f32"]["command"]
  assert data["wd02"]["steps"] == 2000 and "carried" not in data["wd02"]
  text = open(multi30k_recipe.write(str(runs), str(out), "avx2")[0]).read()
  assert f"(their workdirs were not in `{runs}`): f32." in text
  assert "| f32 | the documented recipe before weight decay" in text and "old words" not in text
  assert "| 3773 |" in text and "| 39.30 |" in text
  assert json.loads((out / "multi30k_avx2.json").read_text())["wd02"]["steps"] == 2000


def test_cooldown_branch_continues_the_same_run(tmp_path):
  """Each cool-down is a branch of the hour's run (--branch_from, whose copying and checks
  test_train_reliability runs) at its start, in SOURCE_cooldown<start>, to the hour's steps with
  the cool-down over the rest and no wall-time limit."""
  workdir, cmd = multi30k_cooldown.branch_command(str(tmp_path / "hour"), 3000, 4000)
  assert workdir == str(tmp_path / "hour_cooldown3000")
  assert cmd[1:4] == ["-m", "transformer_jax.main", f"--workdir={workdir}"]
  assert f"--branch_from={tmp_path / 'hour'}" in cmd and "--step=3000" in cmd
  given, rest = overrides.split_override_args(cmd)
  assert not [a for a in rest if a.startswith("--config")]
  changed = overrides.parse_overrides(given)
  assert set(changed) <= branch.MAY_CHANGE  # what a branch accepts
  c = overrides.apply_overrides(overrides.load_config_file("configs/multi30k.py"), changed)
  config_lib.validate(c)
  assert (c.train.num_steps, c.train.cooldown_steps, c.train.max_train_minutes) == (4000, 1000, 0.0)
