"""A sweep's report, made from its committed result files (experiments/harness/runner.py writes
them).

The results folder (<study>/results/<sweep>_<scale>/) holds one `<row>_seed<k>.json` per
finished (row, seed) and the dev references (references.json). The report beside it,
`<sweep>_<scale>.{md,json}` with `_curves.png` (every row's dev-perplexity curve, mean over
seeds) and `.png` (ours against the paper's values), puts each row next to the paper's:

- ours as the mean over seeds with min–max and n, and the change against base;
- the paper's direction for the row, the verdict against the seed noise, the paired bootstrap
  p-value of its BLEU against base's (the rules: experiments/verdicts.py);
- convergence: the relative change of dev perplexity over the last quarter of training, and the
  row's dev perplexity relative to base's halfway through training and at the end;
- the wall time per row and for the whole sweep;
- the study's own sections, from the files the sweep names in `report_sections`.
Rows without all their seeds finished show what there is, and no verdict. A `## Reading`
section is not generated: it is the contents of `<sweep>_<scale>_reading.md` when that exists.
The JSON records the `--report` command that regenerates it and the settings that command
resolves to (`settings`), which experiments/harness/provenance.py checks at HEAD.
"""

from __future__ import annotations

import datetime
import os

from experiments.harness import plots, records, resolve, study, verdicts
from transformer_jax.runtime import markdown
from transformer_jax.runtime.overrides import REPO
from transformer_jax.runtime.results import read_json, write_result

TOLERANCE_M = 3.0  # paper-scale parameter counts must match the paper within this (millions)


def _gap_text(gap: dict | None) -> str:
  if not gap:
    return ""
  trend = ("closing" if abs(gap["end"]) < abs(gap["half"]) - 0.01 else
           "widening" if abs(gap["end"]) > abs(gap["half"]) + 0.01 else "steady")
  return f"{gap['half']:+.0%} @{gap['half_step']} → {gap['end']:+.0%} @{gap['end_step']} ({trend})"


# ----------------------------------------------------------------------------- the report

def params_markdown(sweep) -> str:
  rows = []
  for p in verdicts.paper_params_table(sweep):
    ref = p["paper_params_m"]
    rows.append([p["label"], f"{p['params']:,} ({p['params'] / 1e6:.1f}M)", ref,
                 None if ref is None else f"{p['params'] / 1e6 - ref:+.1f}M"])
  return markdown.table(["row", "params (exact, vocab 37000)", "paper ×10^6", "difference"], rows)


HEADERS = {"N": "N", "d_model": "d_model", "d_ff": "d_ff", "h": "h", "d_k": "d_k", "d_v": "d_v",
           "P_drop": "P_drop", "eps_ls": "ε_ls", "train_steps": "steps"}


def _num(value, digits=2) -> str:
  return "" if value is None else f"{value:.{digits}f}"


def ours(row, key, digits) -> str:
  """A row's mean over seeds (min–max, n), 'pending' without a finished seed."""
  s = row[key]
  if not s["n"]:
    return "pending"
  of = "" if row["complete"] else f" of {len(row['planned_seeds'])}"
  return (f"{s['mean']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f}, "
          f"n={s['n']}{of})")


def _delta(row, base, key) -> str:
  if base is None or row is base or row[f"paper_{key}"] is None or base[f"paper_{key}"] is None:
    return ""
  paper = f"{row[f'paper_{key}'] - base[f'paper_{key}']:+.2f}"
  if row[f"{key}_delta"] is None:
    return f"{paper} / —"
  return f"{paper} / {row[f'{key}_delta']:+.2f} (noise {row[f'{key}_noise']:.2f})"


def _hparam(col, value) -> str:
  if value is None:
    return ""
  if col in ("P_drop", "eps_ls"):
    return f"{value:g}"
  return f"{value:g}" if isinstance(value, float) else str(value)


