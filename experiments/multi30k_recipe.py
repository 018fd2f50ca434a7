"""Multi30k recipe pilot (issue: time to quality): which changes to configs/multi30k.py buy dev
perplexity per minute of training on a 2-core CPU, measured on the dev split only.

Each recipe is configs/multi30k.py with the overrides below, trained for 12 minutes of wall time
on an otherwise idle machine, with the dev perplexity (the whole dev split, teacher forced) every
100 steps. Perplexity is compared at equal wall time, not equal steps: the recipes' steps cost
different amounts. The test split is never read.

  python -m experiments.multi30k_recipe --print_commands --runs=runs/m30k   # one line per recipe
  python -m experiments.multi30k_recipe --runs=runs/m30k   # -> results/multi30k_recipe.{md,json,png}

Twelve minutes favours whatever learns fastest early; the reading in
experiments/results/time_to_quality.md says how far that carried to the 60-minute run.

`--pilot=batch` is the same comparison over the whole hour for one lever, 1024-token batches
against the documented 2048: both trained at the same time, each pinned to its own core with
the one-core XLA flags (the sweep's `--parallel` runs), so that they share the machine alike
whatever its speed; its summary adds each run's dev sacreBLEU with the last A checkpoints
averaged, read from `--mode=eval --split=validation --average=A` reports in the workdirs.

  python -m experiments.multi30k_recipe --pilot=batch --print_commands --runs=runs/pair  # run together
  python -m experiments.multi30k_recipe --pilot=batch --runs=runs/pair   # -> results/multi30k_batch.*

`--pilot=vocab` is the same for 12000 shared vocabulary pieces against the documented 8000; the
per-token perplexities of two vocabularies do not compare, so it compares the dev split's total
negative log-likelihood in nats (and dev sacreBLEU). `--pilot=bf16` is the same for bfloat16
compute (`model.dtype`) against float32: cheaper steps on CPUs with bfloat16 matmul units.
`--pilot=room` asks what the two-core bfloat16 hour's 1.5x updates buy with more regularisation
and more parameters: whole-machine hours run one after another (the bfloat16 hour itself is the
first recipe), compared on the dev split only. `--pilot=ensemble` spends the hour on two models
instead of one: the documented recipe with seeds 0 and 1, trained at the same time on one core
each, then decoded as one ensemble (`--ensemble`, the mean of their next-token probabilities),
against the same recipe alone on both cores for the hour (run after the pair); its summary adds
the ensemble's dev sacreBLEU, read from the reports of
`--mode=eval --workdir=RUNS/s0 --ensemble=RUNS/s1 --split=validation --average=A`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex

from experiments import local_runner, plots, report_run, results_files
from experiments.multi30k_pilots import BEFORE_ALPHA, PILOTS, Pilot
from transformer_jax import evaluate, files, markdown, workdir as workdir_lib

ONE_CORE = f"XLA_FLAGS={local_runner.ONE_CORE_XLA_FLAGS}"  # as the sweep's --parallel runs
AVERAGES = (1, 3, 5, 10)  # checkpoints averaged, as the hour's report_run --average_choices


def command(name: str, runs: str, pilot: str = "recipe") -> str:
  """The training command of one recipe (workdir RUNS/NAME)."""
  spec = PILOTS[pilot]
  overrides = {**spec.common, **BEFORE_ALPHA, **spec.recipes[name][1]}
  cmd = shlex.join(["python", "-m", "transformer_jax.main", "--config=configs/multi30k.py",
                    f"--workdir={os.path.join(runs, name)}"]
                   + [f"--config.{k}={v}" for k, v in overrides.items()])
  return f"{ONE_CORE} taskset -c {spec.cores[name]} {cmd}" if name in spec.cores else cmd


def ensemble_command(runs: str, pilot: str, average: int) -> str:
  """The dev evaluation of the pilot's ensemble, the last `average` checkpoints of each member."""
  first, *others = (os.path.join(runs, name) for name in PILOTS[pilot].ensemble)
  return shlex.join(["python", "-m", "transformer_jax.main", "--mode=eval", f"--workdir={first}",
                     f"--ensemble={','.join(others)}", "--split=validation",
                     f"--average={average}"])


