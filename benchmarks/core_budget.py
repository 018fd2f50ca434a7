"""A time budget on every core, or one run per core decoded as an ensemble: what a config's
`train.max_train_minutes` buys on this host's cores, scored by the task's headline metric.

  python -m benchmarks.core_budget --config=configs/wsj_parsing.py:sample --workdir=W \
      [--split=validation] [--cores=0,1] [--out=experiments/results/core_budget_wsj_sample]

Two set-ups train the config for its time budget on the same cores:
- `every core`: one run (seed 0) on all the cores, XLA's Eigen pool on (WORKDIR/every_core);
- `one core each`: one run per core (seeds 0, 1, ...), side by side, each pinned to its core with
  the Eigen pool off, as the sweep runner's `--parallel` (WORKDIR/one_core_seed<k>), all from one
  vocabulary, then decoded together as an ensemble (`--ensemble`: the mean of their next-token
  probabilities), and each alone.
The evaluation CLI scores every run and the ensemble on `--split` (the one evaluation path; its
reports land in each workdir's eval/), each against the every-core run by the task's paired
bootstrap (`--compare`). A run already trained in WORKDIR is not trained again, so an
interrupted benchmark resumes; the budget is wall time, so run it on an otherwise idle machine.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
from concurrent import futures

from absl import flags

from experiments.harness import processes, resolve
from transformer_jax.inference.evaluate import ensemble_tag
from transformer_jax.runtime import cli, files as files_lib, overrides as overrides_lib, results
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.markdown import table
from transformer_jax.tasks import registry
from transformer_jax.training import workdir as workdir_lib

from benchmarks import report, settings as settings_lib

EVERY_CORE = "every_core"


def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values` (FLAGS when it runs; a fresh set to resolve a recorded
  command)."""
  def define(kind, name, default, help_text, **kwargs):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values, **kwargs)
  define("string", "config", None, "Run config with a time budget (train.max_train_minutes), "
         "e.g. configs/wsj_parsing.py:sample.")
  define("string", "workdir", None, "Folder of the runs (resumed where already trained).")
  define("string", "split", "validation", "Configured split every run is scored on.")
  define("integer", "average", 0, "Score each run's average of its last K checkpoints (0: the "
         "newest alone).", lower_bound=0)
  define("string", "cores", "", "Comma-separated CPU cores both set-ups use (default: all of "
         "this process's).")
  define("string", "out", "", "Result files OUT.{md,json} (default experiments/results/"
         "core_budget_<config name>).")
  define("string", "notes", "", "Circumstances worth recording (e.g. what else ran).")


# Its own flag set: tests import this module beside entry points that define the same names.
FLAGS = flags.FlagValues()
define_flags(FLAGS)


def _config(values: flags.FlagValues, override_args):
  if not values.config:
    raise ConfigError("benchmarks.core_budget: --config is required (a run config with "
                      "train.max_train_minutes)")
  config = overrides_lib.load(values.config, override_args)
  if not config.train.max_train_minutes > 0:
    raise ConfigError(f"--config={values.config}: config key 'train.max_train_minutes' is "
                      f"{config.train.max_train_minutes:g}; the set-ups share a time budget")
  return config


def settings(values: flags.FlagValues, override_args) -> dict:
  """What a run with these flags measures (benchmarks/settings.py): the run config with its
  overrides, the split, the averaging and the cores."""
  config = _config(values, override_args)
  own = {k: values[k].value for k in ("config", "split", "average", "cores")}
  own["overrides"] = list(override_args)
  return settings_lib.normalized({**settings_lib.benchmark_settings(own),
                                  **settings_lib.config_settings("train", config)})


def default_out(config_spec: str) -> str:
  """experiments/results/core_budget_<file>[_<variant>] for configs/<file>.py[:<variant>]."""
  path, _, variant = config_spec.partition(":")
  stem = os.path.splitext(os.path.basename(path))[0] + (f"_{variant}" if variant else "")
  return os.path.join(overrides_lib.REPO, "experiments", "results", f"core_budget_{stem}")