def bootstrap_lines(clear: list[dict]) -> list[str]:
  """The clear BLEU rows read by the pooled paired bootstrap instead of the seed spread: a second
  reading (it measures the dev set's sampling noise, and the seeds' only as far as pooling them
  does), never the verdict."""
  tested = [r for r in clear if r.get("p_value") is not None and r.get("bleu_delta") is not None]
  if not tested:
    return []
  agree = [r for r in tested if r["p_value"] < verdicts.SIGNIFICANT
           and (r["bleu_delta"] > 0) == (r["bleu_expected"] == "+")]
  more = [f"{r['label']} (p {r['p_value']:.3f}, {r['bleu_verdict']} by the spread)"
          for r in agree if r["bleu_verdict"] != "✓"]
  return [f"  - By the paired bootstrap instead (p < {verdicts.SIGNIFICANT:g} in the paper's "
          "direction, seeds pooled: the dev set's sampling noise rather than the seeds'): "
          f"{len(agree)} of {len(clear)} clear rows, {len(clear) - len(tested)} without a "
          "p-value" + ("; beyond the spread's ✓: " + ", ".join(more) if more else "") + "."]


def summary_lines(rows: list[dict]) -> list[str]:
  """The verdict counts for PPL and BLEU, the rows the paper calls unchanged, base's spread."""
  lines = []
  for key, name, clear in (("ppl", "PPL", verdicts.PPL_CLEAR),
                           ("bleu", "BLEU", verdicts.BLEU_CLEAR)) if has_paper(rows) else ():
    clear_ = [r for r in rows if r[f"{key}_expected"] in ("+", "-")]
    count = lambda mark, rs: sum(r[f"{key}_verdict"] == mark for r in rs)  # noqa: E731
    lines.append(
        f"- {name}: {count('✓', clear_)} of {len(clear_)} clear rows (the paper's |Δ{name}| ≥ "
        f"{clear:g}) move in the paper's direction beyond the seed spread; "
        f"{count('✗', clear_)} move the other way beyond it, {count('=', clear_)} stay within "
        f"it, {count('pending', clear_)} pending.")
    if key == "bleu":
      lines += bootstrap_lines(clear_)
    same = [r for r in rows if r["paper_unchanged"]]
    lines.append("  - Rows the paper calls unchanged (to stay within the spread): " + ("; ".join(
        f"{r['label']}: {r[f'{key}_verdict'] or '—'}" + (
            "" if r[f"{key}_delta"] is None else
            f" (ours {r[f'{key}_delta']:+.2f}, noise {r[f'{key}_noise']:.2f})") for r in same)
        or "none") + ".")
    small = [r for r in rows if r[f"{key}_expected"] == "=" and not r["paper_unchanged"]]
    if small:
      lines.append(f"  - Other rows with a small change in the paper (|Δ{name}| < {clear:g}): "
                   f"{count('= ✓', small)} of {len(small)} within the spread, "
                   f"{count('✗', small)} beyond it, {count('pending', small)} pending.")
  for key, name in (("ppl", "PPL"), ("bleu", "BLEU")):
    early = [r for r in rows if r.get(f"{key}_verdict_two_thirds") and r[f"{key}_expected"] in ("+", "-")]
    if early:
      moved = [r for r in early if r[f"{key}_verdict_two_thirds"] != r[f"{key}_verdict"]]
      lines.append(f"- {name} at two thirds of training: "
                   f"{sum(r[f'{key}_verdict_two_thirds'] == '✓' for r in early)} of {len(early)} "
                   "clear rows ✓; verdicts that change between two thirds and the end: " + (
                       ", ".join(f"{r['label']} ({r[f'{key}_verdict_two_thirds']} → "
                                 f"{r[f'{key}_verdict']})" for r in moved) or "none") + ".")
  base = next((r for r in rows if r["row"] == "base"), None)
  forecast = base and base.get("forecast")
  if forecast:
    lines.append(
        f"- Convergence forecast (log PPL = a + b t^-c fitted to base's mean dev curve from 30% "
        f"of training): < {verdicts.CONVERGED:.0%} over the last quarter "
        + (f"at ~{forecast['steps']} steps (PPL {forecast['ppl']:.2f})" if forecast["steps"]
           else "not within 20x these steps")
        + f"; at twice these steps PPL {forecast['at_2x'][0]:.2f}, {forecast['at_2x'][1]:+.1%} "
        "over the last quarter.")
  if base and base["seeds"]:
    p, (name, b) = base["ppl"], next(
        ((n, base[k]) for k, n in (("bleu", "tokenized BLEU"), ("f1", "bracket F1"))
         if base.get(k, {}).get("n")), ("", {"n": 0}))
    lines.append(f"- Base over seeds {', '.join(map(str, base['seeds']))}: dev PPL {p['mean']:.2f} "
                 f"({p['min']:.2f}–{p['max']:.2f}, range {p['max'] - p['min']:.2f})" + (
                     f", {name} {b['mean']:.2f} ({b['min']:.2f}–{b['max']:.2f}, range "
                     f"{b['max'] - b['min']:.2f})" if b["n"] else "") + ".")
  return lines


