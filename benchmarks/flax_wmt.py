"""Side by side: the flax WMT example's train step and ours, same shapes, one process.

  git clone --depth 1 https://github.com/google/flax /tmp/flax
  python -m benchmarks.flax_wmt --flax_wmt_dir=/tmp/flax/examples/wmt

Theirs is `train.train_step` from their train.py, unchanged, set up as their `train_and_evaluate`
does (jitted init, adamw(lr, 0.9, 0.98, 1e-9, weight_decay=0), pmap over the one local device,
`common_utils.shard`ed batches). Equal configuration: ours at base size (any
`--config.KEY=VALUE` applies to ours, and theirs takes our shapes), a shared 32000-piece
vocabulary, dropout 0.1 on residuals, attention weights and ReLU outputs (flax's defaults; ours
gets FLAX_DROPOUT first), label smoothing 0.1, float32, threefry dropout in both
(`--config.train.dropout_rng_impl=rbg`: ours with rbg), the same batch of random ids. Each model
is as its authors wrote it (flax pre-LN, ours post-LN); their matmuls are the same, so both are
credited the same model FLOPs against the same peak. After compiling and warm-up, steps are timed
in rounds of one step of each side in turn (`train_step.time_interleaved`); both run with the
same process settings (this entry point re-executes itself with `host_memory.MALLOC_SETTINGS`).
With `--flax_unrolled_variant`, flax's step is compiled once more after ours has registered the
unrolled threefry lowering (`transformer_jax/runtime/rng.py`), for reference.
"""

if __name__ == "__main__":
  from transformer_jax.runtime import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.reexec_with_malloc_settings()  # the same process settings for both steps

import functools
import shlex
import sys
import time

from absl import flags, logging
from flax import jax_utils
from flax.training import common_utils
import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer_jax.runtime import cli, rng
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.markdown import table
from transformer_jax.runtime.overrides import parse_overrides
from transformer_jax.runtime.special_ids import PAD_ID
from transformer_jax.training import metrics

from benchmarks import flax_example, report, settings as settings_lib, train_step

FLAX_DROPOUT = {"model.attention_dropout_rate": 0.1, "model.relu_dropout_rate": 0.1}



