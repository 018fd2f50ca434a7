"""Side by side: the flax WMT example's beam-search decoding and ours, same shapes, one process.

  git clone --depth 1 https://github.com/google/flax /tmp/flax
  python -m benchmarks.flax_wmt_decode --flax_wmt_dir=/tmp/flax/examples/wmt
  python -m benchmarks.flax_wmt_decode --flax_wmt_dir=/tmp/flax/examples/wmt \
      --workdir=<a run trained with --config.model.pre_ln=True> --sentences=32

Theirs is their train.py's `initialize_cache` + `predict_step` (their decode.py's beam search
and their models.py's cache), unchanged, pmapped over the one local device as their
`train_and_evaluate` does. Ours is `decode.jitted_beam_decode` (encoder, cache and search in one
jitted call). Equal settings: base size, a shared 32000-piece vocabulary, float32, beam 4,
alpha 0.6, the same source sentences (random ids, each ending in that side's EOS id), and the
same output limit: their max_decode_len = source width + `--max_extra_len`, which is also our
buffer (our per-sentence limit, source length + max_extra_len, is the same number when every
source has the full width, as here). Weights are random for both (each model's own
initializer), so neither side stops early: both run every output position, the worst case.
With `--workdir`, both decode the first dev sentences with one trained model instead: a pre-LN
run of ours converted to their parameters (flax_example.py, checked on teacher-forced logits
before anything is timed), so both stop early as real translation does, and the report counts
the sentences whose best outputs are identical. Batches are timed in rounds of one batch of each
side in turn (`train_step.time_interleaved`); both run with the same process settings (this
entry point re-executes itself with `host_memory.MALLOC_SETTINGS`).
"""

if __name__ == "__main__":
  from transformer_jax.runtime import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.reexec_with_malloc_settings()  # the same process settings for both sides

import functools
import shlex
import statistics
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import flags, logging
from flax import jax_utils
from flax.training import common_utils

from transformer_jax.data import sources
from transformer_jax.decoding import decode
from transformer_jax.inference import trained
from transformer_jax.inference.translate import Translator
from transformer_jax.model.transformer import Transformer, unstack_layers
from transformer_jax.runtime import cli
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.markdown import table
from transformer_jax.runtime.special_ids import EOS_ID

from benchmarks import decoding, flax_example, report, settings as settings_lib, train_step
from benchmarks.flax_example import swap_eos

ALPHA = decoding.ALPHA



