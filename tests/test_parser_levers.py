"""experiments/parser_levers: its folds partition the training files at every step budget, each
row changes only its own settings, and its verdict needs every fold and the pooled bootstrap."""

import os

import nltk

from experiments.harness import resolve, study
from tests.common import REPO
from transformer_jax.tasks.parsing import parseval


def test_the_parser_levers_sweep_folds_partition_the_training_files():
  """experiments/parser_levers: three folds of wsj_0001-wsj_0159, each held back once and never
  trained on in its own fold; every row changes only its own settings; dev is never a fold."""
  from experiments.parser_levers import sweep as levers
  sweep = study.load_sweep(os.path.join(REPO, "experiments", "parser_levers"))
  files = lambda spec: {n for part in spec.split(",") for a, b in [part.split("-")]  # noqa: E731
                        for n in range(int(a[4:]), int(b[4:]) + 1)}
  held = []
  for fold in range(levers.FOLDS):
    cfg = resolve.resolve(sweep, "base", f"cv{fold}").config
    train, evaluated = files(cfg.data.train_files), files(cfg.data.eval_files)
    assert not train & evaluated and train | evaluated == set(range(1, 160))
    assert cfg.decode.parse_constraint and cfg.train.num_steps == 1200
    held.append(evaluated)
  assert set().union(*held) == set(range(1, 160)) and sum(map(len, held)) == 159
  for fold in range(levers.FOLDS):  # a longer budget: the same folds, only the steps differ
    for steps in levers.FOLD_STEPS:
      name = levers.fold_scale(fold, steps)
      assert levers.fold_steps(name) == steps
      cfg = resolve.resolve(sweep, "base", name).config
      assert cfg.train.num_steps == steps and files(cfg.data.eval_files) == held[fold]
  assert levers.fold_steps("dev") is None and levers.fold_steps("dev25") is None
  dev = resolve.resolve(sweep, "base", "dev").config
  assert dev.data.eval_files == "wsj_0160-wsj_0179" and files(dev.data.train_files) == set(range(1, 160))
  assert files(resolve.resolve(sweep, "base", "dev25").config.data.train_files) == set(range(1, 41))
  for steps in levers.FOLD_STEPS:  # the dev split and the learning curve at every budget
    for name, last in (("dev", 159), ("dev25", 40), ("dev50", 80)):
      cfg = resolve.resolve(sweep, "base", levers.budget_scale(name, steps)).config
      assert cfg.train.num_steps == steps and cfg.data.eval_files == "wsj_0160-wsj_0179"
      assert files(cfg.data.train_files) == set(range(1, last + 1))
  base = resolve.resolve(sweep, "base", "cv0").config.to_dict()
  flat = lambda d, p="": {k2: v2 for k, v in d.items() for k2, v2 in (  # noqa: E731
      flat(v, p + k + ".").items() if isinstance(v, dict) else [(p + k, v)])}
  for row in study.row_ids(sweep):
    run = resolve.resolve(sweep, row, "cv0")
    changed = {k for k, v in flat(run.config.to_dict()).items() if flat(base)[k] != v}
    assert changed == {o.split("=")[0][len("--config."):] for o in run.overrides
                       if "_files=" not in o}
    assert (row == "base") == (not changed)




