"""One epoch of a config's real training batches, timed: the train step at every batch shape the
planner makes, with each bucket's sources padded to their own length (what training does) and to
the bucket's length (the targets' padding), side by side.

  python -m benchmarks.epoch_cost --config=configs/wsj_parsing.py:sample [--steps=5] \
      [--config.KEY=VALUE]... [--out=experiments/results/epoch_cost_wsj_sample]

The config's vocabulary is trained in a temporary folder as a training run's start would, and
epoch 0 is planned on its real token lengths (bucket mode). For each bucket, the first batch of
the epoch is assembled twice, the same examples in the same rows: sources padded as the planner
pads them and to the bucket length. Both compiled steps run in turn (`--warmup` untimed, then
`--steps` timed each), so a drift of the machine's speed lands on both alike. An epoch's cost is
the sum over buckets of its batch count times the median step: the train step only, not the
input pipeline (grain assembles batches ahead of the step) or evaluations. Run it on an idle
machine.
"""

from __future__ import annotations

if __name__ == "__main__":
  from transformer_jax.runtime import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.reexec_with_malloc_settings()  # before jax: the steps are timed as main.py runs them

import collections
import dataclasses
import statistics
import tempfile

from absl import flags, logging

from transformer_jax.data import pipeline, token_cache, tokenizer
from transformer_jax.data.batching import BatchAssembler
from transformer_jax.runtime import cli, overrides as overrides_lib
from transformer_jax.runtime.config import validate
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.markdown import table
from transformer_jax.tasks import registry

from benchmarks import report, settings as settings_lib
from benchmarks.train_step import Stepper, time_interleaved


