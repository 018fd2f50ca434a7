"""Runs a sweep (experiments/table3.py, a grid, ...) row by row and writes a results table.

  # the Table 3 ablations on this CPU (Multi30k, reduced widths and steps; see table3_cpu.md)
  python -m experiments.run --sweep=experiments/table3.py --scale=cpu --out=runs/table3_cpu
  # some rows, with an override for every row
  python -m experiments.run --sweep=experiments/table3.py --scale=cpu --out=runs/t3 \
      --rows=base,A_* --config.train.num_steps=200
  # the per-row training commands only (validated, nothing run): plain CLI, sbatch or TPU VM
  python -m experiments.run --sweep=experiments/table3.py --scale=paper --out=/shared/t3 \
      --dry_run --launcher=slurm [--commands_file=t3.sh]
  # after training elsewhere (launch scripts): evaluate the finished rows and write the table
  python -m experiments.run --sweep=experiments/table3.py --scale=paper --out=/shared/t3 --eval_only
  # the table and plot again from the finished rows; the paper-scale parameter counts
  python -m experiments.run --report --out=runs/table3_cpu
  python -m experiments.run --params --sweep=experiments/table3.py

Every selected row is resolved and validated before anything runs (unknown keys, bad values,
inconsistent shapes, sharding divisibility): a mistake is one line `error: ...`, exit status 2.

Per row, in OUT/<row>/: the training CLI and an evaluation (`--eval_row`) in subprocesses, their
logs and result.json (experiments/row_runner.py): a rerun skips finished rows, resumes unfinished
ones and retries failed ones.
At the end (and with --report): OUT/<sweep>_<scale>.{md,csv,json,png} (experiments/sweep_report.py);
--publish=NAME also copies them to experiments/results/NAME.*.
"""

from __future__ import annotations

import os
import signal
import sys

from absl import app, flags, logging

from experiments import row_commands, row_runner, sweep_report, sweep_rows
from transformer_jax.config import ConfigError

_SWEEP = flags.DEFINE_string("sweep", None, "Sweep file, e.g. experiments/table3.py.")
_SCALE = flags.DEFINE_string("scale", "cpu", "Scale the rows are run at (paper, small, cpu, tiny).")
_OUT = flags.DEFINE_string("out", None, "Folder of the sweep: one workdir per row, the results.")
_ROWS = flags.DEFINE_string("rows", "", "Comma-separated row ids, shell patterns or groups "
                            "(e.g. 'base,A_*,C'); default all.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Validate every row, print the per-row commands, run nothing.")
flags.DEFINE_alias("print_commands", "dry_run")
_LAUNCHER = flags.DEFINE_enum("launcher", "local", list(row_commands.LAUNCHERS),
                              "Command form for --dry_run: the CLI, launch/slurm.sbatch or launch/tpu_vm.sh.")
_COMMANDS_FILE = flags.DEFINE_string("commands_file", "", "With --dry_run: also write the commands to this shell script.")
_REPORT = flags.DEFINE_bool("report", False, "Only regenerate the table and plot from OUT's finished rows.")
_PARAMS = flags.DEFINE_bool("params", False, "Only print the rows' exact parameter counts at the paper's scale.")
_EVAL_ONLY = flags.DEFINE_bool("eval_only", False, "Do not train: evaluate rows whose training finished (e.g. launched elsewhere).")
_BASE_CONFIG = flags.DEFINE_string("base_config", "", "Run-config file replacing the scale's (e.g. configs/tpu.py).")
_BLEU_SENTENCES = flags.DEFINE_integer("bleu_sentences", -1, "Dev sentences for BLEU (0: all; -1: the scale's).")
_ROW_TIMEOUT = flags.DEFINE_float("row_timeout_minutes", 0.0, "Stop a row's training after this long "
                                  "(checkpoint saved, recorded as unfinished; 0: no limit).")
_PUBLISH = flags.DEFINE_string("publish", "", "Also write the report to experiments/results/NAME.*.")
_EVAL_ROW = flags.DEFINE_string("eval_row", "", "(internal) Evaluate one trained row workdir.")

_CONFIG_ARGS: list[str] = []   # the --config.KEY=VALUE arguments, taken out before absl parses


def _sweep_record(sweep, scale_name, rows, user_overrides, base_config, argv,
                  with_params=True, out="") -> dict:
  """OUT/sweep.json: what the report needs (all rows of the sweep, the paper's values, the rows'
  exact parameter counts at the paper's scale: computed once, then kept from OUT/sweep.json)."""
  sc = sweep.scales[scale_name]
  params = {}
  previous = sweep_report.read_json(os.path.join(out, "sweep.json")) if out else None
  if previous and previous.get("spec") == sweep.spec and [
      r["row"] for r in previous.get("rows", []) if r.get("paper_scale_params")] == sweep_rows.row_ids(sweep):
    params = {r["row"]: {"params": r["paper_scale_params"]} for r in previous["rows"]}
  elif with_params and "paper" in sweep.scales:
    try:
      params = {p["row"]: p for p in row_commands.paper_params_table(sweep)}
    except ConfigError:
      params = {}
  return {
      "sweep": sweep.name, "spec": sweep.spec, "description": sweep.description,
      "scale": scale_name, "scale_description": sc.description,
      "base_config": base_config or sc.config, "base_config_flag": base_config,
      "user_overrides": user_overrides,
      "command": "python -m experiments.run " + row_commands.quote(argv[1:]),
      "rows": [{"row": r, "label": sweep.rows[r].label, "group": sweep.rows[r].group,
                "selected": r in rows,
                "paper": sweep.rows[r].paper.to_dict() if sweep.rows[r].paper is not None else None,
                "paper_hparams": sweep_rows.paper_columns(sweep, r),
                "paper_scale_params": params.get(r, {}).get("params")}
               for r in sweep_rows.row_ids(sweep)],
  }


