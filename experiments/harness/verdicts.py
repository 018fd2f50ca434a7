"""How a sweep's row is judged against the paper's: its direction, the seed noise, the verdict.

The rules (the report, experiments/harness/report.py, prints them beside each row):
- the paper's direction for a row: the sign of its change against base when that is clear
  (|ΔPPL| >= PPL_CLEAR, |ΔBLEU| >= BLEU_CLEAR), '=' otherwise;
- the verdict (`verdict`): with noise = the larger of the row's and base's ranges over seeds, ✓
  when |ours - base| > noise in the paper's direction, ✗ when beyond the noise the other way (or
  when the paper's row is '=' and ours moved), '=' within the noise ('= ✓' for a '=' row);
- the paired bootstrap p-value of the row's BLEU against base's (sacreBLEU), pooled over seeds:
  the translations of every seed both ran, concatenated, row seed k paired with base seed k;
- convergence: the row's dev perplexity relative to base's halfway through training and at the
  end (`gap`: a gap that is still closing says the ordering could change with a longer run), and
  the PPL verdict at two thirds of training (each run's evaluation nearest 2/3 of its steps): a
  verdict that differs there from the end's is still moving.
`summarize` turns a sweep's result files into one dict per row with all of these.
"""

from __future__ import annotations

import functools
import math
import statistics

import numpy as np

from experiments.harness import resolve, study
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.tasks.parsing.treebank import nltk  # loaded at the first tree (treebank.py)

PPL_CLEAR = 0.2    # |ΔPPL| of the paper at or above which a row's direction is clear
BLEU_CLEAR = 0.3   # the same for ΔBLEU
SIGNIFICANT = 0.05  # the paired bootstrap's level, for the report's second reading of BLEU


def expectation(paper_row, paper_base, clear: float):
  """The paper's direction for a row: '+' or '-' when |change| >= clear, '=' below; None without
  values. (Compared at the paper's printed precision: 5.12 - 4.92 is a change of 0.20.)"""
  if paper_row is None or paper_base is None:
    return None
  delta = round(paper_row - paper_base, 6)
  if abs(delta) < clear - 1e-9:
    return "="
  return "+" if delta > 0 else "-"


def paper_unchanged(sweep) -> list[str]:
  """Rows the paper shows as unchanged: PPL and BLEU within one unit of the last printed digit
  of base's (0.01 and 0.1)."""
  base = sweep.rows["base"].paper
  return [r for r in study.row_ids(sweep) if r != "base" and sweep.rows[r].paper is not None
          and None not in (sweep.rows[r].paper.ppl, sweep.rows[r].paper.bleu)
          and abs(round(sweep.rows[r].paper.ppl - base.ppl, 6)) <= 0.01
          and abs(round(sweep.rows[r].paper.bleu - base.bleu, 6)) <= 0.1]


def spread(values: list[float | None]) -> dict:
  """Mean, min, max and count of the values a run has (a parser's runs have no BLEU: None)."""
  values = [v for v in values if v is not None]
  return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
          "n": len(values)} if values else {"mean": None, "min": None, "max": None, "n": 0}


def verdict(expected, row_values: list[float], base_values: list[float]) -> dict:
  """A row against base on one metric: the difference of the means, the noise (the larger of the
  two ranges over seeds) and the verdict ('✓', '✗', '=', '= ✓', or '' without values or
  expectation); see the module docstring."""
  row_values = [v for v in row_values if v is not None]
  base_values = [v for v in base_values if v is not None]
  if not row_values or not base_values:
    return {"delta": None, "noise": None, "verdict": ""}
  delta = statistics.fmean(row_values) - statistics.fmean(base_values)
  noise = max(max(row_values) - min(row_values), max(base_values) - min(base_values))
  beyond = abs(delta) > noise
  if expected is None:
    mark = ""
  elif expected == "=":
    mark = "✗" if beyond else "= ✓"
  elif beyond:
    mark = "✓" if (delta > 0) == (expected == "+") else "✗"
  else:
    mark = "="
  return {"delta": delta, "noise": noise, "verdict": mark}


def p_value(base: dict[int, dict], row: dict[int, dict], references: list[str]):
  """Paired bootstrap p-value of a row's sacreBLEU (a parser's: bracket F1) against base's,
  pooled over the seeds both ran (`base`, `row`: seed -> result): each seed's outputs for the
  same dev sentences, concatenated, row seed k against base seed k; None without a seed in
  common."""
  from transformer_jax.tasks.translation import bleu  # pylint: disable=g-import-not-at-top
  from transformer_jax.tasks.parsing import parseval
  seeds = sorted(set(base) & set(row))
  if not references or not seeds or any(
      len(r[s]["hypotheses"]) != len(references) for r in (base, row) for s in seeds):
    return None
  pooled = lambda runs: [h for s in seeds for h in runs[s]["hypotheses"]]  # noqa: E731
  if "f1" in base[seeds[0]]:  # a parser's: its outputs and references are trees
    trees = lambda lines: [nltk.Tree.fromstring(t) for t in lines]  # noqa: E731
    return parseval.paired_bootstrap(trees(references * len(seeds)), trees(pooled(base)),
                                     trees(pooled(row)))["f1"]["p_value"]
  return bleu.paired_bootstrap(pooled(base), pooled(row), references * len(seeds))["bleu"]["p_value"]


