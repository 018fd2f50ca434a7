"""Sweeps: the helpers sweep files are written with, the scales, loading and selecting rows.

A sweep file (`experiments/table3.py`, `experiments/grid_example.py`) has a `get_config()` that
returns a ConfigDict built with `new_sweep`, `add_row`, `add_grid` and `scale`:

- `reference`: the hyperparameters every row starts from, in *paper units* (default
  `PAPER_BASE`, the paper's base model: N=6, d_model 512, d_ff 2048, h=8, d_k=d_v=64,
  P_drop 0.1, eps_ls 0.1, sinusoids, 100k steps);
- `rows`: one ConfigDict per row (keyed by an identifier, ordered by `index`): `overrides`, a
  partial run config (any keys of `transformer_jax.runtime.config.default_config()`, model widths in
  paper units), `label`, `group`, `same_width` (the row keeps h*d_k = h*d_v = d_model, as the
  paper's base, A and C-d_model rows and big do: checked after all overrides), and `paper`, the
  values the paper reports for it (None where its table leaves the cell blank);
- `scales`: how a row becomes a run config (default `standard_scales()`): a run-config file
  (`configs/...`), a factor applied to every row's d_model, d_k, d_v and d_ff (h and N stay as
  in the paper, so h*d_k/d_model and d_ff/d_model keep the paper's ratios), a step count for
  every row (0: the row's own, i.e. the paper's 100k and 300k for big), further overrides, how
  many dev sentences the BLEU of a row is computed on, and the seeds each row is trained with
  (`seeds`; the base row: `base_seeds`, more of them, since every row is compared against it).

How a row becomes a run config, its protocol and its training command: experiments/row_runs.py.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from typing import Any

import ml_collections

from transformer_jax.runtime.config import did_you_mean
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import load_config_file, load_python_file, split_variant

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
          seeds: tuple[int, ...] = (0,), base_seeds: tuple[int, ...] | None = None,
          paper_step_ratio: bool = False, row_seeds: dict[str, tuple[int, ...]] | None = None,
          compare_with: str = "", bleu_two_thirds: bool = False) -> ml_collections.ConfigDict:
  """One scale: run-config file, width factor, steps per row (0: the row's), BLEU sentences, the
  seeds of every row and those of the base row (default: the same), and `row_seeds`, the rows
  that run other seeds than `seeds` (fewer, for rows the paper calls unchanged). With
  `paper_step_ratio`, num_steps is the reference's (base's) and each row trains num_steps x its
  paper steps / the reference's (big: 300k / 100k = 3x, as in the paper); without it every row
  trains num_steps. `compare_with`: another scale of the sweep whose committed report the report
  of this one shows beside its own verdicts. `bleu_two_thirds`: each run's checkpoint at two
  thirds of its steps is kept (the overrides must save it) and its BLEU measured too, so that
  the report can show whether the BLEU verdicts still move."""
  return ml_collections.ConfigDict(dict(
      config=config, dim_factor=float(dim_factor), num_steps=int(num_steps),
      paper_step_ratio=bool(paper_step_ratio),
      bleu_sentences=int(bleu_sentences), overrides=nest(overrides or {}),
      description=description, seeds=list(seeds),
      base_seeds=list(seeds if base_seeds is None else base_seeds),
      row_seeds={r: list(v) for r, v in (row_seeds or {}).items()}, compare_with=compare_with,
      bleu_two_thirds=bool(bleu_two_thirds)))


# The `cpu` scales: Multi30k on a 2-core CPU, widths the paper's x1/8 (h and N as the paper's),
# every row, big included, trains train.num_steps steps; the whole dev split is evaluated
# dev_evaluations times during training (the convergence curve) and once more by the runner
# (loss, perplexity; BLEU of beam search on the first bleu_sentences sentences). Each scale's run
# settings are a pinned variant of configs/table3_cpu.py (its docstring gives the reasons), so
# a change to configs/multi30k.py never changes them.
CPU = dict(dim_factor=0.125, num_steps=3000, dev_evaluations=10, bleu_sentences=500,
           seeds=(0, 1), base_seeds=(0, 1, 2))
# The post-LN pilot (issue #53): base, A h=1 and C N=2 (--rows=base,A_h1,C_N2) at each
# learning-rate setting, seed 0.
POSTLN_PILOTS = {
    "postln_pilot_paper_lr": "the paper's base peak rate 7.0e-4 (at step 400)",
    "postln_pilot_paper_lr_clip": "the paper's base peak rate 7.0e-4 (at step 400), gradients "
                                  "clipped to global norm 1",
    "postln_pilot_long_warmup": "the `cpu` peak 3.1e-3, reached at step 1600 (not 400)",
}


# `cpu_long` (issue #53): the `cpu` protocol trained twice as long (big 3x as long, as the
# paper), BLEU on the whole dev split; A h=16 and E (the paper: unchanged PPL and BLEU) one seed.
CPU_LONG = dict(num_steps=6000, dev_evaluations=12, bleu_sentences=0, paper_step_ratio=True,
                compare_with="cpu", bleu_two_thirds=True,
                row_seeds={"A_h16": (0,), "E_learned_pe": (0,)},
                why_pre_ln="pre-LN (a deviation: post-LN base learned slower than pre-LN at every "
                           "rate of the post-LN pilot, experiments/results/table3_postln_pilot.md), ")


# What every CPU-scale run sets besides its protocol: no time limit, logging, checkpoints for
# resumption, no BLEU during training, no progress bar.
CPU_RUN = {"train.max_train_minutes": 0.0, "train.log_every_steps": 20,
           "train.checkpoint_every_minutes": 5.0, "train.keep_checkpoints": 2,
           "train.eval_bleu_sentences": 0, "train.progress_bar": False}


def cpu_long_scale(**changes: Any) -> ml_collections.ConfigDict:
  """The `cpu_long` scale, with `changes` to its CPU_LONG settings (seeds, compare_with): for
  another sweep at the same protocol (experiments/head_width.py)."""
  return _cpu_scale(**dict(CPU_LONG, **changes))


def _cpu_scale(variant: str = "", what: str = "",
               **settings: Any) -> ml_collections.ConfigDict:
  p = dict(CPU, **settings)
  ratio = p.get("paper_step_ratio", False)
  spec = "configs/table3_cpu.py" + (f":{variant}" if variant else "")
  cfg = load_config_file(spec)
  t = cfg.train
  d_model = round(512 * p["dim_factor"])
  peak = t.learning_rate_scale * d_model ** -0.5 * t.warmup_steps ** -0.5
  every = max(1, p["num_steps"] // p["dev_evaluations"])
  # saved at two thirds of training (of big's 3x too) and kept, to measure BLEU there at the end
  two_thirds = 2 * p["num_steps"] // 3 if p.get("bleu_two_thirds") else 0
  return scale(
      spec, dim_factor=p["dim_factor"], num_steps=p["num_steps"],
      bleu_sentences=p["bleu_sentences"], seeds=p["seeds"], base_seeds=p["base_seeds"],
      paper_step_ratio=ratio, row_seeds=p.get("row_seeds"), compare_with=p.get("compare_with", ""),
      bleu_two_thirds=bool(two_thirds),
      overrides=dict(CPU_RUN, **{"train.eval_every_steps": every, "train.max_eval_batches": 0,
                                 "train.checkpoint_every_steps": two_thirds or p["num_steps"],
                                 **({"train.keep_every_steps": two_thirds} if two_thirds else {})}),
      description=(
          f"Multi30k en-de on a 2-core CPU ({spec}): every row's widths x{p['dim_factor']:g} "
          f"(base: d_model {d_model}, d_ff {4 * d_model}, h=8, d_k=d_v={d_model // 8}, N=6), h "
          f"and N as in the paper, {p['num_steps']} steps of ~{cfg.data.tokens_per_batch} "
          + ("source + target tokens each (packed), big 3x as many as in the paper, " if ratio
             else "source + target tokens each (packed) for every row, big included, ")
          + (p.get("why_pre_ln", "pre-LN (a deviation: post-LN base does not train in this "
                                 "budget at this rate), ")
             if cfg.model.pre_ln else f"post-LN as the paper, {what}, ")
          + f"warmup {t.warmup_steps}, lrate scale {t.learning_rate_scale:g} (base peak {peak:.1e}), "
          + (f"gradient clipping at global norm {t.grad_clip_norm:g}, " if t.grad_clip_norm else "")
          + f"seeds {','.join(map(str, p['seeds']))} (base: {','.join(map(str, p['base_seeds']))}"
          + "".join(f"; {r}: {','.join(map(str, v))}" for r, v in p.get("row_seeds", {}).items())
          + f"), dev perplexity on the whole dev split every {every} steps, BLEU on "
          + (f"the first {p['bleu_sentences']} of the 1014 dev sentences" if p["bleu_sentences"]
             else "all 1014 dev sentences")))


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
  s.cpu = _cpu_scale()
  s.cpu_long = cpu_long_scale()
  for name, what in POSTLN_PILOTS.items():
    s[name] = _cpu_scale(name, what, seeds=(0,), base_seeds=(0,))
  s.small = scale(
      "configs/multi30k.py", dim_factor=0.5, num_steps=2000, bleu_sentences=0,
      overrides=dict(CPU_RUN, **{"train.warmup_steps": 400, "train.learning_rate_scale": 0.3,
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
  path, arg = split_variant(spec)
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