def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values` (flags.FLAGS when it runs; a fresh set to resolve a
  recorded command)."""
  def define(kind, name, default, help_text, **kwargs):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values, **kwargs)
  define("string", "config", None, "Run config in bucket mode, e.g. configs/wsj_parsing.py:sample.")
  define("integer", "steps", 5, "timed steps per bucket and padding", lower_bound=1)
  define("integer", "warmup", 1, "untimed steps after compiling", lower_bound=0)
  define("string", "out", "", "Result files OUT.{md,json} ('' to write nothing).")


def _config(values: flags.FlagValues, override_args):
  if not values.config:
    raise ConfigError("benchmarks.epoch_cost: --config is required (a run config)")
  config = overrides_lib.load(values.config, override_args)
  if config.data.batch_mode != "bucket":
    raise ConfigError(f"--config={values.config}: config key 'data.batch_mode' is "
                      f"{config.data.batch_mode!r}; the benchmark compares bucket paddings")
  return config


def settings(values: flags.FlagValues, override_args) -> dict:
  """What a run with these flags measures (benchmarks/settings.py): the run config with its
  overrides and the step counts."""
  config = _config(values, override_args)
  own = {"config": values.config, "steps": values.steps, "warmup": values.warmup,
         "overrides": list(override_args)}
  return settings_lib.normalized({**settings_lib.benchmark_settings(own),
                                  **settings_lib.config_settings("train", config)})


def _buckets(planner) -> list[dict]:
  """Epoch 0's batches grouped by shape: the fullest batch of each, their count, and the source
  length of the same bucket padded to its length."""
  specs, _, _ = planner.epoch_batches(0)
  by_shape = collections.defaultdict(list)  # one compiled step per shape
  for spec in specs:
    by_shape[spec.num_rows, spec.source_len, spec.target_len].append(spec)
  loose = dict(zip(planner.batch_shapes(), _loose_shapes(planner)))  # bucket by bucket
  out = []
  for shape in sorted(by_shape, key=lambda k: (k[2], k[1], -k[0])):
    group = by_shape[shape]
    first = max(group, key=lambda s: len(s.example_ids))  # a full batch where there is one
    out.append({"spec": first, "batches": len(group), "rows": shape[0], "source_len": shape[1],
                "target_len": shape[2], "bucket_source_len": loose[shape][1]})
  return out


def _loose_shapes(planner):
  """The planner's shapes with every source padded to its bucket's length."""
  own = planner.source_lengths
  planner.source_lengths = None
  try:
    return planner.batch_shapes()
  finally:
    planner.source_lengths = own


def run(values, command: str, recorded: dict) -> dict:
  config = validate(_config(values, cli.OVERRIDE_ARGS))
  task = registry.get(config)
  result = report.start(command, recorded)
  with tempfile.TemporaryDirectory() as tmp:
    tok = tokenizer.load_or_train_tokenizer(config, tmp, reader=task.read_split,
                                            split_by_script=task.split_by_script)
    planner = pipeline.make_train_iterator(config, tok, reader=task.read_split).planner
    tokenized = token_cache.tokenized_split(config, tok, "train", reader=task.read_split)
  if planner.source_lengths is None:
    raise ConfigError(f"--config={values.config}: the planner pads sources to the bucket length "
                      "(a sampled segmentation, data.bpe_dropout > 0): nothing to compare")
  assembler = BatchAssembler(tokenized)
  buckets = _buckets(planner)
  for b in buckets:
    steppers = [Stepper(values.config, b["rows"], b["target_len"], config=config,
                        batch=assembler(dataclasses.replace(b["spec"], source_len=source_len)))
                for source_len in (b["source_len"], b["bucket_source_len"])]
    own, loose = time_interleaved(steppers, values.steps, values.warmup)
    for stepper in steppers:
      stepper.close()
    b.update(step_s=statistics.median(own), bucket_step_s=statistics.median(loose),
             samples=own, bucket_samples=loose)
    del b["spec"]
    print(f"  {b['rows']}x{b['source_len']}x{b['target_len']} ({b['batches']} a epoch): "
          f"{b['step_s']:.3f} s; sources to {b['bucket_source_len']}: {b['bucket_step_s']:.3f} s",
          flush=True)
  epoch = sum(b["batches"] * b["step_s"] for b in buckets)
  loose_epoch = sum(b["batches"] * b["bucket_step_s"] for b in buckets)
  padded = lambda key: sum(b["batches"] * b["rows"] * b[key] for b in buckets)  # noqa: E731
  result.update(config=values.config, buckets=buckets, epoch_s=epoch, bucket_epoch_s=loose_epoch,
                speedup=loose_epoch / epoch, padded_source_tokens=padded("source_len"),
                bucket_padded_source_tokens=padded("bucket_source_len"),
                padded_target_tokens=padded("target_len"),
                real_source_tokens=int(tokenized.source_lengths[planner.example_ids].sum()))
  print(f"an epoch's train steps: {epoch:.1f} s with sources padded to their own length, "
        f"{loose_epoch:.1f} s to the bucket length ({loose_epoch / epoch:.2f}x)", flush=True)
  return report.finish(result)


def markdown(r: dict) -> str:
  lines = report.header("One epoch of a config's training batches: sources padded to their own "
                        "length or to the bucket's", r)
  lines += [
      f"`{r['config']}`{''.join(' ' + o for o in r['settings']['benchmark.overrides'])}: epoch 0 "
      f"of its real training batches (bucket mode). Per bucket, its first full batch with the "
      f"sources padded as training pads them and to the bucket length, both compiled steps "
      f"timed in turn ({r['settings']['benchmark.steps']} steps each, median). An epoch's cost: "
      f"batches × median step, summed (the train step only).", "",
      table(["bucket (rows × source × target)", "batches an epoch", "step s",
             "sources to the bucket length", "step s", "speed-up"],
            [[f"{b['rows']}×{b['source_len']}×{b['target_len']}", b["batches"],
              f"{b['step_s']:.3f}", f"{b['rows']}×{b['bucket_source_len']}×{b['target_len']}",
              f"{b['bucket_step_s']:.3f}", f"{b['bucket_step_s'] / b['step_s']:.2f}x"]
             for b in r["buckets"]]), "",
      f"An epoch's train steps: **{r['epoch_s']:.1f} s** with sources padded to their own length "
      f"against {r['bucket_epoch_s']:.1f} s padded to the bucket length (**{r['speedup']:.2f}x**). "
      f"Source positions an epoch: {r['padded_source_tokens']:,} against "
      f"{r['bucket_padded_source_tokens']:,} ({r['real_source_tokens']:,} real); target positions "
      f"{r['padded_target_tokens']:,}."]
  return "\n".join(lines) + "\n"


def main(argv):
  report.main(argv, "benchmarks.epoch_cost", settings, run, markdown)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  cli.run(main, verbosity=logging.WARNING)