def _check_out(out: str, record: dict) -> None:
  previous = sweep_report.read_json(os.path.join(out, "sweep.json"))
  if previous and (previous.get("sweep"), previous.get("scale")) != (record["sweep"], record["scale"]):
    raise ConfigError(f"--out={out} holds the sweep '{previous.get('sweep')}' at scale "
                      f"'{previous.get('scale')}'; use another --out for '{record['sweep']}' at "
                      f"'{record['scale']}'")


def _print_commands(resolved, out, launcher, commands_file, record):
  lines = [f"# {record['sweep']} at scale '{record['scale']}': {len(resolved)} rows "
           f"(config {record['base_config']})"]
  for res in resolved:
    workdir = os.path.join(out, res.row_id)
    lines.append(f"# {res.row_id}: {res.label}")
    lines.append(row_commands.quote(row_commands.train_command(res, workdir, launcher)))
  rows_flag = ",".join(r.row_id for r in resolved)
  follow = ["python", "-m", "experiments.run", f"--sweep={record['spec']}", f"--scale={record['scale']}",
            f"--out={out}", f"--rows={rows_flag}"]
  if record.get("base_config_flag"):
    follow.append(f"--base_config={record['base_config_flag']}")
  if launcher != "local":
    follow.append("--eval_only")
  follow += [f"--config.{k}={sweep_rows.format_value(v)}" for k, v in record["user_overrides"].items()]
  lines.append("# then evaluate the trained rows and write the table:" if launcher != "local"
               else "# the runner does all of the above, then evaluates each row:")
  lines.append(row_commands.quote(follow))
  text = "\n".join(lines) + "\n"
  print(text, end="")
  if commands_file:
    with open(commands_file, "w") as f:
      f.write("#!/usr/bin/env bash\nset -euo pipefail\ncd " + row_commands.quote([sweep_rows.REPO])
              + "\n" + text)
    os.chmod(commands_file, 0o755)


def _print_params(sweep):
  print("| row | params (exact, vocab 37000) | paper ×10^6 | difference |")
  print("|---|---|---|---|")
  for p in row_commands.paper_params_table(sweep):
    ref = p["paper_params_m"]
    diff = f"{p['params'] / 1e6 - ref:+.1f}M" if ref is not None else ""
    print(f"| {p['label']} | {p['params']:,} ({p['params_m']}M) | {'' if ref is None else ref} | {diff} |")


def main(argv):
  if not flags.FLAGS["verbosity"].present:  # as the training CLI: progress, warnings, errors
    logging.set_verbosity(logging.ERROR)
  try:
    if len(argv) > 1:
      raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
    user_overrides = sweep_rows.parse_overrides(_CONFIG_ARGS)
    if _EVAL_ROW.value:
      row_runner.evaluate_row(_EVAL_ROW.value, max(_BLEU_SENTENCES.value, 0))
      return
    if _REPORT.value:
      if not _OUT.value:
        raise ConfigError("--report needs --out")
      paths = sweep_report.write_report(_OUT.value, publish=_PUBLISH.value)
      print("wrote " + ", ".join(paths))
      return
    sweep = sweep_rows.load_sweep(_SWEEP.value)
    if _PARAMS.value:
      _print_params(sweep)
      return
    if not _OUT.value:
      raise ConfigError("--out is required (the folder of the sweep's row workdirs)")
    rows = sweep_rows.select_rows(sweep, _ROWS.value)
    resolved = sweep_rows.resolve_all(sweep, rows, _SCALE.value, user_overrides, _BASE_CONFIG.value)
    if _COMMANDS_FILE.value and not _DRY_RUN.value:
      raise ConfigError("--commands_file goes with --dry_run")
    record = _sweep_record(sweep, _SCALE.value, rows, user_overrides, _BASE_CONFIG.value, sys.argv,
                           with_params=not _DRY_RUN.value, out=_OUT.value)
    if _DRY_RUN.value:
      _print_commands(resolved, _OUT.value, _LAUNCHER.value, _COMMANDS_FILE.value, record)
      return
    _check_out(_OUT.value, record)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  signal.signal(signal.SIGTERM, row_runner.forward_sigterm)
  try:
    row_runner.run_sweep(resolved, _OUT.value, record, eval_only=_EVAL_ONLY.value,
                         bleu_sentences=_BLEU_SENTENCES.value, timeout_s=_ROW_TIMEOUT.value * 60)
  except KeyboardInterrupt:
    print("interrupted; rerun the same command to resume (finished rows are kept)", file=sys.stderr)
    sys.exit(130)
  paths = sweep_report.write_report(_OUT.value, publish=_PUBLISH.value)
  print("wrote " + ", ".join(paths))
  if row_runner.stop_requested():
    sys.exit(143)


def _parse_flags(argv):
  """absl flags, with the --config.KEY=VALUE overrides taken aside first."""
  rest = [argv[0]]
  for arg in argv[1:]:
    (_CONFIG_ARGS if arg.startswith("--config.") else rest).append(arg)
  try:
    return flags.FLAGS(rest)
  except flags.Error as e:
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
