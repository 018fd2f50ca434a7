"""A sweep's row at a scale, as a run: its config, its protocol and its commands.

A row at a scale (`resolve`) is: the scale's config file <- the scale's overrides <- the
reference and the row's overrides (widths scaled) <- the user's `--config.*` overrides, validated
with the run-config schema (`transformer_jax.runtime.config.validate`, tensor-parallel/FSDP
divisibility included) and the row's `same_width`. Its `overrides` are exactly the keys that
differ from the config file, so the training command built from them (`train_command`: the CLI,
launch/slurm.sbatch or launch/tpu_vm.sh) trains the same config. Its `protocol` is what makes
two rows' results comparable (scale, config file, steps, widths, batch, schedule, BLEU
sentences, the resolved config): result files of another protocol are never mixed with them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any

import ml_collections

from experiments.harness.define import COLUMNS, DIM_KEYS
from experiments.harness.study import row_ids
from transformer_jax.runtime.config import did_you_mean, validate
from transformer_jax.runtime.dotted import flatten
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import apply_overrides, load_config_file

LAUNCHERS = ("local", "slurm", "tpu_vm")


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
  hparams: dict[str, Any]        # the report's hyperparameter columns of the run (scaled)
  paper_hparams: dict[str, Any]  # the same columns in paper units
  bleu_sentences: int
  two_thirds_step: int = 0       # also scored there (the scale's score_two_thirds; 0: not)
  trained_as: str = ""           # the row whose training this one shares (shared_training)
  eval_overrides: tuple = ()     # its own decode.* settings: given to the evaluation only

  def to_json(self) -> dict:
    return {"row": self.row_id, "label": self.label, "group": self.group, "scale": self.scale,
            "config": self.config_spec, "overrides": self.overrides, "hparams": self.hparams,
            "paper_hparams": self.paper_hparams, "bleu_sentences": self.bleu_sentences,
            "two_thirds_step": self.two_thirds_step,
            **({"trained_as": self.trained_as, "eval_overrides": list(self.eval_overrides)}
               if self.trained_as not in ("", self.row_id) else {})}

  @property
  def average(self) -> int:
    """Checkpoints averaged before the evaluation (decode.average_checkpoints; 0: none)."""
    return int(self.config.decode.average_checkpoints)


def format_value(value: Any) -> str:
  """A value as the training CLI's `--config.KEY=VALUE` reads it back with the same type."""
  if isinstance(value, float):
    return repr(value)
  return str(value)


def _columns(flat: dict[str, Any]) -> dict[str, Any]:
  return {col: flat.get(key) for col, key in COLUMNS}


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


def _training_settings(row) -> dict[str, Any]:
  return {k: v for k, v in flatten(row.overrides).items() if not k.startswith("decode.")}


