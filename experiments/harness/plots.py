"""The plots of the experiment reports (matplotlib, written as PNG files): a sweep's rows against
the paper's (`sweep_vs_paper`) and its rows' dev-perplexity curves (`dev_ppl_curves`), for
experiments/harness/report.py; a training run's dev BLEU and perplexity against wall time (`run_curves`),
for experiments/harness/run_report.py.
"""

from __future__ import annotations

import numpy as np


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def sweep_vs_paper(rows: list[dict], path: str, title: str) -> bool:
  """A sweep's dev PPL and BLEU against the paper's (the report's rows: ours as the
  mean over seeds with a min–max bar), base's values as cross-hairs, a row green for ✓, red for
  ✗, grey within the noise; False (nothing written) when no row has both values."""
  panels = (("PPL (dev)", "paper_ppl", "ppl", "ppl_verdict"),
            ("BLEU (dev, tokenized)", "paper_bleu", "bleu", "bleu_verdict"))
  if not any(r[p] is not None and r[o]["n"] for _, p, o, _ in panels for r in rows):
    return False
  plt = pyplot()
  base = next((r for r in rows if r["row"] == "base"), None)
  fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
  for ax, (name, pk, ok, vk) in zip(axes, panels):
    for r in rows:
      if r[pk] is None or not r[ok]["n"]:
        continue
      color = "black" if r is base else {"✓": "tab:green", "✗": "tab:red", "= ✓": "tab:green"}.get(
          r[vk], "tab:gray")
      mean = r[ok]["mean"]
      ax.errorbar(r[pk], mean, yerr=[[mean - r[ok]["min"]], [r[ok]["max"] - mean]], fmt="o",
                  color=color, ms=5, capsize=2, zorder=3)
      ax.annotate(r["row"], (r[pk], mean), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if base and base[pk] is not None and base[ok]["n"]:
      ax.axvline(base[pk], color="gray", lw=0.8, ls="--")
      ax.axhspan(base[ok]["min"], base[ok]["max"], color="gray", alpha=0.15, lw=0)
      ax.axhline(base[ok]["mean"], color="gray", lw=0.8, ls="--")
    ax.set(xlabel=f"paper {name}", ylabel=f"ours {name} (mean, min–max over seeds)")
    ax.set_title(f"{name}: green ✓, red ✗, grey = within the seed spread or pending", fontsize=9)
    ax.grid(alpha=0.3)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def dev_ppl_curves(curves: dict[str, list[list[list[float]]]], path: str, title: str) -> bool:
  """Every row's dev perplexity against the training step, the mean over its seeds at the steps
  all of them evaluated (`curves`: label -> one [[step, perplexity], ...] per seed), log scale;
  False (nothing written) when no row has a curve."""
  means = {}
  for label, per_seed in curves.items():
    per_seed = [dict((float(s), p) for s, p in c) for c in per_seed if c]
    steps = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
    if steps:
      means[label] = (steps, [float(np.mean([c[s] for c in per_seed])) for s in steps],
                      len(per_seed))
  if not means:
    return False
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(11, 6.5))
  cmap = plt.get_cmap("tab20")
  for i, (label, (steps, ppl, n)) in enumerate(means.items()):
    ax.plot(steps, ppl, "o-" if len(steps) < 30 else "-", ms=3, lw=2.2 if label == "base" else 1.2,
            color="black" if label == "base" else cmap(i % 20), label=f"{label} (n={n})")
  ax.set(yscale="log", xlabel="training step",
         ylabel="dev perplexity (mean over seeds, log)", title=title)
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=7, ncol=2, loc="upper right")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def run_curves(curve: list[dict], train_rows: list[dict], dev_rows: list[dict], path: str,
               name: str, score_name: str) -> None:
  """A training run: the dev score (`score_name`: sacreBLEU, bracket F1) of its checkpoints
  against wall time (`curve`: wall_minutes, dev_score, and test_score where scored), and
  train/dev perplexity (metrics.jsonl rows with `minutes`)."""
  plt = pyplot()
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  minutes = [c["wall_minutes"] for c in curve]
  ax1.plot(minutes, [c["dev_score"] for c in curve], "o-", label=f"dev {score_name}")
  with_test = [c for c in curve if "test_score" in c]
  if with_test:
    ax1.plot([c["wall_minutes"] for c in with_test], [c["test_score"] for c in with_test], "^:",
             label=f"test {score_name} (reported only)")
  ax1.set(xlabel="training wall time (minutes)", ylabel=f"{score_name} (beam search)",
          title=f"{name}: dev {score_name} vs wall time")
  ax2.plot([r["minutes"] for r in train_rows], [r["perplexity"] for r in train_rows], label="train")
  ax2.plot([r["minutes"] for r in dev_rows], [r["perplexity"] for r in dev_rows], "o-", label="dev")
  ax2.set(yscale="log", xlabel="training wall time (minutes)",
          ylabel="perplexity per target wordpiece")
  for ax in (ax1, ax2):
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
