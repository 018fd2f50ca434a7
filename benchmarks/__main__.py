"""`python -m benchmarks`: the train step, beam-search decoding and the input pipeline (see
benchmarks/__init__.py); writes OUT.json and OUT.md and prints the report."""

if __name__ == "__main__":
  from transformer_jax.runtime import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.reexec_with_malloc_settings()  # before jax: the steps are timed as main.py runs them

import shlex
import sys
import tempfile
import time

from absl import flags, logging
import numpy as np

from transformer_jax.runtime import cli
from transformer_jax.training import metrics
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import parse_overrides

from benchmarks import decoding, input_pipeline, report, train_step

PARTS = ("train", "decode", "data")
SCHEMA_VERSION = 3  # 3: no HLO statistics, no decoder step vs position

_ONLY = flags.DEFINE_list("only", [], f"parts to run, of {','.join(PARTS)} (default all)")
_TRAIN = flags.DEFINE_list("train", ["multi30k:40x100", "base:8x128", "base:32x128"],
                           "train entries CONFIG:ROWSxLENGTH (CONFIG: base, big, multi30k, tiny; "
                           "base and big with flax's 32000-piece vocabulary); --config.KEY=VALUE "
                           "overrides apply to each")
_STEPS = flags.DEFINE_integer("steps", 5, "timed train steps per entry", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 1, "untimed steps after compiling", lower_bound=0)
_PROFILE = flags.DEFINE_bool("profile", False,
                             "profile two more train steps per entry; split their time by category")
_PEAK_N = flags.DEFINE_integer("peak_n", 2048, "size of the peak-FLOP/s jnp.dot", lower_bound=1)
_DECODE_CONFIG = flags.DEFINE_enum("decode_config", "base", ["base", "big", "multi30k", "tiny"],
                                   "model shapes for decoding (the config's own vocabulary)")
_DECODE_SENTENCES = flags.DEFINE_integer("decode_sentences", 32, "sentences to decode",
                                         lower_bound=1)
_DECODE_BATCH = flags.DEFINE_integer("decode_batch", 32, "sentences per batch", lower_bound=1)
_BEAM_SIZE = flags.DEFINE_integer("beam_size", 4, "beam size", lower_bound=1)
_DATA = flags.DEFINE_list("data", ["multi30k:pack@4096", "wmt-news:bucket@25000"],
                          "input-pipeline entries CORPUS:MODE@TOKENS (CORPUS: multi30k, wmt-news; "
                          "MODE: bucket, pack, pack-balanced)")
_DATA_SECONDS = flags.DEFINE_float("data_seconds", 3.0, "seconds of reading per data entry",
                                   lower_bound=0.0)
_SEED = flags.DEFINE_integer("seed", 0, "seed of the decoding sample and random weights")
_OUT = flags.DEFINE_string("out", "experiments/results/bench",
                           "writes OUT.json and OUT.md ('' to write nothing)")


def run(override_args) -> dict:
  """Checks every flag and override, then measures the parts asked for; the JSON-able result."""
  parts = _ONLY.value or list(PARTS)
  for p in parts:
    if p not in PARTS:
      raise ConfigError(f"--only: unknown part {p!r}; use {','.join(PARTS)}")
  overrides = parse_overrides(override_args)
  entries = [train_step.parse_entry(e) for e in _TRAIN.value] if "train" in parts else []
  configs = [train_step.train_config(name, overrides)[0] for name, _, _ in entries]
  for config, (_, _, length) in zip(configs, entries):
    train_step.check_fits(config, length)
  if "train" in parts and not entries:
    raise ConfigError("--train: no entries")
  if "data" in parts:
    for e in _DATA.value:
      input_pipeline.parse_entry(e)

  result = {"schema_version": SCHEMA_VERSION,
            **report.start(shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]])),
            "parts": parts, "peak": None, "train": None, "decode": None, "data": None}
  if entries:
    dtype = np.dtype(ModelConfig.from_config(configs[0].model).dtype)
    t = time.perf_counter()
    peak = metrics.measure_peak_flops(dtype, n=_PEAK_N.value)
    result["peak"] = {"dtype": str(dtype), "n": _PEAK_N.value, "flops_per_s": peak,
                      "measure_s": time.perf_counter() - t}
    print(f"peak ({dtype} {_PEAK_N.value}^2 jnp.dot): {peak / 1e9:.1f} GFLOP/s", flush=True)
    result["train"] = []
    for name, rows, length in entries:
      print(f"train {name} {rows}x{length} ...", flush=True)
      e = train_step.measure(name, rows, length, _STEPS.value, _WARMUP.value, overrides, peak,
                             _PROFILE.value)
      print(f"  {e['step_s']['median']:.3f} s/step, {e['target_tokens_per_s']:.0f} target tok/s, "
            f"{e['model_flops_per_s'] / 1e9:.1f} GFLOP/s, MFU {e['mfu']:.1%}, compile "
            f"{e['compile_s']:.1f} s", flush=True)
      result["train"].append(e)
  if "decode" in parts:
    print("decode ...", flush=True)
    result["decode"] = decoding.measure(
        _DECODE_CONFIG.value, _DECODE_SENTENCES.value, _DECODE_BATCH.value, _BEAM_SIZE.value,
        _SEED.value)
  if "data" in parts:
    print("data ...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
      result["data"] = input_pipeline.measure(_DATA.value, _DATA_SECONDS.value, tmp)
  return report.finish(result)


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(argv[1:])}")
  result = run(cli.OVERRIDE_ARGS)
  report.write(result, report.markdown(result), _OUT.value)


if __name__ == "__main__":
  cli.run(main, verbosity=logging.WARNING)
