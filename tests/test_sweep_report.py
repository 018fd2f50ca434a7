"""A sweep's verdicts (experiments/verdicts.py) and report (experiments/report.py), on synthetic
and faked results."""

import json
import math

import nltk
import pytest

from experiments.harness import define, report, resolve, study, verdicts
from tests.common import table_row
from tests.sweep_fakes import FakeCLI, run_fake, sweep_cli, TABLE3
from transformer_jax.tasks.parsing import parseval
from transformer_jax.tasks.translation import bleu


@pytest.fixture(scope="module")
def table3():
  return study.load_sweep(TABLE3)


# --- verdicts ---------------------------------------------------------------------------------

def test_runs_with_one_fingerprint_share_a_vocabulary_whatever_their_files():
  """Files that differ only in their trainer's record are one vocabulary; a result written
  before the fingerprint takes the one another run recorded for its file, if any."""
  new = lambda sha, fp: {"vocab_sha256": sha, "vocab_fingerprint": fp}  # noqa: E731
  old = lambda sha: {"vocab_sha256": sha}  # noqa: E731
  assert report.vocab_identities([new("a1", "f1"), new("b2", "f1"), old("a1")]) == {"fingerprint f1"}
  assert report.vocab_identities([new("a1", "f1"), old("c3")]) == {"fingerprint f1",
                                                                   "file sha256 c3"}
  assert report.vocab_identities([new("a1", "f1"), new("d4", "f2")]) == {"fingerprint f1",
                                                                         "fingerprint f2"}


def test_verdicts_on_synthetic_results():
  base = [10.0, 10.1, 10.2]                                      # range 0.2
  assert verdicts.verdict("+", [10.5, 10.7], base) == pytest.approx({"delta": 0.5, "noise": 0.2, "verdict": "✓"})
  assert verdicts.verdict("-", [10.5, 10.7], base)["verdict"] == "✗"   # beyond the noise, other way
  assert verdicts.verdict("+", [10.15, 10.25], base)["verdict"] == "="  # +0.1 within 0.2
  assert verdicts.verdict("-", [9.0, 10.0], base)["verdict"] == "="     # -0.6, but the row's range is 1.0
  assert verdicts.verdict("=", [10.5, 10.6], base)["verdict"] == "✗"    # the paper's unchanged row moved
  assert verdicts.verdict("=", [10.1, 10.2], base)["verdict"] == "= ✓"
  assert verdicts.verdict(None, [10.5, 10.7], base)["verdict"] == ""
  assert verdicts.verdict("+", [], base) == {"delta": None, "noise": None, "verdict": ""}
  bleu_base = [20.0, 20.5, 19.8]
  assert verdicts.verdict("-", [18.0, 18.4], bleu_base)["verdict"] == "✓"  # BLEU down, as the paper's
  assert verdicts.verdict("+", [18.0, 18.4], bleu_base)["verdict"] == "✗"
  assert verdicts.verdict("+", [10.3], [10.0])["verdict"] == "✓"            # one seed each: no spread
  assert verdicts.expectation(5.12, 4.92, verdicts.PPL_CLEAR) == "+"          # 0.2 at printed precision
  assert verdicts.expectation(4.75, 4.92, verdicts.PPL_CLEAR) == "="
  assert verdicts.expectation(25.5, 25.8, verdicts.BLEU_CLEAR) == "-"
  assert verdicts.expectation(None, 4.92, verdicts.PPL_CLEAR) is None


def test_gap_to_base_over_training():
  """A row's dev PPL relative to base's, halfway (the evaluation nearest half of the last step) and
  at the end, from the mean curves over seeds; 'closing' when the gap shrank by over 1 point."""
  runs = lambda *curves: {s: {"dev_ppl_curve": c} for s, c in enumerate(curves)}  # noqa: E731
  base = verdicts.mean_curve(runs([[100, 40.0], [200, 21.0], [300, 15.0], [400, 11.0]],
                                 [[100, 44.0], [200, 19.0], [300, 17.0], [400, 13.0]]))
  assert base == {100: 42.0, 200: 20.0, 300: 16.0, 400: 12.0}
  shallow = verdicts.mean_curve(runs([[100, 30.0], [200, 10.0], [300, 8.0], [400, 9.0]]))
  gap = verdicts.gap(shallow, base)
  assert gap == pytest.approx({"half_step": 200, "half": -0.5, "end_step": 400, "end": -0.25})
  assert report._gap_text(gap) == "-50% @200 → -25% @400 (closing)"
  assert report._gap_text(verdicts.gap({200: 30.0, 400: 6.0}, base)) == "+50% @200 → -50% @400 (steady)"
  assert report._gap_text(verdicts.gap({200: 21.0, 400: 18.0}, base)) == "+5% @200 → +50% @400 (widening)"
  assert verdicts.gap({400: 9.0}, base) is None and report._gap_text(None) == ""


