"""A sweep's results table: Markdown in the paper's Table 3 layout, CSV, JSON and a PNG plot.

Reads OUT/sweep.json (written by experiments/run.py: the sweep's rows, the paper's values, the
exact paper-scale parameter counts) and OUT/<row>/result.json of each row, and writes
OUT/<sweep>_<scale>.{md,csv,json,png} (and experiments/results/NAME.* with publish=NAME).

For every row with a paper value, "direction" compares the change against the base row: the
paper's (row - base) and ours (row - our base) for dev perplexity and dev BLEU; 'same' when both
moved the same way, 'opposite' otherwise, 'paper: =' when the paper reports no change.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import shutil

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
HPARAMS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "train_steps")
HEADERS = {"N": "N", "d_model": "d_model", "d_ff": "d_ff", "h": "h", "d_k": "d_k", "d_v": "d_v",
           "P_drop": "P_drop", "eps_ls": "ε_ls", "train_steps": "train steps"}
TOLERANCE_M = 3.0  # paper-scale parameter counts must match the paper within this (millions)


def read_json(path):
  """The JSON in `path`, or None when it is missing or unreadable."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _fmt(value, digits=2):
  if value is None or value == "":
    return ""
  if isinstance(value, float):
    return f"{value:.{digits}f}"
  return str(value)


def _steps(value):
  if value is None:
    return ""
  return f"{value // 1000}K" if value >= 1000 and value % 1000 == 0 else str(value)


def _cell(col, value):
  if value is None:
    return ""
  if col == "train_steps":
    return _steps(value)
  if col in ("P_drop", "eps_ls"):
    return f"{value:.1f}" if abs(value * 10 - round(value * 10)) < 1e-9 else f"{value:g}"
  return f"{value:g}" if isinstance(value, float) else str(value)


def direction(paper_row, paper_base, ours_row, ours_base) -> str:
  """'same' / 'opposite' / 'ours: =' (we saw no change) / 'paper: =' / '' (a value missing)."""
  if None in (paper_row, paper_base, ours_row, ours_base):
    return ""
  dp, do = paper_row - paper_base, ours_row - ours_base
  if abs(dp) < 1e-9:
    return "paper: ="
  if abs(do) < 1e-9:
    return "ours: ="
  return "same" if (dp > 0) == (do > 0) else "opposite"


def collect(out: str) -> tuple[dict, list[dict]]:
  """(sweep record, one merged dict per row of the sweep, in order)."""
  record = read_json(os.path.join(out, "sweep.json"))
  if record is None:
    from transformer_jax.config import ConfigError  # pylint: disable=g-import-not-at-top
    raise ConfigError(f"{out}/sweep.json not found: not a sweep folder of experiments.run")
  rows = []
  for meta in record["rows"]:
    res = read_json(os.path.join(out, meta["row"], "result.json")) or {}
    paper = meta.get("paper") or {}
    row = {"row": meta["row"], "label": meta["label"], "group": meta["group"],
           "status": res.get("status", "not run"), "error": res.get("error", "")}
    for key in ("ppl", "bleu", "params_m") + HPARAMS:
      row[f"paper_{key}"] = paper.get(key)
    row["paper_scale_params"] = meta.get("paper_scale_params")
    done = row["status"] == "done"
    hp = res.get("hparams") or {}
    for key in HPARAMS:
      row[f"run_{key}"] = hp.get(key)
    for key in ("steps", "params", "dev_loss", "dev_nll", "dev_ppl", "bleu", "bleu_tokenized",
                "bleu_sentences", "train_seconds", "eval_seconds", "step_seconds",
                "tokens_per_second", "beam_size", "alpha"):
      row[key] = res.get(key) if done or key in ("steps", "train_seconds") else None
    rows.append(row)
  base = next((r for r in rows if r["row"] == "base"), None)
  for r in rows:
    r["ppl_direction"] = direction(r["paper_ppl"], base and base["paper_ppl"], r["dev_ppl"],
                                   base and base["dev_ppl"]) if base and r is not base else ""
    r["bleu_direction"] = direction(r["paper_bleu"], base and base["paper_bleu"],
                                    r["bleu_tokenized"], base and base["bleu_tokenized"]) \
        if base and r is not base else ""
  return record, rows