def comparison_lines(rows: list[dict], other_scale: str, other: dict | None, link: str) -> list[str]:
  """Each row's verdicts beside those of the same sweep at `other_scale` (its committed report
  JSON `other`, linked as `link`): the clear rows' counts, then the rows whose verdict differs."""
  if not other_scale:
    return []
  if not other:
    return [f"## Beside scale '{other_scale}'", "", f"(Its report, `{link}`, is not there.)", ""]
  theirs = {r["row"]: r for r in other["rows"]}
  both = [r for r in rows if r["row"] in theirs]
  lines = [f"## Beside scale '{other_scale}'", "", f"Its report: [{link}]({link}). Clear rows in "
           "the paper's direction beyond the seed spread (✓), here and there:", ""]
  for key, name in (("ppl", "PPL"), ("bleu", "BLEU")):
    clear = [r for r in both if r[f"{key}_expected"] in ("+", "-")]
    lines.append(f"- {name}: here {sum(r[f'{key}_verdict'] == '✓' for r in clear)} of {len(clear)}, "
                 f"{other_scale} {sum(theirs[r['row']][f'{key}_verdict'] == '✓' for r in clear)} "
                 f"of {len(clear)} (pending here: "
                 f"{sum(r[f'{key}_verdict'] == 'pending' for r in clear)}).")
  changed = [r for r in both if any(r[f"{k}_verdict"] not in ("pending", theirs[r["row"]][f"{k}_verdict"])
                                    for k in ("ppl", "bleu"))]
  delta = lambda r, k: "—" if r[f"{k}_delta"] is None else f"{r[f'{k}_delta']:+.2f}"  # noqa: E731
  table = [[r["label"], *(f"{delta(theirs[r['row']], k)} {theirs[r['row']][f'{k}_verdict']} → "
                          f"{delta(r, k)} {r[f'{k}_verdict']}" for k in ("ppl", "bleu"))]
           for r in changed]
  lines += ["", "Rows whose verdict differs (Δ vs base and verdict, there → here):", ""]
  return lines + ([markdown.table(["row", "PPL", "BLEU"], table)] if table else ["none", ""])


def vocab_identities(runs: list[dict]) -> set[str]:
  """The vocabularies `runs` used: their segmentation fingerprints (tokenizer.vocab_fingerprint),
  or a file's sha256 where no run with that file recorded one (results written before the
  fingerprint); files that differ only in how their trainer was run are one vocabulary."""
  of_file = {r["vocab_sha256"]: r["vocab_fingerprint"] for r in runs if r.get("vocab_fingerprint")}

  def identity(run: dict) -> str:
    fingerprint = run.get("vocab_fingerprint") or of_file.get(run["vocab_sha256"])
    return f"fingerprint {fingerprint}" if fingerprint else f"file sha256 {run['vocab_sha256']}"
  return {identity(r) for r in runs}