def test_clear_and_unchanged_rows_of_table3(table3):
  base = table3.rows.base.paper
  clear = [r for r in study.row_ids(table3) if r != "base" and verdicts.expectation(
      table3.rows[r].paper.ppl, base.ppl, verdicts.PPL_CLEAR) in ("+", "-")]
  assert clear == ["A_h1", "B_dk16", "C_N2", "C_N4", "C_dmodel256",
                                       "C_dmodel1024", "C_dff1024", "D_pdrop0", "D_ls0", "D_ls02", "big"]
  assert verdicts.paper_unchanged(table3) == ["A_h16", "E_learned_pe"]


# --- the report -------------------------------------------------------------------------------

def test_report_of_a_partial_sweep(table3, tmp_path):
  out, results = tmp_path / "sweep", tmp_path / "t3_tiny"
  scores = {("base", 0): (10.0, 20.0), ("base", 1): (10.1, 20.5), ("base", 2): (9.9, 19.5),
            ("A_h1", 0): (11.0, 18.0), ("A_h1", 1): (11.2, 18.4),
            ("C_N8", 0): (10.05, 20.1), ("C_N8", 1): (10.15, 20.3),
            ("E_learned_pe", 0): (10.6, 20.0), ("E_learned_pe", 1): (10.8, 20.2),
            ("D_ls0", 0): (9.0, 21.0)}
  fake = FakeCLI(fail={("D_ls0", 1)}, scores=scores)
  run_fake(table3, out, results, ["base", "A_h1", "C_N8", "E_learned_pe", "D_ls0"], fake)
  (tmp_path / "t3_tiny_reading.md").write_text("Our reading: the tiny scale says nothing.\n")
  result = sweep_cli("--report", f"--sweep={TABLE3}", "--scale=tiny", "--seeds=0,1", "--base_seeds=0,1,2",
                f"--results_dir={results}", f"--out={out}", timeout=120)
  assert result.returncode == 0, result.stderr
  md = (tmp_path / "t3_tiny.md").read_text()
  head = table_row(md, "row")
  row = lambda label: dict(zip(head, table_row(md, label)))  # noqa: E731
  base, a_h1 = row("base"), row("(A) h=1, d_k=d_v=512")
  assert (base["PPL paper"], base["PPL ours"], base["BLEU ours"]) == ("4.92", "10.00 (9.90–10.10, n=3)",
                                                                    "20.0 (19.5–20.5, n=3)")
  assert (base["params ×10⁶ paper"], base["params ×10⁶ at paper scale"]) == ("65", "63.0")
  assert a_h1["ΔPPL vs base"] == "+0.37 / +1.10 (noise 0.20)" and a_h1["PPL"] == "✓"
  assert a_h1["ΔBLEU vs base"] == "-0.90 / -1.80 (noise 1.00)" and a_h1["BLEU"] == "✓"
  assert 0 <= float(a_h1["p (BLEU)"]) <= 1
  c_n8 = row("(C) N=8")  # the paper: -0.04 PPL (small), -0.3 BLEU (clear)
  assert (c_n8["PPL"], c_n8["BLEU"]) == ("= ✓", "=")
  e = row("(E) positional embedding instead of sinusoids")
  assert (e["PPL"], e["BLEU"]) == ("✗", "= ✓")
  d_ls0 = row("(D) eps_ls=0.0")
  assert d_ls0["PPL ours"] == "9.00 (9.00–9.00, n=1 of 2)" and d_ls0["PPL"] == "pending"
  assert row("(A) h=4, d_k=d_v=128")["PPL ours"] == "pending"
  assert ("- PPL: 1 of 11 clear rows (the paper's |ΔPPL| ≥ 0.2) move in the paper's direction beyond "
          "the seed spread; 0 move the other way beyond it, 0 stay within it, 10 pending.") in md
  assert ("(E) positional embedding instead of sinusoids: ✗ (ours +0.70, noise 0.20)") in md
  assert "- Base over seeds 0, 1, 2: dev PPL 10.00 (9.90–10.10, range 0.20)" in md
  assert "D_ls0 seed 1: failed: config key 'model.d_k' boom" in md
  assert "- Runs finished: 10 of 41 (row × seed); rows complete: 4 of 20." in md
  assert "- Vocabulary: one for all runs (fingerprint " in md
  assert "- Command: `python -m experiments.harness.runner" not in md  # runs made in-process record none
  assert "by more than 3M in: (C) d_model=1024, d_k=d_v=128 (163.8M vs 168M)" in md
  # Rows that change only the heads, by per-head width: base (d_model 32 / 8 heads: d_k 4), A h=1 (32);
  # C N=8 and E (another positional table at base's d_k) change something else and are left out.
  widths = md[md.index("## By per-head width"):md.index("## What each row ran")]
  cells = [[c.strip() for c in line.strip("|").split("|")] for line in widths.splitlines()
           if line.startswith("| ") and not line.startswith("| d_k")]
  assert [c[:3] for c in cells] == [["4", "base", "8"], ["32", "(A) h=1, d_k=d_v=512", "1"]]
  assert cells[1][4] == "11.10 (11.00–11.20, n=2)"
  ran = md[md.index("## What each row ran"):]
  head2 = table_row(ran, "row")
  base_run = dict(zip(head2, table_row(ran, "base")))
  assert (base_run["d_model"], base_run["h"], base_run["steps"], base_run["seeds"]) == ("32", "8", "2", "0,1,2 of 0,1,2")
  assert base_run["last quarter ΔPPL"] == "-20.0% (-20.0%–-20.0%)" and base_run["status"] == "done"
  assert base_run["PPL vs base"] == ""  # the fake's curves: ppl * (1 + (2 - step) / 4)
  assert dict(zip(head2, table_row(ran, "A_h1")))["PPL vs base"] == "+11% @1 → +11% @2 (steady)"  # 11.1 / 10.0
  assert dict(zip(head2, table_row(ran, "D_ls0")))["status"].startswith("failed; seed 1: failed:")
  assert md.rstrip().endswith("## Reading\n\nOur reading: the tiny scale says nothing.")
  data = json.load(open(tmp_path / "t3_tiny.json"))
  by_row = {r["row"]: r for r in data["rows"]}
  assert len(data["rows"]) == 20 and by_row["A_h1"]["ppl_verdict"] == "✓"
  assert by_row["A_h4"]["status"] == "pending" and by_row["base"]["ppl"]["n"] == 3
  assert [w["row"] for w in data["by_head_width"]] == ["base", "A_h1"]
  assert (tmp_path / "t3_tiny_curves.png").stat().st_size > 10_000
  assert (tmp_path / "t3_tiny.png").stat().st_size > 10_000
  assert "Changed from the scale" not in md and data["changed_from_scale"] == {}
  # The report names the command line's changes to the scale (here one that leaves the protocol).
  result = sweep_cli("--report", f"--sweep={TABLE3}", "--scale=tiny", "--seeds=0,1", "--base_seeds=0,1,2",
                     f"--results_dir={results}", f"--out={out}", "--config.train.log_every_steps=1",
                     timeout=120)
  assert result.returncode == 0, result.stderr
  assert ("**Changed from the scale for every run here** (command line; these win over the "
          "description above): `--config.train.log_every_steps=1`.") in (tmp_path / "t3_tiny.md").read_text()
  assert json.load(open(tmp_path / "t3_tiny.json"))["changed_from_scale"] == {"train.log_every_steps": 1}
  # A run that fills in one seed (--seeds=1) writes a report of the whole sweep: the scale's seed
  # 0 stays planned beside it (the tiny scale: seed 0 for every row, base included).
  result = sweep_cli("--report", f"--sweep={TABLE3}", "--scale=tiny", "--seeds=1",
                     f"--results_dir={results}", f"--out={out}", timeout=120)
  assert result.returncode == 0, result.stderr
  md = (tmp_path / "t3_tiny.md").read_text()
  assert "- Runs finished: 10 of 39 (row × seed)" in md  # 19 rows x seeds 0,1 + base's seed 0
  ran = md[md.index("## What each row ran"):]
  assert dict(zip(table_row(ran, "row"), table_row(ran, "A_h1")))["seeds"] == "0,1 of 0,1"


