"""Cool-down or checkpoint averaging at the end of the Multi30k hour (issue: time to quality),
measured on the dev split by branching the hour's run.

A linear cool-down over the last C of N steps (`train.cooldown_steps`) leaves the rate unchanged
before step N - C, so a run with it is the hour's run up to there. Each variant is therefore a
branch of the hour's run (`--branch_from`, transformer_jax/branch.py) at its checkpoint N - C,
in its own workdir SOURCE_cooldown<N-C>, trained to N with the cool-down: by the resume
guarantee (train.py) bit for bit a fresh run of the hour's config with the cool-down, minus the
steps already paid for. The branch keeps the hour's config (stored with the checkpoint) and
refuses any change that would alter the steps before N - C.

Every variant and the hour itself are scored on the whole dev split (perplexity, sacreBLEU with
the config's beam and alpha) for the last checkpoint alone and the average of the last 3 and 5;
the test split is never read.

  python -m experiments.multi30k_cooldown --source=runs/m30k/final --starts=3908,3130
  -> experiments/results/multi30k_cooldown.{md,json}
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

from experiments import report_run
from transformer_jax import markdown, workdir as workdir_lib

AVERAGES = (1, 3, 5)


def branch_command(source: str, start: int, total: int) -> tuple[str, list[str]]:
  """The branch workdir of the cool-down from `start` and the command that makes and trains it
  (rerun, it resumes the branch)."""
  workdir = f"{source.rstrip('/')}_cooldown{start}"
  return workdir, [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}",
                   f"--branch_from={source}", f"--step={start}",
                   f"--config.train.num_steps={total}",
                   f"--config.train.cooldown_steps={total - start}",
                   "--config.train.max_train_minutes=0", "--config.train.progress_bar=False"]


def scores(workdir: str, step: int) -> dict:
  """Dev perplexity and sacreBLEU of the last checkpoint and of each average (evaluation reports
  already in WORKDIR/eval are read, not recomputed)."""
  out = {}
  for k in AVERAGES:
    stem = workdir_lib.eval_stem(workdir, "validation", step, k)
    if os.path.exists(stem + ".json"):
      with open(stem + ".json") as f:
        report = json.load(f)
    else:
      report = report_run.evaluate(workdir, "validation", step, average=k)
    out[str(k)] = {"perplexity": report["perplexity"], "sacrebleu": report["sacrebleu"],
                   "sentences": report["num_sentences"]}
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--source", required=True, help="The hour's workdir (configs/multi30k.py).")
  p.add_argument("--starts", required=True, help="Checkpoint steps where cool-downs start, e.g. 3908,3130.")
  p.add_argument("--out", default=os.path.join(report_run.RESULTS, "multi30k_cooldown"))
  args = p.parse_args()
  saved = os.path.join(args.source, "config.json")
  if not os.path.isfile(saved):
    sys.exit(f"error: {saved}: no such file (--source must be the hour's training workdir)")
  try:
    starts = [int(s) for s in args.starts.split(",")]
  except ValueError:
    sys.exit(f"error: --starts={args.starts}: expected checkpoint steps, e.g. 3908,3130")
  total = max(int(n) for n in os.listdir(os.path.join(args.source, "checkpoints")) if n.isdigit())
  late = [s for s in starts if not 0 < s < total]
  if late:
    sys.exit(f"error: --starts={args.starts}: {late[0]} is not a step before the run's last ({total})")
  rows = [{"variant": f"no cool-down (the hour's run, {total} steps)", "start": None,
           "command": "", "dev": scores(args.source, total)}]
  for start in starts:
    workdir, cmd = branch_command(args.source, start, total)
    done = os.path.isdir(os.path.join(workdir, "checkpoints", str(total)))  # e.g. before branch.py
    if not done and subprocess.run(cmd, check=False).returncode:
      sys.exit(f"error: training {workdir} failed (its log is above)")
    rows.append({"variant": f"cool-down from step {start} ({total - start} steps, "
                            f"{(total - start) / total:.0%} of the run)", "start": start,
                 "command": " ".join(["python", *cmd[1:]]), "dev": scores(workdir, total)})
  with open(args.out + ".json", "w") as f:
    json.dump({"source": os.path.abspath(args.source), "steps": total, "rows": rows,
               "date": datetime.date.today().isoformat(),
               "command": " ".join(["python", "-m", "experiments.multi30k_cooldown", *sys.argv[1:]])},
              f, indent=1)
  table = markdown.table(
      ["variant", "dev PPL (last)"] + [f"dev sacreBLEU, {'last' if k == 1 else f'avg {k}'}"
                                       for k in AVERAGES],
      [[r["variant"], f"{r['dev']['1']['perplexity']:.2f}"]
       + [f"{r['dev'][str(k)]['sacrebleu']:.2f}" for k in AVERAGES] for r in rows])
  with open(args.out + ".md", "w") as f:
    f.write("# Multi30k: cool-down or checkpoint averaging at the end of the hour\n\n"
            f"`python -m experiments.multi30k_cooldown {' '.join(sys.argv[1:])}` "
            f"({datetime.date.today().isoformat()}; what it does: the module docstring). "
            f"Dev split, all {rows[0]['dev']['1']['sentences']} sentences; the test split is not "
            "read.\n\n" + table + "\n\nBranch commands:\n\n"
            + "".join(f"- `{r['command']}`\n" for r in rows if r["command"]))
  print(f"wrote {args.out}.md/.json")


if __name__ == "__main__":
  main()
