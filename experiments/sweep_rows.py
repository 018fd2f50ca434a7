"""The rows of a sweep: loading a sweep file, choosing rows, `--config.*` overrides, and
resolving a row at a scale to a validated run config.

A row at a scale resolves to: the scale's config file <- the scale's overrides <- the reference
and the row's overrides (widths scaled) <- the user's `--config.*` overrides; it is validated
with the run-config schema (`transformer_jax.config.validate`, which includes the
tensor-parallel/FSDP divisibility) and the row's `same_width`. Its `overrides` are exactly the
keys that differ from the config file, so the training command built from them
(experiments/row_commands.py) trains the same config.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib.util
import os
import re
import sys
import types
from typing import Any

import ml_collections

from experiments.sweeps import COLUMNS, DIM_KEYS
from transformer_jax.config import ConfigError, default_config, validate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- loading

def _load_module(path: str, what: str) -> types.ModuleType:
  if REPO not in sys.path:
    sys.path.insert(0, REPO)  # sweep and config files import `configs`, `experiments`
  name = "_sweep_" + re.sub(r"\W", "_", os.path.abspath(path))
  spec = importlib.util.spec_from_file_location(name, path)
  if spec is None or spec.loader is None:
    raise ConfigError(f"{what} {path} is not a Python file")
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except ConfigError:
    raise
  except Exception as e:  # noqa: BLE001 - a broken user file: one line, naming it
    raise ConfigError(f"{what} {path} cannot be loaded: {type(e).__name__}: {e}") from None
  if not hasattr(module, "get_config"):
    raise ConfigError(f"{what} {path} has no get_config() function")
  return module


def _find(path: str, what: str) -> str:
  candidates = [path] if os.path.isabs(path) else [path, os.path.join(REPO, path)]
  for p in candidates:
    if os.path.isfile(p):
      return p
  raise ConfigError(f"{what} {path} not found")


def load_sweep(spec: str) -> ml_collections.ConfigDict:
  """Loads 'experiments/table3.py' (or 'file.py:arg') and checks its structure."""
  if not spec:
    raise ConfigError("--sweep is required (e.g. --sweep=experiments/table3.py)")
  path, _, arg = spec.partition(":")
  module = _load_module(_find(path, "sweep file"), "sweep file")
  try:
    sweep = module.get_config(arg) if arg else module.get_config()
  except ConfigError:
    raise
  except Exception as e:  # noqa: BLE001
    raise ConfigError(f"sweep file {path}: get_config({arg!r}) failed: {type(e).__name__}: {e}") from None
  if not isinstance(sweep, ml_collections.ConfigDict):
    raise ConfigError(f"sweep file {path}: get_config() must return an ml_collections.ConfigDict")
  for key in ("name", "rows", "scales", "reference"):
    if key not in sweep:
      raise ConfigError(f"sweep file {path}: the sweep has no '{key}' (build it with sweeps.new_sweep)")
  if not len(sweep.rows):
    raise ConfigError(f"sweep file {path} defines no rows")
  sweep.spec = spec
  return sweep


def row_ids(sweep: ml_collections.ConfigDict) -> list[str]:
  return sorted(sweep.rows.keys(), key=lambda r: sweep.rows[r].index)


def select_rows(sweep: ml_collections.ConfigDict, patterns: str | list[str] | None) -> list[str]:
  """Row ids matching comma-separated ids, shell patterns ('A_*') or group names ('C'), in order."""
  ids = row_ids(sweep)
  if not patterns:
    return ids
  if isinstance(patterns, str):
    patterns = [p for p in patterns.split(",") if p.strip()]
  chosen = set()
  for pattern in (p.strip() for p in patterns):
    hits = {r for r in ids if fnmatch.fnmatchcase(r, pattern) or sweep.rows[r].group == pattern}
    if not hits:
      close = difflib.get_close_matches(pattern, ids, n=1, cutoff=0.5)
      hint = f" (did you mean '{close[0]}'?)" if close else ""
      raise ConfigError(f"--rows: no row matches {pattern!r}{hint}; rows: {', '.join(ids)}")
    chosen |= hits
  return [r for r in ids if r in chosen]


def load_run_config(spec: str) -> ml_collections.ConfigDict:
  """A run config file such as 'configs/multi30k.py' or 'configs/tpu.py:big'."""
  path, _, arg = spec.partition(":")
  module = _load_module(_find(path, "config file"), "config file")
  try:
    return module.get_config(arg) if arg else module.get_config()
  except Exception as e:  # noqa: BLE001
    raise ConfigError(f"config file {spec}: {type(e).__name__}: {e}") from None


# ----------------------------------------------------------------------------- overrides

def _schema_leaf(key: str):
  """The schema's default for a dotted key; ConfigError naming the first unknown part."""
  node = default_config()
  parts = key.split(".")
  for i, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      options = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      close = difflib.get_close_matches(part, options, n=1, cutoff=0.5)
      hint = f" (did you mean '{close[0]}'?)" if close else ""
      raise ConfigError(f"unknown config key '{'.'.join(parts[:i + 1])}'{hint}")
    node = node[part]
  if isinstance(node, ml_collections.ConfigDict):
    raise ConfigError(f"config key '{key}' is a section, not a value")
  return node


