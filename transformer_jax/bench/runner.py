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


def others_busy(seconds: float = 2.0) -> float | None:
  """Share of all CPUs busy over `seconds` while this process sleeps, i.e. used by other
  processes (Linux /proc/stat; None elsewhere). Unlike the load average it does not lag: a job
  that just ended does not count."""
  def sample():
    with open("/proc/stat") as f:
      v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]  # total, idle + iowait
  try:
    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
  except (OSError, ValueError, IndexError):
    return None
  return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def machine_load() -> dict:
  """The load average and the CPU share of other processes (others_busy), now."""
  return {"load": list(os.getloadavg()), "others_busy": others_busy()}


def idle_record(before: dict, after: dict) -> dict:
  """The result's load_before/after, others_busy_before/after and `idle`: other processes used
  < 10% of the CPUs just before and just after the run (the load average, < 0.5, where
  /proc/stat is not available)."""
  if before["others_busy"] is not None and after["others_busy"] is not None:
    idle = max(before["others_busy"], after["others_busy"]) < 0.10
  else:
    idle = max(before["load"][0], after["load"][0]) < 0.5
  return {"load_before": before["load"], "others_busy_before": before["others_busy"],
          "load_after": after["load"], "others_busy_after": after["others_busy"], "idle": idle}


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
  before = machine_load()
  result = {"schema_version": SCHEMA_VERSION,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": opts.command, "machine": machine(), "parts": parts,
            "train": None, "decode": None, "data": None,
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
  result.update(idle_record(before, machine_load()))
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