def report_markdown(sweep, scale_name: str, rows: list[dict], results: dict, reading: str,
                    stem: str, changes: dict | None = None) -> str:
  runs = [res for by_seed in results.values() for res in by_seed.values()]
  parsing = any("f1" in r for r in runs)  # a parser's sweep: bracket F1 where BLEU would be
  base = next((r for r in rows if r["row"] == "base"), None)
  commands = sorted({r["commands"]["sweep"] for r in runs if r["commands"].get("sweep")})
  machines = sorted({f"{r['machine']['cpu']}, {r['machine']['cores']} cores" for r in runs})
  dates = sorted(r["date"] for r in runs)
  config = sorted({r["protocol"]["config"] for r in runs})
  vocabs = sorted(vocab_identities(runs))
  planned = sum(len(r["planned_seeds"]) for r in rows)
  train_h, eval_h = (sum(r[k] for r in rows) / 60 for k in ("train_minutes", "eval_minutes"))
  shared = ["cores " + ",".join(map(str, r["cpu_share"])) for r in runs if r.get("cpu_share")]
  lines = [f"# {sweep.name} at scale '{scale_name}'", ""]
  if sweep.description:
    lines += [sweep.description + ".", ""]
  lines += [f"Scale '{scale_name}': {sweep.scales[scale_name].description}.", ""]
  if changes:
    lines += ["**Changed from the scale for every run here** (command line; these win over the "
              "description above): " + ", ".join(f"`--config.{k}={v}`" for k, v in changes.items())
              + ".", ""]
  lines += [
            "- Command: " + (", ".join(f"`{c}`" for c in commands) or "—"),
            "- Config: " + (", ".join(f"`{c}`" for c in config) or "—") + "; result files: "
            f"`{_shown_path(stem)}/`",
            "- Machine: " + ("; ".join(machines) or "—"),
            "- Date: " + (f"{dates[0]} to {dates[-1]}" if dates else "—"),
            f"- Runs finished: {len(runs)} of {planned} (row × seed); rows complete: "
            f"{sum(r['complete'] for r in rows)} of {len(rows)}.",
            f"- Wall time: {train_h + eval_h:.2f} h for the {len(runs)} finished runs "
            f"(training {train_h:.2f} h, evaluation {eval_h:.2f} h); per row below."
            + (f" {len(shared)} of them ran beside other runs, each on its own share of the "
               f"cores (`--parallel`; shares: {', '.join(sorted(set(shared)))}): their hours "
               "overlap, so the sum exceeds the elapsed time." if shared else ""),
            "- Vocabulary: " + (f"one for all runs ({vocabs[0]}…)" if len(vocabs) == 1 else
                                f"{len(vocabs)} different ones ({', '.join(vocabs)}): perplexities "
                                "of runs with different vocabularies do not compare" if vocabs
                                else "—"), ""]
  problems = [f"{r['row']} {p}" for r in rows for p in r["problems"]]
  if problems:
    lines += ["Not finished: " + "; ".join(problems) + ".", ""]
  other_scale = sweep.scales[scale_name].get("compare_with", "")
  other = os.path.join(os.path.dirname(stem), f"{sweep.name}_{other_scale}")
  summary = summary_lines(rows)
  lines += [*(["## Summary", "", *summary, ""] if summary else []),
            *comparison_lines(rows, other_scale, read_json(other + ".json"),
                              os.path.basename(other) + ".md"),
            *(paper_table(rows, base, parsing) if has_paper(rows) else base_table(rows, base, parsing))]
  lines += study.report_sections(sweep, rows, scale_name)[0]
  cols = list(HEADERS)
  lines += ["", "## What each row ran: widths, convergence, cost", "",
            f"![dev perplexity curves]({os.path.basename(stem)}_curves.png)", "",
            "Widths at this scale; params = the run's parameter count; last quarter = relative "
            "change of dev PPL from 3/4 of training to the end (mean over seeds, min–max); "
            "PPL vs base = the row's mean dev PPL relative to base's halfway and at the end "
            "(closing / widening: the gap shrinks / grows by more than 1 point); "
            "minutes are wall-clock summed over the row's seeds (training including start-up and "
            "compilation, and any time a run was paused; evaluation: dev loss and beam search); "
            "s/step: the median logged window after the first (which holds the compilation), "
            "mean over seeds (a row whose seeds ran on different CPUs has none: its runs' are in "
            "\"Every run\").", ""]
  lines.append(markdown.table(
      ["row"] + [HEADERS[c] for c in cols] + ["params", "seeds", "last quarter ΔPPL",
                                              "PPL vs base", "train min", "eval min", "s/step",
                                              "status"],
      [[r["row"]] + [_hparam(c, r["hparams"].get(c)) for c in cols] + [
          None if r["params"] is None else f"{r['params']:,}",
          (",".join(map(str, r["seeds"])) or "none") + f" of {','.join(map(str, r['planned_seeds']))}",
          "" if not r["last_quarter"]["n"] else
          f"{r['last_quarter']['mean']:+.1%} ({r['last_quarter']['min']:+.1%}–"
          f"{r['last_quarter']['max']:+.1%})", _gap_text(r["gap_to_base"]),
          _num(r["train_minutes"] or None, 1), _num(r["eval_minutes"] or None, 1),
          _num(r["step_seconds"], 3) if r["step_cpus"] <= 1 else f"({r['step_cpus']} CPUs)",
          "; ".join([r["status"]] + r["problems"])] for r in rows]))
  lines += ["", "## Every run", ""]
  runs = [results.get(row["row"], {})[s] for row in rows for s in row["seeds"]]
  scored = (["F1", "P / R", "exact", "repaired"] if parsing else ["BLEU tok.", "sacreBLEU", "chrF"])
  by_cpu = len(machines) > 1  # runs of one sweep on other CPUs: their s/step do not compare
  lines.append(markdown.table(
      ["row", "seed", "steps", "dev loss", "dev PPL"] + scored +
      ["last quarter ΔPPL", "train min", "eval min", "s/step", "date"] + (["CPU"] if by_cpu else []),
      [[r["row"], r["seed"], r["step"], _num(r["dev_loss"], 3), _num(r["dev_ppl"])] +
       ([_num(r.get("f1")), f"{_num(r.get('precision'))} / {_num(r.get('recall'))}",
         _num(r.get("exact_match"), 1), r.get("repaired")] if parsing else
        [_num(r["bleu_tokenized"]), _num(r["bleu"]), _num(r["chrf"])]) +
       ["" if not r.get("last_quarter") else f"{r['last_quarter']['relative_change']:+.1%}",
        _num(r["train_minutes"], 1), _num(r["eval_minutes"], 1), _num(r.get("step_seconds"), 3),
        r["date"]] + ([r["machine"]["cpu"]] if by_cpu else []) for r in runs]))
  lines += ["", "## Reading", "", reading.strip() if reading.strip() else
            f"(Not written yet: `{os.path.relpath(stem, REPO)}_reading.md` appears here.)", ""]
  return "\n".join(lines)