def _train(spec, overrides, workdir, seed, config, cpus):
  """Trains one run unless its checkpoints already hold the budget; returns its steps and the
  training minutes its newest checkpoint records."""
  if not processes.training_done(workdir, config):
    cmd = [sys.executable, "-m", "transformer_jax.main", f"--config={spec}",
           f"--workdir={workdir}", f"--config.seed={seed}", *overrides]
    rc, error = processes.subprocess_runner(cmd, os.path.join(workdir, "train.log"), cpus=cpus)
    if rc:
      raise SystemExit(f"error: training {workdir} failed: {error} (log {workdir}/train.log)")
  step = processes.latest_step(workdir)
  return {"steps": step, "train_minutes": processes.trained_seconds(workdir, step) / 60.0}


def _evaluate(workdir, values, cpus, *, ensemble=(), compare=""):
  """The evaluation CLI on `workdir`'s newest checkpoint (with `ensemble`'s members, against
  `compare`); its report."""
  step = processes.latest_step(workdir)
  cmd = resolve.eval_command(workdir, values.split, step=None if ensemble else step,
                             average=values.average, python=sys.executable)  # newest each
  cmd += ([f"--ensemble={','.join(ensemble)}"] if ensemble else []) + (
      [f"--compare={compare}"] if compare else [])
  rc, error = processes.subprocess_runner(cmd, os.path.join(workdir, "eval.log"), cpus=cpus)
  if rc:
    raise SystemExit(f"error: evaluating {workdir} failed: {error} (log {workdir}/eval.log)")
  path = workdir_lib.eval_stem(workdir, values.split, step, values.average,
                               settings=ensemble_tag(ensemble)) + ".json"
  found = results.read_json(path)
  if found is None:
    raise SystemExit(f"error: the evaluation of {workdir} wrote no readable {path}")
  return found


def _stop_if_asked(root):
  """After SIGTERM: the runs have checkpointed; a rerun resumes them."""
  if processes.STOP["requested"]:
    raise SystemExit(f"stopped (SIGTERM): the runs in {root} resume when the command is rerun")


def _pool(fn, items):
  """fn over items, one thread each (a pinned command pins only its own thread)."""
  with futures.ThreadPoolExecutor(max_workers=len(items)) as pool:
    return list(pool.map(fn, items))