def dev_bleu_by_average(workdir: str, step: int, settings: str = "") -> dict[str, float]:
  """{A: dev sacreBLEU} of the `--mode=eval --split=validation [--average=A]` reports of the
  run's last step (the checkpoint's own decode settings; '1': no averaging; `settings`: the
  file-name tag of other settings or an ensemble, workdir.eval_stem)."""
  out = {}
  for a in AVERAGES:
    stem = workdir_lib.eval_stem(workdir, "validation", step, a, settings)
    report = results_files.read_json(stem + ".json")
    if report and report.get("sacrebleu") is not None:
      out[str(a)] = report["sacrebleu"]
  return out


def dev_at(dev_rows: list[dict], minutes: float) -> dict | None:
  """The last dev evaluation at or before `minutes` of training (evaluations every N steps land
  minutes apart, more so for the slower recipe: the table shows when it ran)."""
  before = [r for r in dev_rows if r["minutes"] <= minutes + 1e-9]
  return before[-1] if before else None


def _dev_point(row: dict) -> dict:
  """One dev evaluation: when, at which step, per-token perplexity and the split's total NLL."""
  nats = row["nll"] * row["tokens"] if "nll" in row and "tokens" in row else None
  return {"minutes": row["minutes"], "step": row["step"], "perplexity": row["perplexity"],
          "nats": nats}


def _measure(point: dict | None, spec: Pilot) -> float | None:
  """The compared dev number: perplexity, or the split's NLL in whole nats."""
  if point is None or point["nats" if spec.nats else "perplexity"] is None:
    return None
  return round(point["nats"]) if spec.nats else point["perplexity"]


def _at_cell(point: dict | None, spec: Pilot) -> str:
  """'7.64 (12.3 min)': the dev measure at a mark and when that evaluation ran."""
  value = _measure(point, spec)
  return "" if value is None else f"{value:.{0 if spec.nats else 2}f} ({point['minutes']:.1f} min)"


def _utc(seconds: float) -> str:
  return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def summarize(runs: str, pilot: str = "recipe", previous: dict | None = None) -> dict:
  """One row per recipe whose run is in `runs`; a recipe whose workdir is not there (trained on
  another machine or in an earlier session) keeps its row from `previous`, the pilot's last
  summary (its measurements), with `carried` set and its words and command as the recipe now
  gives them."""
  spec, out = PILOTS[pilot], {}
  for name in spec.recipes:
    workdir = os.path.join(runs, name)
    if not os.path.isfile(os.path.join(workdir, "metrics.jsonl")):
      if name in (previous or {}):
        out[name] = {**previous[name], "changes": spec.recipes[name][0],
                     "command": command(name, runs, pilot), "carried": True}
      continue
    saved = os.path.join(workdir, "config.json")  # written by the run; its logging cadence
    log_every = json.load(open(saved))["train"]["log_every_steps"] if os.path.isfile(saved) else 50
    train, dev = report_run.read_metrics(workdir, log_every_steps=log_every)
    points = [_dev_point(r) for r in dev]
    at = {str(m): dev_at(points, m) for m in spec.marks}
    out[name] = {"changes": spec.recipes[name][0], "command": command(name, runs, pilot),
                 "trained": [_utc(train[0]["time"] - 60 * train[0]["minutes"]),
                             _utc(train[-1]["time"])],
                 "steps": train[-1]["step"], "minutes": train[-1]["minutes"],
                 "s_per_step": results_files.median_window(train),
                 "dev_at": at, "dev_end": points[-1] if points else None,
                 "dev_at_step": next((p for p in points if p["step"] == spec.step_mark), None),
                 "dev_bleu_by_average": dev_bleu_by_average(workdir, train[-1]["step"]),
                 "dev_curve": points}
  if spec.ensemble and all(name in out for name in spec.ensemble):
    first, *others = (files.resolve(os.path.join(runs, name)) for name in spec.ensemble)
    step, tag = out[spec.ensemble[0]]["steps"], evaluate.ensemble_tag(others)
    last = results_files.read_json(workdir_lib.eval_stem(first, "validation", step, 1, tag) + ".json")
    out[" + ".join(spec.ensemble)] = {
        "changes": "the runs above decoding as one ensemble (the mean of their next-token "
                   "probabilities), each member its last A checkpoints averaged",
        "command": ensemble_command(runs, pilot, AVERAGES[-1]), "ensemble": True,
        "dev_at": {str(m): None for m in spec.marks}, "dev_at_step": None,
        "dev_end": {"perplexity": last["perplexity"], "nats": None} if last else None,  # its own
        "dev_bleu_by_average": dev_bleu_by_average(first, step, tag),
        "dev_curve": []}
  return out


