"""Side by side: CTranslate2's beam search and ours on the same trained weights, one process.

  TRANSFORMER_JAX_DATA_DIR=../shared/data python -m benchmarks.ctranslate2_decode \
      --workdir=W [--sentences=200] [--threads=1,2]

The workdir's newest checkpoint is exported (tools/export.py, float32 and int8) into a
temporary folder, and both decoders translate the first `--sentences` dev sentences of its
corpus, encoded as our translator encodes them. Ours is the translator itself
(`Translator.translate_ids`: sorted by length, batches of decode.batch_size rows padded to
widths of multiples of 16, one jitted search per width, compiled before timing). CTranslate2
gets the same batches (its `translate_batch`, the pad rows left out) at beam 4 with the run's
alpha, once per weight type and per thread count (`intra_threads`, one `inter_threads`).
Ours runs with JAX's default CPU threads (all cores of the process). Output limits: ours is each
sentence's length + decode.max_extra_len (EOS included); CTranslate2 takes one number a batch,
its longest sentence's, so a sentence that never emits EOS may run a few steps longer there.
Passes are timed in rounds of one pass of each decoder in turn (`train_step.time_interleaved`);
both run with the same process settings (this entry point re-executes itself with
`host_memory.MALLOC_SETTINGS`).
"""

if __name__ == "__main__":
  from transformer_jax.runtime import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.reexec_with_malloc_settings()  # the same process settings for both sides

import os
import shlex
import statistics
import sys
import tempfile
import time

from absl import flags, logging

from transformer_jax.data import sources
from transformer_jax.inference import trained
from transformer_jax.inference.translate import Translator
from transformer_jax.runtime import cli
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.markdown import table
from transformer_jax.runtime.special_ids import EOS_ID
from transformer_jax.tools import export

from benchmarks import report, settings as settings_lib, train_step

QUANTIZATIONS = ("float32", "int8")