def shared_training(sweep: ml_collections.ConfigDict, row_id: str) -> str:
  """The row whose trained runs `row_id` is evaluated on: the first row (in sweep order) whose
  own settings equal its own but for decode.* ones, which change only the evaluation (beam,
  length penalty, constraint limits, checkpoint averaging). Such rows train once."""
  mine = _training_settings(sweep.rows[row_id])
  return next(r for r in row_ids(sweep) if _training_settings(sweep.rows[r]) == mine)


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
      reference_steps = flatten(sweep.reference).get("train.num_steps")
      if sc.get("paper_step_ratio") and reference_steps and "train.num_steps" in paper:
        hp["train.num_steps"] = int(round(sc.num_steps * paper["train.num_steps"] / reference_steps))
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
  trained_as = shared_training(sweep, row_id)
  own_decode = {k for k in flatten(row.overrides) if k.startswith("decode.")}
  eval_overrides = tuple(o for o in overrides if trained_as != row_id
                         and o[len("--config."):].split("=", 1)[0] in own_decode
                         and not o.startswith("--config.decode.average_checkpoints="))
  return Resolved(trained_as=trained_as, eval_overrides=eval_overrides,row_id=row_id, label=row.label, group=row.group, scale=scale_name,
                  config_spec=spec, config=cfg, overrides=overrides, hparams=_columns(final),
                  paper_hparams=_columns(paper), bleu_sentences=int(sc.bleu_sentences),
                  two_thirds_step=(2 * cfg.train.num_steps // 3 if sc.get("score_two_thirds") else 0))


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
  """The seeds a row runs with: the base row's (more), the row's own (`row_seeds`), or every other
  row's; the flags' first."""
  sc = sweep.scales[scale_name]
  if row_id == "base":
    return list(base_seeds or sc.base_seeds)
  return list(seeds or sc.get("row_seeds", {}).get(row_id) or sc.seeds)


# Config keys that do not change a run's results (logging, checkpoint and dev-evaluation
# cadence, paths, the seed, which every result records on its own, and how the search spends
# its steps): left out of the protocol.
BOOKKEEPING_KEYS = frozenset((
    "seed", "data.data_dir", "data.eval_data_dir", "data.tfds_data_dir", "data.num_workers",
    "train.log_every_steps", "train.checkpoint_every_minutes", "train.checkpoint_every_steps",
    "train.keep_checkpoints", "train.keep_every_steps", "train.progress_bar", "train.peak_flops", "train.max_train_minutes",
    "train.eval_every_steps", "train.max_eval_batches", "train.eval_bleu_sentences",
    "decode.drop_finished"))


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


def sweep_settings(sweep, scale_name: str, planned: dict[str, list[int]],
                   changes: dict | None = None) -> dict:
  """What a report's command resolves to, flat: the scale (not its prose), the reference, every
  row's definition, the seeds planned for each row and the command line's overrides."""
  scale = {k: v for k, v in flatten(sweep.scales[scale_name]).items() if k != "description"}
  flat = {"sweep": sweep.name, **{f"scale.{k}": v for k, v in scale.items()},
          **{f"reference.{k}": v for k, v in flatten(sweep.reference).items()},
          **{f"changes.{k}": v for k, v in (changes or {}).items()},
          "report_sections": list(sweep.get("report_sections", []))}
  for r in row_ids(sweep):
    row = sweep.rows[r]
    paper = row.paper.to_dict() if row.paper is not None else None
    flat.update({f"rows.{r}.label": row.label, f"rows.{r}.group": row.group,
                 f"rows.{r}.same_width": row.same_width, f"rows.{r}.paper": paper,
                 **{f"rows.{r}.overrides.{k}": v for k, v in flatten(row.overrides).items()},
                 f"planned_seeds.{r}": list(planned.get(r, []))})
  return json.loads(json.dumps(flat, default=str))  # as the report's JSON holds it


# ----------------------------------------------------------------------------- commands

def eval_command(workdir: str, split: str = "validation", *, bleu_sentences: int = 0,
                 step: int | None = None, average: int | None = None,
                 overrides=(), python: str = "python") -> list[str]:
  """The one evaluation of a trained run: the evaluation CLI on `split`, the newest checkpoint
  (or `step`, or the average of the last `average` up to it), with decode `overrides`
  (--config.decode.KEY=VALUE)."""
  return [python, "-m", "transformer_jax.main", "--mode=eval", f"--workdir={workdir}",
          f"--split={split}", *([] if step is None else [f"--step={step}"]),
          *([] if not average else [f"--average={average}"]),
          f"--bleu_sentences={bleu_sentences}", *overrides]


def train_command(res: Resolved, workdir: str, launcher: str = "local",
                  python: str = "python", seed: int | None = None) -> list[str]:
  """The command that trains one row (with `seed`: that seed): the CLI itself, or through
  launch/slurm.sbatch or launch/tpu_vm.sh."""
  own_decode = {o.split("=", 1)[0] for o in res.eval_overrides} | (
      {"--config.decode.average_checkpoints"} if res.trained_as not in ("", res.row_id) else set())
  overrides = [o for o in res.overrides if o.split("=", 1)[0] not in own_decode] + (
      [] if seed is None else [f"--config.seed={seed}"])
  tag = (res.trained_as or res.row_id) + ("" if seed is None else f"-seed{seed}")
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
