"""The train-step benchmark: one compiled step of a named config on a synthetic batch.

Per entry: compile time, step time (median and min after warm-up), target tokens/s, model FLOP/s
and MFU against a peak measured in the same run, XLA's own FLOP count, the compiled step's buffers
and the process's peak RSS, the attention that ran and, when asked, where its time goes
(hlo_profile.profile_step). `markdown` is its report section (also the accelerator check's).
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from transformer_jax.model import attention, sharding
from transformer_jax.runtime.config import ModelConfig, validate
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.markdown import table
from transformer_jax.runtime.overrides import apply_overrides, load_config_file, REPO
from transformer_jax.runtime.special_ids import EOS_ID, PAD_ID
from transformer_jax.training import metrics, step

from benchmarks import hlo_profile

PRESETS = ("base", "big", "multi30k", "tiny")
FLAX_VOCAB = 32000  # the flax WMT example's vocabulary: the train entries of base and big use it


def _check_preset(name: str):
  if name not in PRESETS:
    raise ConfigError(f"unknown benchmark config {name!r}; use {', '.join(PRESETS)}")


def preset(name: str, vocab_size: int | None = None) -> tuple[ml_collections.ConfigDict, str]:
  """(run config, description) of configs/NAME.py, with `vocab_size` if given."""
  _check_preset(name)
  config = load_config_file(os.path.join(REPO, "configs", f"{name}.py"))
  description = f"configs/{name}.py"
  if vocab_size:
    config.model.vocab_size = vocab_size
    description += f", vocab {vocab_size}"
  return config, description


def train_config(name: str, overrides: Mapping[str, Any] = ()
                 ) -> tuple[ml_collections.ConfigDict, str]:
  """The train entry's config: the preset (base and big with flax's vocabulary), overridden and
  validated."""
  config, description = preset(name, FLAX_VOCAB if name in ("base", "big") else None)
  apply_overrides(config, dict(overrides))
  return validate(config), description


def parse_shape(text: str) -> tuple[int, int]:
  """'8x128' -> (8, 128)."""
  rows, x, length = text.lower().partition("x")
  if not (x and rows.isdigit() and length.isdigit() and int(rows) > 0 and int(length) > 0):
    raise ConfigError(f"batch shape {text!r}: expected ROWSxLENGTH, e.g. 8x128")
  return int(rows), int(length)


def parse_entry(text: str) -> tuple[str, int, int]:
  """'base:8x128' -> ('base', 8, 128)."""
  name, _, shape = text.partition(":")
  _check_preset(name)
  return (name, *parse_shape(shape))


def check_fits(config, length: int) -> None:
  if length > config.model.max_len:
    raise ConfigError(f"batch length {length} exceeds model.max_len={config.model.max_len}")


def synthetic_batch(config, rows: int, length: int, seed: int = 0, empty_rows: int | None = None
                    ) -> dict:
  """A batch shaped as the data pipeline makes them, random ids in [3, vocab) ending in EOS.

  Bucket mode: right-padded rows of varied lengths, as a length bucket holds them (the longer
  side of each pair from half the row length to all of it, the other side from half that), and
  `empty_rows` filler rows of zero length at the end (default 1 when rows > 1), as a partial batch
  has them: the padding that the step, its FLOPs and cuDNN's per-row lengths must handle.
  Pack mode: every position filled with segments of 8-24 tokens, with segment ids and positions.
  """
  rng = np.random.default_rng(seed)
  if config.data.batch_mode != "pack":
    return _bucket_batch(config, rows, length, rng, empty_rows)
  batch = {}
  for side in ("inputs", "targets"):
    ids = rng.integers(3, config.model.vocab_size, (rows, length)).astype(np.int32)
    seg = np.zeros((rows, length), np.int32)
    pos = np.zeros((rows, length), np.int32)
    for r in range(rows):
      start, k = 0, 1
      while start < length:
        n = min(int(rng.integers(8, 25)), length - start)
        seg[r, start:start + n] = k
        pos[r, start:start + n] = np.arange(n)
        ids[r, start + n - 1] = EOS_ID
        start, k = start + n, k + 1
    batch[side], batch[f"{side}_segmentation"], batch[f"{side}_position"] = ids, seg, pos
  return batch


def _bucket_batch(config, rows: int, length: int, rng: np.random.Generator,
                  empty_rows: int | None) -> dict:
  """synthetic_batch's bucket mode: {'inputs', 'targets'} [rows, length], PAD_ID after each
  row's length, all PAD_ID in the last `empty_rows` rows."""
  empty = (1 if rows > 1 else 0) if empty_rows is None else empty_rows
  if not 0 <= empty < rows:
    raise ConfigError(f"synthetic batch: {empty} empty rows of {rows}; at least one must be real")
  real = rows - empty
  longer = rng.integers(max(2, length // 2), length + 1, real)
  shorter = np.maximum(2, (longer * rng.uniform(0.5, 1.0, real)).astype(np.int64))
  source_is_longer = rng.random(real) < 0.5
  lengths = {"inputs": np.where(source_is_longer, longer, shorter),
             "targets": np.where(source_is_longer, shorter, longer)}
  batch = {}
  for side, n_R in lengths.items():
    ids = rng.integers(3, config.model.vocab_size, (rows, length)).astype(np.int32)
    ids[np.arange(length)[None, :] >= np.pad(n_R, (0, empty))[:, None]] = PAD_ID
    ids[np.arange(real), n_R - 1] = EOS_ID
    batch[side] = ids
  return batch


def compiled_memory(compiled) -> dict:
  """XLA's memory analysis of the compiled step (not every backend has one)."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001
    m = None
  keys = ("argument", "output", "alias", "temp", "generated_code")
  return {f"{k}_bytes": int(getattr(m, f"{k}_size_in_bytes")) for k in keys
          if hasattr(m, f"{k}_size_in_bytes")}


def step_bytes(memory: dict) -> int:
  """The buffers a compiled step needs (compiled_memory's): arguments + outputs not aliased to
  them + temporaries."""
  return (memory.get("argument_bytes", 0) + memory.get("output_bytes", 0)
          - memory.get("alias_bytes", 0) + memory.get("temp_bytes", 0))


def _xla_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return float(cost["flops"]) if cost and "flops" in cost else None


def step_timing(samples: Sequence[float], tokens: int, flops: float, peak: float | None,
                devices: int) -> dict:
  """Median/min step time and the rates derived from it, for `tokens` target tokens and `flops`
  model FLOPs per step run on `devices` devices (`peak` is per device: metrics.mfu, as in the
  training loop)."""
  median = statistics.median(samples)
  return {"step_s": {"median": median, "min": min(samples), "samples": list(samples)},
          "target_tokens_per_step": tokens, "target_tokens_per_s": tokens / median,
          "model_flops_per_step": flops, "model_flops_per_s": flops / median, "devices": devices,
          "mfu": metrics.mfu(flops / median, peak, devices) if peak else None}


def time_interleaved(steppers, steps: int, warmup: int) -> list[list[float]]:
  """Warm-up steps for each stepper, then `steps` rounds of one timed step each, in turn, so that
  a drift of the machine's speed lands on every stepper alike."""
  for stepper in steppers:
    for _ in range(warmup):
      stepper()
  samples = [[] for _ in steppers]
  for _ in range(steps):
    for stepper, out in zip(steppers, samples):
      out.append(stepper())
  return samples


class Stepper:
  """One compiled train step of a named config on a synthetic batch (or a given one); each call
  runs one step and returns its wall time in seconds."""

  def __init__(self, name: str, rows: int, length: int, overrides: Mapping[str, Any] = (),
               config: ml_collections.ConfigDict | None = None, description: str = "",
               batch: dict | None = None):
    """A preset by `name` (+ `overrides`), or a validated `config` given as is; `batch`: this
    process's rows of a real batch (the data pipeline's) instead of a synthetic one."""
    if config is None:
      config, description = train_config(name, overrides)
    self.config, self.description = config, description
    self.name, self.rows, self.length, self.overrides = name, rows, length, dict(overrides)
    self.model_cfg = ModelConfig.from_config(self.config.model)
    mesh = sharding.make_mesh(self.config.mesh)
    self.devices = mesh.devices.size
    _, state_sh = step.state_shardings(self.config, mesh)
    self.state = step.create_state(self.config, mesh, state_sh)
    if batch is None:
      self.batch = jax.device_put(synthetic_batch(self.config, rows, length),
                                  sharding.batch_sharding(mesh))
    else:
      self.batch = sharding.global_batch(mesh, {k: v for k, v in batch.items()
                                                if k in step.BATCH_KEYS})
    fn = step.jit_train_step(self.config, mesh, state_sh)
    logged = len(attention.choices())
    t = time.perf_counter()
    with sharding.mesh_context(mesh):
      self.compiled = fn.jitted.lower(self.state, self.batch).compile()
    self.compile_s = time.perf_counter() - t
    # What attention ran (attention.py logs each choice once per process, at trace time).
    self.attention = attention.choices()[logged:] or [
        line for line in attention.choices() if self.model_cfg.attention_impl in line][:1]
    self.losses, self.page_faults = [], []

  def __call__(self) -> float:
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    self.state, m = self.compiled(self.state, self.batch)
    jax.block_until_ready((self.state, m))
    seconds = time.perf_counter() - t
    # Minor page faults of the step: few when host_memory's malloc settings keep XLA's buffers.
    self.page_faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
    self.losses.append(float(m["loss_sum"]) / max(float(m["tokens"]), 1.0))
    return seconds

  def entry(self, samples: Sequence[float], warmup: int, peak: float | None,
            profile: bool = False) -> dict:
    """The report entry for the timed `samples` (and a profile of two more steps if asked)."""
    cfg, config = self.model_cfg, self.config
    tokens = int((np.asarray(self.batch["targets"]) != PAD_ID).sum())
    flops = metrics.train_flops(cfg, self.rows, self.length, self.length)
    entry = {
        "name": self.name, "config": self.description, "overrides": self.overrides,
        "model": {"d_model": cfg.d_model, "heads": cfg.num_heads, "d_ff": cfg.d_ff,
                  "layers": [cfg.num_encoder_layers, cfg.num_decoder_layers],
                  "vocab": cfg.vocab_size, "dtype": cfg.dtype, "dropout": cfg.dropout_rate},
        "dropout_rng_impl": config.train.dropout_rng_impl,
        "batch": {"shape": f"{self.rows}x{self.length}", "rows": self.rows,
                  "source_len": self.length, "target_len": self.length,
                  "packed": config.data.batch_mode == "pack"},
        "compile_s": self.compile_s, "warmup_steps": warmup, "attention": self.attention,
        **step_timing(samples, tokens, flops, peak, self.devices),
        "xla_flops_per_step": _xla_flops(self.compiled),
        "page_faults_per_step": statistics.median(self.page_faults[-len(samples):]),
        "memory": dict(compiled_memory(self.compiled), process_peak_rss_bytes=resource.getrusage(
            resource.RUSAGE_SELF).ru_maxrss * 1024),  # Linux reports kilobytes
        "loss_first_last": [self.losses[0], self.losses[-1]],
        "finite": bool(np.all(np.isfinite(self.losses))),
    }
    if profile:
      self.state, cats, busy = hlo_profile.profile_step(self.compiled, self.state, self.batch,
                                                        steps=2)
      entry["profile"] = {"busy_s_per_step": busy, "categories": cats}
    return entry

  def close(self):
    del self.state, self.compiled


def measure(name: str, rows: int, length: int, steps: int, warmup: int,
            overrides: Mapping[str, Any], peak: float | None, profile: bool = False) -> dict:
  """Compiles, runs `warmup` untimed steps, times `steps` steps; returns the report entry."""
  stepper = Stepper(name, rows, length, overrides)
  (samples,) = time_interleaved([stepper], steps, warmup)
  entry = stepper.entry(samples, warmup, peak, profile)
  stepper.close()
  return entry


def markdown(entries: Sequence[dict]) -> list[str]:
  """The report section of train entries: their table, the attention each ran and, for profiled
  entries, where the step's time goes."""
  rows = []
  for e in entries:
    mem, xla = e["memory"], e["xla_flops_per_step"]
    rows.append([e["config"] if e["name"] == e["config"] else f"{e['name']} ({e['config']})",
                 e["batch"]["shape"] + (" packed" if e["batch"]["packed"] else ""),
                 e["model"]["dtype"], e["dropout_rng_impl"], f"{e['compile_s']:.1f}",
                 f"{e['step_s']['median']:.3f}; {e['step_s']['min']:.3f}",
                 round(e["target_tokens_per_s"]), f"{e['model_flops_per_s'] / 1e9:.1f}",
                 f"{e['mfu']:.1%}", xla / e["model_flops_per_step"] if xla else "n/a",
                 f"{step_bytes(mem) / 2**30:.2f} GiB",
                 f"{mem['process_peak_rss_bytes'] / 2**30:.2f} GiB"])
  lines = [table(["config", "batch", "dtype", "dropout rng", "compile s", "step s (median; min)",
                  "target tok/s", "model GFLOP/s", "MFU", "XLA/model FLOPs",
                  "step buffers (args+out+temp)", "peak RSS"], rows)]
  lines += [f"- {e['name']} {e['batch']['shape']}: " + "; ".join(e["attention"] or ["attention: "
            "not recorded"]) for e in entries] + [""]
  profiled = [e for e in entries if e.get("profile")]
  if profiled:
    cats = list(dict.fromkeys(c for e in profiled for c in e["profile"]["categories"]))

    def share(e, c):
      v = e["profile"]["categories"].get(c)
      return f"{v['share']:.1%} ({v['forward']:.1%}; {v['backward']:.1%})" if v else ""
    rows = [[c, *(share(e, c) for e in profiled)] for c in cats]
    rows.append(["busy seconds per step", *(e["profile"]["busy_s_per_step"] for e in profiled)])
    lines += ["## Where the train step's time goes", "",
              "Profiled steps per entry (jax.profiler): the executor's busy time split over the "
              "compiled step's operations by their source (op_name metadata); operations running "
              "at the same time share each instant. Share of the step (forward; backward).", "",
              table(["category", *(f"{e['name']} {e['batch']['shape']}" for e in profiled)], rows)]
  return lines
