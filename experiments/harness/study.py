"""A study: a folder of experiments/ holding its sweep, README and results; loading and choosing.

  experiments/<study>/
    README.md     what it asks, the command, the machine, the headline result
    sweep.py      get_config(): the sweep (experiments/harness/define.py)
    protocol.py   the run config its scales train (when no shared config fits)
    report.py     sections(sweep, rows, scale_name): its own report sections (named by the sweep)
    results/      <sweep>_<scale>/ (one file per run) and the reports beside it

`--sweep=experiments/<study>` names a study by its folder; `--sweep=FILE.py` loads a sweep
file anywhere (its results go to experiments/results/). A study's sweep may set
`FORMER_PATHS` ({path a committed result recorded: the path now}) so that provenance reads the
commands of results that ran before a file moved.
"""

from __future__ import annotations

import fnmatch
import glob
import importlib
import os

import ml_collections

from transformer_jax.runtime.config import did_you_mean
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import load_python_file, REPO, split_variant

SWEEP_FILE = "sweep.py"
README = "README.md"
EXPERIMENTS = os.path.join(REPO, "experiments")


def _on_disk(path: str) -> str:
  return path if os.path.isabs(path) or os.path.exists(path) else os.path.join(REPO, path)


def study_folder(spec: str) -> str:
  """The study folder a sweep spec names ('' for a sweep file outside one); ConfigError for a
  folder that lacks its sweep or README."""
  path, _ = split_variant(spec)
  full = _on_disk(path)
  if os.path.isdir(full):
    folder = os.path.abspath(full)
  elif os.path.basename(full) == SWEEP_FILE:
    folder = os.path.dirname(os.path.abspath(full))
  else:
    return ""
  for name, what in ((SWEEP_FILE, "its sweep (get_config())"),
                     (README, "its README (what it asks, the command, the machine, the headline "
                              "result)")):
    if not os.path.isfile(os.path.join(folder, name)):
      raise ConfigError(f"{os.path.join(path if os.path.isdir(full) else os.path.dirname(path), name)}"
                        f": missing; a study folder holds {what}")
  return folder


def _sweep_path(spec: str) -> tuple[str, str]:
  path, arg = split_variant(spec)
  if os.path.isdir(_on_disk(path)):
    return os.path.join(path, SWEEP_FILE), arg
  return path, arg


def _check_files(sweep, path: str) -> None:
  """Every protocol a scale names and every report-sections file exists."""
  for name in sweep.scales.keys():
    config = split_variant(sweep.scales[name].config)[0]
    if not os.path.isfile(_on_disk(config)):
      raise ConfigError(f"sweep file {path}: scale '{name}' names the protocol {config}, which "
                        "does not exist")
  for sections in sweep.get("report_sections", []):
    if not os.path.isfile(_on_disk(sections)):
      raise ConfigError(f"sweep file {path}: its report_sections names {sections}, which does "
                        "not exist")


def load_sweep(spec: str) -> ml_collections.ConfigDict:
  """Loads a study folder ('experiments/<study>'), a sweep file ('x.py' or 'x.py:arg') and checks
  its structure and the files it names; records `spec` and `folder` (its study's, or '')."""
  if not spec:
    raise ConfigError("--sweep is required (a study folder, --sweep=experiments/<study>)")
  folder = study_folder(spec)
  path, arg = _sweep_path(spec)
  module = load_python_file(path, "sweep file")
  try:
    sweep = module.get_config(arg) if arg else module.get_config()
  except ConfigError:
    raise
  except Exception as e:  # noqa: BLE001 - a user's file: its reason, one line
    raise ConfigError(f"sweep file {path}: get_config({arg!r}) failed: {type(e).__name__}: {e}") from None
  if not isinstance(sweep, ml_collections.ConfigDict):
    raise ConfigError(f"sweep file {path}: get_config() must return an ml_collections.ConfigDict")
  for key in ("name", "rows", "scales", "reference"):
    if key not in sweep:
      raise ConfigError(f"sweep file {path}: the sweep has no '{key}' (build it with "
                        "experiments.harness.define.new_sweep)")
  if not len(sweep.rows):
    raise ConfigError(f"sweep file {path} defines no rows")
  _check_files(sweep, path)
  sweep.spec = spec
  sweep.folder = folder
  return sweep


def default_results_dir(sweep, scale_name: str) -> str:
  """<study>/results/<sweep>_<scale>, or experiments/results/<sweep>_<scale> for a sweep file
  outside a study folder."""
  base = os.path.join(sweep.folder, "results") if sweep.get("folder") else os.path.join(
      EXPERIMENTS, "results")
  return os.path.join(base, f"{sweep.name}_{scale_name}")


def report_sections(sweep, rows: list[dict], scale_name: str) -> tuple[list[str], dict]:
  """The Markdown lines and JSON entries the sweep's `report_sections` files add to the report
  of `scale_name`."""
  lines, record = [], {}
  for path in sweep.get("report_sections", []):
    module = _import_file(path)
    if not hasattr(module, "sections"):
      raise ConfigError(f"report sections file {path} has no sections(sweep, rows, scale_name) "
                        "function")
    more, entries = module.sections(sweep, rows, scale_name)
    lines += more
    record.update(entries)
  return lines, record


def _import_file(path: str):
  """The module of a file in this checkout ('experiments/x/report.py' -> experiments.x.report)."""
  full = os.path.abspath(_on_disk(path))
  name = os.path.splitext(os.path.relpath(full, REPO))[0].replace(os.sep, ".")
  if name.startswith("."):
    raise ConfigError(f"report sections file {path} is outside this checkout")
  return importlib.import_module(name)


def study_folders() -> list[str]:
  """Every folder under experiments/ that holds a sweep.py."""
  return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(EXPERIMENTS, "*", SWEEP_FILE)))


def former_paths() -> dict[str, str]:
  """{path a result recorded: the path now} over every study's FORMER_PATHS."""
  out = {}
  for folder in study_folders():
    module = load_python_file(os.path.join(folder, SWEEP_FILE), "sweep file")
    out.update(getattr(module, "FORMER_PATHS", {}))
  return out


def row_ids(sweep: ml_collections.ConfigDict) -> list[str]:
  return sorted(sweep.rows.keys(), key=lambda r: sweep.rows[r].index)


def select_rows(sweep: ml_collections.ConfigDict, patterns: str | list[str] | None) -> list[str]:
  """Row ids matching comma-separated ids, shell patterns ('A_*') or group names ('C'), in order."""
  ids = row_ids(sweep)
  if not patterns:
    return ids
  if isinstance(patterns, str):
    patterns = patterns.split(",")
  chosen = set()
  for pattern in (p.strip() for p in patterns if p.strip()):
    hits = {r for r in ids if fnmatch.fnmatchcase(r, pattern) or sweep.rows[r].group == pattern}
    if not hits:
      raise ConfigError(f"--rows: no row matches {pattern!r}{did_you_mean(pattern, ids)}; "
                        f"rows: {', '.join(ids)}")
    chosen |= hits
  return [r for r in ids if r in chosen]
