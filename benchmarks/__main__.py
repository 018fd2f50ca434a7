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
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import parse_overrides
from transformer_jax.training import metrics

from benchmarks import decoding, input_pipeline, report, settings as settings_lib, train_step

PARTS = ("train", "decode", "data")
SCHEMA_VERSION = 4  # the layout of the JSON result; raised when its keys change


def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values` (flags.FLAGS when it runs; a fresh set to resolve a
  recorded command)."""
  def define(kind, name, default, help_text, **kwargs):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values, **kwargs)
  define("list", "only", [], f"parts to run, of {','.join(PARTS)} (default all)")
  define("list", "train", ["multi30k:40x100", "base:8x128", "base:32x128"],
         "train entries CONFIG:ROWSxLENGTH (CONFIG: base, big, multi30k, tiny; base and big with "
         "flax's 32000-piece vocabulary); --config.KEY=VALUE overrides apply to each")
  define("integer", "steps", 5, "timed train steps per entry", lower_bound=1)
  define("integer", "warmup", 1, "untimed steps after compiling", lower_bound=0)
  define("bool", "profile", False, "profile two more train steps per entry; split their time by "
         "category")
  define("integer", "peak_n", 2048, "size of the peak-FLOP/s jnp.dot", lower_bound=1)
  flags.DEFINE_enum("decode_config", "base", list(train_step.PRESETS),
                    "model shapes for decoding (the config's own vocabulary)", flag_values=values)
  define("integer", "decode_sentences", 32, "sentences to decode", lower_bound=1)
  define("integer", "decode_batch", 32, "sentences per batch", lower_bound=1)
  define("integer", "beam_size", 4, "beam size", lower_bound=1)
  define("list", "data", ["multi30k:pack@4096", "wmt-news:bucket@25000"],
         "input-pipeline entries CORPUS:MODE@TOKENS (CORPUS: multi30k, wmt-news; MODE: bucket, "
         "pack, pack-balanced)")
  define("float", "data_seconds", 3.0, "seconds of reading per data entry", lower_bound=0.0)
  define("integer", "seed", 0, "seed of the decoding sample and random weights")
  define("string", "out", "experiments/results/bench",
         "writes OUT.json and OUT.md ('' to write nothing)")


def _plan(values: flags.FlagValues, override_args) -> tuple[list, list, dict, list]:
  """(parts, train entries, their configs by preset name, data entries), every flag and
  override checked: mistakes are one line before anything is measured."""
  parts = values.only or list(PARTS)
  for p in parts:
    if p not in PARTS:
      raise ConfigError(f"--only: unknown part {p!r}; use {','.join(PARTS)}")
  overrides = parse_overrides(override_args)
  entries = [train_step.parse_entry(e) for e in values.train] if "train" in parts else []
  if "train" in parts and not entries:
    raise ConfigError("--train: no entries")
  configs = {name: train_step.train_config(name, overrides)[0] for name, _, _ in entries}
  for name, _, length in entries:
    train_step.check_fits(configs[name], length)
  data = [input_pipeline.parse_entry(e) for e in values.data] if "data" in parts else []
  return parts, entries, configs, data


def _settings(values: flags.FlagValues, parts, configs, data) -> dict:
  own, out = {"parts": parts}, {}
  if "train" in parts:
    own.update({k: values[k].value for k in ("train", "steps", "warmup", "profile", "peak_n")})
    for name, config in configs.items():
      out.update(settings_lib.config_settings(f"train:{name}", config))
  if "decode" in parts:
    own.update({k: values[k].value for k in ("decode_config", "decode_sentences",
                                              "decode_batch", "beam_size", "seed")},
               decode_alpha=decoding.ALPHA, decode_max_extra_len=decoding.MAX_EXTRA_LEN)
    name = values.decode_config
    out.update(settings_lib.config_settings(f"decode:{name}", train_step.preset(name)[0],
                                            "model"))
  if "data" in parts:
    own.update(data=values.data, data_seconds=values.data_seconds)
    for corpus in dict.fromkeys(name for name, _, _ in data):
      out.update(settings_lib.config_settings(f"data:{corpus}",
                                              input_pipeline.corpus_config(corpus, "")))
  return settings_lib.normalized({**settings_lib.benchmark_settings(own), **out})


def settings(values: flags.FlagValues, override_args) -> dict:
  """What a run with these flags and overrides measures (benchmarks/settings.py)."""
  parts, _, configs, data = _plan(values, override_args)
  return _settings(values, parts, configs, data)


def run(values: flags.FlagValues, override_args, command: str) -> dict:
  """Checks every flag and override, then measures the parts asked for; the JSON-able result."""
  parts, entries, configs, data = _plan(values, override_args)
  overrides = parse_overrides(override_args)
  result = {"schema_version": SCHEMA_VERSION,
            **report.start(command, _settings(values, parts, configs, data)),
            "parts": parts, "peak": None, "train": None, "decode": None, "data": None}
  if entries:
    dtype = np.dtype(ModelConfig.from_config(configs[entries[0][0]].model).dtype)
    t = time.perf_counter()
    peak = metrics.measure_peak_flops(dtype, n=values.peak_n)
    result["peak"] = {"dtype": str(dtype), "n": values.peak_n, "flops_per_s": peak,
                      "measure_s": time.perf_counter() - t}
    print(f"peak ({dtype} {values.peak_n}^2 jnp.dot): {peak / 1e9:.1f} GFLOP/s", flush=True)
    result["train"] = []
    for name, rows, length in entries:
      print(f"train {name} {rows}x{length} ...", flush=True)
      e = train_step.measure(name, rows, length, values.steps, values.warmup, overrides, peak,
                             values.profile)
      print(f"  {e['step_s']['median']:.3f} s/step, {e['target_tokens_per_s']:.0f} target tok/s, "
            f"{e['model_flops_per_s'] / 1e9:.1f} GFLOP/s, MFU {e['mfu']:.1%}, compile "
            f"{e['compile_s']:.1f} s", flush=True)
      result["train"].append(e)
  if "decode" in parts:
    print("decode ...", flush=True)
    result["decode"] = decoding.measure(values.decode_config, values.decode_sentences,
                                        values.decode_batch, values.beam_size, values.seed)
  if "data" in parts:
    print("data ...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
      result["data"] = input_pipeline.measure(values.data, values.data_seconds, tmp)
  return report.finish(result)


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(argv[1:])}")
  command = shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]])
  result = run(flags.FLAGS, cli.OVERRIDE_ARGS, command)
  report.write(result, report.markdown(result), flags.FLAGS.out)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  cli.run(main, verbosity=logging.WARNING)
