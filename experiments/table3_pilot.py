"""The Table 3 pilot: which budget makes reduced-scale rows converge (issue: Table 3 reproduces).

Rows of experiments/table3.py trained once each on Multi30k at widths x1/4 or x1/8 of the
paper's d_model, d_k, d_v, d_ff (h and N as in the paper), ~2048 source + 2048 target tokens a
step, warmup 400, with the dev perplexity on the whole dev set every 200 steps. The schedule
(inverse square root after warmup) does not depend on the run length, so the curve at step s is
what a run of s steps would give: one run answers every step budget up to its length.

What ran (from this file's scales; `runs` is any folder):
  python -m experiments.run --sweep=experiments/table3_pilot.py --scale=pilot_w4 --rows=base \
      --out=runs/table3_pilot_w4                                   # lrate scale 0.25, 3000 steps
  python -m experiments.run --sweep=experiments/table3_pilot.py --scale=pilot_w8 --rows=base \
      --out=runs/table3_pilot_w8                                   # lrate scale 0.25 (stopped)
  python -m experiments.run --sweep=experiments/table3_pilot.py --scale=pilot_w8 --rows=base \
      --out=runs/table3_pilot_w8_lr0.5 --config.train.learning_rate_scale=0.5 \
      --config.train.num_steps=1500 --config.train.checkpoint_every_steps=1500
  (the same with lr1.0 / learning_rate_scale=1.0; stopped at step 800)
  python -m experiments.table3_pilot --runs=runs         # the summary: results/table3_pilot.*

What it found, and the protocol chosen from it: experiments/results/table3_pilot_reading.md.
"""

import glob
import os

from experiments import sweeps, table3

PILOT_STEPS = 3000


def _pilot_scale(dim_factor: float) -> dict:
  overrides = {"train.max_train_minutes": 0.0, "train.log_every_steps": 50,
               "train.checkpoint_every_minutes": 10.0, "train.keep_checkpoints": 1,
               "train.eval_bleu_sentences": 0, "train.progress_bar": False,
               "data.tokens_per_batch": 2048, "train.warmup_steps": 400,
               "train.learning_rate_scale": 0.25, "train.eval_every_steps": 200,
               "train.max_eval_batches": 0, "train.checkpoint_every_steps": PILOT_STEPS}
  d_model = int(512 * dim_factor)
  return sweeps.scale(
      "configs/multi30k.py", dim_factor=dim_factor, num_steps=PILOT_STEPS, bleu_sentences=500,
      overrides=overrides,
      description=f"pilot: Multi30k, widths x{dim_factor:g} (base d_model {d_model}), "
                  f"{PILOT_STEPS} steps of ~2048+2048 tokens, warmup 400, lrate scale 0.25, "
                  f"dev PPL every 200 steps")


def get_config():
  c = table3.get_config()
  c.scales.pilot_w4 = _pilot_scale(0.25)
  c.scales.pilot_w8 = _pilot_scale(0.125)
  return c


# ----------------------------------------------------------------------------- the pilot's summary
# python -m experiments.table3_pilot --runs=runs  ->  experiments/results/table3_pilot.{md,json,png}


def _curve(workdir: str) -> list[list[float]]:
  import json  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    return []
  rows = [json.loads(line) for line in open(path, encoding="utf-8")]
  return [[r["step"], r["perplexity"]] for r in rows if r.get("split") == "dev"]


def _step_time(workdir: str) -> float | None:
  import json  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "metrics.jsonl")
  times = [json.loads(line).get("step_time") for line in open(path, encoding="utf-8")
           if '"train"' in line] if os.path.isfile(path) else []
  times = [t for t in times[1:] if t]  # the first window holds compilation
  return float(sorted(times)[len(times) // 2]) if times else None


def last_quarter_change(curve: list[list[float]]) -> float | None:
  """Relative change of dev perplexity over the last quarter of the steps: (p_end - p_q) / p_q,
  p_q the value at the first evaluation at or after 3/4 of the last step."""
  if len(curve) < 2:
    return None
  last = curve[-1][0]
  start = next(p for s, p in curve if s >= 0.75 * last)
  return (curve[-1][1] - start) / start


def summarize(runs: str) -> dict:
  """Every pilot run folder under `runs` (table3_pilot_*/<row>/): curves and what they say."""
  out = []
  for folder in sorted(glob.glob(os.path.join(runs, "table3_pilot_*"))):
    for row_dir in sorted(glob.glob(os.path.join(folder, "*", "metrics.jsonl"))):
      workdir = os.path.dirname(row_dir)
      curve = _curve(workdir)
      if not curve:
        continue
      out.append({"run": os.path.basename(folder), "row": os.path.basename(workdir),
                  "steps": curve[-1][0], "final_ppl": curve[-1][1],
                  "last_quarter_change": last_quarter_change(curve),
                  "s_per_step": _step_time(workdir), "curve": curve})
  return {"runs": out}


def write_summary(runs: str, out_dir: str) -> list[str]:
  """table3_pilot.{json,md,png} in `out_dir`."""
  import json  # pylint: disable=g-import-not-at-top
  from experiments import plots  # pylint: disable=g-import-not-at-top
  from transformer_jax import markdown  # pylint: disable=g-import-not-at-top
  data = summarize(runs)
  stem = os.path.join(out_dir, "table3_pilot")
  with open(stem + ".json", "w") as f:
    json.dump(data, f, indent=1)
  checkpoints = (400, 800, 1200, 1500, 2000, 3000)
  rows = []
  for r in data["runs"]:
    at = dict((int(s), p) for s, p in r["curve"])
    rows.append([r["run"], r["row"], r["steps"]] + [at.get(s) for s in checkpoints] +
                [None if r["last_quarter_change"] is None else 100 * r["last_quarter_change"],
                 r["s_per_step"]])
  header = (["run", "row", "steps"] + [f"PPL @{s}" for s in checkpoints] +
            ["Δ last quarter %", "s/step (median, shared machine)"])
  plots.dev_ppl_curves({f"{r['run']}/{r['row']}": [r["curve"]] for r in data["runs"]},
                       stem + ".png", "Table 3 pilot: dev perplexity")
  text = (f"# Table 3 pilot: measured curves\n\nGenerated by `python -m experiments.table3_pilot "
          f"--runs={runs}` from the pilot runs (commands in experiments/table3_pilot.py); "
          "what they mean and the protocol chosen: `table3_pilot_reading.md`.\n\n"
          + markdown.table(header, rows, digits=2) +
          "\n![dev perplexity curves](table3_pilot.png)\n")
  with open(stem + ".md", "w", encoding="utf-8") as f:
    f.write(text)
  return [stem + ".md", stem + ".json", stem + ".png"]


if __name__ == "__main__":
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description="Summarize the Table 3 pilot runs.")
  parser.add_argument("--runs", default="runs", help="folder holding table3_pilot_* run folders")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
  args = parser.parse_args()
  print("wrote " + ", ".join(write_summary(args.runs, args.out)))