def test_the_parser_levers_verdict_needs_every_fold_and_the_pooled_bootstrap(tmp_path, monkeypatch):
  """experiments/parser_levers/report.py: a row better on every fold with p < 0.05 is adopted,
  one better on two folds only stays as base, one missing a fold is pending; a row stacked on
  another is judged against that row, not base."""
  from experiments.parser_levers import report as levers_report
  monkeypatch.setitem(levers_report.REFERENCE, "ls0", "lr10")
  monkeypatch.setitem(levers_report.REFERENCE, "drop02", "lr10")
  from transformer_jax.runtime.results import write_json
  sweep = study.load_sweep(os.path.join(REPO, "experiments", "parser_levers"))
  gold = "(TOP (S (NP (XX a) (XX b)) (VP (XX c) (NP (XX d) (XX e)))))"
  flat = "(TOP (S (XX a) (XX b) (XX c) (XX d) (XX e)))"
  folders = []
  for fold in range(3):
    folder = tmp_path / f"cv{fold}"
    folder.mkdir()
    write_json(str(folder / "references.json"), {"references": [gold] * 40})
    rows = {"base": [flat] * 20 + [gold] * 20, "lr10": [gold] * 40,
            "drop03": [gold] * 40 if fold < 2 else [flat] * 40,
            "ls0": [flat] * 30 + [gold] * 10, "drop02": [gold] * 40}
    if fold < 2:
      rows["wd0"] = [gold] * 40
    for row, trees in rows.items():
      f1 = parseval.score_trees([nltk.Tree.fromstring(gold)] * 40,
                                [nltk.Tree.fromstring(t) for t in trees])["f1"]
      write_json(str(folder / f"{row}_seed0.json"), {"row": row, "seed": 0, "f1": f1,
                                                     "hypotheses": trees})
    folders.append(str(folder))
  table = {r["row"]: r for r in levers_report.verdicts(sweep, folders)}
  assert table["base"]["verdict"] == "base" and table["base"]["mean_delta"] == 0
  assert table["lr10"]["verdict"] == "adopt" and table["lr10"]["p_value"] < 0.05
  assert min(table["lr10"]["delta"]) > 0
  assert table["drop03"]["verdict"] == "as base" and table["drop03"]["delta"][2] < 0
  assert table["wd0"]["verdict"] == "pending" and table["wd0"]["f1"][2] is None
  # Stacked on lr10: worse than lr10 on every fold (though better than base on none either way).
  assert table["ls0"]["against"] == "lr10" and table["ls0"]["verdict"] == "harmful"
  assert table["ls0"]["delta"] == [a - b for a, b in zip(table["ls0"]["f1"], table["lr10"]["f1"])]
  assert table["drop02"]["verdict"] == "as lr10" and table["drop02"]["delta"] == [0.0] * 3
  assert table["lr10"]["against"] == "base"
  lengths = {r["row"]: r["lengths"] for r in levers_report.by_length(sweep, list(table.values()),
                                                                      folders)}
  assert set(lengths) == {"base", "lr10"}  # base and the adopted rows only
  assert [(s["first"], s["last"], s["sentences"]) for s in lengths["lr10"]] == [(1, 10, 120)]
  assert lengths["lr10"][0]["f1"] == 100 and lengths["base"][0]["f1"] == table["base"]["f1"][0]


def test_the_learning_curve_shows_rows_that_ran_at_every_share(tmp_path, monkeypatch):
  """report.learning_curve: a row with a result at 25%, 50% and 100% of the files is a curve,
  in that order, at its own step budget; a row missing a share is left out."""
  from experiments.parser_levers import report as levers_report
  from experiments.parser_levers.sweep import budget_scale
  from transformer_jax.runtime.results import write_json
  sweep = study.load_sweep(os.path.join(REPO, "experiments", "parser_levers"))
  monkeypatch.setattr(levers_report.study, "default_results_dir",
                      lambda sweep, scale: str(tmp_path / scale))
  for i, name in enumerate(("dev25", "dev50", "dev")):
    for row in ("base", "lr10") if name != "dev50" else ("base",):
      folder = tmp_path / budget_scale(name, 2400)
      folder.mkdir(exist_ok=True)
      write_json(str(folder / f"{row}_seed0.json"), {
          "row": row, "seed": 0, "f1": 10.0 * (i + 1), "precision": 1.0, "recall": 2.0,
          "dev_ppl": 3.0 - i})
  curve = levers_report.learning_curve(sweep, 2400)
  assert [r["row"] for r in curve] == ["base"] and not levers_report.learning_curve(sweep, 1200)
  assert [(p["share"], p["f1"], p["dev_ppl"]) for p in curve[0]["points"]] == [
      (25, 10.0, 3.0), (50, 20.0, 2.0), (100, 30.0, 1.0)]
  lines, record = levers_report.sections(sweep, [], "dev_2400")
  assert "## Learning curve at 2400 steps" in lines and "learning_curve_2400" in record
