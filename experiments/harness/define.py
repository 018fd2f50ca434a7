"""The helpers a sweep file is written with: `new_sweep`, `add_row`, `add_grid` and `scale`.

A sweep file (a study's `sweep.py`) has a `get_config()` returning a ConfigDict with:

- `reference`: the hyperparameters every row starts from, in the paper's units (default
  `PAPER_BASE`, the paper's base model);
- `rows`: one ConfigDict per row (keyed by its id, ordered by `index`): `overrides`, a partial
  run config (dotted keys of `transformer_jax.runtime.config.default_config()`, widths in the
  paper's units), `label`, `group`, `same_width` (h*d_k = h*d_v = d_model, checked after every
  override) and `paper`, the values the paper reports for the row (None where it has none);
- `scales`: how a row becomes a run (default `standard_scales()`): the protocol (a run-config
  file), a factor on every row's d_model, d_k, d_v and d_ff (h and N as the paper's, so the
  paper's ratios hold), the steps of every row, further overrides, the dev sentences a row's
  BLEU is computed on, and the seeds of every row and of the base row;
- `report_sections`: files whose `sections(sweep, rows, scale_name)` add a study's own sections to the
  generic report (experiments/harness/report.py).

How a row becomes a run config, its protocol and its command: experiments/harness/resolve.py.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import ml_collections

from transformer_jax.runtime.dotted import nest
from transformer_jax.runtime.exceptions import ConfigError

# The paper's base model, the default reference rows override.
PAPER_BASE = {
    "model.num_encoder_layers": 6, "model.num_decoder_layers": 6,
    "model.d_model": 512, "model.d_ff": 2048, "model.num_heads": 8,
    "model.d_k": 64, "model.d_v": 64,
    "model.dropout_rate": 0.1, "train.label_smoothing": 0.1,
    "model.pe_type": "sinusoidal", "train.num_steps": 100_000,
}
# Widths a scale multiplies by its factor (h and N are never scaled).
DIM_KEYS = ("model.d_model", "model.d_k", "model.d_v", "model.d_ff")
# The hyperparameter columns of every report (the paper's table columns), and their keys.
COLUMNS = (("N", "model.num_encoder_layers"), ("d_model", "model.d_model"),
           ("d_ff", "model.d_ff"), ("h", "model.num_heads"), ("d_k", "model.d_k"),
           ("d_v", "model.d_v"), ("P_drop", "model.dropout_rate"),
           ("eps_ls", "train.label_smoothing"), ("train_steps", "train.num_steps"))
PAPER_VALUES = tuple(c for c, _ in COLUMNS) + ("ppl", "bleu", "params_m")
_ROW_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# What a small-machine run sets besides its protocol: no time limit, logging every 20 steps,
# checkpoints for resumption, no BLEU during training, no progress bar.
QUIET_RUN = {"train.max_train_minutes": 0.0, "train.log_every_steps": 20,
             "train.checkpoint_every_minutes": 5.0, "train.keep_checkpoints": 2,
             "train.eval_bleu_sentences": 0, "train.progress_bar": False}


def scale(config: str, *, dim_factor: float = 1.0, num_steps: int = 0, bleu_sentences: int = 0,
          overrides: dict[str, Any] | None = None, description: str = "",
          seeds: tuple[int, ...] = (0,), base_seeds: tuple[int, ...] | None = None,
          paper_step_ratio: bool = False, row_seeds: dict[str, tuple[int, ...]] | None = None,
          compare_with: str = "", score_two_thirds: bool = False) -> ml_collections.ConfigDict:
  """One scale of a sweep.

  Args:
    config: the protocol, a run-config file ('configs/base.py', 'experiments/x/protocol.py:v').
    dim_factor: multiplies every row's d_model, d_k, d_v and d_ff.
    num_steps: the steps of every row (0: the row's own).
    bleu_sentences: dev sentences a row's BLEU is computed on (0: all).
    overrides: dotted run-config keys set on every row.
    description: one paragraph for the report.
    seeds: the seeds of every row; `base_seeds` those of the base row (default: the same);
      `row_seeds` rows that run other seeds.
    paper_step_ratio: num_steps is the reference's, and each row trains num_steps x its own
      paper steps / the reference's (the paper's ratios of training length).
    compare_with: another scale of the sweep whose committed report is shown beside this one's.
    score_two_thirds: each run's checkpoint at two thirds of its steps is scored too (the
      overrides must keep it), so the report shows whether the verdicts still move.
  """
  return ml_collections.ConfigDict(dict(
      config=config, dim_factor=float(dim_factor), num_steps=int(num_steps),
      paper_step_ratio=bool(paper_step_ratio),
      bleu_sentences=int(bleu_sentences), overrides=nest(overrides or {}),
      description=description, seeds=list(seeds),
      base_seeds=list(seeds if base_seeds is None else base_seeds),
      row_seeds={r: list(v) for r, v in (row_seeds or {}).items()}, compare_with=compare_with,
      score_two_thirds=bool(score_two_thirds)))


def standard_scales() -> ml_collections.ConfigDict:
  """paper (WMT14, the paper's batch and steps), small (Multi30k), tiny (smoke tests)."""
  s = ml_collections.ConfigDict()
  s.paper = scale(
      "configs/base.py", dim_factor=1.0, num_steps=0, bleu_sentences=0,
      description="WMT14 en-de (newstest2013 dev), the paper's widths and batch (~25000 source + "
                  "25000 target tokens), 100k steps (big: 300k), BLEU on the whole dev set; for "
                  "8 accelerators (--base_config=configs/gpu.py or configs/tpu.py for bf16 presets)")
  s.small = scale(
      "configs/multi30k.py", dim_factor=0.5, num_steps=2000, bleu_sentences=0,
      overrides=dict(QUIET_RUN, **{"train.warmup_steps": 400, "train.learning_rate_scale": 0.3,
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


def new_sweep(name: str, description: str = "", reference: dict[str, Any] | None = None,
              report_sections: tuple[str, ...] = ()) -> ml_collections.ConfigDict:
  """An empty sweep at the standard scales; `report_sections`: files (from the checkout's root)
  whose `sections(sweep, rows, scale_name)` the report adds (a study's own sections)."""
  c = ml_collections.ConfigDict()
  c.name = name
  c.description = description
  c.reference = nest(dict(PAPER_BASE if reference is None else reference))
  c.scales = standard_scales()
  c.rows = ml_collections.ConfigDict()
  c.report_sections = list(report_sections)
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