def _together(spec: Pilot, data: dict) -> str:
  """How the listed training commands ran: ' (run together)' when each is pinned to a core."""
  trained = [name for name, r in data.items() if not r.get("ensemble")]
  if not spec.cores:
    return ""
  if all(name in spec.cores for name in trained):
    return " (run together)"
  return " (those pinned with `taskset` run together; the others by themselves, after them)"


def write(runs: str, out_dir: str, pilot: str = "recipe") -> list[str]:
  spec, host = PILOTS[pilot], results_files.machine()
  stem = os.path.join(out_dir, spec.stem)
  data = summarize(runs, pilot, results_files.read_json(stem + ".json"))
  carried = [name for name, r in data.items() if r.get("carried")]
  os.makedirs(out_dir, exist_ok=True)
  results_files.write_json(stem + ".json", data)  # whole: it holds the carried rows
  averages = [a for a in AVERAGES if any(str(a) in r["dev_bleu_by_average"] for r in data.values())]
  rows = [[name, r["changes"], r.get("steps"), r.get("s_per_step")]
          + [_at_cell(r["dev_at"][str(m)], spec) for m in spec.marks]
          + [_measure(r["dev_end"], spec), _measure(r["dev_at_step"], spec)]
          + [r["dev_bleu_by_average"].get(str(a), "not decoded") for a in averages]
          for name, r in data.items()]
  measure = "dev NLL of the split (nats)" if spec.nats else "dev PPL"
  plots.dev_ppl_curves({name: [[[p["minutes"], _measure(p, spec)] for p in r["dev_curve"]]]
                        for name, r in data.items()},
                       stem + ".png", f"{spec.title}: {measure} vs training minutes",
                       xlabel="training wall time (minutes)", ylabel=f"{measure} (log scale)")
  commands = "\n".join(r["command"] for r in data.values() if not r.get("ensemble"))
  ensembles = [r for r in data.values() if r.get("ensemble")]
  minutes = f"{spec.minutes:g}"
  text = (f"# {spec.title}\n\nGenerated by `python -m experiments.multi30k_recipe"
          + ("" if pilot == "recipe" else f" --pilot={pilot}") + f" --runs={runs}` from the runs "
          f"below ({minutes} minutes of training each, {spec.how}; "
          + ("dev NLL (per-token NLL x pieces: the vocabularies differ)" if spec.nats else
             "dev perplexity") + " on the whole dev split, teacher forced"
          + ("; dev sacreBLEU on all of it, beam 4" if averages else "")
          + "; the test split is not read). What they mean and the recipe chosen: `time_to_quality.md`.\n\n"
          + (f"Carried from this file's previous version (their workdirs were not in `{runs}`): "
             + ", ".join(carried) + ".\n\n" if carried else "")
          + "Trained (UTC): " + "; ".join(f"{n} {r['trained'][0]} to {r['trained'][1]}"
                                          for n, r in data.items() if "trained" in r)
          + f". Summary written on: {host['cpu']}, {host['cores']} cores (the runs' machine "
          "unless `time_to_quality.md` says otherwise).\n\n"
          + markdown.table(["recipe", "change", "steps", "s/step (median)"]
                           + [f"{measure} @{m:g} min (its evaluation's time)" for m in spec.marks]
                           + [f"{measure} at the end ({minutes} min)", f"{measure} @step {spec.step_mark}"]
                           + [f"dev sacreBLEU, avg {a}" if a > 1 else "dev sacreBLEU, last" for a in averages],
                           rows, digits=2)
          + f"\n![dev perplexity vs minutes]({spec.stem}.png)\n\nCommands"
          + _together(spec, data) + ":\n\n```\n" + commands + "\n```\n"
          + "".join("\nThe ensemble's dev evaluation, after both runs (and with `--average=A` for "
                    "each A in the table):\n\n```\n" + r["command"] + "\n```\n"
                    for r in ensembles))
  files.write_text(stem + ".md", text)
  return [stem + ".md", stem + ".json", stem + ".png"]


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", default="runs/m30k", help="folder holding one workdir per recipe")
  parser.add_argument("--pilot", default="recipe", choices=sorted(PILOTS))
  parser.add_argument("--out", default=report_run.RESULTS)
  parser.add_argument("--print_commands", action="store_true")
  args = parser.parse_args()
  if args.print_commands:
    print("\n".join(command(name, args.runs, args.pilot) for name in PILOTS[args.pilot].recipes))
  else:
    print("wrote " + ", ".join(write(args.runs, args.out, args.pilot)))