def has_paper(rows: list[dict]) -> bool:
  """Whether the paper reports any of the rows (a sweep of the paper's table does; one of our own
  settings not)."""
  return any(r[k] is not None for r in rows for k in ("paper_ppl", "paper_bleu", "paper_params_m"))


def _score(parsing: bool) -> tuple[str, str, int]:
  return ("f1", "F1", 2) if parsing else ("bleu", "BLEU", 1)


def base_table(rows: list[dict], base: dict | None, parsing: bool) -> list[str]:
  """Each row against base, for a sweep the paper has no numbers for: ours and the change."""
  key, name, digits = _score(parsing)
  mean = lambda r, k: r[k]["mean"] if r[k]["n"] else None  # noqa: E731
  change = lambda r, k: ("" if base is None or r is base or None in (mean(r, k), mean(base, k))  # noqa: E731
                         else f"{mean(r, k) - mean(base, k):+.2f}")
  lines = ["## Against base", "",
           "The paper reports none of these rows: each is compared with base. PPL = dev perplexity "
           "per target token, exp(NLL), no label smoothing in it; " + (
               "F1 = bracket F1 (EVALB) of beam-search parses" if parsing else
               "BLEU = tokenized BLEU of beam search") + ". Ours: mean over seeds (min–max, n); "
           f"Δ: the row's mean less base's. p: paired bootstrap of the row's {name} against "
           "base's (1000 resamples, pooled over the seeds both ran: row seed k against base seed "
           "k).", ""]
  return lines + [markdown.table(
      ["row", "PPL", "ΔPPL vs base", name, f"Δ{name} vs base", f"p ({name})"],
      [[r["label"], ours(r, "ppl", 2), change(r, "ppl"), ours(r, key, digits),
        change(r, key), _num(r["p_value"], 3)] for r in rows])]


