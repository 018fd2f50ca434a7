"""A trained parser's dev decoding, timed: sentences/s of the search `--mode=eval` runs.

  taskset -c 0 python -m benchmarks.parse_decode --workdir=W [--sentences=N] \
      [--config.decode.KEY=VALUE]... [--config.data.eval_files=FILES]

The workdir is loaded by the one loader (inference/trained.py) with the decode overrides on top
(the constrained search by default, `decode.parse_constraint=True`), and its dev sentences are
decoded by `Translator.translate`, the path an evaluation takes: sorted by length into batches of
`decode.batch_size`. Reported: wall and CPU seconds (on one pinned core the CPU seconds are the
time an idle core takes, whatever else the machine runs), compile time apart (a first pass over
one sentence of each batch width), decoder steps, and the trees' F1 (a speed change that changed
the trees would show here; `--expect` names a trees file they must equal line for line).
"""

from __future__ import annotations

import time

from absl import flags, logging

from transformer_jax.runtime import cli
from transformer_jax.runtime.exceptions import ConfigError

from benchmarks import report, settings as settings_lib

DEFAULT_OVERRIDES = ("--config.decode.parse_constraint=True",)


def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values` (flags.FLAGS when it runs; a fresh set to resolve a
  recorded command)."""
  def define(kind, name, default, help_text, **kwargs):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values, **kwargs)
  define("string", "workdir", None, "a trained parser's workdir")
  define("integer", "sentences", 0, "decode the first N dev sentences (0: all)", lower_bound=0)
  define("string", "expect", None, "a file of trees (one per line) the outputs must equal")
  define("string", "out", "experiments/results/parse_decode",
         "writes OUT.json and OUT.md ('' to write nothing)")


def _overrides(override_args) -> list[str]:
  keys = {a.split("=")[0] for a in override_args}
  return [a for a in DEFAULT_OVERRIDES if a.split("=")[0] not in keys] + list(override_args)


def settings(values: flags.FlagValues, override_args) -> dict:
  """The benchmark's flags and the decode overrides (the workdir's own config is its
  checkpoint's, not resolved here)."""
  bad = [a for a in override_args
         if not a.startswith(("--config.decode.", "--config.data.eval_files="))]
  if bad:
    raise ConfigError(f"{bad[0]}: benchmarks.parse_decode takes only --config.decode.* and "
                      "--config.data.eval_files overrides")
  own = {"sentences": values.sentences, "overrides": _overrides(override_args)}
  return settings_lib.normalized(settings_lib.benchmark_settings(own))


def run(values, command: str, recorded: dict) -> dict:
  from transformer_jax.data import sources as sources_lib  # pylint: disable=g-import-not-at-top
  from transformer_jax.inference import translate  # pylint: disable=g-import-not-at-top
  if not values.workdir:
    raise ConfigError("--workdir: a trained parser's workdir is required")
  translator = translate.Translator.from_workdir(values.workdir,
                                                 override_args=_overrides(cli.OVERRIDE_ARGS))
  config = translator.config
  task = translator.task
  texts, refs = sources_lib.load_split_texts(config, "validation", task.read_split)
  n = min(values.sentences or len(texts), len(texts))
  sources, references = texts[:n], refs[:n]
  expected = None
  if values.expect:
    with open(values.expect, encoding="utf-8") as f:
      expected = [line.rstrip("\n") for line in f][:n]
    if len(expected) != n:
      raise ConfigError(f"--expect={values.expect}: {len(expected)} lines for {n} sentences")
  result = report.start(command, recorded)
  # Compile first: each batch's longest sentence alone, a batch of the width the timed pass
  # gives that batch (rows are always decode.batch_size).
  ids = translator.encode(sources)
  start = time.time()
  for batch in translator.batches(ids):
    translator.translate_ids([ids[batch[-1]]])
  compile_s = time.time() - start
  translator.decoder_steps = 0
  wall, cpu = time.time(), time.process_time()
  outputs = translator.translate(sources, raw=True)
  wall, cpu = time.time() - wall, time.process_time() - cpu
  scores, trees = task.score(config, sources, outputs, references)
  same = None if expected is None else sum(a == b for a, b in zip(trees, expected))
  result.update(
      workdir=values.workdir, sentences=n, batch_size=translator.batch_size,
      beam_size=translator.beam_size, compile_s=compile_s, decode_wall_s=wall, decode_cpu_s=cpu,
      sentences_per_s_wall=n / wall, sentences_per_s_cpu=n / cpu,
      decoder_steps=translator.decoder_steps,
      scores={k: scores[k] for k in ("f1", "precision", "recall", "exact_match", "repaired")},
      trees=trees, same_as_expected=same)
  print(f"{n} sentences in {wall:.1f} s wall, {cpu:.1f} s CPU: {n / cpu:.2f} sentences/s (CPU); "
        f"F1 {scores['f1']:.2f}" + ("" if same is None else f"; {same} of {n} trees as expected"),
        flush=True)
  return report.finish(result)


def markdown(r: dict) -> str:
  lines = report.header("A parser's dev decoding (the constrained search), timed", r)
  lines += [
      f"Workdir `{r['workdir']}`, {r['sentences']} dev sentences, batches of {r['batch_size']}, "
      f"beam {r['beam_size']}; settings {', '.join(r['settings']['benchmark.overrides'])}.", "",
      "| decode wall s | decode CPU s | sentences/s (CPU) | compile s | decoder steps | F1 | "
      "same trees as expected |", "|---|---|---|---|---|---|---|",
      f"| {r['decode_wall_s']:.1f} | {r['decode_cpu_s']:.1f} | {r['sentences_per_s_cpu']:.2f} | "
      f"{r['compile_s']:.1f} | {r['decoder_steps']} | {r['scores']['f1']:.2f} | "
      f"{'n/a' if r['same_as_expected'] is None else r['same_as_expected']} |"]
  return "\n".join(lines) + "\n"


def main(argv):
  report.main(argv, "benchmarks.parse_decode", settings, run, markdown)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  cli.run(main, verbosity=logging.WARNING)