def test_the_verdict_at_two_thirds_of_training(table3):
  """Each run's dev PPL at its evaluation nearest 2/3 of its steps, judged as at the end: a row
  that overtakes base only in the last third has a verdict that is still moving."""
  run = lambda curve: {"dev_ppl": curve[-1][1], "bleu_tokenized": 20.0, "bleu": 20.0,  # noqa: E731
                       "dev_ppl_curve": curve, "train_minutes": 1.0, "eval_minutes": 1.0,
                       "params": 1, "hparams": {}, "machine": {"cpu": "AMD EPYC", "cores": 2}}
  assert verdicts.ppl_at(run([[100, 9.0], [200, 8.0], [300, 7.0]]), verdicts.TWO_THIRDS) == 8.0
  base = {s: run([[100, 30.0], [200, 10.0 + s / 10], [300, 8.0 + s / 10]]) for s in range(3)}
  late = {s: run([[100, 30.0], [200, 9.0 + s / 10], [300, 9.0 + s / 10]]) for s in range(2)}  # C_N2: +
  early = {s: run([[100, 30.0], [200, 12.0 + s / 10], [300, 9.0 + s / 10]]) for s in range(2)}  # N4: +
  results = {"base": base, "C_N2": late, "C_N4": early}
  planned = {"base": [0, 1, 2], "C_N2": [0, 1], "C_N4": [0, 1]}
  rows = {r["row"]: r for r in verdicts.summarize(table3, results, planned, [])}
  assert (rows["C_N2"]["ppl_verdict_two_thirds"], rows["C_N2"]["ppl_verdict"]) == ("✗", "✓")
  assert (rows["C_N4"]["ppl_verdict_two_thirds"], rows["C_N4"]["ppl_verdict"]) == ("✓", "✓")
  assert rows["A_h1"]["ppl_verdict_two_thirds"] is None  # not run
  line = next(l for l in report.summary_lines(list(rows.values())) if "two thirds" in l)
  assert "1 of 2 clear rows ✓" in line and "(C) N=2 (✗ → ✓)" in line