def paper_table(rows: list[dict], base: dict | None, parsing: bool) -> list[str]:
  """Each row beside the paper's: values, changes against base, verdicts, parameters."""
  lines = ["## Beside the paper", "",
           "PPL = dev perplexity per target token, exp(NLL), no label smoothing in it; BLEU = "
           "tokenized BLEU of beam search (the paper's), no checkpoint averaging. Ours: mean over "
           "seeds (min–max, n). Δ vs base: the paper's / ours (noise = the larger of the row's "
           "and base's ranges over seeds). Verdict: ✓ beyond the noise in the paper's direction "
           f"(clear when the paper's |ΔPPL| ≥ {verdicts.PPL_CLEAR:g}, |ΔBLEU| ≥ "
           f"{verdicts.BLEU_CLEAR:g}), ✗ beyond it the other way or where the paper shows no "
           "change, = within it (= ✓ where the paper shows no change). p: paired bootstrap of the row's "
           + ("bracket F1" if parsing else "sacreBLEU") + " against base's (sacreBLEU's test, "
           "1000 resamples, pooled over the seeds both ran: row seed k against base seed k). Params at paper scale: the exact count "
           "of the row at the paper's widths and a 37000-piece vocabulary.", ""]
  key, name, digits = _score(parsing)
  lines.append(markdown.table(
      ["row", "PPL paper", "PPL ours", "ΔPPL vs base", "PPL", "BLEU paper", f"{name} ours",
       "ΔBLEU vs base", "BLEU", f"p ({name})", "params ×10⁶ paper", "params ×10⁶ at paper scale"],
      [[r["label"], _num(r["paper_ppl"]), ours(r, "ppl", 2), _delta(r, base, "ppl"),
        r["ppl_verdict"], _num(r["paper_bleu"], 1), ours(r, key, digits), _delta(r, base, "bleu"),
        r["bleu_verdict"], _num(r["p_value"], 3), r["paper_params_m"],
        None if r["paper_scale_params"] is None else f"{r['paper_scale_params'] / 1e6:.1f}"]
       for r in rows]))
  off = [r for r in rows if r["paper_scale_params"] is not None and r["paper_params_m"] is not None
         and abs(r["paper_scale_params"] / 1e6 - r["paper_params_m"]) > TOLERANCE_M]
  if off:
    lines.append(f"Parameters at paper scale differ from the paper's by more than "
                 f"{TOLERANCE_M:g}M in: " + ", ".join(
                     f"{r['label']} ({r['paper_scale_params'] / 1e6:.1f}M vs {r['paper_params_m']}M)"
                     for r in off) + ".")
  return lines


def _shown_path(results_dir: str) -> str:
  """The results folder as the report names it: from the checkout's root, or (a folder outside
  this checkout, e.g. another worktree's) by its name, as seen from the report beside it."""
  path = os.path.relpath(results_dir, REPO)
  return os.path.basename(results_dir.rstrip("/")) if path.startswith("..") else path


def write_report(sweep, scale_name: str, results_dir: str, planned: dict[str, list[int]],
                 out: str = "", changes: dict | None = None, command: str = "") -> list[str]:
  """Writes <results_dir>.md, .json, _curves.png and .png (when there is something to plot);
  returns the paths written. `changes`: the command line's --config overrides of the scale;
  `command`: the `--report` command that writes this report again, for the record."""
  results = records.load_results(results_dir)
  refs = (read_json(os.path.join(results_dir, "references.json")) or {}).get("references")
  params = verdicts.paper_params(sweep.spec) if "paper" in sweep.scales else {}
  rows = verdicts.summarize(sweep, results, planned, refs, records.load_states(out), params)
  stem = results_dir.rstrip("/")
  reading_path = stem + "_reading.md"
  reading = open(reading_path, encoding="utf-8").read() if os.path.exists(reading_path) else ""
  record = {"sweep": sweep.name, "spec": sweep.spec, "scale": scale_name,
            "scale_description": sweep.scales[scale_name].description,
            "changed_from_scale": dict(changes or {}),
            "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "settings": resolve.sweep_settings(sweep, scale_name, planned, changes),
            "summary": summary_lines(rows), "rows": rows, **study.report_sections(sweep, rows, scale_name)[1]}
  write_result(stem, record, report_markdown(sweep, scale_name, rows, results, reading, stem,
                                             changes))
  paths = [stem + ".md", stem + ".json"]
  title = f"{sweep.name} at scale '{scale_name}'"
  curves = {r["label"]: [res["dev_ppl_curve"] for res in results.get(r["row"], {}).values()]
            for r in rows}
  if plots.dev_ppl_curves(curves, stem + "_curves.png", f"{title}: dev perplexity while training"):
    paths.append(stem + "_curves.png")
  if plots.sweep_vs_paper(rows, stem + ".png", f"{title}: ours vs the paper"):
    paths.append(stem + ".png")
  return paths
