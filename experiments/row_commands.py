"""What a resolved sweep row is run and reported with: its training command (the CLI itself,
or through launch/slurm.sbatch or launch/tpu_vm.sh), and the rows' exact parameter counts at
the paper's scale.
"""

from __future__ import annotations

import re
import shlex

import ml_collections

from experiments.sweep_rows import Resolved, resolve, row_ids
from transformer_jax.config import ConfigError

LAUNCHERS = ("local", "slurm", "tpu_vm")


# ----------------------------------------------------------------------------- commands

def quote(args: list[str]) -> str:
  return " ".join(shlex.quote(a) for a in args)


def train_command(res: Resolved, workdir: str, launcher: str = "local",
                  python: str = "python") -> list[str]:
  """The command that trains one row: the CLI itself, or through launch/slurm.sbatch or tpu_vm.sh."""
  flags_ = [f"--config={res.config_spec}", f"--workdir={workdir}", *res.overrides]
  if launcher == "local":
    return [python, "-m", "transformer_jax.main", *flags_]
  if launcher == "slurm":
    return ["sbatch", f"--job-name=tj-{res.row_id}", "launch/slurm.sbatch", res.config_spec,
            workdir, *res.overrides]
  if launcher == "tpu_vm":
    name = "tj-" + re.sub(r"[^a-z0-9-]", "-", res.row_id.lower())
    return ["launch/tpu_vm.sh", "--name", name, res.config_spec, workdir, "--", *res.overrides]
  raise ConfigError(f"unknown launcher {launcher!r}; expected one of {', '.join(LAUNCHERS)}")


# ----------------------------------------------------------------------------- parameters

def paper_params_table(sweep: ml_collections.ConfigDict, rows: list[str] | None = None,
                       scale_name: str = "paper") -> list[dict]:
  """Exact parameter counts of the rows at the paper's scale (vocab 37000), beside the paper's."""
  from transformer_jax.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from transformer_jax.params import count_params  # pylint: disable=g-import-not-at-top
  table = []
  base_paper = None
  if "base" in sweep.rows and sweep.rows.base.paper is not None:
    base_paper = sweep.rows.base.paper.params_m
  for r in rows or row_ids(sweep):
    res = resolve(sweep, r, scale_name)
    count = count_params(ModelConfig.from_config(res.config.model))
    paper = sweep.rows[r].paper
    reported = paper.params_m if paper is not None else None
    table.append({"row": r, "label": res.label, "params": count,
                  "params_m": round(count / 1e6, 1), "paper_params_m": reported,
                  "paper_params_m_or_base": reported if reported is not None else
                  (base_paper if paper is not None else None)})
  return table