def test_the_report_sets_its_verdicts_beside_another_scales():
  """`compare_with`: the clear rows' counts here and there, the rows whose verdict differs with
  their Δ vs base, rows pending here not counted as changed; a missing report is said."""
  def row(name, ppl, ppl_delta, bleu="pending", expected="+"):
    return {"row": name, "label": name, "ppl_expected": expected, "ppl_verdict": ppl,
            "ppl_delta": ppl_delta, "bleu_expected": "-", "bleu_verdict": bleu, "bleu_delta": None}
  here = [row("base", None, None, None, "="), row("A_h1", "✓", 0.6), row("C_N2", "✓", 0.9),
          row("C_N4", "pending", None)]
  there = {"rows": [row("base", None, None, None, "="), row("A_h1", "✗", -0.3),
                    row("C_N2", "✓", 0.4), row("C_N4", "✓", 0.2), row("big", "✓", -1.0)]}
  text = "\n".join(report.comparison_lines(here, "cpu", there, "t3_cpu.md"))
  assert "- PPL: here 2 of 3, cpu 2 of 3 (pending here: 1)." in text
  assert "| A_h1 | -0.30 ✗ → +0.60 ✓ | — pending → — pending |" in text
  assert "C_N2 |" not in text and "C_N4 |" not in text
  assert "is not there" in "\n".join(report.comparison_lines(here, "cpu", None, "t3_cpu.md"))
  assert report.comparison_lines(here, "", there, "t3_cpu.md") == []