@functools.lru_cache(maxsize=None)
def paper_params(spec: str) -> dict[str, int]:
  """{row: its exact parameter count at the paper's scale} for the sweep file `spec`."""
  return {p["row"]: p["params"] for p in paper_params_table(study.load_sweep(spec))}


def paper_params_table(sweep) -> list[dict]:
  """Exact parameter counts of the rows at the paper's scale (vocab 37000), beside the paper's."""
  if "paper" not in sweep.scales:
    raise ConfigError(f"the sweep '{sweep.name}' has no 'paper' scale to count its rows at (its "
                      f"scales: {', '.join(sweep.scales.keys())})")
  from transformer_jax.tools.params import count_params  # pylint: disable=g-import-not-at-top
  table = []
  for r in study.row_ids(sweep):
    res = resolve.resolve(sweep, r, "paper")
    paper = sweep.rows[r].paper
    table.append({"row": r, "label": res.label,
                  "params": count_params(ModelConfig.from_config(res.config.model)),
                  "paper_params_m": paper.params_m if paper is not None else None})
  return table


def summarize(sweep, results: dict, planned: dict[str, list[int]], references, states=None,
              paper_params=None) -> list[dict]:
  """One dict per row of the sweep: the paper's values, ours over seeds, verdicts, cost."""
  states, paper_params = states or {}, paper_params or {}
  ids = study.row_ids(sweep)
  base_paper = sweep.rows["base"].paper if "base" in sweep.rows else None
  unchanged = set(paper_unchanged(sweep)) if base_paper is not None else set()
  out = []
  for r in ids:
    runs = results.get(r, {})
    seeds = sorted(runs)
    paper = sweep.rows[r].paper
    cpus = {runs[s]["machine"]["cpu"] for s in seeds}
    row = {"row": r, "label": sweep.rows[r].label, "group": sweep.rows[r].group,
           "paper_ppl": paper.ppl if paper else None, "paper_bleu": paper.bleu if paper else None,
           "paper_params_m": paper.params_m if paper else None,
           "paper_scale_params": paper_params.get(r), "paper_unchanged": r in unchanged,
           "planned_seeds": planned.get(r, []), "seeds": seeds,
           "complete": bool(seeds) and set(planned.get(r, [])) <= set(seeds),
           "ppl": spread([runs[s]["dev_ppl"] for s in seeds]),
           "bleu": spread([runs[s]["bleu_tokenized"] for s in seeds]),
           "sacrebleu": spread([runs[s]["bleu"] for s in seeds]),
           "f1": spread([runs[s].get("f1") for s in seeds]),  # a parser's bracket F1
           "last_quarter": spread([runs[s]["last_quarter"]["relative_change"] for s in seeds
                                   if runs[s].get("last_quarter")]),
           "train_minutes": sum(runs[s]["train_minutes"] for s in seeds),
           "eval_minutes": sum(runs[s]["eval_minutes"] for s in seeds),
           # a step time compares only on one CPU: no mean over seeds that ran on several
           "step_cpus": len(cpus),
           "step_seconds": None if len(cpus) > 1 else spread(
               [runs[s]["step_seconds"] for s in seeds if runs[s].get("step_seconds")])["mean"],
           "params": runs[seeds[0]]["params"] if seeds else None,
           "hparams": runs[seeds[0]]["hparams"] if seeds else {},
           "problems": [f"seed {s}: {st['status']}: {st['error']}" for (rr, s), st in
                        sorted(states.items()) if rr == r and s not in runs
                        and st.get("status") != "done"]}
    row["status"] = ("done" if row["complete"] else
                     "failed" if any(": failed:" in p for p in row["problems"]) else
                     "partial" if seeds else "pending")
    out.append(row)
  base = next((x for x in out if x["row"] == "base"), None)
  base_curve = mean_curve(results.get("base", {}))
  if base is not None:
    base["forecast"] = convergence_forecast(base_curve)
  for row in out:
    compared = base is not None and row is not base
    row["gap_to_base"] = gap(mean_curve(results.get(row["row"], {})), base_curve) if compared else None
    for key, clear, metric in (("ppl", PPL_CLEAR, "dev_ppl"), ("bleu", BLEU_CLEAR, "bleu_tokenized")):
      expected = expectation(row[f"paper_{key}"], base[f"paper_{key}"], clear) if compared else None
      v = verdict(expected, [results[row["row"]][s][metric] for s in row["seeds"]],
                  [results["base"][s][metric] for s in base["seeds"]]) if compared else {}
      judged = compared and row["complete"] and base["complete"]
      row.update({f"{key}_expected": expected, f"{key}_delta": v.get("delta"),
                  f"{key}_noise": v.get("noise"),
                  f"{key}_verdict": v["verdict"] if judged else ("pending" if expected else "")})
    two_thirds = lambda r: [ppl_at(results[r][s], TWO_THIRDS) for s in results.get(r, {})]  # noqa: E731
    if compared and row["ppl_expected"] and row["ppl_verdict"] not in ("", "pending"):
      early = verdict(row["ppl_expected"], [v for v in two_thirds(row["row"]) if v],
                      [v for v in two_thirds("base") if v])["verdict"]
      row["ppl_verdict_two_thirds"] = early or None
    else:
      row["ppl_verdict_two_thirds"] = None
    # BLEU at two thirds: measured only where the scale keeps that checkpoint (score_two_thirds)
    early_bleu = lambda r: [(results[r][s].get("two_thirds") or {}).get("bleu_tokenized")  # noqa: E731
                            for s in results.get(r, {})]
    row["bleu_verdict_two_thirds"] = (verdict(
        row["bleu_expected"], early_bleu(row["row"]), early_bleu("base"))["verdict"] or None
        if compared and row["bleu_expected"] and row["bleu_verdict"] not in ("", "pending")
        and None not in early_bleu(row["row"]) + early_bleu("base") else None)
    row["p_value"] = (p_value({s: results["base"][s] for s in base["seeds"]},
                              {s: results[row["row"]][s] for s in row["seeds"]}, references)
                      if compared else None)
  return out


