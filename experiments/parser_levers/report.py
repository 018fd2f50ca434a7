"""The report section of the parser levers: every row across the three folds, and its verdict.

Each fold (scale cv0..cv2, or cv0_2400.. at a longer step budget) scores a row on its own
held-back trees; this section reads every fold of the report's step budget (of each budget in a
report of another scale). A row's Δ on a fold is its bracket F1 less its reference row's there
(base, or for a row stacked on an adopted lever that lever's row: sweep.REFERENCE); the paired
bootstrap pools the folds' sentences (each tree scored by its own fold's run). The rule
(README.md): a lever is adopted when its Δ is positive on every fold and the pooled p < 0.05;
harmful when negative on every fold with p < 0.05; otherwise it stays as its reference. Base
and the adopted rows are also scored by sentence length, to show where a lever helps.
"""

from __future__ import annotations

import os

import nltk

from experiments.harness import records, study
from experiments.parser_levers.sweep import (CURVE, FOLD_STEPS, FOLDS, REFERENCE, budget_scale,
                                             fold_scale, fold_steps)
from transformer_jax.runtime import markdown
from transformer_jax.runtime.results import read_json
from transformer_jax.tasks.parsing import parseval

SIGNIFICANT = 0.05
# Sentence lengths in words (first, last; None: no limit) that the by-length table splits into.
LENGTHS = ((1, 10), (11, 20), (21, 30), (31, 40), (41, None))


def fold_results(sweep, folders=None,
                 steps: int = FOLD_STEPS[0]) -> list[tuple[dict, list[nltk.Tree]]]:
  """[({row: result of seed 0}, gold trees)] of each fold, from its result files (`folders`;
  default: the study's results folder of each fold at `steps`)."""
  out = []
  for fold in range(FOLDS):
    scale = fold_scale(fold, steps)
    folder = folders[fold] if folders else study.default_results_dir(sweep, scale)
    refs = read_json(os.path.join(folder, "references.json")) or {"references": []}
    results = {row: seeds[0] for row, seeds in records.load_results(folder).items() if 0 in seeds}
    out.append((results, [nltk.Tree.fromstring(t) for t in refs["references"]]))
  return out


def verdicts(sweep, folders=None, steps: int = FOLD_STEPS[0]) -> list[dict]:
  """Per row: F1 on each fold at `steps`, Δ against its reference row on each, their mean, the
  pooled paired bootstrap and the verdict ('adopt', 'harmful', 'as base' or 'pending')."""
  folds = fold_results(sweep, folders, steps)
  f1_of = lambda row: [f[0][row]["f1"] if row in f[0] else None for f in folds]  # noqa: E731
  rows = []
  for row in study.row_ids(sweep):
    against = REFERENCE.get(row, "base")
    f1, ref_f1 = f1_of(row), f1_of(against)
    entry = {"row": row, "label": sweep.rows[row].label, "group": sweep.rows[row].group,
             "against": against, "f1": f1, "delta": None, "mean_delta": None, "p_value": None,
             "verdict": "pending"}
    if None not in f1 and None not in ref_f1:
      entry["delta"] = [a - b for a, b in zip(f1, ref_f1)]
      entry["mean_delta"] = sum(entry["delta"]) / FOLDS
      if row == "base":
        entry["verdict"] = "base"
      else:
        golds, ref_trees, row_trees = [], [], []
        for results, gold in folds:
          golds += gold
          ref_trees += [nltk.Tree.fromstring(t) for t in results[against]["hypotheses"]]
          row_trees += [nltk.Tree.fromstring(t) for t in results[row]["hypotheses"]]
        entry["p_value"] = parseval.paired_bootstrap(golds, ref_trees, row_trees)["f1"]["p_value"]
        significant = entry["p_value"] < SIGNIFICANT
        entry["verdict"] = ("adopt" if significant and min(entry["delta"]) > 0 else
                            "harmful" if significant and max(entry["delta"]) < 0 else
                            f"as {against}")
    rows.append(entry)
  return rows


def by_length(sweep, table: list[dict], folders=None,
              steps: int = FOLD_STEPS[0]) -> list[dict]:
  """Base and each adopted row of `table` (verdicts' rows): bracket F1, precision and recall on
  the folds' held-back sentences pooled, per range of sentence length (LENGTHS)."""
  folds = fold_results(sweep, folders, steps)
  shown = [r for r in table if r["verdict"] in ("base", "adopt")]
  out = []
  for r in shown:
    buckets = {span: ([], []) for span in LENGTHS}
    for results, gold in folds:
      for g, h in zip(gold, results[r["row"]]["hypotheses"]):
        n = len(g.leaves())
        span = next(s for s in LENGTHS if s[0] <= n and (s[1] is None or n <= s[1]))
        buckets[span][0].append(g)
        buckets[span][1].append(nltk.Tree.fromstring(h))
    out.append({"row": r["row"], "label": r["label"], "lengths": [
        {"first": a, "last": b, "sentences": len(g), **{k: parseval.score_trees(g, h)[k]
                                                         for k in ("f1", "precision", "recall")}}
        for (a, b), (g, h) in buckets.items() if g]})
  return out