def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values` (flags.FLAGS when it runs; a fresh set to resolve a
  recorded command)."""
  flax_example.define_flags(values)
  flags.DEFINE_list("shapes", ["8x128", "32x128"], "batch shapes ROWSxLENGTH", flag_values=values)
  flags.DEFINE_integer("steps", 5, "rounds of timed steps (one step of each side per round)",
                       lower_bound=1, flag_values=values)
  flags.DEFINE_integer("warmup", 1, "untimed steps after compiling", lower_bound=0,
                       flag_values=values)
  flags.DEFINE_bool("flax_unrolled_variant", True, "also time flax's step compiled with the "
                    "unrolled threefry lowering that ours registers (transformer_jax/runtime/"
                    "rng.py), for reference", flag_values=values)
  flags.DEFINE_string("out", "experiments/results/bench_flax_wmt",
                      "writes OUT.json and OUT.md ('' to write nothing)", flag_values=values)


def our_overrides(override_args) -> dict:
  """Our side's overrides: flax's dropout first, then the command's --config.KEY=VALUE."""
  return dict(FLAX_DROPOUT, **parse_overrides(override_args))


def settings(values: flags.FlagValues, override_args) -> dict:
  """What a run with these flags and overrides measures (benchmarks/settings.py): the flags and
  our side's config (theirs is their code at --flax_wmt_dir, given our shapes)."""
  config = train_step.train_config("base", our_overrides(override_args))[0]
  for shape in values.shapes:
    train_step.parse_shape(shape)
  own = {k: values[k].value for k in ("shapes", "steps", "warmup", "flax_unrolled_variant")}
  return settings_lib.normalized({**settings_lib.benchmark_settings(own),
                                  **settings_lib.config_settings("train:base", config)})


class FlaxStepper:
  """Their step at base size on our synthetic batch, set up as their train_and_evaluate does; one
  timed step per call (the first call compiles)."""

  def __init__(self, models, train, config, rows: int, length: int):
    train_config = flax_example.flax_config(models, ModelConfig.from_config(config.model),
                                            max_len=256, dropout=0.1)
    dropout_rng, init_rng = jax.random.split(jax.random.key(0))
    m = models.Transformer(train_config.replace(deterministic=True))
    variables = jax.jit(m.init)(init_rng, jnp.ones((rows, length), jnp.float32),
                                jnp.ones((rows, length), jnp.float32))
    learning_rate_fn = train.create_learning_rate_schedule(learning_rate=0.002, warmup_steps=1000)
    state = train.TrainState.create(
        apply_fn=m.apply, params=variables["params"],
        tx=optax.adamw(learning_rate=learning_rate_fn, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0),
        dynamic_scale=None)
    del variables
    self.state = jax_utils.replicate(state)
    self.p_train_step = jax.pmap(
        functools.partial(train.train_step, config=train_config, learning_rate_fn=learning_rate_fn,
                          label_smoothing=0.1),
        axis_name="batch", donate_argnums=(0,))
    self.dropout_rngs = jax.random.split(dropout_rng, jax.local_device_count())
    self.batch = train_step.synthetic_batch(config, rows, length)
    self.sharded = common_utils.shard(jax.tree_util.tree_map(np.asarray, self.batch))
    self.losses = []

  def __call__(self) -> float:
    t = time.perf_counter()
    self.state, m = self.p_train_step(self.state, self.sharded, dropout_rng=self.dropout_rngs)
    jax.block_until_ready((self.state, m))
    seconds = time.perf_counter() - t
    self.losses.append(float(m["loss"][0]) / float(m["denominator"][0]))
    return seconds

  def entry(self, compile_and_first: float, samples, flops: float, peak: float) -> dict:
    tokens = int((self.batch["targets"] != PAD_ID).sum())
    return {"compile_and_first_step_s": compile_and_first,
            **train_step.step_timing(samples, tokens, flops, peak, jax.local_device_count()),
            "loss_first_last": [self.losses[0], self.losses[-1]],
            "finite": bool(np.all(np.isfinite(self.losses)))}


def run(folder: str, shapes, steps: int, warmup: int, overrides: dict, flax_unrolled: bool,
        command: str, recorded_settings: dict) -> dict:
  """Both steps at each shape; the JSON-able result, headed by `command` and `recorded_settings`."""
  config = train_step.train_config("base", overrides)[0]  # mistakes: before timing
  cfg = ModelConfig.from_config(config.model)
  parsed = [train_step.parse_shape(shape) for shape in shapes]
  for _, length in parsed:
    train_step.check_fits(config, length)
  models, train = flax_example.load_flax_wmt(folder)
  result = report.start(command, recorded_settings)
  peak = metrics.measure_peak_flops(np.dtype("float32"))
  print(f"peak (float32 2048^2 jnp.dot): {peak / 1e9:.1f} GFLOP/s", flush=True)
  entries = []
  for rows, length in parsed:
    shape = f"{rows}x{length}"
    flops = metrics.train_flops(cfg, rows, length, length)
    print(f"{shape}: compiling the flax WMT example's step and ours ...", flush=True)
    theirs = [FlaxStepper(models, train, config, rows, length)]
    compile_s = [theirs[0]()]
    ours = train_step.Stepper("base", rows, length, overrides)
    if flax_unrolled and rng.unroll_threefry_on_cpu():  # compiled after: their step, our lowering
      theirs.append(FlaxStepper(models, train, config, rows, length))
      compile_s.append(theirs[-1]())
    print(f"{shape}: {warmup} warm-up step(s) each, then {steps} rounds of one step each ...",
          flush=True)
    *samples, own = train_step.time_interleaved([*theirs, ours], steps, warmup)
    flax_entries = [s.entry(c, x, flops, peak) for s, c, x in zip(theirs, compile_s, samples)]
    del theirs
    e = dict(ours.entry(own, warmup, peak), **flax_example.speedup(samples[0], own))
    ours.close()
    for name, x in (("flax WMT", flax_entries[0]), ("ours", e)):
      print(f"  {name}: {x['step_s']['median']:.3f} s/step, {x['target_tokens_per_s']:.0f} tok/s, "
            f"MFU {x['mfu']:.1%}", flush=True)
    entries.append({"shape": shape, "model_flops_per_step": flops, "flax_wmt": flax_entries[0],
                    "flax_wmt_unrolled_threefry": (flax_entries + [None])[1],
                    "transformer_jax": e})
  result.update(flax_wmt_code=flax_example.checkout(folder), peak_flops_per_s=peak,
                ours_overrides=dict(overrides), interleaved=True, warmup_steps=warmup,
                entries=entries)
  return report.finish(result)


def markdown(r: dict) -> str:
  def s_per_step(e):
    return f"{e['step_s']['median']:.3f}; {e['step_s']['min']:.3f}"
  rows, notes = [], []
  for e in r["entries"]:
    f, o, u = e["flax_wmt"], e["transformer_jax"], e["flax_wmt_unrolled_threefry"]
    rows.append([e["shape"], s_per_step(f), round(f["target_tokens_per_s"]), f"{f['mfu']:.1%}",
                 o["dropout_rng_impl"], s_per_step(o), round(o["target_tokens_per_s"]),
                 f"{o['mfu']:.1%}", *flax_example.speedup_cells(o)])
    if u:
      notes += [f"{e['shape']}, for reference: flax's step compiled with the unrolled threefry "
                "lowering that our step registers (`transformer_jax/runtime/rng.py`; theirs as "
                f"shipped uses jax's rolled CPU loops): {u['step_s']['median']:.3f} s/step, "
                f"{u['target_tokens_per_s']:.0f} tok/s, MFU {u['mfu']:.1%}; ours is "
                f"{o['target_tokens_per_s'] / u['target_tokens_per_s']:.2f}x that.", ""]
  overrides = ", ".join(f"{k}={v}" for k, v in r["ours_overrides"].items())
  lines = report.header("The flax WMT example's train step and ours, side by side", r) + [
      flax_example.code_line(r), "",
      f"Peak: {r['peak_flops_per_s'] / 1e9:.1f} GFLOP/s (float32 2048x2048 jnp.dot, same run).", "",
      "Both at base size, vocabulary 32000 shared, fp32, dropout 0.1 on residuals, attention "
      "weights and ReLU outputs, label smoothing 0.1, Adam(0.9, 0.98, 1e-9), the same batch of "
      f"random ids. Ours with `{overrides}`. Model FLOPs = `metrics.train_flops` (3 x forward "
      "matmul FLOPs) for both; MFU against the peak above. After "
      f"{r['warmup_steps']} warm-up step(s) each, the steps are "
      + flax_example.ROUNDS_NOTE.format("step"), "",
      table(["batch", "flax WMT s/step (median; min)", "tok/s", "MFU", "ours: dropout PRNG",
             "s/step (median; min)", "tok/s", "MFU", "speed-up (medians)", "per round"], rows),
      *notes, "Compile (flax: compile + first step; ours: compile only): " + ", ".join(
          f"{e['shape']} {e['flax_wmt']['compile_and_first_step_s']:.1f} s / "
          f"{e['transformer_jax']['compile_s']:.1f} s" for e in r["entries"])]
  return "\n".join(lines) + "\n"


def main(argv):
  values = flags.FLAGS
  folder = flax_example.check_command_line(argv, values)
  r = run(folder, values.shapes, values.steps, values.warmup, our_overrides(cli.OVERRIDE_ARGS),
          values.flax_unrolled_variant,
          shlex.join(["python", "-m", "benchmarks.flax_wmt", *sys.argv[1:]]),
          settings(values, cli.OVERRIDE_ARGS))
  report.write(r, markdown(r), values.out)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  cli.run(main, verbosity=logging.WARNING)
