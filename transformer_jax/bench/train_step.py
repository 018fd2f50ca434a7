"""The train-step benchmark: one compiled step of a named config on a synthetic batch.

Step time (median and min after warm-up), target tokens/s, model FLOP/s and MFU against a peak
measured in the same run, compile time, the compiled step's buffers and the process's peak RSS,
and the speed-up against the flax WMT example's step measured on the development machine.
"""

from __future__ import annotations

import resource
import statistics
import time
from typing import Sequence

import jax
import ml_collections
import numpy as np

from transformer_jax import metrics, sharding, step
from transformer_jax.bench import hlo_profile
from transformer_jax.config import ConfigError, ModelConfig, validate

FLAX_WMT_REFERENCE = {
    "8x128": {"seconds_per_step": 5.5, "target_tokens_per_s": 185.0},
    "32x128": {"seconds_per_step": 23.5, "target_tokens_per_s": 174.0},
    "note": "flax examples/wmt train step, fp32, measured on this machine (issue #9); about 50% "
            "of a ~140 GFLOP/s jnp.dot peak",
}
GOAL_SPEEDUP = 1.3


def train_config(name: str) -> tuple[ml_collections.ConfigDict, str]:
  """(run config, description) of a named train preset."""
  from configs import base, big, multi30k, tiny  # pylint: disable=g-import-not-at-top
  if name == "base":
    c = base.get_config()
    c.model.vocab_size = 32000
    return c, "configs/base.py, vocab 32000"
  if name == "big":
    c = big.get_config()
    c.model.vocab_size = 32000
    return c, "configs/big.py, vocab 32000"
  if name == "multi30k":
    return multi30k.get_config(), "configs/multi30k.py"
  if name == "tiny":
    return tiny.get_config(), "configs/tiny.py"
  raise ConfigError(f"unknown benchmark config {name!r}; use base, big, multi30k or tiny")


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> dict:
  """`section.key=value` strings, parsed as the type of the current value; the config is then
  validated, so a mistake is a ConfigError naming the key."""
  done = {}
  for item in overrides:
    key, eq, raw = item.partition("=")
    if not eq:
      raise ConfigError(f"--override {item!r}: expected section.key=value")
    *path, leaf = key.split(".")
    node = config
    for i, part in enumerate(path + [leaf]):
      if not hasattr(node, "keys") or part not in node:
        raise ConfigError(f"--override {item!r}: unknown config key '{'.'.join(path[:i] + [part])}'")
      if i < len(path):
        node = node[part]
    old = node[leaf]
    try:
      if isinstance(old, bool):
        value = raw.lower() in ("1", "true", "yes")
      elif old is None:
        value = raw
      else:
        value = type(old)(raw)
    except ValueError:
      raise ConfigError(f"--override {item!r}: config key '{key}' needs a "
                        f"{type(old).__name__}") from None
    node[leaf] = value
    done[key] = value
  validate(config)
  return done


def parse_shape(text: str) -> tuple[int, int]:
  rows, _, length = text.lower().partition("x")
  return int(rows), int(length)


def synthetic_batch(config, rows: int, length: int, seed: int = 0) -> dict:
  """Random ids in [3, vocab) filling every position; pack-mode configs get packed rows of
  segments of 8-24 tokens (each ending in EOS) with segment ids and positions."""
  rng = np.random.default_rng(seed)
  vocab = config.model.vocab_size
  batch = {}
  packed = config.data.batch_mode == "pack"
  for side in ("inputs", "targets"):
    ids = rng.integers(3, vocab, (rows, length)).astype(np.int32)
    if not packed:
      ids[:, -1] = 1
      batch[side] = ids
      continue
    seg = np.zeros((rows, length), np.int32)
    pos = np.zeros((rows, length), np.int32)
    for r in range(rows):
      start, k = 0, 1
      while start < length:
        n = min(int(rng.integers(8, 25)), length - start)
        seg[r, start:start + n] = k
        pos[r, start:start + n] = np.arange(n)
        ids[r, start + n - 1] = 1
        start, k = start + n, k + 1
    batch[side], batch[f"{side}_segmentation"], batch[f"{side}_position"] = ids, seg, pos
  return batch


def _rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


def _memory(compiled) -> dict:
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 - not every backend reports it
    return {}
  if m is None:
    return {}
  keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "generated_code_size_in_bytes")
  return {k.replace("_size_in_bytes", "_bytes"): int(getattr(m, k)) for k in keys if hasattr(m, k)}


def _xla_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return float(cost["flops"]) if cost and "flops" in cost else None


def step_timing(samples: Sequence[float], tokens: int, flops: float, peak: float | None) -> dict:
  """Median/min step time and the rates derived from it, for `tokens` target tokens and `flops`
  model FLOPs per step."""
  median = statistics.median(samples)
  return {"step_s": {"median": median, "min": min(samples), "samples": list(samples)},
          "target_tokens_per_step": tokens, "target_tokens_per_s": tokens / median,
          "model_flops_per_step": flops, "model_flops_per_s": flops / median,
          "mfu": flops / median / peak if peak else None}