def learning_curve(sweep, steps: int) -> list[dict]:
  """Per row that ran at every share of the training files at `steps` (CURVE's scales and dev,
  the fixed dev split): its dev F1, precision, recall and perplexity at each share."""
  shares = [*[(share, budget_scale(f"dev{share}", steps)) for share, _ in CURVE],
            (100, budget_scale("dev", steps))]
  ran = [(share, records.load_results(study.default_results_dir(sweep, scale)))
         for share, scale in shares]
  out = []
  for row in study.row_ids(sweep):
    if all(0 in results.get(row, {}) for _, results in ran):
      out.append({"row": row, "label": sweep.rows[row].label, "points": [
          {"share": share, **{k: results[row][0][k]
                              for k in ("f1", "precision", "recall", "dev_ppl")}}
          for share, results in ran]})
  return out


def sections(sweep, rows: list[dict], scale_name: str) -> tuple[list[str], dict]:
  """(Markdown lines, JSON entries): the rows across the folds of this report's step budget,
  whichever fold it is; a report of another scale (dev, ...) shows every budget's."""
  del rows  # this scale's rows; the section reads every fold's
  steps = fold_steps(scale_name)
  lines, record = [], {}
  for budget in (steps,) if steps else FOLD_STEPS:
    table = verdicts(sweep, steps=budget)
    record[f"across_folds_{budget}"] = table
    lines += _section(sweep, table, budget)
    if None not in next(r for r in table if r["row"] == "base")["f1"]:
      lengths = by_length(sweep, table, steps=budget)
      record[f"by_length_{budget}"] = lengths
      lines += _length_section(lengths, budget)
    curve = [] if steps else learning_curve(sweep, budget)  # the dev scales' reports only
    if curve:
      record[f"learning_curve_{budget}"] = curve
      lines += _curve_section(curve, budget)
  return lines, record


def _curve_section(curve: list[dict], steps: int) -> list[str]:
  shares = [p["share"] for p in curve[0]["points"]]
  return ["", f"## Learning curve at {steps} steps", "",
          "Each row that ran on every share of the training files (wsj_0001 on, the same "
          "steps), scored on the fixed dev split: F1 (precision / recall), dev perplexity.",
          "",
          markdown.table(["row", *[f"{s}% of the files" for s in shares]], [
              [r["label"], *[f"{p['f1']:.2f} ({p['precision']:.2f} / {p['recall']:.2f}), "
                             f"PPL {p['dev_ppl']:.2f}" for p in r["points"]]] for r in curve])]


def _length_section(lengths: list[dict], steps: int) -> list[str]:
  spans = [(s["first"], s["last"], s["sentences"]) for s in lengths[0]["lengths"]]
  head = [f"{a}–{b} words ({n})" if b else f"{a}+ words ({n})" for a, b, n in spans]
  return ["", f"## Bracket F1 by sentence length at {steps} steps", "",
          "Base and each adopted row, on the three folds' held-back sentences pooled (how many in "
          "each range in brackets): F1 (precision / recall).",
          "",
          markdown.table(["row", *head], [
              [r["label"], *[f"{s['f1']:.1f} ({s['precision']:.1f} / {s['recall']:.1f})"
                             for s in r["lengths"]]] for r in lengths])]


def _section(sweep, table: list[dict], steps: int) -> list[str]:
  base = next(r for r in table if r["row"] == "base")
  fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
  spread = ("" if None in base["f1"] else
            f" Base's F1 ranges {min(base['f1']):.2f}–{max(base['f1']):.2f} over the folds.")
  scales = ", ".join(fold_scale(f, steps) for f in range(FOLDS))
  return ["", f"## Across the folds at {steps} steps", "",
          f"Bracket F1 on each fold's held-back trees (scales {scales}; constrained search, the "
          f"first {sweep.scales[fold_scale(0, steps)].bleu_sentences} of each), Δ against the "
          f"row's reference (base, or the adopted lever it is stacked on) on the same fold, their "
          f"mean, and p: the paired bootstrap of the row against its reference over the folds' "
          f"sentences pooled. Verdict: adopt = Δ > 0 on every fold and p < {SIGNIFICANT:g}; "
          f"harmful = Δ < 0 on every fold and p < {SIGNIFICANT:g}; as its reference "
          "otherwise." + spread,
          "",
          markdown.table(
              ["row", "group", "against", *[f"F1 fold {i}" for i in range(FOLDS)],
               *[f"Δ fold {i}" for i in range(FOLDS)], "mean Δ", "p", "verdict"],
              [[r["label"], r["group"], r["against"], *[fmt(v, ".2f") for v in r["f1"]],
                *([fmt(v, "+.2f") for v in r["delta"]] if r["delta"] else [""] * FOLDS),
                fmt(r["mean_delta"], "+.2f"), fmt(r["p_value"], ".3f"), r["verdict"]]
               for r in table])]