def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values` (flags.FLAGS when it runs; a fresh set to resolve a
  recorded command)."""
  def define(kind, name, default, help_text, **kwargs):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values, **kwargs)
  flax_example.define_flags(values)
  define("integer", "sentences", 16, "sentences per batch", lower_bound=1)
  define("integer", "source_len", 32, "source tokens per sentence (EOS included)", lower_bound=2)
  define("integer", "beam_size", 4, "beam size", lower_bound=1)
  define("integer", "max_extra_len", 50, "output positions beyond the source width",
         lower_bound=1)
  define("integer", "rounds", 3, "timed rounds (one batch of each side per round)",
         lower_bound=1)
  define("string", "workdir", None, "a trained pre-LN run (model.pre_ln=True) to decode its first "
         "--sentences dev sentences with on both sides (--source_len is then their padded "
         "width); default: random weights at base size")
  define("string", "out", None, "writes OUT.json and OUT.md ('' to write nothing; default: "
         "experiments/results/bench_flax_wmt_decode, + '_trained' with --workdir)")


def settings(values: flags.FlagValues, override_args) -> dict:
  """What a run with these flags measures (benchmarks/settings.py): the flags, and with random
  weights our base model's config (trained weights bring their own, from the workdir's
  checkpoint, which is not resolved here)."""
  if override_args:
    raise ConfigError(f"benchmarks.flax_wmt_decode takes no config overrides: "
                      f"{' '.join(override_args)}")
  check_lengths(values.source_len, values.max_extra_len)
  own = {k: values[k].value for k in ("sentences", "source_len", "beam_size", "max_extra_len",
                                      "rounds")}
  own.update(alpha=ALPHA, weights="trained" if values.workdir else "random")
  out = settings_lib.benchmark_settings(own)
  if not values.workdir:
    out.update(settings_lib.config_settings("decode:base", train_step.train_config("base")[0],
                                            "model"))
  return settings_lib.normalized(out)


def check_lengths(width: int, max_extra_len: int) -> None:
  if width + max_extra_len > 1024:
    raise ConfigError(f"--source_len + --max_extra_len = {width + max_extra_len}: too long")


class FlaxDecoder:
  """Their cache initialisation + beam search for one batch, as their train_and_evaluate sets
  them up; each call decodes the batch and returns its wall time."""

  def __init__(self, train, config, params, inputs: np.ndarray, beam_size: int,
               max_decode_len: int):
    predict_config = config.replace(decode=True)
    self.params = jax_utils.replicate(params)
    self.p_init_cache = jax.pmap(functools.partial(
        train.initialize_cache, max_decode_len=max_decode_len, config=predict_config),
        axis_name="batch")
    self.p_pred_step = jax.pmap(
        functools.partial(train.predict_step, config=predict_config, beam_size=beam_size),
        axis_name="batch", static_broadcasted_argnums=(3, 4))
    self.eos, self.max_decode_len = train.decode.EOS_ID, max_decode_len
    self.inputs = common_utils.shard(inputs)

  def __call__(self) -> float:
    t = time.perf_counter()
    cache = self.p_init_cache(self.inputs)
    out = self.p_pred_step(self.inputs, self.params, cache, self.eos, self.max_decode_len)
    jax.block_until_ready(out)
    self.output = np.asarray(out)[0]
    return time.perf_counter() - t


class OurDecoder:
  """decode.jitted_beam_decode on the same inputs; each call decodes the batch."""

  def __init__(self, cfg: ModelConfig, params, inputs: np.ndarray, beam_size: int,
               max_extra_len: int):
    self.cfg, self.params = cfg, params
    self.fn = decode.jitted_beam_decode(cfg, beam_size, ALPHA, max_extra_len)
    self.inputs = jnp.asarray(inputs)

  def __call__(self) -> float:
    t = time.perf_counter()
    result = self.fn(self.params, self.inputs)
    jax.block_until_ready(result)
    self.steps = int(result.num_steps)
    self.output = np.asarray(result.seqs_BxKxL[:, 0, :])
    return time.perf_counter() - t


def sides(models, workdir: str | None, rows: int, width: int, max_extra_len: int):
  """(ours, theirs, agreement): each side's (config, params), our source ids [rows, width] and
  the record of a trained model. Random: base size, each side's own initializer, random ids.
  `workdir`: its last checkpoint (a pre-LN run) on both sides and its first `rows` dev sentences,
  after checking both models' teacher-forced logits agree."""
  if not workdir:
    cfg = ModelConfig.from_config(train_step.train_config("base")[0].model)
    ids = np.random.default_rng(0).integers(3, cfg.vocab_size, (rows, width)).astype(np.int32)
    ids[:, -1] = EOS_ID
    flax_cfg = flax_example.flax_config(models, cfg, max(256, width + max_extra_len))
    flax_params = jax.jit(models.Transformer(flax_cfg).init)(
        jax.random.key(0), jnp.ones((rows, width), jnp.float32),
        jnp.ones((rows, width), jnp.float32))["params"]
    return (cfg, decoding.random_params(cfg, 0), ids), (flax_cfg, flax_params), None
  loaded = trained.load(workdir)
  params, config, step = loaded.params, loaded.config, loaded.step
  cfg, params = unstack_layers(ModelConfig.from_config(config.model), nn.meta.unbox(params))
  flax_example.check_convertible(cfg, f"--workdir={workdir}")
  texts = sources.load_split_texts(config, "validation")[0][:rows]
  # Encoded as translation encodes them (EOS kept on a line cut to the model's limit).
  ids = Translator(params, config, loaded.tokenizer).encode(texts)
  inputs = np.zeros((len(ids), max(map(len, ids))), np.int32)
  for row, sentence in zip(inputs, ids):
    row[:len(sentence)] = sentence
  flax_cfg = flax_example.flax_config(
      models, cfg, max(inputs.shape[1] + max_extra_len, cfg.max_len), position_table=True)
  flax_params = flax_example.to_flax_params(params, cfg, flax_cfg.max_len)
  # Teacher forcing on the sources themselves as targets: both models' logits, ids in our order.
  ours = np.asarray(Transformer(cfg).apply({"params": params}, inputs, inputs))
  theirs = models.Transformer(flax_cfg).apply(
      {"params": flax_params}, swap_eos(inputs), swap_eos(inputs))
  theirs = np.asarray(theirs)[..., swap_eos(np.arange(cfg.vocab_size))]
  mask = inputs != 0
  diff = float(np.max(np.abs(ours - theirs)[mask]))
  scale = float(np.max(np.abs(ours)[mask]))
  if diff > 1e-3 * scale:
    raise ConfigError(f"--workdir={workdir}: converted weights disagree with ours (logits differ "
                      f"by {diff:.3g} at scale {scale:.3g}): not a side-by-side of one model")
  agreement = {"checkpoint_step": step, "max_abs_logit_diff": diff, "max_abs_logit": scale}
  return (cfg, params, inputs), (flax_cfg, flax_params), agreement


def _compiled(decoder):
  """The decoder and the seconds of its first call (compile + first batch)."""
  t = time.perf_counter()
  decoder()
  return decoder, time.perf_counter() - t


def run(folder: str, rows: int, width: int, beam_size: int, max_extra_len: int, rounds: int,
        command: str, recorded_settings: dict, workdir: str | None = None) -> dict:
  """Both decoders on one batch; the JSON-able result, headed by `command` and
  `recorded_settings`."""
  check_lengths(width, max_extra_len)
  models, train = flax_example.load_flax_wmt(folder, with_decode=True)
  result = report.start(command, recorded_settings)
  (cfg, params, inputs), (flax_cfg, flax_params), agreement = sides(
      models, workdir, rows, width, max_extra_len)
  rows, width = inputs.shape  # fewer rows when the dev split is shorter than --sentences
  max_decode_len = width + max_extra_len
  print(f"{rows} sentences x {width} source tokens, beam {beam_size}, {max_decode_len} output "
        "positions: compiling both ...", flush=True)
  theirs, their_compile = _compiled(FlaxDecoder(train, flax_cfg, flax_params, swap_eos(inputs),
                                                beam_size, max_decode_len))
  ours, our_compile = _compiled(OurDecoder(cfg, params, inputs, beam_size, max_extra_len))
  flax_s, ours_s = train_step.time_interleaved([theirs, ours], rounds, warmup=0)
  entry = {
      "sentences": rows, "source_len": width, "beam_size": beam_size, "alpha": ALPHA,
      "max_decode_len": max_decode_len, "our_decoder_steps": ours.steps,
      "flax_wmt": {"compile_and_first_s": their_compile, "batch_s": flax_s,
                   "sentences_per_s": rows / statistics.median(flax_s)},
      "transformer_jax": {"compile_and_first_s": our_compile, "batch_s": ours_s,
                          "sentences_per_s": rows / statistics.median(ours_s)},
      **flax_example.speedup(flax_s, ours_s)}
  if agreement is not None:
    best = decode.strip_eos(ours.output)
    same = [a == b for a, b in zip(best, decode.strip_eos(swap_eos(theirs.output)))]
    entry.update(agreement, identical_outputs=int(sum(same)),
                 output_tokens=sum(len(s) for s in best))
  print(f"flax WMT {statistics.median(flax_s):.2f} s/batch, ours "
        f"{statistics.median(ours_s):.2f} s/batch: {entry['speedup']:.2f}x", flush=True)
  weights = (f"trained ({workdir}, step {agreement['checkpoint_step']})" if workdir
             else "random (each side's own initializer)")
  result.update(flax_wmt_code=flax_example.checkout(folder), entries=[entry], weights=weights)
  return report.finish(result)


def markdown(r: dict) -> str:
  rows = []
  for e in r["entries"]:
    f, o = e["flax_wmt"], e["transformer_jax"]
    rows.append([f"{e['sentences']} x {e['source_len']}", e["beam_size"], e["max_decode_len"],
                 f"{np.median(f['batch_s']):.2f}; {min(f['batch_s']):.2f}",
                 f"{f['sentences_per_s']:.2f}",
                 f"{np.median(o['batch_s']):.2f}; {min(o['batch_s']):.2f}",
                 f"{o['sentences_per_s']:.2f}", e["our_decoder_steps"],
                 *flax_example.speedup_cells(e)])
  lines = report.header("The flax WMT example's beam-search decoding and ours, side by side", r)
  lines += [flax_example.code_line(r), ""]
  if r["weights"].startswith("random"):
    setup = ("Base size, vocabulary 32000 shared, float32, beam 4, alpha 0.6, random weights "
             "(each side's own initializer: neither stops early), the same random source ids")
  else:
    e = r["entries"][0]
    setup = (f"Weights {r['weights']}, converted to their model "
             "(`benchmarks/flax_example.py`; teacher-forced logits agree to "
             f"{e['max_abs_logit_diff']:.1e} at a largest logit of {e['max_abs_logit']:.1f}), "
             "float32, beam 4, alpha 0.6, the first dev sentences of the run's corpus, padded "
             f"to the longest; both stop early. Identical best outputs: "
             f"{e['identical_outputs']} of {e['sentences']} ({e['output_tokens']} output tokens)")
  lines += [
      setup + "; their `initialize_cache` + `predict_step` (pmapped, as their train.py) against "
      "our `decode.jitted_beam_decode`. Batches " + flax_example.ROUNDS_NOTE.format("batch"), "",
      table(["sentences x source tokens", "beam", "output positions",
             "flax WMT s/batch (median; min)", "sent/s", "ours s/batch (median; min)", "sent/s",
             "our decoder steps", "speed-up (medians)", "per round"], rows),
      "Compile + first batch: " + ", ".join(
          f"flax {e['flax_wmt']['compile_and_first_s']:.1f} s, ours "
          f"{e['transformer_jax']['compile_and_first_s']:.1f} s" for e in r["entries"])]
  return "\n".join(lines) + "\n"


def main(argv):
  values = flags.FLAGS
  folder = flax_example.check_command_line(argv, values)
  r = run(folder, values.sentences, values.source_len, values.beam_size, values.max_extra_len,
          values.rounds, shlex.join(["python", "-m", "benchmarks.flax_wmt_decode", *sys.argv[1:]]),
          settings(values, cli.OVERRIDE_ARGS), values.workdir)
  out = values.out
  if out is None:
    out = "experiments/results/bench_flax_wmt_decode" + ("_trained" if values.workdir else "")
  report.write(r, markdown(r), out)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  cli.run(main, verbosity=logging.WARNING)
