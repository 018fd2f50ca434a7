"""Runs a study's sweep: every row with each of its seeds, then its report.

  python -m experiments.harness.runner --sweep=experiments/STUDY --scale=cpu --out=W \
      [--rows=base,A_*] [--seeds=0,1 --base_seeds=0,1,2] [--config.train.num_steps=200]
  python -m experiments.harness.runner --sweep=experiments/STUDY --scale=paper --out=/shared/t3 \
      --dry_run --launcher=slurm [--commands_file=t3.sh]   # the per-run commands, nothing run
  python -m experiments.harness.runner --sweep=experiments/STUDY --scale=paper --out=/shared/t3 \
      --eval_only                         # runs trained elsewhere: evaluate them, write the report
  python -m experiments.harness.runner --report --sweep=experiments/STUDY --scale=cpu
  python -m experiments.harness.runner --params --sweep=experiments/STUDY   # paper-scale params

Before anything runs, the study folder (or sweep file), every selected row and the results
folder are checked: a result file of another protocol (other steps, widths, learning
rate, ...) or a bad seed list is one line `error: ...`, exit status 2, nothing written.

Each (row, seed) trains in OUT/<row>/seed<k>/ with `--config.seed=<k>` (a whole run's
randomness), then the evaluation CLI scores its last checkpoint on the dev split (loss, NLL and
perplexity over the whole split; BLEU of beam search, no averaging, on the scale's first N). All runs share one vocabulary (OUT/_vocab), so perplexities compare. As soon as a
run is evaluated, its result file lands in the results folder (default
<study>/results/<sweep>_<scale>/<row>_seed<k>.json, to be committed; the dev references once
in references.json): written atomically, never overwritten (transformer_jax.runtime.results). A rerun skips every (row, seed) that
has a result file, even on a fresh clone whose OUT is empty; it resumes an unfinished run from
its checkpoints and retries a failed one (its error line is kept in OUT/<row>/seed<k>/status.json
and shown in the report; the sweep goes on). SIGTERM reaches the running subprocess and no
further run starts. The report (experiments/harness/report.py) is written at the end.

`--parallel=N` runs N (row, seed) pairs at a time on this host, each pinned to its own share of
the CPU cores (XLA's Eigen pool off on a one-core share): small models use two cores poorly,
so two one-core runs side by side do more steps per second than one two-core run
(experiments/results/sweep_parallel.md). Each result records its share
(`cpu_share`); the shared vocabulary is trained first, on every core (`--mode=vocab`).
`--cores=0,1` limits a sweep to those cores (split by `--parallel`), pinning its runs even one at
a time: e.g. `--cores=0` runs a second sweep on the core another leaves free.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import queue
import shlex
import signal
import sys
import threading
import time
from concurrent import futures

from absl import flags

from experiments.harness import records, report, resolve, study
from experiments.harness.processes import (STOP, cpu_shares, forward_sigterm, latest_step,
                                           prepare_vocab, run_workdir, share_vocab,
                                           subprocess_runner, training_done, vocab_cache)
from transformer_jax.runtime import cli
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import parse_overrides, REPO
from transformer_jax.runtime.results import read_json, write_json, write_once
from transformer_jax.training import workdir as workdir_lib

MODULE = "experiments.harness.runner"

_SWEEP = flags.DEFINE_string("sweep", None, "Study folder (experiments/<study>) or sweep file.")
_SCALE = flags.DEFINE_string("scale", "cpu", "Scale the rows are run at (paper, small, cpu, tiny).")
_OUT = flags.DEFINE_string("out", None, "Folder of the runs' workdirs (OUT/<row>/seed<k>).")
_ROWS = flags.DEFINE_string("rows", "", "Comma-separated row ids, shell patterns or groups "
                            "(e.g. 'base,A_*,C'); default all.")
_SEEDS = flags.DEFINE_string("seeds", None, "Seeds of every row but base, e.g. 0,1 (default: the scale's).")
_BASE_SEEDS = flags.DEFINE_string("base_seeds", None, "Seeds of the base row, e.g. 0,1,2 (default: the scale's).")
_RESULTS_DIR = flags.DEFINE_string("results_dir", "", "Folder of the result files (default "
                                   "<study>/results/<sweep>_<scale>); the report goes beside it.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Validate every row, print the per-run commands, run nothing.")
flags.DEFINE_alias("print_commands", "dry_run")
_LAUNCHER = flags.DEFINE_enum("launcher", "local", list(resolve.LAUNCHERS),
                              "Command form for --dry_run: the CLI, launch/slurm.sbatch or launch/tpu_vm.sh.")
_COMMANDS_FILE = flags.DEFINE_string("commands_file", "", "With --dry_run: also write the commands to this shell script.")
_REPORT = flags.DEFINE_bool("report", False, "Only write the report from the result files.")
_PARAMS = flags.DEFINE_bool("params", False, "Only print the rows' exact parameter counts at the paper's scale.")
_EVAL_ONLY = flags.DEFINE_bool("eval_only", False, "Do not train: evaluate runs whose training finished (e.g. launched elsewhere).")
_BASE_CONFIG = flags.DEFINE_string("base_config", "", "Run-config file replacing the scale's (e.g. configs/tpu.py).")
_BLEU_SENTENCES = flags.DEFINE_integer("bleu_sentences", -1, "Dev sentences for BLEU (0: all; -1: the scale's).")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs at a time, each on its own share of this "
                                 "host's CPU cores (see the module docstring).", lower_bound=1)
_CORES = flags.DEFINE_string("cores", "", "Comma-separated CPU cores this sweep's runs may use "
                             "(default: all of this process's), split by --parallel; given, runs "
                             "are pinned to them even one at a time, e.g. --cores=0 beside a sweep "
                             "on core 1.")
_ROW_TIMEOUT = flags.DEFINE_float("row_timeout_minutes", 0.0, "Stop a run's training after this long "
                                  "(checkpoint saved, recorded as unfinished; 0: no limit).")

# ----------------------------------------------------------------------------- one (row, seed)

def _result_path(results_dir: str, row_id: str, seed: int) -> str:
  return os.path.join(results_dir, f"{row_id}_seed{seed}.json")


def run_one(res: resolve.Resolved, seed: int, out: str, results_dir: str, protocol: dict, *,
            runner=subprocess_runner, eval_only: bool = False, timeout_s: float = 0.0,
            sweep_command: str = "", log=print, cpus: list[int] | None = None) -> dict:
  """Trains (or resumes) and evaluates one (row, seed), then writes its result file; returns
  {'row', 'seed', 'status' ('done', 'failed', 'unfinished'), 'error', 'stage'}. `cpus`: the
  cores its commands run on (None: all; run_sweep's --parallel)."""
  if cpus:
    runner = functools.partial(runner, cpus=cpus)
  name = f"{res.row_id}_seed{seed}"
  result_path = _result_path(results_dir, res.row_id, seed)
  if os.path.exists(result_path):
    log(f"  {name}: done earlier ({os.path.relpath(result_path)}), skipped")
    return {"row": res.row_id, "seed": seed, "status": "done", "error": "", "stage": ""}
  workdir = run_workdir(out, res.trained_as or res.row_id, seed)  # shared_training's
  os.makedirs(workdir, exist_ok=True)
  train_cmd = resolve.train_command(res, workdir, python=sys.executable, seed=seed)
  eval_cmd = resolve.eval_command(workdir, bleu_sentences=res.bleu_sentences,
                                  average=res.average, overrides=res.eval_overrides,
                                  python=sys.executable)
  settings = workdir_lib.settings_tag(parse_overrides(list(res.eval_overrides)))
  timing_path = os.path.join(workdir, "timing.json")
  timing = records.close_killed_attempt(
      dict({"train_seconds": 0.0, "train_attempts": 0, "eval_seconds": 0.0},
           **(read_json(timing_path) or {})), workdir)
  target = res.config.train.num_steps

  def finish(status, error="", stage=""):
    state = {"row": res.row_id, "seed": seed, "status": status, "error": error, "stage": stage,
             "steps": latest_step(workdir), "target_steps": target,
             "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    write_json(os.path.join(workdir, "status.json"), state)
    if error:
      log(f"  {name}: {status.upper() if status == 'failed' else status}: {error}")
    return state

  minutes = res.config.train.max_train_minutes
  if not eval_only and not training_done(workdir, res.config):
    share_vocab(out, workdir, res.config, "in")
    log(f"  {name}: training ({target} steps" + (f" or {minutes:g} minutes" if minutes else "")
        + f"), log {workdir}/train.log")
    start = timing["running_since"] = time.time()  # left behind if this process is killed
    write_json(timing_path, timing)
    rc, error = runner(train_cmd, os.path.join(workdir, "train.log"), timeout_s)
    del timing["running_since"]
    timing["train_seconds"] += time.time() - start
    timing["train_attempts"] += 1
    timing["cpu_share"] = cpus  # of the latest training attempt (None: all cores)
    write_json(timing_path, timing)
    if rc != 0:
      return finish("failed", error, "train")
  step = latest_step(workdir)
  if not training_done(workdir, res.config):
    return finish("unfinished", f"not trained yet (step {step or 0} of {target})" if eval_only
                  else f"training stopped at step {step or 0} of {target}; rerun to resume", "train")
  share_vocab(out, workdir, res.config, "out")
  log(f"  {name}: evaluating (dev loss/perplexity, BLEU on {res.bleu_sentences or 'all'} dev "
      f"sentences), log {workdir}/eval.log")

  def evaluate(cmd, at_step, log_name):
    """One evaluation of the checkpoint at `at_step` (a fresh report), timed into timing.json."""
    stem = workdir_lib.eval_stem(workdir, "validation", at_step, res.average, settings,
                                 bleu_sentences=res.bleu_sentences)
    if os.path.exists(stem + ".json"):
      os.remove(stem + ".json")
    start = time.time()
    rc, error = runner(cmd, os.path.join(workdir, log_name), 0.0)
    timing["eval_seconds"] += time.time() - start
    write_json(timing_path, timing)
    return rc, error, stem, read_json(stem + ".json")

  timing["eval_seconds"] = 0.0  # this attempt's
  rc, error, stem, evaluation = evaluate(eval_cmd, step, "eval.log")
  if rc != 0 or evaluation is None:
    return finish("failed", error or f"the evaluation wrote no {stem}.json", "eval")
  with open(stem + ".jsonl", encoding="utf-8") as f:
    sentences = [json.loads(l) for l in f if l.strip()][:evaluation.get("sentences") or None]
  references = {"split": "validation", "sentences": len(sentences),
                "references": [s["reference"] for s in sentences]}
  refs_path = os.path.join(results_dir, "references.json")
  if not write_once(refs_path, references) and read_json(refs_path) != references:
    return finish("failed", f"its dev references differ from {refs_path}", "eval")
  commands = {"sweep": sweep_command, "train": shlex.join(train_cmd), "eval": shlex.join(eval_cmd)}
  early = None
  if res.two_thirds_step:  # the kept checkpoint at two thirds of training, the same sentences
    early_cmd = resolve.eval_command(workdir, bleu_sentences=res.bleu_sentences,
                                     step=res.two_thirds_step, average=res.average,
                                     overrides=res.eval_overrides, python=sys.executable)
    log(f"  {name}: evaluating step {res.two_thirds_step} too (two thirds of training)")
    rc, error, _, early = evaluate(early_cmd, res.two_thirds_step, "eval_two_thirds.log")
    if rc != 0 or early is None:
      return finish("failed", error or f"no evaluation of step {res.two_thirds_step}", "eval")
    commands["eval_two_thirds"] = shlex.join(early_cmd)
  result = records.build_result(res, seed, protocol, workdir, evaluation, sentences, timing,
                                      commands, early)
  if not write_once(result_path, result):
    log(f"  {name}: {result_path} appeared meanwhile; kept")
  state = finish("done", stage="eval")
  scored = (f"F1 {result['f1']:.2f} ({result['repaired']} outputs repaired)" if "f1" in result
            else f"BLEU {result['bleu_tokenized']:.2f} (tokenized; sacreBLEU {result['bleu']:.2f})")
  log(f"  {name}: done: dev PPL {result['dev_ppl']:.2f}, {scored}, "
      f"{result['train_minutes']:.1f} min training")
  return state


def run_sweep(runs: list[tuple[resolve.Resolved, int]], out: str, results_dir: str,
              protocols: dict[str, dict], *, log=print, parallel: int = 1, cores: str = "",
              **run_args) -> list[dict]:
  """Every (row, seed), `parallel` at a time on `cores` (--cores; run_one's keyword arguments);
  a run's OSError is recorded, the rest go on."""
  os.makedirs(results_dir, exist_ok=True)
  start = time.time()
  lock, log_line = threading.Lock(), log

  def log(line):  # the parallel runs' lines whole, one at a time (print writes the newline apart)
    with lock:
      log_line(line)

  # None: every core; given --cores, runs are pinned to them even one at a time
  host = cpu_shares(parallel, cores) if parallel > 1 or cores else [None]
  every = sorted(sum(host, [])) if cores else None  # for the vocabulary and a lone first run
  todo = [i for i, (res, seed) in enumerate(runs)
          if not os.path.exists(_result_path(results_dir, res.row_id, seed))]
  if parallel > 1 and todo and not (run_args.get("eval_only") or STOP["requested"]):
    runner = run_args.get("runner", subprocess_runner)
    prepare_vocab(*runs[todo[0]], out, functools.partial(runner, cpus=every) if every else runner,
                  log)
  # If that failed, the first run to do trains the vocabulary alone on every core (with the
  # finished ones before it, which it skips).
  first = (todo[0] + 1 if parallel > 1 and todo
           and not os.path.isdir(vocab_cache(out, runs[todo[0]][0].config)) else 0)
  shares = queue.Queue()
  for share in [every] if first else host:
    shares.put(share)

  def one(i):
    res, seed = runs[i]
    if STOP["requested"]:
      return None
    share = shares.get()
    try:
      log(f"[{i + 1}/{len(runs)}] {res.row_id} seed {seed}: {res.label}"
          + (f" (cores {','.join(map(str, share))})" if share else ""))
      return run_one(res, seed, out, results_dir, protocols[res.row_id], log=log, cpus=share,
                     **run_args)
    except OSError as e:  # e.g. a full disk in one run's workdir
      log(f"  {res.row_id}_seed{seed}: FAILED: {e}")
      return {"row": res.row_id, "seed": seed, "status": "failed", "error": str(e), "stage": ""}
    finally:
      shares.put(share)

  results = [one(i) for i in range(first)]
  if first:
    shares.get()
    for share in host:
      shares.put(share)
  # Rows that share another's training (resolve.shared_training) start once every training
  # run is over, so that no two runs ever train one workdir at a time.
  shared = lambda i: runs[i][0].trained_as not in ("", runs[i][0].row_id)  # noqa: E731
  for phase in (False, True):
    with futures.ThreadPoolExecutor(max_workers=parallel) as pool:
      results += list(pool.map(one, [i for i in range(first, len(runs)) if shared(i) == phase]))
  if STOP["requested"]:
    log("stopped (SIGTERM); rerun the same command to resume")
  results = [r for r in results if r is not None]
  done = sum(r["status"] == "done" for r in results)
  log(f"{done} of {len(runs)} runs done ({(time.time() - start) / 60:.1f} min this time)")
  return results


# ----------------------------------------------------------------------------- the CLI

def _check_out(out: str, sweep_name: str, scale_name: str) -> None:
  """An OUT folder holds one sweep at one scale (OUT/sweep.json says which)."""
  path = os.path.join(out, "sweep.json")
  previous = read_json(path)
  if previous and (previous.get("sweep"), previous.get("scale")) != (sweep_name, scale_name):
    raise ConfigError(f"--out={out} holds the sweep '{previous.get('sweep')}' at scale "
                      f"'{previous.get('scale')}'; use another --out for '{sweep_name}' at "
                      f"'{scale_name}'")
  os.makedirs(out, exist_ok=True)
  write_json(path, {"sweep": sweep_name, "scale": scale_name})


def _print_commands(runs, out, launcher, commands_file, follow_args):
  lines = [f"# {len(runs)} runs (row x seed)"]
  for res, seed in runs:
    if res.trained_as not in ("", res.row_id):  # resolve.shared_training: nothing to train
      lines += [f"# {res.row_id} seed {seed}: {res.label}: scored on {res.trained_as}'s run"]
      continue
    lines += [f"# {res.row_id} seed {seed}: {res.label}", shlex.join(resolve.train_command(
        res, os.path.join(out, res.row_id, f"seed{seed}"), launcher, seed=seed))]
  follow = ["python", "-m", MODULE, *follow_args] + (
      ["--eval_only"] if launcher != "local" else [])
  lines += ["# then evaluate the trained runs and write the report:" if launcher != "local"
            else "# the runner does all of the above, then evaluates each run:", shlex.join(follow)]
  text = "\n".join(lines) + "\n"
  print(text, end="")
  if commands_file:
    with open(commands_file, "w") as f:
      f.write(f"#!/usr/bin/env bash\nset -euo pipefail\ncd {shlex.quote(REPO)}\n{text}")
    os.chmod(commands_file, 0o755)


def plan(sweep, scale_name: str, rows: list[str], user_overrides: dict, base_config: str,
         bleu_sentences: int, seeds, base_seeds, results_dir: str):
  """(runs [(Resolved, seed)], protocols {row: protocol}) after checking every selected row and
  the results folder (records.check_results_folder): a bad row or folder is a ConfigError."""
  resolved = {}

  def protocol(row_id):
    if row_id not in resolved:
      res = resolve.resolve_all(sweep, [row_id], scale_name, user_overrides, base_config)[0]
      if bleu_sentences >= 0:
        res = dataclasses.replace(res, bleu_sentences=bleu_sentences)
      resolved[row_id] = res
    return resolve.protocol(resolved[row_id], sweep)

  protocols = {r: protocol(r) for r in rows}
  records.check_results_folder(results_dir, sweep, protocol)
  runs = [(resolved[r], s) for r in rows
          for s in resolve.seeds_of(sweep, scale_name, r, seeds, base_seeds)]
  return runs, protocols


def planned_seeds(sweep, scale: str, seeds=None, base_seeds=None) -> dict[str, list[int]]:
  """The seeds the report plans for every row: the scale's, plus any the flags add (a run of
  --rows=X --seeds=1 that fills in one seed does not shrink what the others plan)."""
  return {r: sorted(set(resolve.seeds_of(sweep, scale, r))
                    | set(resolve.seeds_of(sweep, scale, r, seeds, base_seeds)))
          for r in study.row_ids(sweep)}


def report_command(spec: str, scale: str, seeds, base_seeds, results_dir: str,
                   changes: dict) -> str:
  """The `--report` command that writes this sweep's report again (`results_dir`: the flag's)."""
  args = ["--report", f"--sweep={spec}", f"--scale={scale}"]
  args += [f"--seeds={','.join(map(str, seeds))}"] if seeds is not None else []
  args += [f"--base_seeds={','.join(map(str, base_seeds))}"] if base_seeds is not None else []
  args += [f"--results_dir={os.path.relpath(os.path.abspath(results_dir), REPO)}"] if results_dir else []
  args += [f"--config.{k}={resolve.format_value(v)}" for k, v in changes.items()]
  return shlex.join(["python", "-m", MODULE, *args])


def report_settings(args: list[str]) -> dict:
  """The settings a recorded runner command's report resolves to at HEAD (for provenance)."""
  value = lambda name, default=None: next(  # noqa: E731
      (a.split("=", 1)[1] for a in reversed(args) if a.startswith(f"--{name}=")), default)
  sweep = study.load_sweep(value("sweep", ""))
  scale = value("scale", _SCALE.default)
  if scale not in sweep.scales:
    raise ConfigError(f"unknown scale {scale!r}; the sweep defines: {', '.join(sweep.scales.keys())}")
  seeds, base_seeds = (resolve.parse_seeds(value(f), f"--{f}") if value(f) is not None else None
                       for f in ("seeds", "base_seeds"))
  changes = parse_overrides([a for a in args if a.startswith("--config.")])
  return resolve.sweep_settings(sweep, scale, planned_seeds(sweep, scale, seeds, base_seeds),
                                changes)


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  user_overrides = parse_overrides(cli.OVERRIDE_ARGS)
  sweep = study.load_sweep(_SWEEP.value)
  if _PARAMS.value:
    print(report.params_markdown(sweep), end="")
    return
  scale = _SCALE.value
  seeds = resolve.parse_seeds(_SEEDS.value, "--seeds") if _SEEDS.value is not None else None
  base_seeds = (resolve.parse_seeds(_BASE_SEEDS.value, "--base_seeds")
                if _BASE_SEEDS.value is not None else None)
  results_dir = os.path.abspath(_RESULTS_DIR.value or study.default_results_dir(sweep, scale))
  for flag, folder in (("--out", _OUT.value), ("--results_dir", results_dir)):
    if folder and os.path.exists(folder) and not os.path.isdir(folder):
      raise ConfigError(f"{flag}={folder} is a file; it must name a folder")
  rows = study.select_rows(sweep, _ROWS.value)
  runs, protocols = plan(sweep, scale, rows, user_overrides, _BASE_CONFIG.value,
                         _BLEU_SENTENCES.value, seeds, base_seeds, results_dir)
  planned = planned_seeds(sweep, scale, seeds, base_seeds)
  write = lambda out: print("wrote " + ", ".join(report.write_report(  # noqa: E731
      sweep, scale, results_dir, planned, out=out, changes=user_overrides,
      command=report_command(sweep.spec, scale, seeds, base_seeds, _RESULTS_DIR.value,
                             user_overrides))))
  if _REPORT.value:
    write(_OUT.value or "")
    return
  if not _OUT.value:
    raise ConfigError("--out is required (the folder of the runs' workdirs)")
  if _COMMANDS_FILE.value and not _DRY_RUN.value:
    raise ConfigError("--commands_file goes with --dry_run")
  out = _OUT.value
  if _DRY_RUN.value:
    follow = [a for a in sys.argv[1:] if not a.startswith(("--dry_run", "--print_commands",
                                                            "--launcher", "--commands_file"))]
    _print_commands(runs, out, _LAUNCHER.value, _COMMANDS_FILE.value, follow)
    return
  cpu_shares(_PARALLEL.value, _CORES.value)  # too many runs or bad cores: one line, nothing written
  _check_out(out, sweep.name, scale)
  signal.signal(signal.SIGTERM, forward_sigterm)
  try:
    run_sweep(runs, out, results_dir, protocols, eval_only=_EVAL_ONLY.value,
              timeout_s=_ROW_TIMEOUT.value * 60, parallel=_PARALLEL.value,
              cores=_CORES.value,
              sweep_command=f"python -m {MODULE} " + shlex.join(sys.argv[1:]))
  except KeyboardInterrupt:
    print("interrupted; rerun the same command to resume (finished runs are kept)", file=sys.stderr)
    sys.exit(130)
  write(out)
  if STOP["requested"]:
    sys.exit(143)


if __name__ == "__main__":
  cli.run(main)