class Stepper:
  """One compiled train step of a named config on a synthetic batch, run one timed step per call.

  The flax side-by-side interleaves the steps of several steppers, so that a drift in the
  machine's speed hits all of them alike.
  """

  def __init__(self, name: str, shape: str, overrides: Sequence[str]):
    config, self.description = train_config(name)
    self.name, self.shape, self.config = name, shape, config
    self.applied = apply_overrides(config, overrides)
    self.rows, self.length = parse_shape(shape)
    self.model_cfg = ModelConfig.from_config(config.model)
    mesh = sharding.make_mesh(config.mesh)
    _, state_sh = step.state_shardings(config, mesh)
    self.state = step.create_state(config, mesh)
    self.batch = jax.device_put(synthetic_batch(config, self.rows, self.length),
                                sharding.batch_sharding(mesh))
    fn = step.jit_train_step(config, mesh, state_sh)
    t = time.perf_counter()
    with sharding.mesh_context(mesh):
      self.compiled = fn.jitted.lower(self.state, self.batch).compile()
    self.compile_s = time.perf_counter() - t
    self.losses = []

  def __call__(self) -> float:
    """Runs one step; returns its wall time in seconds."""
    t = time.perf_counter()
    self.state, m = self.compiled(self.state, self.batch)
    jax.block_until_ready((self.state, m))
    seconds = time.perf_counter() - t
    self.losses.append(float(m["loss_sum"]) / max(float(m["tokens"]), 1.0))
    return seconds

  def entry(self, samples: Sequence[float], warmup: int, peak: float | None,
            profile: bool = False) -> dict:
    """The report entry for the timed `samples` (and a profile of two more steps if asked)."""
    config, model_cfg, compiled = self.config, self.model_cfg, self.compiled
    tokens = int((np.asarray(self.batch["targets"]) != 0).sum())
    flops = metrics.train_flops(model_cfg, self.rows, self.length, self.length)
    entry = {
        "name": self.name, "config": self.description, "overrides": self.applied,
        "model": {"d_model": model_cfg.d_model, "heads": model_cfg.num_heads,
                  "d_ff": model_cfg.d_ff,
                  "layers": [model_cfg.num_encoder_layers, model_cfg.num_decoder_layers],
                  "vocab": model_cfg.vocab_size, "dtype": model_cfg.dtype,
                  "dropout": model_cfg.dropout_rate},
        "dropout_rng_impl": config.train.dropout_rng_impl,
        "batch": {"shape": self.shape, "rows": self.rows, "source_len": self.length,
                  "target_len": self.length, "packed": config.data.batch_mode == "pack"},
        "compile_s": self.compile_s, "warmup_steps": warmup,
        **step_timing(samples, tokens, flops, peak),
        "xla_flops_per_step": _xla_flops(compiled),
        "memory": dict(_memory(compiled), process_peak_rss_bytes=_rss_bytes()),
        "loss_first_last": [self.losses[0], self.losses[-1]],
        "finite": bool(np.all(np.isfinite(self.losses))),
    }
    entry["hlo"] = hlo_profile.hlo_statistics(compiled.as_text())
    if profile:
      self.state, cats, busy = hlo_profile.profile_step(compiled, self.state, self.batch, steps=2)
      entry["profile"] = {"busy_s_per_step": busy, "categories": cats}
    ref = FLAX_WMT_REFERENCE.get(self.shape) if self.name == "base" else None
    if ref:
      entry["flax_wmt_reference"] = ref
      entry["speedup_vs_flax_wmt"] = entry["target_tokens_per_s"] / ref["target_tokens_per_s"]
    return entry

  def close(self):
    del self.state, self.compiled


def time_interleaved(steppers, steps: int, warmup: int) -> list[list[float]]:
  """Warm-up steps for each stepper, then `steps` rounds of one timed step each, in turn.

  Interleaving puts every stepper's samples in the same stretches of time, so a drift of the
  machine's speed (a few % to 15% on a shared VM) does not land on one side only.
  """
  for stepper in steppers:
    for _ in range(warmup):
      stepper()
  samples = [[] for _ in steppers]
  for _ in range(steps):
    for stepper, out in zip(steppers, samples):
      out.append(stepper())
  return samples


def measure(name: str, shape: str, steps: int, warmup: int, overrides: Sequence[str],
            peak: float | None, profile: bool = False) -> dict:
  """Compiles, runs `warmup` untimed steps, times `steps` steps; returns the report entry."""
  stepper = Stepper(name, shape, overrides)
  (samples,) = time_interleaved([stepper], steps, warmup)
  entry = stepper.entry(samples, warmup, peak, profile)
  stepper.close()
  return entry