def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values` (flags.FLAGS when it runs; a fresh set to resolve a
  recorded command)."""
  def define(kind, name, default, help_text, **kwargs):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values, **kwargs)
  define("string", "workdir", None, "the trained workdir whose newest checkpoint both decode")
  define("integer", "sentences", 200, "first dev sentences to translate", lower_bound=1)
  define("integer", "beam_size", 4, "beam size", lower_bound=1)
  define("integer", "rounds", 3, "timed rounds (one pass of each decoder per round)",
         lower_bound=1)
  define("list", "threads", ["1", "2"], "CTranslate2 intra_threads to time")
  define("string", "out", None, "writes OUT.json and OUT.md ('' to write nothing; default: "
         "experiments/results/bench_ctranslate2_decode)")


def settings(values: flags.FlagValues, override_args) -> dict:
  """What a run with these flags measures (benchmarks/settings.py): the flags (the trained
  model's config comes from its checkpoint, which is not resolved here)."""
  if override_args:
    raise ConfigError(f"benchmarks.ctranslate2_decode takes no config overrides: "
                      f"{' '.join(override_args)}")
  own = {k: values[k].value for k in ("workdir", "sentences", "beam_size", "rounds")}
  own["threads"] = thread_counts(values.threads)
  return settings_lib.normalized(settings_lib.benchmark_settings(own))


def thread_counts(texts) -> list[int]:
  try:
    counts = [int(t) for t in texts]
  except ValueError:
    raise ConfigError(f"--threads={','.join(texts)}: expected thread counts, e.g. 1,2") from None
  if not counts or min(counts) < 1:
    raise ConfigError(f"--threads={','.join(texts)}: expected thread counts >= 1")
  return counts


# --------------------------------------------------------------- shared with export_agreement


def dev_sentences(config, count: int) -> tuple[list[str], list[str]]:
  """The first `count` (sources, references) of the run's dev split."""
  texts, refs = sources.load_split_texts(config, "validation")
  return texts[:count], refs[:count]


def translator(loaded, beam_size: int) -> Translator:
  """Our translator of the loaded workdir at this beam size (its other decode settings)."""
  config = loaded.config.copy_and_resolve_references()
  config.decode.beam_size = beam_size
  return Translator(loaded.params, config, loaded.tokenizer)


def ct2_translate(model, tok, source_ids, groups, *, beam_size: int, alpha: float,
                  max_extra_len: int) -> list[list[int]]:
  """CTranslate2's output ids (no EOS) for the sentences of each group of `groups`, one
  translate_batch a group, its output limit the longest source's (our limit, EOS included,
  is length + max_extra_len: CTranslate2's counts the tokens before EOS)."""
  vocab = {tok.id_to_piece(i): i for i in range(tok.vocab_size)}
  out: list[list[int]] = [[] for _ in source_ids]
  for group in groups:
    batch = [[tok.id_to_piece(i) for i in source_ids[j] if i != EOS_ID] for j in group]
    limit = max(len(source_ids[j]) for j in group) + max_extra_len - 1
    results = model.translate_batch(batch, beam_size=beam_size, length_penalty=alpha,
                                    max_decoding_length=limit, min_decoding_length=0,
                                    max_input_length=0)
    for j, r in zip(group, results):
      out[j] = [vocab[p] for p in r.hypotheses[0]]
  return out


def ct2_model(folder: str, threads: int):
  import ctranslate2  # pylint: disable=g-import-not-at-top
  return ctranslate2.Translator(folder, device="cpu", intra_threads=threads, inter_threads=1)


# ------------------------------------------------------------------------------ the benchmark


class _Ours:
  def __init__(self, ours: Translator, ids):
    self.ours, self.ids = ours, ids

  def __call__(self) -> float:
    t = time.perf_counter()
    self.output = self.ours.translate_ids(self.ids)
    return time.perf_counter() - t


class _CT2:
  def __init__(self, model, tok, ids, groups, beam_size, alpha, max_extra_len):
    self.args = (model, tok, ids, groups)
    self.kwargs = dict(beam_size=beam_size, alpha=alpha, max_extra_len=max_extra_len)

  def __call__(self) -> float:
    t = time.perf_counter()
    self.output = ct2_translate(*self.args, **self.kwargs)
    return time.perf_counter() - t


def run(workdir: str, count: int, beam_size: int, rounds: int, threads: list[int],
        command: str, recorded_settings: dict) -> dict:
  import ctranslate2  # pylint: disable=g-import-not-at-top
  result = report.start(command, recorded_settings)
  loaded = trained.load(workdir)
  config, tok = loaded.config, loaded.tokenizer
  alpha, extra = config.decode.alpha, config.decode.max_extra_len
  texts, _ = dev_sentences(config, count)
  ours = translator(loaded, beam_size)
  ids = ours.encode(texts)
  groups = ours.batches(ids)
  print(f"{len(texts)} dev sentences in {len(groups)} batches, beam {beam_size}, alpha {alpha}: "
        "exporting and compiling ...", flush=True)
  deciders, names = [], []
  with tempfile.TemporaryDirectory() as tmp:
    for q in QUANTIZATIONS:
      export.export(workdir, "ctranslate2", os.path.join(tmp, q), quantization=q,
                    step=loaded.step)
    t = time.perf_counter()
    first = _Ours(ours, ids)
    first()  # compiles one search per batch width
    compile_s = time.perf_counter() - t
    deciders.append(first)
    names.append(("transformer_jax", "float32", None))
    for q in QUANTIZATIONS:
      for n in threads:
        deciders.append(_CT2(ct2_model(os.path.join(tmp, q), n), tok, ids, groups, beam_size,
                             alpha, extra))
        names.append(("ctranslate2", q, n))
    times = train_step.time_interleaved(deciders, rounds, warmup=1)
  our_median = statistics.median(times[0])
  tokens = lambda out: sum(len(x) + 1 for x in out)  # EOS included
  entries = []
  for (side, q, n), d, s in zip(names, deciders, times):
    median = statistics.median(s)
    entries.append(dict(
        decoder=side, weights=q, intra_threads=n, pass_s=s, sentences_per_s=len(texts) / median,
        output_tokens=tokens(d.output), tokens_per_s=tokens(d.output) / median,
        speed_vs_ours=our_median / median,
        identical_to_ours=sum(a == b for a, b in zip(d.output, deciders[0].output))))
  result.update(workdir=loaded.workdir, checkpoint_step=loaded.step, sentences=len(texts),
                batches=len(groups), batch_size=ours.batch_size, beam_size=beam_size,
                alpha=alpha, max_extra_len=extra, our_compile_and_first_s=compile_s,
                ctranslate2_version=ctranslate2.__version__, entries=entries,
                model={k: config.model[k] for k in ("d_model", "num_heads", "d_ff",
                                                    "num_encoder_layers", "num_decoder_layers",
                                                    "vocab_size")})
  return report.finish(result)


def markdown(r: dict) -> str:
  rows = []
  for e in r["entries"]:
    rows.append([e["decoder"], e["weights"], e["intra_threads"] or "JAX default",
                 f"{statistics.median(e['pass_s']):.2f}; {min(e['pass_s']):.2f}",
                 f"{e['sentences_per_s']:.1f}", f"{e['tokens_per_s']:.0f}",
                 f"{e['speed_vs_ours']:.2f}x", f"{e['identical_to_ours']} / {r['sentences']}"])
  m = r["model"]
  lines = report.header("CTranslate2's beam search and ours on the same trained weights", r)
  lines += [
      f"Weights: {r['workdir']} step {r['checkpoint_step']} ({m['num_encoder_layers']} + "
      f"{m['num_decoder_layers']} layers, d_model {m['d_model']}, {m['num_heads']} heads, d_ff "
      f"{m['d_ff']}, {m['vocab_size']} pieces), exported with `transformer_jax.tools.export` "
      f"(CTranslate2 {r['ctranslate2_version']}). The first {r['sentences']} dev sentences, "
      f"beam {r['beam_size']}, alpha {r['alpha']} (each side's own length-penalty formula), "
      f"in {r['batches']} batches of up to {r['batch_size']} sentences sorted by length, the "
      "same batches on both sides. Ours: `Translator.translate_ids` (jitted, compiled "
      f"beforehand: {r['our_compile_and_first_s']:.1f} s for compile + first pass). Each pass "
      f"translates every sentence once; {len(r['entries'][0]['pass_s'])} rounds of one pass of "
      "each decoder in turn after one warm-up pass each.", "",
      table(["decoder", "weights", "threads", "s/pass (median; min)", "sent/s",
             "output tokens/s", "speed vs ours", "outputs identical to ours"], rows)]
  return "\n".join(lines) + "\n"


def main(argv):
  values = flags.FLAGS
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not values.workdir:
    raise ConfigError("--workdir is required: a trained workdir (e.g. configs/multi30k.py:short)")
  r = run(values.workdir, values.sentences, values.beam_size, values.rounds,
          thread_counts(values.threads),
          shlex.join(["python", "-m", "benchmarks.ctranslate2_decode", *sys.argv[1:]]),
          settings(values, cli.OVERRIDE_ARGS))
  out = "experiments/results/bench_ctranslate2_decode" if values.out is None else values.out
  report.write(r, markdown(r), out)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  cli.run(main, verbosity=logging.WARNING)