def test_the_bleu_verdict_at_two_thirds_comes_from_the_kept_checkpoint(table3, tmp_path):
  """A scale with score_two_thirds: each run's checkpoint at 2/3 of its steps is evaluated too
  (the same sentences), recorded, and judged as at the end; the report says which moved."""
  table3.scales.tiny.score_two_thirds = True
  try:
    assert resolve.resolve(table3, "base", "tiny").two_thirds_step == 1  # 2/3 of 2 steps
    out, results = tmp_path / "sweep", tmp_path / "t3_tiny"
    fake = FakeCLI(scores={("base", 0): (10.0, 20.0), ("A_h1", 0): (11.0, 18.0)})
    run_fake(table3, out, results, ["base", "A_h1"], fake, seeds=(0,), base_seeds=(0,))
  finally:
    table3.scales.tiny.score_two_thirds = False
  record = json.loads((results / "A_h1_seed0.json").read_text())
  assert record["two_thirds"] == {"step": 1, "dev_ppl": 16.5, "bleu": 15.0, "bleu_tokenized": 16.0}
  assert "--step=1" in record["commands"]["eval_two_thirds"]
  run = lambda end, early: {"dev_ppl": 9.0, "bleu_tokenized": end, "bleu": end,  # noqa: E731
                            "two_thirds": {"bleu_tokenized": early}, "dev_ppl_curve": [],
                            "train_minutes": 1.0, "eval_minutes": 1.0, "params": 1, "hparams": {},
                            "machine": {"cpu": "AMD EPYC", "cores": 2}}
  base = {s: run(20.0 + s / 10, 15.0 + s / 10) for s in range(3)}
  late = {s: run(18.0 + s / 10, 16.0 + s / 10) for s in range(2)}  # A h=1: BLEU below base's
  rows = {r["row"]: r for r in verdicts.summarize(
      table3, {"base": base, "A_h1": late}, {"base": [0, 1, 2], "A_h1": [0, 1]}, [])}
  assert (rows["A_h1"]["bleu_verdict_two_thirds"], rows["A_h1"]["bleu_verdict"]) == ("✗", "✓")
  line = next(l for l in report.summary_lines(list(rows.values())) if "BLEU at two thirds" in l)
  assert "0 of 1 clear rows ✓" in line and "(A) h=1, d_k=d_v=512 (✗ → ✓)" in line


def test_paper_step_ratio_gives_big_the_papers_three_times_base(table3):
  table3.scales.tiny.paper_step_ratio = True
  try:
    steps = {r: resolve.resolve(table3, r, "tiny").config.train.num_steps for r in ("base", "big", "C_N2")}
  finally:
    table3.scales.tiny.paper_step_ratio = False
  assert steps == {"base": 2, "big": 6, "C_N2": 2}
  assert resolve.resolve(table3, "big", "tiny").config.train.num_steps == 2  # every row equal


def test_a_parsers_sweep_records_and_reports_bracket_f1(table3, tmp_path):
  """A parser's evaluation (F1, P, R, exact match, repaired outputs) reaches its result file and
  the report's per-run table, in the columns BLEU has for a translation sweep."""
  out, results = tmp_path / "sweep", tmp_path / "t3_tiny"
  parse = {"f1": 61.25, "precision": 60.0, "recall": 62.5, "exact_match": 12.5, "repaired": 3}
  run_fake(table3, out, results, ["base", "A_h1"], FakeCLI(parse_scores=parse), seeds=(0,),
           base_seeds=(0,))
  record = json.loads((results / "base_seed0.json").read_text())
  assert {k: record[k] for k in parse} == parse and record["bleu"] is None
  result = sweep_cli("--report", f"--sweep={TABLE3}", "--scale=tiny", "--rows=base,A_h1",
                     "--seeds=0", "--base_seeds=0", f"--results_dir={results}", f"--out={out}")
  assert result.returncode == 0, result.stderr
  md = (tmp_path / "t3_tiny.md").read_text()
  runs = md[md.index("## Every run"):]
  cells = dict(zip(table_row(runs, "row"), table_row(runs, "base")))
  assert (cells["F1"], cells["P / R"], cells["repaired"]) == ("61.25", "60.00 / 62.50", "3")
  assert "sacreBLEU" not in table_row(runs, "row")
  paper = md[md.index("## Beside the paper"):md.index("## What each row ran")]
  cells = dict(zip(table_row(paper, "row"), table_row(paper, "(A) h=1, d_k=d_v=512")))
  assert float(cells["p (F1)"]) > 0  # the bootstrap of the trees' bracket F1