def parse_value(key: str, text: str):
  """Parses the text of `--config.KEY=TEXT` with the type of the key in the schema."""
  ref = _schema_leaf(key)
  try:
    if isinstance(ref, bool):
      low = text.strip().lower()
      if low not in ("true", "false", "1", "0"):
        raise ValueError(text)
      return low in ("true", "1")
    if isinstance(ref, int):
      return int(text)
    if isinstance(ref, float):
      return float(text)
  except ValueError:
    raise ConfigError(f"config key '{key}' must be {type(ref).__name__}, got {text!r}") from None
  return text


def parse_overrides(args: list[str]) -> dict[str, Any]:
  """['--config.train.num_steps=50', ...] -> {'train.num_steps': 50} (typed, keys checked)."""
  out = {}
  for arg in args:
    body = arg[2:] if arg.startswith("--") else arg
    if not body.startswith("config.") or "=" not in body:
      raise ConfigError(f"override {arg!r} must look like --config.section.key=value")
    key, text = body[len("config."):].split("=", 1)
    try:
      out[key] = parse_value(key, text)
    except ConfigError as e:
      raise ConfigError(f"{e} in {arg.split('=')[0]}") from None
  return out


def _set(cfg: ml_collections.ConfigDict, key: str, value: Any) -> None:
  ref = _schema_leaf(key)
  node = cfg
  *parents, leaf = key.split(".")
  for p in parents:
    if p not in node:
      raise ConfigError(f"config key '{key}': the run config has no section '{p}'")
    node = node[p]
  if isinstance(ref, float) and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  try:
    node[leaf] = value
  except (TypeError, ValueError, KeyError) as e:
    raise ConfigError(f"config key '{key}' cannot take {value!r} ({type(e).__name__})") from None


# ----------------------------------------------------------------------------- resolving rows

@dataclasses.dataclass
class Resolved:
  """One row at one scale: the run config and the CLI command that trains it."""
  row_id: str
  label: str
  group: str
  scale: str
  config_spec: str               # the run-config file given to --config
  config: ml_collections.ConfigDict
  overrides: list[str]           # --config.KEY=VALUE flags: what differs from the config file
  hparams: dict[str, Any]        # the Table 3 columns of the run (scaled)
  paper_hparams: dict[str, Any]  # the same columns in paper units
  bleu_sentences: int

  def to_json(self) -> dict:
    return {"row": self.row_id, "label": self.label, "group": self.group, "scale": self.scale,
            "config": self.config_spec, "overrides": self.overrides, "hparams": self.hparams,
            "paper_hparams": self.paper_hparams, "bleu_sentences": self.bleu_sentences}