def _delta_cell(r, base, paper_key, ours_key, dir_key):
  if base is None or r is base or r[paper_key] is None or base[paper_key] is None:
    return ""
  paper = f"{r[paper_key] - base[paper_key]:+.2f}"
  if r[ours_key] is None or base[ours_key] is None:
    return f"{paper} / —"
  mark = {"same": " ✓", "opposite": " ✗", "ours: =": " ✗", "paper: =": " (paper: =)"}.get(r[dir_key], "")
  return f"{paper} / {r[ours_key] - base[ours_key]:+.2f}{mark}"


def markdown(record: dict, rows: list[dict]) -> str:
  base = next((r for r in rows if r["row"] == "base"), None)
  done = [r for r in rows if r["status"] == "done"]
  lines = [f"# {record['sweep']} at scale '{record['scale']}'", ""]
  if record.get("description"):
    lines += [record["description"] + ".", ""]
  lines += [f"Scale '{record['scale']}': {record.get('scale_description', '')}.", "",
            f"Run config file: `{record.get('base_config', '')}`; overrides for every row: "
            + (", ".join(f"`{k}={v}`" for k, v in record.get("user_overrides", {}).items()) or "none")
            + ".", "",
            f"Command: `{record.get('command', '')}`", "",
            f"Rows finished: {len(done)} of {len(rows)}."]
  failed = [r for r in rows if r["status"] not in ("done", "not run")]
  if failed:
    lines += ["", "Not finished: " + "; ".join(f"{r['row']} ({r['status']}: {r['error']})" for r in failed) + "."]
  lines += ["", "## Beside the paper", "",
            "Hyperparameter columns as printed in the paper (blank: as base); PPL = dev perplexity "
            "per target token, exp(NLL), no label smoothing in it; BLEU = paper-compatible tokenized "
            "BLEU of beam search, no checkpoint averaging; params at paper scale = exact count of the "
            "row at the paper's widths and a 37000-piece vocabulary. Δ vs base: the paper's change / "
            "ours; ✓ when both moved the same way, ✗ when ours moved the other way or not at all.", ""]
  head = ["row"] + [HEADERS[h] for h in HPARAMS] + [
      "PPL paper", "PPL ours", "BLEU paper", "BLEU ours", "params ×10⁶ paper",
      "params ×10⁶ at paper scale (ours)", "ΔPPL vs base", "ΔBLEU vs base"]
  lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [r["label"]] + [_cell(h, r[f"paper_{h}"]) for h in HPARAMS] + [
        _fmt(r["paper_ppl"]), _fmt(r["dev_ppl"]), _fmt(r["paper_bleu"], 1),
        _fmt(r["bleu_tokenized"], 1), _fmt(r["paper_params_m"]),
        "" if r["paper_scale_params"] is None else f"{r['paper_scale_params'] / 1e6:.1f}",
        _delta_cell(r, base, "paper_ppl", "dev_ppl", "ppl_direction"),
        _delta_cell(r, base, "paper_bleu", "bleu_tokenized", "bleu_direction")]
    lines.append("| " + " | ".join(cells) + " |")
  lines += [""]
  for metric, key in (("PPL", "ppl_direction"), ("BLEU", "bleu_direction")):
    judged = [r for r in rows if r[key] in ("same", "opposite", "ours: =")]
    same = sum(r[key] == "same" for r in judged)
    lines.append(f"- {metric}: moved in the paper's direction in {same} of {len(judged)} rows "
                 f"(rows where the paper reports a change and both values exist).")
  off = [r for r in rows if r["paper_scale_params"] is not None and r["paper_params_m"] is not None
         and abs(r["paper_scale_params"] / 1e6 - r["paper_params_m"]) > TOLERANCE_M]
  lines.append("- Parameters at paper scale: " + (
      "all within ±3M of the paper." if not off else
      "within ±3M of the paper except " + ", ".join(
          f"{r['label']} ({r['paper_scale_params'] / 1e6:.1f}M vs {r['paper_params_m']}M)" for r in off)
      + " (the paper's C d_model=1024 and big rows cannot both hold: tests/test_model.py)."))
  lines += ["", "## What each row ran", "",
            "Widths after the scale's factor; params = the run's parameter count; dev loss = "
            "label-smoothed cross-entropy (the training objective); times are wall-clock (train: the "
            "training CLI, including start-up and compilation; step: mean seconds per step after "
            "the first log window; eval: dev loss + beam search).", ""]
  head2 = ["row"] + [HEADERS[h] for h in HPARAMS[:-1]] + [
      "steps", "params", "dev loss", "dev NLL", "dev PPL", "BLEU tok.", "sacreBLEU", "BLEU sents",
      "train min", "s/step", "eval min", "status"]
  lines += ["| " + " | ".join(head2) + " |", "|" + "---|" * len(head2)]
  for r in rows:
    cells = [r["row"]] + [_cell(h, r[f"run_{h}"]) for h in HPARAMS[:-1]] + [
        _fmt(r["steps"]), "" if r["params"] is None else f"{r['params']:,}",
        _fmt(r["dev_loss"], 3), _fmt(r["dev_nll"], 3), _fmt(r["dev_ppl"]),
        _fmt(r["bleu_tokenized"]), _fmt(r["bleu"]), _fmt(r["bleu_sentences"]),
        "" if not r["train_seconds"] else f"{r['train_seconds'] / 60:.1f}",
        _fmt(r["step_seconds"], 3),
        "" if r["eval_seconds"] is None else f"{r['eval_seconds'] / 60:.1f}",
        r["status"] + (f": {r['error']}" if r["error"] else "")]
    lines.append("| " + " | ".join(cells) + " |")
  lines += ["", f"Generated {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} "
            f"on {platform.node() or 'unknown'} ({platform.machine()}, {os.cpu_count()} CPUs).", ""]
  return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> bool:
  """Ours against the paper's, dev PPL and BLEU; the base row's values as cross-hairs."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  panels = (("PPL (dev)", "paper_ppl", "dev_ppl"), ("BLEU (dev, tokenized)", "paper_bleu", "bleu_tokenized"))
  if not any(r[p] is not None and r[o] is not None for _, p, o in panels for r in rows):
    return False
  base = next((r for r in rows if r["row"] == "base"), None)
  fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
  for ax, (name, pk, ok) in zip(axes, panels):
    pts = [r for r in rows if r[pk] is not None and r[ok] is not None]
    for r in pts:
      color = "black" if r is base else {"same": "tab:green", "opposite": "tab:red", "ours: =": "tab:red"}.get(
          r["ppl_direction" if pk == "paper_ppl" else "bleu_direction"], "tab:blue")
      ax.scatter(r[pk], r[ok], color=color, s=28, zorder=3)
      ax.annotate(r["row"], (r[pk], r[ok]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if base and base[pk] is not None and base[ok] is not None:
      ax.axvline(base[pk], color="gray", lw=0.8, ls="--")
      ax.axhline(base[ok], color="gray", lw=0.8, ls="--")
    ax.set_xlabel(f"paper {name}")
    ax.set_ylabel(f"ours {name}")
    ax.set_title(f"{name}: green = moved like the paper vs base, red = opposite")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


CSV_COLUMNS = (["row", "label", "group", "status", "error"] + [f"paper_{k}" for k in HPARAMS] +
               ["paper_ppl", "paper_bleu", "paper_params_m", "paper_scale_params"] +
               [f"run_{k}" for k in HPARAMS] +
               ["steps", "params", "dev_loss", "dev_nll", "dev_ppl", "bleu_tokenized", "bleu",
                "bleu_sentences", "beam_size", "alpha", "train_seconds", "step_seconds",
                "tokens_per_second", "eval_seconds", "ppl_direction", "bleu_direction"])


def write_report(out: str, publish: str = "") -> list[str]:
  """Writes OUT/<sweep>_<scale>.{md,csv,json,png}; returns the paths written."""
  record, rows = collect(out)
  stem = os.path.join(out, f"{record['sweep']}_{record['scale']}")
  paths = []
  with open(stem + ".md", "w", encoding="utf-8") as f:
    f.write(markdown(record, rows))
  paths.append(stem + ".md")
  with open(stem + ".csv", "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
  paths.append(stem + ".csv")
  with open(stem + ".json", "w") as f:
    json.dump({"sweep": {k: v for k, v in record.items() if k != "rows"}, "rows": rows,
               "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
              f, indent=2)
  paths.append(stem + ".json")
  if plot(rows, stem + ".png", f"{record['sweep']} at scale '{record['scale']}': ours vs the paper"):
    paths.append(stem + ".png")
  if publish:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    for p in list(paths):
      dst = os.path.join(RESULTS_DIR, publish + os.path.splitext(p)[1])
      shutil.copyfile(p, dst)
      paths.append(dst)
  return paths