def test_the_bleu_p_value_pools_the_seeds_both_ran():
  refs = ["ein Hund läuft im Park .", "zwei Männer spielen Fußball .", "eine Frau liest ."] * 4
  good = {s: {"hypotheses": list(refs)} for s in (0, 1, 2)}
  worse = {s: {"hypotheses": [r.split()[0] + " ." for r in refs]} for s in (0, 1)}
  p = verdicts.p_value(good, worse, refs)
  expected = bleu.paired_bootstrap(refs * 2, [h for s in (0, 1) for h in worse[s]["hypotheses"]],
                                   refs * 2)["bleu"]["p_value"]
  assert p == expected  # base seed 2 has no partner: left out
  assert verdicts.p_value(good, {3: worse[0]}, refs) is None  # no seed in common


def test_the_summary_reads_bleu_by_the_bootstrap_too_without_changing_the_verdicts():
  """A second count of the clear BLEU rows: p < 0.05 in the paper's direction; the rows it adds
  to the spread's ✓ are named; a significant move the other way or p >= 0.05 is not counted."""
  def row(name, expected, delta, verdict, p):
    return {"row": name, "label": name, "paper_unchanged": False, "paper_ppl": None,
            "paper_bleu": 25.0, "paper_params_m": None, "seeds": [], "ppl_expected": None,
            "ppl_verdict": "", "ppl_delta": None, "bleu_expected": expected, "bleu_delta": delta,
            "bleu_noise": 0.9, "bleu_verdict": verdict, "p_value": p}
  rows = [row("base", None, None, "", None), row("r1", "-", -1.5, "✓", 0.001),
          row("r2", "-", -0.4, "=", 0.02), row("r3", "+", -0.4, "=", 0.01),
          row("r4", "-", -0.3, "=", 0.2), row("r5", "+", None, "pending", None)]
  lines = report.summary_lines(rows)
  at = next(i for i, line in enumerate(lines) if line.startswith("- BLEU: 1 of 5 clear rows"))
  assert lines[at + 1] == ("  - By the paired bootstrap instead (p < 0.05 in the paper's direction, "
                      "seeds pooled: the dev set's sampling noise rather than the seeds'): 2 of 5 "
                      "clear rows, 1 without a p-value; beyond the spread's ✓: r2 (p 0.020, = by "
                      "the spread).")
  assert [r["bleu_verdict"] for r in rows][1:] == ["✓", "=", "=", "=", "pending"]


def test_a_parsers_p_value_is_the_bootstrap_of_bracket_f1():
  """Parser runs (their results carry F1) are compared on bracket F1 of their trees, not on the
  BLEU of tree strings."""
  refs = ["(TOP (S (NP (DT a) (NN dog)) (VP (VBZ runs)) (. .)))",
          "(TOP (S (NP (NNS men)) (VP (VBP play) (NP (NN ball))) (. .)))"] * 6
  flat = ["(TOP (S (XX a) (XX dog) (XX runs) (XX .)))",
          "(TOP (S (XX men) (XX play) (XX ball) (XX .)))"] * 6
  good = {s: {"f1": 100.0, "hypotheses": list(refs)} for s in (0, 1)}
  worse = {s: {"f1": 40.0, "hypotheses": list(flat)} for s in (0, 1)}
  tree = nltk.Tree.fromstring
  expected = parseval.paired_bootstrap([tree(t) for t in refs * 2], [tree(t) for t in refs * 2],
                                       [tree(t) for t in flat * 2])["f1"]
  assert expected["delta"] < -30
  assert verdicts.p_value(good, worse, refs) == expected["p_value"]
  assert verdicts.p_value(good, {3: worse[0]}, refs) is None  # no seed in common