def _scaled(key: str, value: int, factor: float, row_id: str, scale_name: str) -> int:
  out = value * factor
  if abs(out - round(out)) > 1e-9 or round(out) < 1:
    raise ConfigError(f"row '{row_id}' at scale '{scale_name}': {key}={value} x {factor:g} = "
                      f"{out:g} is not a positive whole number")
  return int(round(out))


def format_value(value: Any) -> str:
  if isinstance(value, bool):
    return "True" if value else "False"
  if isinstance(value, float):
    return repr(value)
  return str(value)


def flatten(tree, prefix: str = "") -> dict[str, Any]:
  """ConfigDict/dict -> {'model.d_k': 16, ...} (sorted keys, sections recursed)."""
  out = {}
  if tree is None:
    return out
  items = tree.items() if hasattr(tree, "items") else []
  for key, value in items:
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _columns(flat: dict[str, Any]) -> dict[str, Any]:
  return {col: flat.get(key) for col, key in COLUMNS}


def paper_columns(sweep: ml_collections.ConfigDict, row_id: str) -> dict[str, Any]:
  """A row's Table 3 columns in paper units: the reference with the row's overrides."""
  return _columns(dict(flatten(sweep.reference), **flatten(sweep.rows[row_id].overrides)))


def check_row(cfg: ml_collections.ConfigDict, same_width: bool) -> None:
  """The row's own shape check, beyond `validate`: h*d_k = h*d_v = d_model where it keeps them."""
  m = cfg.model
  if same_width:
    for name in ("d_k", "d_v"):
      if m.num_heads * m[name] != m.d_model:
        raise ConfigError(f"h*{name} = {m.num_heads}*{m[name]} = {m.num_heads * m[name]} differs "
                          f"from d_model={m.d_model}, but this row keeps h*{name} = d_model as "
                          f"in the paper")


def resolve(sweep: ml_collections.ConfigDict, row_id: str, scale_name: str,
            user_overrides: dict[str, Any] | None = None, base_config: str = "") -> Resolved:
  """The run config and command of one row at one scale; ConfigError naming the row if invalid."""
  if scale_name not in sweep.scales:
    raise ConfigError(f"unknown scale {scale_name!r}; the sweep defines: "
                      f"{', '.join(sweep.scales.keys())}")
  if row_id not in sweep.rows:
    raise ConfigError(f"unknown row {row_id!r}")
  sc, row = sweep.scales[scale_name], sweep.rows[row_id]
  where = f"row '{row_id}' at scale '{scale_name}'"
  try:
    spec = base_config or sc.config
    cfg = load_run_config(spec)
    original = flatten(cfg)
    for key, value in flatten(sc.overrides).items():
      _set(cfg, key, value)
    paper = dict(flatten(sweep.reference), **flatten(row.overrides))
    hp = dict(paper)
    for key in DIM_KEYS:
      if key in hp:
        hp[key] = _scaled(key, hp[key], sc.dim_factor, row_id, scale_name)
    if sc.num_steps:
      hp["train.num_steps"] = sc.num_steps
    for key, value in hp.items():
      _set(cfg, key, value)
    for key, value in (user_overrides or {}).items():
      _set(cfg, key, value)
    validate(cfg)  # the schema, and the model widths against the mesh
    check_row(cfg, row.same_width)
  except ConfigError as e:
    message = str(e)
    raise ConfigError(message if message.startswith("row '") else f"{where}: {message}") from None
  final = flatten(cfg)
  overrides = [f"--config.{k}={format_value(v)}" for k, v in final.items()
               if k not in original or original[k] != v or type(original[k]) is not type(v)]
  return Resolved(row_id=row_id, label=row.label, group=row.group, scale=scale_name,
                  config_spec=spec, config=cfg, overrides=overrides,
                  hparams=_columns(final), paper_hparams=_columns(paper),
                  bleu_sentences=int(sc.bleu_sentences))


def resolve_all(sweep, rows: list[str], scale_name: str, user_overrides=None,
                base_config: str = "") -> list[Resolved]:
  """Every selected row, validated up front: the first bad one raises ConfigError."""
  return [resolve(sweep, r, scale_name, user_overrides, base_config) for r in rows]
