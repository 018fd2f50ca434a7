"""Sweeps: the helpers sweep files are written with, and how a row becomes a run.

A sweep file (`experiments/table3.py`, `experiments/grid_example.py`) has a `get_config()` that
returns a ConfigDict built with `new_sweep`, `add_row`, `add_grid` and `scale`:

- `reference`: the hyperparameters every row starts from, in *paper units* (default
  `PAPER_BASE`, the paper's base model: N=6, d_model 512, d_ff 2048, h=8, d_k=d_v=64,
  P_drop 0.1, eps_ls 0.1, sinusoids, 100k steps);
- `rows`: one ConfigDict per row (keyed by an identifier, ordered by `index`): `overrides`, a
  partial run config (any keys of `transformer_jax.config.default_config()`, model widths in
  paper units), `label`, `group`, `same_width` (the row keeps h*d_k = h*d_v = d_model, as the
  paper's base, A and C-d_model rows and big do: checked after all overrides), and `paper`, the
  values the paper reports for it (None where its table leaves the cell blank);
- `scales`: how a row becomes a run config (default `standard_scales()`): a run-config file
  (`configs/...`), a factor applied to every row's d_model, d_k, d_v and d_ff (h and N stay as
  in the paper, so h*d_k/d_model and d_ff/d_model keep the paper's ratios), a step count for
  every row (0: the row's own, i.e. the paper's 100k and 300k for big), further overrides, how
  many dev sentences the BLEU of a row is computed on, and the seeds each row is trained with
  (`seeds`; the base row: `base_seeds`, more of them, since every row is compared against it).

A row at a scale (`resolve`) is: the scale's config file <- the scale's overrides <- the
reference and the row's overrides (widths scaled) <- the user's `--config.*` overrides, validated
with the run-config schema (`transformer_jax.config.validate`, tensor-parallel/FSDP
divisibility included) and the row's `same_width`. Its `overrides` are exactly the keys that
differ from the config file, so the training command built from them (`train_command`: the CLI,
launch/slurm.sbatch or launch/tpu_vm.sh) trains the same config. Its `protocol` is what makes
two rows' results comparable (scale, config file, steps, widths, batch, schedule, BLEU
sentences, the resolved config): result files of another protocol are never mixed with them.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import itertools
import json
import re
from typing import Any

import ml_collections

from transformer_jax.config import ConfigError, did_you_mean, validate
from transformer_jax.overrides import apply_overrides, load_config_file, load_python_file

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


def scale(config: str, *, dim_factor: float = 1.0, num_steps: int = 0, bleu_sentences: int = 0,
          overrides: dict[str, Any] | None = None, description: str = "",
          seeds: tuple[int, ...] = (0,), base_seeds: tuple[int, ...] | None = None
          ) -> ml_collections.ConfigDict:
  """One scale: run-config file, width factor, steps per row (0: the row's), BLEU sentences, the
  seeds of every row and those of the base row (default: the same)."""
  return ml_collections.ConfigDict(dict(
      config=config, dim_factor=float(dim_factor), num_steps=int(num_steps),
      bleu_sentences=int(bleu_sentences), overrides=nest(overrides or {}),
      description=description, seeds=list(seeds),
      base_seeds=list(seeds if base_seeds is None else base_seeds)))


# The `cpu` scale's protocol, in one place: Multi30k on this 2-core CPU. Widths are the paper's
# times dim_factor (h and N as in the paper); every row, big included, trains num_steps steps of
# ~tokens_per_batch source + target tokens (packed); the whole dev split is evaluated
# dev_evaluations times during training (the convergence curve) and once more by the runner
# (loss, perplexity; BLEU of beam search on the first bleu_sentences sentences).
# Chosen from the pilot (experiments/results/table3_pilot_reading.md): widths x1/8 learn more per
# minute than x1/4 here, and a peak learning rate twice the 300-step scale's learns faster without
# diverging; 3000 steps is what ~41 runs can afford in ~8 hours of this machine.
CPU = dict(dim_factor=0.125, num_steps=3000, tokens_per_batch=2048, warmup_steps=400,
           learning_rate_scale=0.5, dev_evaluations=10, bleu_sentences=500,
           seeds=(0, 1), base_seeds=(0, 1, 2))


def _cpu_scale(short: dict[str, Any]) -> ml_collections.ConfigDict:
  p = CPU
  d_model = round(512 * p["dim_factor"])
  peak = p["learning_rate_scale"] * d_model ** -0.5 * p["warmup_steps"] ** -0.5
  every = max(1, p["num_steps"] // p["dev_evaluations"])
  return scale(
      "configs/multi30k.py", dim_factor=p["dim_factor"], num_steps=p["num_steps"],
      bleu_sentences=p["bleu_sentences"], seeds=p["seeds"], base_seeds=p["base_seeds"],
      overrides=dict(short, **{
          "data.tokens_per_batch": p["tokens_per_batch"], "train.warmup_steps": p["warmup_steps"],
          "train.learning_rate_scale": p["learning_rate_scale"], "train.eval_every_steps": every,
          "train.max_eval_batches": 0, "train.checkpoint_every_steps": p["num_steps"]}),
      description=(
          f"Multi30k en-de on a 2-core CPU: every row's widths x{p['dim_factor']:g} (base: "
          f"d_model {d_model}, d_ff {4 * d_model}, h=8, d_k=d_v={d_model // 8}, N=6), h and N as "
          f"in the paper, {p['num_steps']} steps of ~{p['tokens_per_batch']} source + "
          f"{p['tokens_per_batch']} target tokens (packed) for every row, big included, warmup "
          f"{p['warmup_steps']}, lrate scale {p['learning_rate_scale']:g} (base peak {peak:.1e}), "
          f"seeds {','.join(map(str, p['seeds']))} (base: {','.join(map(str, p['base_seeds']))}), "
          f"dev perplexity on the whole dev split every {every} steps, BLEU on the first "
          f"{p['bleu_sentences']} of the 1014 dev sentences"))


def standard_scales() -> ml_collections.ConfigDict:
  """paper (WMT14, the paper's batch and steps), small and cpu (Multi30k), tiny (smoke tests)."""
  s = ml_collections.ConfigDict()
  s.paper = scale(
      "configs/base.py", dim_factor=1.0, num_steps=0, bleu_sentences=0,
      description="WMT14 en-de (newstest2013 dev), the paper's widths and batch (~25000 source + "
                  "25000 target tokens), 100k steps (big: 300k), BLEU on the whole dev set; for "
                  "8 accelerators (--base_config=configs/gpu.py or configs/tpu.py for bf16 presets)")
  # Multi30k (29k pairs) on a small machine: widths x1/8 (`CPU`) or x1/2 (small), h and N as in
  # the paper, the same fixed number of steps for every row (big included: a fixed step count is
  # the fairer ablation), one checkpoint at the end (and every 5 minutes, for resumption).
  short = {"train.max_train_minutes": 0.0, "train.log_every_steps": 20,
           "train.checkpoint_every_minutes": 5.0, "train.keep_checkpoints": 2,
           "train.eval_bleu_sentences": 0, "train.progress_bar": False}
  s.cpu = _cpu_scale(short)
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


# ----------------------------------------------------------------------------- loading, choosing

def load_sweep(spec: str) -> ml_collections.ConfigDict:
  """Loads 'experiments/table3.py' (or 'file.py:arg') and checks its structure."""
  if not spec:
    raise ConfigError("--sweep is required (e.g. --sweep=experiments/table3.py)")
  path, _, arg = spec.partition(":")
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
    patterns = patterns.split(",")
  chosen = set()
  for pattern in (p.strip() for p in patterns if p.strip()):
    hits = {r for r in ids if fnmatch.fnmatchcase(r, pattern) or sweep.rows[r].group == pattern}
    if not hits:
      raise ConfigError(f"--rows: no row matches {pattern!r}{did_you_mean(pattern, ids)}; "
                        f"rows: {', '.join(ids)}")
    chosen |= hits
  return [r for r in ids if r in chosen]


# ----------------------------------------------------------------------------- resolving rows

@dataclasses.dataclass
class Resolved:
  """One row at one scale: the run config and what differs from its config file."""
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


def flatten(tree, prefix: str = "") -> dict[str, Any]:
  """ConfigDict/dict -> {'model.d_k': 16, ...} (sections recursed)."""
  out = {}
  for key, value in (tree.items() if tree is not None else []):
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def format_value(value: Any) -> str:
  """A value as the training CLI's `--config.KEY=VALUE` reads it back with the same type."""
  if isinstance(value, float):
    return repr(value)
  return str(value)


def _columns(flat: dict[str, Any]) -> dict[str, Any]:
  return {col: flat.get(key) for col, key in COLUMNS}


def paper_columns(sweep: ml_collections.ConfigDict, row_id: str) -> dict[str, Any]:
  """A row's Table 3 columns in paper units: the reference with the row's overrides."""
  return _columns(dict(flatten(sweep.reference), **flatten(sweep.rows[row_id].overrides)))


def _scaled(key: str, value: int, factor: float) -> int:
  out = value * factor
  if abs(out - round(out)) > 1e-9 or round(out) < 1:
    raise ConfigError(f"{key}={value} x {factor:g} = {out:g} is not a positive whole number")
  return int(round(out))


def _check_same_width(cfg: ml_collections.ConfigDict) -> None:
  m = cfg.model
  for name in ("d_k", "d_v"):
    if m.num_heads * m[name] != m.d_model:
      raise ConfigError(f"h*{name} = {m.num_heads}*{m[name]} = {m.num_heads * m[name]} differs "
                        f"from d_model={m.d_model}, but this row keeps h*{name} = d_model as "
                        f"in the paper")


def resolve(sweep: ml_collections.ConfigDict, row_id: str, scale_name: str,
            user_overrides: dict[str, Any] | None = None, base_config: str = "") -> Resolved:
  """The run config of one row at one scale; ConfigError naming the row and scale if invalid."""
  if scale_name not in sweep.scales:
    raise ConfigError(f"unknown scale {scale_name!r}{did_you_mean(scale_name, sweep.scales.keys())}; "
                      f"the sweep defines: {', '.join(sweep.scales.keys())}")
  if row_id not in sweep.rows:
    raise ConfigError(f"unknown row {row_id!r}{did_you_mean(row_id, row_ids(sweep))}")
  sc, row = sweep.scales[scale_name], sweep.rows[row_id]
  spec = base_config or sc.config
  try:
    cfg = load_config_file(spec)
    original = flatten(cfg)
    apply_overrides(cfg, flatten(sc.overrides))
    paper = dict(flatten(sweep.reference), **flatten(row.overrides))
    hp = dict(paper)
    for key in DIM_KEYS:
      if key in hp:
        hp[key] = _scaled(key, hp[key], sc.dim_factor)
    if sc.num_steps:
      hp["train.num_steps"] = sc.num_steps
    apply_overrides(cfg, hp)
    apply_overrides(cfg, user_overrides or {})
    validate(cfg)
    if row.same_width:
      _check_same_width(cfg)
  except ConfigError as e:
    raise ConfigError(f"row '{row_id}' at scale '{scale_name}': {e}") from None
  final = flatten(cfg)
  overrides = [f"--config.{k}={format_value(v)}" for k, v in final.items()
               if k not in original or original[k] != v or type(original[k]) is not type(v)]
  return Resolved(row_id=row_id, label=row.label, group=row.group, scale=scale_name,
                  config_spec=spec, config=cfg, overrides=overrides, hparams=_columns(final),
                  paper_hparams=_columns(paper), bleu_sentences=int(sc.bleu_sentences))


def resolve_all(sweep, rows: list[str], scale_name: str, user_overrides=None,
                base_config: str = "") -> list[Resolved]:
  """Every selected row, validated up front: the first bad one raises ConfigError."""
  if "seed" in (user_overrides or {}):
    raise ConfigError("--config.seed: a sweep sets each run's seed; use --seeds=0,1 and "
                      "--base_seeds=0,1,2")
  return [resolve(sweep, r, scale_name, user_overrides, base_config) for r in rows]


# ----------------------------------------------------------------------------- seeds, protocol

def parse_seeds(text: str, flag: str) -> list[int]:
  """'0,1' -> [0, 1]; an empty list, a negative, non-integer or repeated seed is a ConfigError."""
  items = [t.strip() for t in text.split(",")]
  if not any(items):
    raise ConfigError(f"{flag}: the seed list is empty; give one or more seeds, e.g. {flag}=0,1")
  seeds = []
  for item in items:
    if not re.fullmatch(r"\d+", item):
      raise ConfigError(f"{flag}={text}: {item!r} is not a seed (a whole number >= 0)")
    if int(item) in seeds:
      raise ConfigError(f"{flag}={text}: seed {item} is listed twice")
    seeds.append(int(item))
  return seeds


def seeds_of(sweep, scale_name: str, row_id: str, seeds: list[int] | None = None,
             base_seeds: list[int] | None = None) -> list[int]:
  """The seeds a row runs with: the base row's (more), or every other row's; the flags' first."""
  sc = sweep.scales[scale_name]
  if row_id == "base":
    return list(base_seeds or sc.base_seeds)
  return list(seeds or sc.seeds)


# Config keys that do not change a run's results (logging, checkpoint and dev-evaluation
# cadence, paths, the seed, which every result records on its own): left out of the protocol.
BOOKKEEPING_KEYS = frozenset((
    "seed", "data.data_dir", "data.eval_data_dir", "data.tfds_data_dir", "data.num_workers",
    "train.log_every_steps", "train.checkpoint_every_minutes", "train.checkpoint_every_steps",
    "train.keep_checkpoints", "train.progress_bar", "train.peak_flops", "train.max_train_minutes",
    "train.eval_every_steps", "train.max_eval_batches", "train.eval_bleu_sentences"))


def protocol(res: Resolved, sweep: ml_collections.ConfigDict) -> dict[str, Any]:
  """What makes this row's results comparable with another run of it, as a readable dict and its
  'hash': the scale's headline numbers, the row's overrides and every key of the resolved config
  that can change a result (not BOOKKEEPING_KEYS)."""
  cfg = res.config
  out = {"sweep": sweep.name, "scale": res.scale, "row": res.row_id, "config": res.config_spec,
         "num_steps": cfg.train.num_steps, "dim_factor": sweep.scales[res.scale].dim_factor,
         "d_model": cfg.model.d_model, "d_ff": cfg.model.d_ff,
         "tokens_per_batch": cfg.data.tokens_per_batch, "warmup_steps": cfg.train.warmup_steps,
         "learning_rate_scale": cfg.train.learning_rate_scale,
         "bleu_sentences": res.bleu_sentences,
         "overrides": [o for o in res.overrides
                       if o[len("--config."):].split("=", 1)[0] not in BOOKKEEPING_KEYS],
         "resolved": {k: v for k, v in flatten(cfg).items() if k not in BOOKKEEPING_KEYS}}
  out = json.loads(json.dumps(out, default=str))  # as a result file holds it
  out["hash"] = hashlib.sha1(json.dumps(out, sort_keys=True).encode()).hexdigest()[:16]
  return out


# ----------------------------------------------------------------------------- commands

def train_command(res: Resolved, workdir: str, launcher: str = "local",
                  python: str = "python", seed: int | None = None) -> list[str]:
  """The command that trains one row (with `seed`: that seed): the CLI itself, or through
  launch/slurm.sbatch or launch/tpu_vm.sh."""
  overrides = res.overrides + ([] if seed is None else [f"--config.seed={seed}"])
  tag = res.row_id + ("" if seed is None else f"-seed{seed}")
  if launcher == "local":
    return [python, "-m", "transformer_jax.main", f"--config={res.config_spec}",
            f"--workdir={workdir}", *overrides]
  if launcher == "slurm":
    return ["sbatch", f"--job-name=tj-{tag}", "launch/slurm.sbatch", res.config_spec,
            workdir, *overrides]
  if launcher == "tpu_vm":
    name = "tj-" + re.sub(r"[^a-z0-9-]", "-", tag.lower())
    return ["launch/tpu_vm.sh", "--name", name, res.config_spec, workdir, "--", *overrides]
  raise ConfigError(f"unknown launcher {launcher!r}; expected one of {', '.join(LAUNCHERS)}")