def test_the_convergence_forecast_finds_where_a_curve_meets_the_bar():
  a, b, c = 1.8, 400.0, 0.9
  ppl = lambda t: math.exp(a + b * t ** -c)  # noqa: E731
  curve = {s: ppl(s) for s in range(300, 3001, 300)}
  f = verdicts.convergence_forecast(curve)
  assert f["fit"] == pytest.approx((a, b, c), rel=1e-3)
  n = f["steps"]
  assert ppl(n) / ppl(0.75 * n) - 1 > -verdicts.CONVERGED >= ppl(n - 300) / ppl(0.75 * (n - 300)) - 1
  assert f["ppl"] == pytest.approx(ppl(n), rel=1e-3) and n % 300 == 0
  assert f["at_2x"][0] == pytest.approx(ppl(6000), rel=1e-3)
  assert verdicts.convergence_forecast({300: 9.0, 600: 8.0}) is None  # too few points


def test_a_sweep_the_paper_does_not_report_is_compared_with_base(tmp_path):
  """The treebank parser's settings sweep has no paper values: its report has no verdict counts
  and no paper columns, but each row's change in PPL and F1 against base."""
  wsj = study.load_sweep("experiments/wsj_parsing")
  out, results = tmp_path / "sweep", tmp_path / "wsj_parsing_pilot"
  scores = {("base", 0): (2.0, 0.0), ("lr10", 0): (2.5, 0.0)}
  run_fake(wsj, out, results, ["base", "lr10"], FakeCLI(scores=scores, parse_scores={
      "f1": 50.0, "precision": 50.0, "recall": 50.0, "exact_match": 0.0, "repaired": 0}),
           scale="pilot", seeds=(0,), base_seeds=(0,), overrides={"train.num_steps": 8})
  report.write_report(wsj, "pilot", str(results), {"base": [0], "lr10": [0]}, str(out))
  md = (tmp_path / "wsj_parsing_pilot.md").read_text()
  assert "clear rows" not in md and "## Beside the paper" not in md
  table = md[md.index("## Against base"):md.index("## What each row ran")]
  cells = dict(zip(table_row(table, "row"), table_row(table, "lrate scale 1.0 (peak 3.6e-3; base 2.5e-3)")))
  assert (cells["ΔPPL vs base"], cells["ΔF1 vs base"]) == ("+0.50", "+0.00")
  assert "bracket F1 50.00" in md  # base's spread names the parser's score


def test_runs_on_other_cpus_are_told_apart_in_the_report(table3, tmp_path):
  """A sweep resumed on another machine: each run's CPU and s/step are in the per-run table (a
  step time compares only on one CPU), and a row whose seeds ran on different CPUs has no mean
  s/step; a sweep on one CPU has no CPU column."""
  out, results = tmp_path / "sweep", tmp_path / "t3_tiny"
  run_fake(table3, out, results, ["base", "A_h1"], FakeCLI(), seeds=(0, 1), base_seeds=(0,))
  report_args = ("--report", f"--sweep={TABLE3}", "--scale=tiny", "--rows=base,A_h1",
                 "--seeds=0,1", "--base_seeds=0", f"--results_dir={results}", f"--out={out}")

  def sections():
    result = sweep_cli(*report_args)
    assert result.returncode == 0, result.stderr
    md = (tmp_path / "t3_tiny.md").read_text()
    ran = md[md.index("## What each row ran"):md.index("## Every run")]
    row_step = dict(zip(table_row(ran, "row"), table_row(ran, "A_h1")))["s/step"]
    return row_step, md[md.index("## Every run"):]

  row_step, runs = sections()
  assert "CPU" not in table_row(runs, "row") and "s/step" in table_row(runs, "row")
  assert float(row_step) > 0
  path = results / "A_h1_seed0.json"
  record = json.loads(path.read_text())
  record["machine"]["cpu"], record["step_seconds"] = "Another CPU (family 6 model 143, AVX-512)", 0.87
  path.write_text(json.dumps(record))
  row_step, runs = sections()
  cells = dict(zip(table_row(runs, "row"), table_row(runs, "A_h1")))
  assert (cells["CPU"], cells["s/step"]) == ("Another CPU (family 6 model 143, AVX-512)", "0.870")
  assert dict(zip(table_row(runs, "row"), table_row(runs, "base")))["CPU"] != cells["CPU"]
  assert row_step == "(2 CPUs)"
