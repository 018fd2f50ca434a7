"""Runs the benchmark's parts (train, decode, data) and writes `<out>.json` and `<out>.md`."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time

import numpy as np

from transformer_jax import metrics
from transformer_jax.bench import decoding, input_pipeline, report, train_step
from transformer_jax.config import ConfigError, ModelConfig

SCHEMA_VERSION = 1
PARTS = ("train", "decode", "data")


@dataclasses.dataclass
class Options:
  """What to measure; the command-line flags of `python -m transformer_jax.bench` (see there)."""
  only: tuple[str, ...] = ()
  train: str = "multi30k:40x100,base:8x128,base:32x128"
  steps: int = 5
  warmup: int = 1
  overrides: tuple[str, ...] = ()
  profile: bool = False
  peak_n: int = 2048
  decode_config: str = "base"
  decode_data: str = "newstest"
  decode_tokenizer: str = "spm"
  decode_sentences: int = 32
  decode_batch: int = 32
  decode_positions: str = "20,200"
  decode_repeats: int = 5
  beam_size: int = 4
  data: str = "multi30k:pack@4096,wmt-news:bucket@25000"
  data_seconds: float = 3.0
  seed: int = 0
  command: str = "python -m transformer_jax.bench"


def machine() -> dict:
  from experiments import bench_decode as bd  # pylint: disable=g-import-not-at-top
  return bd.machine()


def run(opts: Options) -> dict:
  """Measures the parts in `opts.only` (all by default) and returns the JSON-able result."""
  parts = list(opts.only) or list(PARTS)
  for p in parts:
    if p not in PARTS:
      raise ConfigError(f"--only: unknown part {p!r}; use {','.join(PARTS)}")
  entries = [e.partition(":")[::2] for e in opts.train.split(",") if e]
  if "train" in parts:  # configs and overrides are checked before anything is timed
    for name, shape in entries:
      train_step.apply_overrides(train_step.train_config(name)[0], opts.overrides)
      train_step.parse_shape(shape)
  load_before = os.getloadavg()
  result = {"schema_version": SCHEMA_VERSION,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": opts.command, "machine": machine(), "parts": parts,
            "load_before": list(load_before), "train": None, "decode": None, "data": None,
            "peak": None}
  if "train" in parts:
    dtype = np.dtype(ModelConfig.from_config(train_step.train_config(entries[0][0])[0].model).dtype)
    t = time.perf_counter()
    peak = metrics.measure_peak_flops(dtype, n=opts.peak_n)
    result["peak"] = {"dtype": str(dtype), "n": opts.peak_n, "flops_per_s": peak,
                      "measure_s": time.perf_counter() - t}
    print(f"peak ({dtype} {opts.peak_n}^2 jnp.dot): {peak / 1e9:.1f} GFLOP/s", flush=True)
    result["train"] = []
    for name, shape in entries:
      print(f"train {name} {shape} ...", flush=True)
      e = train_step.measure(name, shape, opts.steps, opts.warmup, opts.overrides, peak,
                             opts.profile)
      print(f"  {e['step_s']['median']:.3f} s/step, {e['target_tokens_per_s']:.0f} target tok/s, "
            f"{e['model_flops_per_s'] / 1e9:.1f} GFLOP/s, MFU {e['mfu']:.1%}, compile "
            f"{e['compile_s']:.1f} s", flush=True)
      result["train"].append(e)
  if "decode" in parts:
    print("decode ...", flush=True)
    result["decode"] = decoding.measure(opts)
  if "data" in parts:
    print("data ...", flush=True)
    result["data"] = input_pipeline.measure(opts)
  result["load_after"] = list(os.getloadavg())
  result["idle"] = max(load_before[0], result["load_after"][0]) < 0.5
  return result


def write(result: dict, out: str) -> str:
  """Writes OUT.json and OUT.md (nothing when out is ''); returns the Markdown."""
  text = report.markdown(result)
  if out:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".json", "w") as f:
      json.dump(result, f, indent=2)
    with open(out + ".md", "w") as f:
      f.write(text + "\n")
  return text
