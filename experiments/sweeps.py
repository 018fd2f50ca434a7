"""Sweep definitions: rows of overrides on a base run config, resolved at a chosen scale.

A sweep file (`experiments/table3.py`, `experiments/grid_example.py`) is an ml_collections config
file whose `get_config()` returns a ConfigDict built with the helpers here:

- `reference`: the hyperparameters every row starts from, in *paper units* (default
  `PAPER_BASE`, the paper's base model: N=6, d_model 512, d_ff 2048, h=8, d_k=d_v=64,
  P_drop 0.1, eps_ls 0.1, sinusoids, 100k steps);
- `rows`: one ConfigDict per row (keyed by an identifier, ordered by `index`): `overrides`, a
  partial run config (nested, any keys of `transformer_jax.config.default_config()`, model widths
  in paper units), `label`, `group`, `same_width` (the row keeps h*d_k = h*d_v = d_model, as the
  paper's base, A and C-d_model rows and big do: checked after all overrides), and `paper`, the
  values the paper reports for it (None where its table leaves the cell blank);
- `scales`: how a row becomes a run config (default `standard_scales()`): a run-config file
  (`configs/...`), a factor applied to every row's d_model, d_k, d_v and d_ff (h and N stay as
  in the paper, so h*d_k/d_model and d_ff/d_model keep the paper's ratios), a step count for
  every row (0: the row's own, i.e. the paper's 100k and 300k for big), further overrides, and
  how many dev sentences the BLEU of a row is computed on.

A row at a scale resolves to: the scale's config file <- the scale's overrides <- the reference
and the row's overrides (widths scaled) <- the user's `--config.*` overrides; it is validated
with the run-config schema, the tensor-parallel/FSDP divisibility and the row's `same_width`.
Its command is the training CLI with the config file and exactly the keys that differ from it,
so what the runner executes and what it prints for the launch scripts are the same command.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib.util
import itertools
import os
import re
import shlex
import sys
import types
from typing import Any

import ml_collections

from transformer_jax.config import ConfigError, default_config, validate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The paper's base model (Table 3 row 'base'), the reference rows override.
PAPER_BASE = {
    "model.num_encoder_layers": 6, "model.num_decoder_layers": 6,
    "model.d_model": 512, "model.d_ff": 2048, "model.num_heads": 8,
    "model.d_k": 64, "model.d_v": 64,
    "model.dropout_rate": 0.1, "train.label_smoothing": 0.1,
    "model.pe_type": "sinusoidal", "train.num_steps": 100_000,
}
# Widths a scale multiplies by its factor (h and N are never scaled).
DIM_KEYS = ("model.d_model", "model.d_k", "model.d_v", "model.d_ff")
# The paper's Table 3 columns and the run-config key each one reads.
COLUMNS = (("N", "model.num_encoder_layers"), ("d_model", "model.d_model"),
           ("d_ff", "model.d_ff"), ("h", "model.num_heads"), ("d_k", "model.d_k"),
           ("d_v", "model.d_v"), ("P_drop", "model.dropout_rate"),
           ("eps_ls", "train.label_smoothing"), ("train_steps", "train.num_steps"))
PAPER_VALUES = tuple(c for c, _ in COLUMNS) + ("ppl", "bleu", "params_m")
LAUNCHERS = ("local", "slurm", "tpu_vm")
_ROW_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


# ----------------------------------------------------------------------------- building sweeps

def nest(flat: dict[str, Any]) -> ml_collections.ConfigDict:
  """{'model.d_k': 16} -> ConfigDict(model=ConfigDict(d_k=16))."""
  out = ml_collections.ConfigDict()
  for key, value in flat.items():
    node = out
    *parents, leaf = key.split(".")
    for p in parents:
      if p not in node:
        node[p] = ml_collections.ConfigDict()
      node = node[p]
    node[leaf] = value
  return out


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


def scale(config: str, *, dim_factor: float = 1.0, num_steps: int = 0, bleu_sentences: int = 0,
          overrides: dict[str, Any] | None = None, description: str = "") -> ml_collections.ConfigDict:
  """One scale: run-config file, width factor, steps per row (0: the row's), BLEU sentences."""
  return ml_collections.ConfigDict(dict(
      config=config, dim_factor=float(dim_factor), num_steps=int(num_steps),
      bleu_sentences=int(bleu_sentences), overrides=nest(overrides or {}),
      description=description))


def standard_scales() -> ml_collections.ConfigDict:
  """paper (WMT14, the paper's batch and steps), small and cpu (Multi30k), tiny (smoke tests)."""
  s = ml_collections.ConfigDict()
  s.paper = scale(
      "configs/base.py", dim_factor=1.0, num_steps=0, bleu_sentences=0,
      description="WMT14 en-de (newstest2013 dev), the paper's widths and batch (~25000 source + "
                  "25000 target tokens), 100k steps (big: 300k), BLEU on the whole dev set; for "
                  "8 accelerators (--base_config=configs/gpu.py or configs/tpu.py for bf16 presets)")
  # Multi30k (29k pairs) on a small machine: widths x1/4 (x1/2 for 'small'), h and N as in the
  # paper, the same fixed number of steps for every row (big included: a fixed step count is the
  # fairer ablation), packed batches (2048 tokens at cpu: twice the updates of 4096 for the same
  # time), warmup and peak rate for a short run (at cpu, a base peak of 2.2e-3 sent the 6-layer
  # post-LN model back to a unigram plateau after step 100; 1.1e-3 kept it learning), one
  # checkpoint at the end (and every 5 minutes, for resumption), BLEU on the first dev sentences.
  short = {"train.max_train_minutes": 0.0, "train.log_every_steps": 20,
           "train.checkpoint_every_minutes": 5.0, "train.keep_checkpoints": 2,
           "train.eval_bleu_sentences": 0, "train.progress_bar": False}
  cpu_steps = 300
  s.cpu = scale(
      "configs/multi30k.py", dim_factor=0.25, num_steps=cpu_steps, bleu_sentences=500,
      overrides=dict(short, **{"data.tokens_per_batch": 2048, "train.warmup_steps": 100,
                               "train.learning_rate_scale": 0.12,
                               "train.eval_every_steps": cpu_steps,
                               "train.max_eval_batches": 1,  # the runner evaluates all of dev
                               "train.checkpoint_every_steps": cpu_steps}),
      description=f"Multi30k en-de on a 2-core CPU: d_model 128, d_ff 512, h=8, d_k=d_v=16, N=6 "
                  f"for base (every row's widths x1/4, h and N as in the paper), {cpu_steps} "
                  f"steps of ~2048 source + 2048 target tokens (packed) for every row, big "
                  f"included, warmup 100, lrate scale 0.12 (base peak 1.1e-3), BLEU on the "
                  f"first 500 of the 1014 dev sentences, dev perplexity on all of them")
  s.small = scale(
      "configs/multi30k.py", dim_factor=0.5, num_steps=2000, bleu_sentences=0,
      overrides=dict(short, **{"train.warmup_steps": 400, "train.learning_rate_scale": 0.3,
                               "train.eval_every_steps": 2000,
                               "train.checkpoint_every_steps": 2000}),
      description="Multi30k en-de on one GPU or a long CPU run: d_model 256, d_ff 1024, "
                  "d_k=d_v=32 for base (widths x1/2), 2000 steps of ~4096+4096 tokens for every "
                  "row, warmup 400, lrate scale 0.3 (base peak 9.4e-4), BLEU on the whole dev "
                  "set (not measured here)")
  s.tiny = scale(
      "configs/tiny.py", dim_factor=1 / 16, num_steps=2, bleu_sentences=4,
      overrides={"train.max_eval_batches": 1, "train.eval_every_steps": 2,
                 "train.checkpoint_every_steps": 2, "train.progress_bar": False,
                 "train.log_every_steps": 1, "train.peak_flops": 1e11,
                 "data.tokens_per_batch": 256, "data.max_source_len": 24,
                 "data.max_target_len": 24, "decode.max_extra_len": 4,
                 "decode.batch_size": 8},
      description="smoke test: configs/tiny.py, widths x1/16, 2 steps, BLEU on 4 sentences")
  return s


def new_sweep(name: str, description: str = "", reference: dict[str, Any] | None = None
              ) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = name
  c.description = description
  c.reference = nest(dict(PAPER_BASE if reference is None else reference))
  c.scales = standard_scales()
  c.rows = ml_collections.ConfigDict()
  return c


def add_row(sweep: ml_collections.ConfigDict, row_id: str, *, label: str = "", group: str = "",
            overrides: dict[str, Any] | None = None, paper: dict[str, Any] | None = None,
            same_width: bool = False) -> None:
  """Appends a row; `overrides` uses dotted run-config keys ('model.d_k'), widths in paper units."""
  if not _ROW_ID.match(row_id):
    raise ConfigError(f"sweep row id {row_id!r} must be letters, digits and '_', starting with a letter")
  if row_id in sweep.rows:
    raise ConfigError(f"sweep row id {row_id!r} is defined twice")
  unknown = set(paper or {}) - set(PAPER_VALUES)
  if unknown:
    raise ConfigError(f"sweep row {row_id!r}: unknown paper value(s) {sorted(unknown)}; "
                      f"expected {', '.join(PAPER_VALUES)}")
  paper_cd = ml_collections.ConfigDict({k: (paper or {}).get(k) for k in PAPER_VALUES}) if paper else None
  sweep.rows[row_id] = ml_collections.ConfigDict(dict(
      index=len(sweep.rows), label=label or row_id, group=group,
      overrides=nest(overrides or {}), same_width=bool(same_width)))
  sweep.rows[row_id].paper = paper_cd


def _id_part(key: str, value: Any) -> str:
  short = {"num_heads": "h", "dropout_rate": "drop", "label_smoothing": "ls", "pe_type": "pe",
           "num_encoder_layers": "Nenc", "num_decoder_layers": "Ndec", "d_k": "dk",
           "d_v": "dv", "d_model": "dmodel", "d_ff": "dff"}.get(key.split(".")[-1],
                                                                           key.split(".")[-1])
  text = str(value).replace(".", "p").replace("-", "m")
  return re.sub(r"[^A-Za-z0-9_]", "", f"{short}{text}")


def add_grid(sweep: ml_collections.ConfigDict, grid: dict[str, list], *, group: str = "grid",
             fixed: dict[str, Any] | None = None, tied: dict[str, str] | None = None,
             same_width: bool = False) -> list[str]:
  """Adds one row per combination of `grid` values (dotted keys -> lists), each with `fixed`.

  `tied` sets keys from swept ones ({'model.d_v': 'model.d_k'}: d_v follows d_k). Row ids are
  built from the swept values ('h4_d_k16_drop0p1_pelearned'); returns them in order.
  """
  keys = list(grid)
  for key in keys:
    if not isinstance(grid[key], (list, tuple)) or not grid[key]:
      raise ConfigError(f"grid key {key!r} needs a non-empty list of values")
  ids = []
  for values in itertools.product(*(grid[k] for k in keys)):
    overrides = dict(fixed or {}, **dict(zip(keys, values)))
    for key, source in (tied or {}).items():
      if source not in overrides:
        raise ConfigError(f"grid: tied key {key!r} follows {source!r}, which is not swept or fixed")
      overrides[key] = overrides[source]
    row_id = "_".join(_id_part(k, v) for k, v in zip(keys, values))
    label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, values))
    add_row(sweep, row_id, label=label, group=group, overrides=overrides, same_width=same_width)
    ids.append(row_id)
  return ids


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


def _columns(flat: dict[str, Any]) -> dict[str, Any]:
  return {col: flat.get(key) for col, key in COLUMNS}


def paper_columns(sweep: ml_collections.ConfigDict, row_id: str) -> dict[str, Any]:
  """A row's Table 3 columns in paper units: the reference with the row's overrides."""
  return _columns(dict(flatten(sweep.reference), **flatten(sweep.rows[row_id].overrides)))


def check_row(cfg: ml_collections.ConfigDict, same_width: bool) -> None:
  """Shape checks beyond the schema: sharding divisibility, h*d_k = d_model where it matters."""
  m, mesh = cfg.model, cfg.mesh
  tp, fsdp = mesh.tensor, mesh.fsdp
  if tp > 1:
    for key in ("num_heads", "d_ff", "vocab_size"):
      if m[key] % tp:
        raise ConfigError(f"config key 'model.{key}'={m[key]} is not divisible by the "
                          f"tensor-parallel size mesh.tensor={tp}")
  if fsdp > 1 and m.d_model % fsdp:
    raise ConfigError(f"config key 'model.d_model'={m.d_model} is not divisible by the FSDP size "
                      f"mesh.fsdp={fsdp}")
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
    validate(cfg)
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
