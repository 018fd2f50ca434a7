"""One run on every core, or one run per core side by side: train steps per second of a sweep
row on this host (the measurement behind `python -m experiments.run --parallel`).

  python -m benchmarks.parallel_runs [--row=base --scale=cpu --batch=20x100 --steps=30]
  -> experiments/results/sweep_parallel.{md,json}

The row's model at the scale (experiments/row_runs.py) is timed by the train-step benchmark
(`python -m benchmarks --only=train`: compile, warm-up, then the median of --steps steps) in
three set-ups: one process on every core; one process pinned to one core with XLA's Eigen pool
off; and one such process per core, all at once (what `--parallel` runs). Throughput is steps
per second summed over the processes. Run it on an idle machine (each benchmark's JSON, kept in
the result's `setups`, records the load it saw).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from concurrent import futures

from absl import flags

from experiments import local_runner, row_runs, sweeps
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.markdown import table
from transformer_jax.runtime.overrides import REPO, load_config_file

from benchmarks import report

RESULTS = os.path.join(REPO, "experiments", "results", "sweep_parallel")
BENCH_CONFIG = "configs/multi30k.py"  # what `--train=multi30k:...` builds before the overrides
# Its own flag set: tests import this module beside entry points that define the same names.
FLAGS = flags.FlagValues()
flags.DEFINE_string("sweep", "experiments/table3.py", "Sweep file.", flag_values=FLAGS)
flags.DEFINE_string("row", "base", "Row of the sweep to time.", flag_values=FLAGS)
flags.DEFINE_string("scale", "cpu", "Scale of the row.", flag_values=FLAGS)
flags.DEFINE_string("batch", "20x100", "ROWSxLENGTH of a packed batch (the scale's).",
                    flag_values=FLAGS)
flags.DEFINE_integer("steps", 30, "Timed steps per benchmark.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_string("out", RESULTS, "Result files OUT.{md,json}.", flag_values=FLAGS)
flags.DEFINE_string("notes", "", "Circumstances worth recording (e.g. what was paused).",
                    flag_values=FLAGS)


def model_overrides(res: row_runs.Resolved) -> list[str]:
  """--config.model.* flags turning the benchmark's model into the row's (every key that differs
  from BENCH_CONFIG's, whatever config file the row's scale pins)."""
  bench = row_runs.flatten(load_config_file(BENCH_CONFIG).model)
  return [f"--config.model.{k}={row_runs.format_value(v)}"
          for k, v in row_runs.flatten(res.config.model).items() if bench.get(k) != v]


def _bench(args, overrides, folder, name, cpus):
  """One benchmark process; returns its train entry (step times) and load record."""
  out = os.path.join(folder, name)
  cmd = [sys.executable, "-m", "benchmarks", "--only=train", f"--train=multi30k:{args.batch}",
         f"--steps={args.steps}", "--warmup=3", f"--out={out}", *overrides]
  rc, error = local_runner.subprocess_runner(cmd, out + ".log", cpus=cpus)
  if rc:
    raise SystemExit(f"error: {' '.join(cmd)} failed: {error} (log {out}.log)")
  with open(out + ".json") as f:
    result = json.load(f)
  entry = result["train"][0]
  return {"cores": cpus, "step_s_median": entry["step_s"]["median"], "mfu": entry["mfu"],
          "load_before": result.get("load_before"), "command": " ".join(["python", *cmd[1:]])}


def _side_by_side(args, overrides, folder, name, shares):
  """One benchmark process per share of cores, all at once."""
  with futures.ThreadPoolExecutor(max_workers=len(shares)) as pool:
    return list(pool.map(lambda i: _bench(args, overrides, folder, f"{name}{i}", shares[i]),
                         range(len(shares))))


def main(argv=None) -> None:
  FLAGS.unparse_flags()  # each call parses its own arguments only
  try:
    FLAGS(argv or sys.argv)
    res = row_runs.resolve(sweeps.load_sweep(FLAGS.sweep), FLAGS.row, FLAGS.scale)
  except (flags.Error, ConfigError) as e:
    raise SystemExit(f"error: {str(e).splitlines()[0]}") from None
  command = "python -m benchmarks.parallel_runs " + " ".join(
      f"--{k}={FLAGS[k].value}" for k in ("sweep", "row", "scale", "batch", "steps", "notes")
      if FLAGS[k].value != "")
  record = report.start(command)
  overrides = model_overrides(res)
  one_core = local_runner.cpu_shares(len(os.sched_getaffinity(0)))
  with tempfile.TemporaryDirectory() as folder:
    setups = [("one run, every core", [_bench(FLAGS, overrides, folder, "all", None)]),
              ("one run, one core", [_bench(FLAGS, overrides, folder, "one", one_core[0])]),
              (f"{len(one_core)} runs side by side, one core each",
               _side_by_side(FLAGS, overrides, folder, "pair", one_core))]
  base = 1 / setups[0][1][0]["step_s_median"]
  rows = [{"setup": name, "processes": procs,
           "steps_per_s": sum(1 / r["step_s_median"] for r in procs)} for name, procs in setups]
  for r in rows:
    r["vs_one_run_every_core"] = r["steps_per_s"] / base
  record.update(row=FLAGS.row, scale=FLAGS.scale, batch=FLAGS.batch, overrides=overrides,
                notes=FLAGS.notes, setups=rows)
  report.finish(record)
  text = "\n".join(report.header("Sweep runs: one on every core, or one per core side by side",
                                  record) + [
      f"Row `{FLAGS.row}` at scale `{FLAGS.scale}` ({' '.join(overrides)}), packed batches of "
      f"{FLAGS.batch}; each s/step is the train-step benchmark's median (`python -m benchmarks "
      "--only=train`). One core = pinned, XLA's Eigen pool off (`experiments.run --parallel`).",
      "", table(["set-up", "s/step (median, per process)", "steps/s (all processes)",
                 "vs one run on every core"],
                [[r["setup"], ", ".join(f"{p['step_s_median']:.3f}" for p in r["processes"]),
                  f"{r['steps_per_s']:.2f}", f"{r['vs_one_run_every_core']:.2f}x"] for r in rows]),
      *([FLAGS.notes, ""] if FLAGS.notes else [])])
  report.write(record, text, FLAGS.out)


if __name__ == "__main__":
  main()
