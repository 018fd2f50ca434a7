"""Command line of the benchmark: `python -m transformer_jax.bench` (flags only; see __init__)."""

if __name__ == "__main__":
  from transformer_jax import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.reexec_with_malloc_settings()  # before jax: the steps are timed as main.py runs them

import shlex
import sys

from absl import app, flags

from transformer_jax.bench import runner

_D = runner.Options()
_ONLY = flags.DEFINE_list("only", [], f"parts to run, of {','.join(runner.PARTS)} (default all)")
_TRAIN = flags.DEFINE_string("train", _D.train,
                             "comma list of CONFIG:ROWSxLENGTH (CONFIG: base, big, multi30k, tiny)")
_STEPS = flags.DEFINE_integer("steps", _D.steps, "timed train steps per entry", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", _D.warmup, "untimed steps after compiling", lower_bound=0)
_OVERRIDE = flags.DEFINE_multi_string(
    "override", [], "config override for the train entries, e.g. train.dropout_rng_impl=rbg")
_PROFILE = flags.DEFINE_bool("profile", False,
                             "profile two more train steps per entry; split their time by category")
_PEAK_N = flags.DEFINE_integer("peak_n", _D.peak_n, "size of the peak-FLOP/s jnp.dot", lower_bound=1)
_DECODE_CONFIG = flags.DEFINE_enum("decode_config", _D.decode_config,
                                   ["base", "big", "multi30k", "tiny"], "model shapes for decoding")
_DECODE_DATA = flags.DEFINE_enum("decode_data", _D.decode_data, ["newstest", "random"],
                                 "newstest2014 sentences (needs the data folder) or random ids")
_DECODE_TOKENIZER = flags.DEFINE_enum("decode_tokenizer", _D.decode_tokenizer, ["spm", "chars"],
                                      "how newstest sentences become ids")
_DECODE_SENTENCES = flags.DEFINE_integer("decode_sentences", _D.decode_sentences,
                                         "sentences to decode", lower_bound=1)
_DECODE_BATCH = flags.DEFINE_integer("decode_batch", _D.decode_batch, "sentences per batch",
                                     lower_bound=1)
_DECODE_POSITIONS = flags.DEFINE_list("decode_positions", _D.decode_positions.split(","),
                                      "cache positions at which one decoder step is timed")
_DECODE_REPEATS = flags.DEFINE_integer("decode_repeats", _D.decode_repeats,
                                       "timed decoder steps per position", lower_bound=1)
_BEAM_SIZE = flags.DEFINE_integer("beam_size", _D.beam_size, "beam size", lower_bound=1)
_DATA = flags.DEFINE_string("data", _D.data, "comma list of CORPUS:MODE@TOKENS")
_DATA_SECONDS = flags.DEFINE_float("data_seconds", _D.data_seconds,
                                   "seconds to read per data entry", lower_bound=0.0)
_SEED = flags.DEFINE_integer("seed", _D.seed, "seed of the synthetic data and random weights")
_OUT = flags.DEFINE_string("out", "experiments/results/bench",
                           "writes OUT.json and OUT.md ('' to write nothing)")


def options(argv) -> runner.Options:
  return runner.Options(
      only=tuple(_ONLY.value), train=_TRAIN.value, steps=_STEPS.value, warmup=_WARMUP.value,
      overrides=tuple(_OVERRIDE.value), profile=_PROFILE.value, peak_n=_PEAK_N.value,
      decode_config=_DECODE_CONFIG.value, decode_data=_DECODE_DATA.value,
      decode_tokenizer=_DECODE_TOKENIZER.value, decode_sentences=_DECODE_SENTENCES.value,
      decode_batch=_DECODE_BATCH.value, decode_positions=",".join(_DECODE_POSITIONS.value),
      decode_repeats=_DECODE_REPEATS.value, beam_size=_BEAM_SIZE.value, data=_DATA.value,
      data_seconds=_DATA_SECONDS.value, seed=_SEED.value,
      command=shlex.join(["python", "-m", "transformer_jax.bench", *argv[1:]]))


def main(argv):
  from transformer_jax import errors  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    print(f"error: unexpected arguments {' '.join(argv[1:])}", file=sys.stderr)
    sys.exit(2)
  try:
    result = runner.run(options(sys.argv))
  except errors.USER_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(runner.write(result, _OUT.value))


if __name__ == "__main__":
  from transformer_jax import errors  # pylint: disable=g-import-not-at-top
  app.run(main, flags_parser=errors.parse_flags)