TWO_THIRDS = 2 / 3


def ppl_at(result: dict, fraction: float) -> float | None:
  """A run's dev perplexity at its evaluation nearest `fraction` of its last evaluated step."""
  curve = [(int(step), ppl) for step, ppl in result.get("dev_ppl_curve") or []]
  if len(curve) < 2:
    return None
  target = fraction * curve[-1][0]
  return min(curve, key=lambda point: abs(point[0] - target))[1]


def mean_curve(runs: dict) -> dict[int, float]:
  """Dev perplexity by step, mean over the seeds (steps every seed evaluated)."""
  curves = [dict((int(step), ppl) for step, ppl in res.get("dev_ppl_curve") or []) for res in runs.values()]
  steps = set.intersection(*(set(c) for c in curves)) if curves else set()
  return {s: statistics.fmean(c[s] for c in curves) for s in sorted(steps)}


CONVERGED = 0.03  # the bar: dev PPL changes less than this over the last quarter of training


def convergence_forecast(curve: dict[int, float], bar: float = CONVERGED) -> dict | None:
  """Where a dev PPL curve would meet the bar: log PPL = a + b t^-c fitted (least squares) to its
  evaluations from 30% of training on, then the first step N (a multiple of the curve's
  evaluation interval, up to 20x its length) whose fitted change over the last quarter, from
  0.75 N to N, is under `bar`: {'fit': (a, b, c), 'steps': N, 'ppl': fitted PPL at N,
  'at_2x': (PPL, last-quarter change) at twice the curve's steps}; None when the fit fails."""
  points = sorted((s, p) for s, p in curve.items() if s >= 0.3 * max(curve, default=0))
  if len(points) < 4:
    return None
  from scipy import optimize  # pylint: disable=g-import-not-at-top  (0.7 s, for fits only)
  t, y = (np.array(v, dtype=np.float64) for v in zip(*points))
  f = lambda x, a, b, c: a + b * np.power(x, -c)  # noqa: E731
  try:
    (a, b, c), _ = optimize.curve_fit(f, t, np.log(y), p0=(math.log(y[-1]) - 0.5, 10.0, 0.5),
                                      maxfev=20000)
  except (RuntimeError, ValueError):
    return None
  ppl = lambda n: float(np.exp(f(n, a, b, c)))  # noqa: E731
  change = lambda n: ppl(n) / ppl(0.75 * n) - 1  # noqa: E731
  every, end = int(t[1] - t[0]), int(t[-1])
  steps = next((n for n in range(every, 20 * end + 1, every) if n >= end and -bar < change(n)),
               None)
  return {"fit": (float(a), float(b), float(c)), "steps": steps,
          "ppl": ppl(steps) if steps else None, "at_2x": (ppl(2 * end), change(2 * end))}


def gap(row_curve: dict[int, float], base_curve: dict[int, float]) -> dict | None:
  """The row's mean dev PPL relative to base's (row / base - 1) at the evaluation nearest half
  of training and at the last one both have."""
  steps = sorted(set(row_curve) & set(base_curve))
  if len(steps) < 2:
    return None
  half = min(steps, key=lambda s: abs(s - steps[-1] / 2))
  rel = {s: row_curve[s] / base_curve[s] - 1 for s in (half, steps[-1])}
  return {"half_step": half, "half": rel[half], "end_step": steps[-1], "end": rel[steps[-1]]}
