"""One run on every core, or one run per core side by side: train steps per second of a sweep
row on this host (what decides whether the sweep runner's `--parallel` pays).

  python -m benchmarks.parallel_runs [--sweep=experiments/table3 --row=base --scale=cpu \
      --batch=20x100 --steps=30]
  -> experiments/results/sweep_parallel.{md,json}

The row's model at the scale (experiments/harness/resolve.py) is timed by the train-step benchmark
(`python -m benchmarks --only=train`: compile, warm-up, then the median of --steps steps) in
three set-ups: one process on every core; one process pinned to one core with XLA's Eigen pool
off; and one such process per core, all at once (what `--parallel` runs). Throughput is steps
per second summed over the processes. Run it on an idle machine (each benchmark's JSON, kept in
the result's `setups`, records the load it saw).
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from concurrent import futures

from absl import flags

from experiments.harness import processes, study
from experiments.harness.resolve import format_value, resolve as resolve_row, Resolved
from transformer_jax.runtime import cli, dotted, results
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.markdown import table
from transformer_jax.runtime.overrides import load_config_file, parse_overrides, REPO

from benchmarks import report, settings as settings_lib, train_step

RESULTS = os.path.join(REPO, "experiments", "results", "sweep_parallel")
BENCH_CONFIG = "configs/multi30k.py"  # what `--train=multi30k:...` builds before the overrides
WARMUP = 3  # untimed steps of each benchmark process after compiling


def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values` (FLAGS when it runs; a fresh set to resolve a recorded
  command)."""
  def define(kind, name, default, help_text, **kwargs):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values, **kwargs)
  define("string", "sweep", "experiments/table3", "Study folder or sweep file.")
  define("string", "row", "base", "Row of the sweep to time.")
  define("string", "scale", "cpu", "Scale of the row.")
  define("string", "batch", "20x100", "ROWSxLENGTH of a packed batch (the scale's).")
  define("integer", "steps", 30, "Timed steps per benchmark.", lower_bound=1)
  define("string", "out", RESULTS, "Result files OUT.{md,json}.")
  define("string", "notes", "", "Circumstances worth recording (e.g. what was paused).")


# Its own flag set: tests import this module beside entry points that define the same names.
FLAGS = flags.FlagValues()
define_flags(FLAGS)


def model_overrides(res: Resolved) -> list[str]:
  """--config.model.* flags turning the benchmark's model into the row's (every key that differs
  from BENCH_CONFIG's, whatever config file the row's scale pins)."""
  bench = dotted.flatten(load_config_file(BENCH_CONFIG).model)
  return [f"--config.model.{k}={format_value(v)}"
          for k, v in dotted.flatten(res.config.model).items() if bench.get(k) != v]


def row_settings(values: flags.FlagValues) -> tuple[list[str], dict]:
  """(the model overrides of the row at its scale, what a run with these flags measures:
  benchmarks/settings.py)."""
  try:
    res = resolve_row(study.load_sweep(values.sweep), values.row, values.scale)
  except ConfigError as e:
    raise ConfigError(f"benchmarks.parallel_runs: {e}") from None
  overrides = model_overrides(res)
  config = train_step.train_config("multi30k", parse_overrides(overrides))[0]
  train_step.check_fits(config, train_step.parse_shape(values.batch)[1])
  own = {k: values[k].value for k in ("sweep", "row", "scale", "batch", "steps")}
  own.update(warmup=WARMUP, overrides=overrides)
  return overrides, settings_lib.normalized({
      **settings_lib.benchmark_settings(own),
      **settings_lib.config_settings("train:multi30k", config)})


def settings(values: flags.FlagValues, override_args) -> dict:
  """What a run with these flags measures (benchmarks/settings.py)."""
  if override_args:
    raise ConfigError(f"benchmarks.parallel_runs takes no config overrides (the row sets the "
                      f"model): {' '.join(override_args)}")
  return row_settings(values)[1]


def _bench(args, overrides, folder, name, cpus):
  """One benchmark process; returns its train entry (step times) and load record."""
  out = os.path.join(folder, name)
  cmd = [sys.executable, "-m", "benchmarks", "--only=train", f"--train=multi30k:{args.batch}",
         f"--steps={args.steps}", f"--warmup={WARMUP}", f"--out={out}", *overrides]
  rc, error = processes.subprocess_runner(cmd, out + ".log", cpus=cpus)
  if rc:
    raise SystemExit(f"error: {' '.join(cmd)} failed: {error} (log {out}.log)")
  result = results.read_json(out + ".json")
  if result is None:
    raise SystemExit(f"error: {' '.join(cmd)} wrote no readable {out}.json (log {out}.log)")
  entry = result["train"][0]
  return {"cores": cpus, "step_s_median": entry["step_s"]["median"], "mfu": entry["mfu"],
          "load_before": result.get("load_before"), "command": " ".join(["python", *cmd[1:]])}


def _side_by_side(args, overrides, folder, name, shares):
  """One benchmark process per share of cores, all at once."""
  with futures.ThreadPoolExecutor(max_workers=len(shares)) as pool:
    return list(pool.map(lambda i: _bench(args, overrides, folder, f"{name}{i}", shares[i]),
                         range(len(shares))))


def main(argv=None) -> None:
  """The benchmark for `argv` (program name first; default this process's); a mistake in the
  flags or the row is a ConfigError."""
  argv = argv or sys.argv
  measure(cli.parse_or_raise(argv, FLAGS, overrides=False), argv)


def measure(extra, argv=None) -> None:
  """The benchmark, once FLAGS are parsed (`extra`: the arguments left, program name first)."""
  argv = argv or sys.argv
  if len(extra) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(extra[1:])}")
  overrides, recorded_settings = row_settings(FLAGS)
  record = report.start(shlex.join(["python", "-m", "benchmarks.parallel_runs", *argv[1:]]),
                        recorded_settings)
  one_core = processes.cpu_shares(len(os.sched_getaffinity(0)))
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
      "--only=train`). One core = pinned, XLA's Eigen pool off (the sweep runner's `--parallel`).",
      "", table(["set-up", "s/step (median, per process)", "steps/s (all processes)",
                 "vs one run on every core"],
                [[r["setup"], ", ".join(f"{p['step_s_median']:.3f}" for p in r["processes"]),
                  f"{r['steps_per_s']:.2f}", f"{r['vs_one_run_every_core']:.2f}x"] for r in rows]),
      *([FLAGS.notes, ""] if FLAGS.notes else [])])
  report.write(record, text, FLAGS.out)


if __name__ == "__main__":
  cli.run(measure, flag_values=FLAGS, overrides=False)