def measure(extra, argv=None) -> None:
  """The benchmark, once FLAGS are parsed (`extra`: the arguments left, program name first)."""
  argv = argv or sys.argv
  if len(extra) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(extra[1:])}")
  overrides = list(cli.OVERRIDE_ARGS)
  config = _config(FLAGS, overrides)
  if not FLAGS.workdir:
    raise ConfigError("benchmarks.core_budget: --workdir is required (where the runs train)")
  if FLAGS.split not in ("validation", "test") or (FLAGS.split == "test"
                                                   and not config.data.test_files):
    raise ConfigError(f"--split={FLAGS.split}: --config={FLAGS.config} configures no such split "
                      "(validation, or test where config key 'data.test_files' is set)")
  task = registry.get(config)
  key, name = task.dev_metrics[0][1], task.score_name
  chosen = sorted(sum(processes.cpu_shares(1, FLAGS.cores), []))
  if len(chosen) < 2:
    raise ConfigError(f"benchmarks.core_budget needs two or more CPU cores; it may use "
                      f"{len(chosen)}")
  every = chosen if FLAGS.cores else None  # None: not pinned at all
  record = report.start(shlex.join(["python", "-m", "benchmarks.core_budget", *argv[1:]]),
                        settings(FLAGS, overrides))
  root = files_lib.resolve(FLAGS.workdir)
  singles = [os.path.join(root, f"one_core_seed{k}") for k in range(len(chosen))]
  every_dir = os.path.join(root, EVERY_CORE)
  for d in [every_dir, *singles]:
    os.makedirs(d, exist_ok=True)
  vocab = os.path.join(singles[0], "vocab")
  if not os.path.isdir(vocab):  # one vocabulary for all, so that the runs ensemble
    cmd = [sys.executable, "-m", "transformer_jax.main", "--mode=vocab",
           f"--config={FLAGS.config}", f"--workdir={singles[0]}", *overrides]
    rc, error = processes.subprocess_runner(cmd, os.path.join(singles[0], "train.log"),
                                            cpus=every)
    if rc:
      raise SystemExit(f"error: the vocabulary of {singles[0]} failed: {error}")
  for d in [every_dir, *singles[1:]]:
    if not os.path.exists(os.path.join(d, "vocab")):
      shutil.copytree(vocab, os.path.join(d, "vocab"))

  signal.signal(signal.SIGTERM, processes.forward_sigterm)  # the runs checkpoint and stop
  trained = _pool(lambda k: _train(FLAGS.config, overrides, singles[k], k, config, [chosen[k]]),
                  range(len(chosen)))
  _stop_if_asked(root)
  trained_every = _train(FLAGS.config, overrides, every_dir, 0, config, every)
  _stop_if_asked(root)
  every_report = _evaluate(every_dir, FLAGS, every)
  single_reports = _pool(lambda k: _evaluate(singles[k], FLAGS, [chosen[k]], compare=every_dir),
                         range(len(chosen)))
  ensemble_report = _evaluate(singles[0], FLAGS, every, ensemble=singles[1:], compare=every_dir)

  metrics = [(n, k) for n, k in task.dev_metrics]

  def row(setup, runs, rep):
    compared = (rep.get("compare") or {}).get(key) or {}
    return {"setup": setup, "runs": runs, "scores": {k: rep.get(k) for _, k in metrics},
            "perplexity": rep.get("perplexity"), "sentences": rep.get("sentences"),
            "decode_seconds": rep.get("decode_seconds"),
            "delta_vs_every_core": compared.get("delta"), "p_value": compared.get("p_value")}

  rows = [row("every core, one run", [dict(trained_every, workdir=every_dir, cores=every)],
              every_report)]
  rows += [row(f"one core, run {k} alone", [dict(trained[k], workdir=singles[k], cores=[c])],
               single_reports[k]) for k, c in enumerate(chosen)]
  rows.append(row(f"one core each, {len(chosen)} runs as an ensemble",
                  [dict(t, workdir=d, cores=[c]) for t, d, c in zip(trained, singles, chosen)],
                  ensemble_report))
  record.update(config=FLAGS.config, overrides=overrides, split=FLAGS.split, cores=chosen,
                budget_minutes=config.train.max_train_minutes, score_name=name, score_key=key,
                notes=FLAGS.notes, setups=rows)
  report.finish(record)
  out = FLAGS.out or default_out(FLAGS.config)
  report.write(record, markdown(record, metrics), out)


def markdown(r: dict, metrics) -> str:
  """The result's report."""
  fmt = lambda v, spec=".2f": "n/a" if v is None else format(v, spec)  # noqa: E731
  body = [[s["setup"], "/".join(str(x["steps"]) for x in s["runs"]),
           "/".join(f"{x['train_minutes']:.1f}" for x in s["runs"]),
           *[fmt(s["scores"][k]) for _, k in metrics], fmt(s["perplexity"], ".3f"),
           fmt(s["delta_vs_every_core"], "+.2f"), fmt(s["p_value"], ".3f")] for s in r["setups"]]
  return "\n".join(report.header("A time budget on every core, or one run per core as an "
                                 "ensemble", r) + [
      f"`{r['config']}`{' ' + ' '.join(r['overrides']) if r['overrides'] else ''}: "
      f"{r['budget_minutes']:g} minutes of training on cores {','.join(map(str, r['cores']))}, "
      f"either one run on all of them or one run per core side by side (pinned, XLA's Eigen "
      f"pool off); each scored on the {r['split']} split ({r['setups'][0]['sentences']} "
      f"sentences) by the evaluation CLI. Δ and p: the task's paired bootstrap of "
      f"{r['score_name']} against the every-core run.", "",
      table(["set-up", "steps", "train minutes", *[n for n, _ in metrics], "perplexity",
             "Δ vs every core", "p"], body),
      *([r["notes"], ""] if r["notes"] else [])]).rstrip("\n") + "\n"


def main(argv=None) -> None:
  """The benchmark for `argv` (program name first; default this process's)."""
  argv = argv or sys.argv
  measure(cli.parse_or_raise(argv, FLAGS), argv)


if __name__ == "__main__":
  cli.run(measure, flag_values=FLAGS)
