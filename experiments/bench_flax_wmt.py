"""Side by side: the flax WMT example's train step and ours, same shapes, one process, one machine.

Run from the repository root, with a checkout of flax's examples/wmt (not part of this repo):
  git clone --depth 1 https://github.com/google/flax /tmp/flax
  python -m experiments.bench_flax_wmt --flax_wmt_dir=/tmp/flax/examples/wmt
Writes experiments/results/bench_flax_wmt.{json,md}; about 10 minutes on 2 CPU cores.

The flax step is theirs, unchanged: `train.train_step` from their train.py with `models.py`, set
up as their `train_and_evaluate` does (`models.TransformerConfig`, `jax.jit(m.init)` with the
deterministic config, `TrainState.create` with `optax.adamw(lr, 0.9, 0.98, 1e-9, weight_decay=0)`,
`jax.pmap(partial(train_step, config=..., learning_rate_fn=..., label_smoothing=0.1),
axis_name="batch", donate_argnums=(0,))` over the one local device, `common_utils.shard`ed
batches). Their train.py imports TensorFlow, clu and their input_pipeline/bleu/decode modules at
the top; the step uses none of them, so the ones that are not installed are replaced by empty
modules (TensorFlow stays out of this process).

Equal configuration: base size (d_model 512, 8 heads of 64, d_ff 2048, 6 + 6 layers), a
32000-piece vocabulary with one embedding matrix shared by source, target and the pre-softmax
projection, dropout 0.1 on residuals, attention weights and the FFN's ReLU output (flax's
defaults; ours gets `--ours_overrides` to match, since the paper's base has only residual
dropout), label smoothing 0.1, Adam(0.9, 0.98, 1e-9), float32, the default jax PRNG for dropout
(threefry) in both (and, with --rbg_variant, ours once more with `train.dropout_rng_impl=rbg`:
the same Bernoulli masks' distribution from XLA's RngBitGenerator), and the same batch of random ids (`bench.train_step.synthetic_batch`: full
rows, no padding). The models are each as their authors wrote them: flax is pre-LN and divides
the logits by sqrt(d_model); ours is post-LN (the paper) and multiplies the embeddings by
sqrt(d_model). Their matmuls are the same, so both are credited the same model FLOPs
(`metrics.train_flops`, 3 x the forward matmul FLOPs) and the same MFU denominator (a jnp.dot
peak measured at the start of the run).

Timing: after compiling and one warm-up step each, the steps are timed in rounds of one step of
each side in turn (`bench.train_step.time_interleaved`). Process settings are the same for both:
this entry point re-executes itself with `host_memory.MALLOC_SETTINGS` unless
TRANSFORMER_JAX_MALLOC=0. With --flax_unrolled_variant, flax's step is compiled a second time
after ours has registered the unrolled threefry lowering (`transformer_jax/rng.py`), for
reference.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import importlib.util
import json
import os
import sys
import time
import types

from absl import app, flags

_FLAX_WMT_DIR = flags.DEFINE_string("flax_wmt_dir", None,
                                    "folder with flax's examples/wmt models.py and train.py")
_SHAPES = flags.DEFINE_list("shapes", ["8x128", "32x128"], "batch shapes ROWSxLENGTH")
_STEPS = flags.DEFINE_integer("steps", 5, "rounds of timed steps (one step of each side per round)",
                             lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 1, "untimed steps after compiling", lower_bound=0)
_OURS_OVERRIDES = flags.DEFINE_list(
    "ours_overrides", ["model.attention_dropout_rate=0.1", "model.relu_dropout_rate=0.1"],
    "overrides of our base config that make it match flax's defaults")
_RBG = flags.DEFINE_bool("rbg_variant", False, "also time ours with train.dropout_rng_impl=rbg "
                         "(the same dropout distribution from XLA's RngBitGenerator)")
_FLAX_UNROLLED = flags.DEFINE_bool(
    "flax_unrolled_variant", True, "also time flax's step compiled with the unrolled threefry "
    "lowering that ours registers (transformer_jax/rng.py), for reference")
_OUT = flags.DEFINE_string("out", "experiments/results/bench_flax_wmt",
                           "writes OUT.json and OUT.md ('' to write nothing)")

def load_flax_wmt(folder: str):
  """Their (models, train) modules. The imports train_step never uses get empty stand-ins while
  train.py loads (TensorFlow and clu only when not installed; their bleu/decode/input_pipeline
  always, as those read data through TensorFlow), and are removed again afterwards."""
  for name in ("models.py", "train.py"):
    if not os.path.isfile(os.path.join(folder, name)):
      raise FileNotFoundError(f"--flax_wmt_dir={folder}: no {name} (expected flax's examples/wmt)")
  # What train.py imports from flax, first: their optional TensorFlow imports must see the truth.
  for name in ("flax.jax_utils", "flax.training.checkpoints", "flax.training.dynamic_scale"):
    importlib.import_module(name)
  stubs = ["bleu", "decode", "input_pipeline"]
  for name in ("tensorflow", "clu"):
    if importlib.util.find_spec(name) is None:
      stubs.append(name)
  stubs += ["clu.metric_writers", "clu.periodic_actions"] if "clu" in stubs else []
  added = [name for name in stubs if name not in sys.modules]
  for name in added:
    sys.modules[name] = types.ModuleType(name)
  if "clu" in added:
    sys.modules["clu"].metric_writers = sys.modules["clu.metric_writers"]
    sys.modules["clu"].periodic_actions = sys.modules["clu.periodic_actions"]
  sys.path.insert(0, folder)
  try:
    return importlib.import_module("models"), importlib.import_module("train")
  finally:
    sys.path.remove(folder)
    for name in added:
      sys.modules.pop(name, None)


class FlaxStepper:
  """Their step at base size on our synthetic batch, set up as their train_and_evaluate does; one
  timed step per call (the first call compiles)."""

  def __init__(self, models, train, rows: int, length: int):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    import optax  # pylint: disable=g-import-not-at-top
    from flax import jax_utils, linen as nn  # pylint: disable=g-import-not-at-top
    from flax.training import common_utils  # pylint: disable=g-import-not-at-top
    from transformer_jax.bench import train_step as ours  # pylint: disable=g-import-not-at-top

    train_config = models.TransformerConfig(
        vocab_size=32000, output_vocab_size=32000, share_embeddings=True,
        logits_via_embedding=True, dtype=jnp.float32, emb_dim=512, num_heads=8, num_layers=6,
        qkv_dim=512, mlp_dim=2048, max_len=256, dropout_rate=0.1, attention_dropout_rate=0.1,
        deterministic=False, decode=False, kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6))
    eval_config = train_config.replace(deterministic=True)
    rng, init_rng = jax.random.split(jax.random.key(0))
    m = models.Transformer(eval_config)
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
    self.dropout_rngs = jax.random.split(rng, jax.local_device_count())
    config, _ = ours.train_config("base")
    self.batch = ours.synthetic_batch(config, rows, length)
    self.sharded = common_utils.shard(jax.tree_util.tree_map(np.asarray, self.batch))
    self.losses = []

  def __call__(self) -> float:
    import jax  # pylint: disable=g-import-not-at-top
    t = time.perf_counter()
    self.state, metrics = self.p_train_step(self.state, self.sharded,
                                            dropout_rng=self.dropout_rngs)
    jax.block_until_ready((self.state, metrics))
    seconds = time.perf_counter() - t
    self.losses.append(float(metrics["loss"][0]) / float(metrics["denominator"][0]))
    return seconds

  def entry(self, compile_and_first: float, samples, flops: float, peak: float) -> dict:
    import numpy as np  # pylint: disable=g-import-not-at-top
    from transformer_jax.bench import train_step as ours  # pylint: disable=g-import-not-at-top
    tokens = int((self.batch["targets"] != 0).sum())
    return {"compile_and_first_step_s": compile_and_first,
            **ours.step_timing(samples, tokens, flops, peak),
            "loss_first_last": [self.losses[0], self.losses[-1]],
            "finite": bool(np.all(np.isfinite(self.losses)))}


def run(folder: str, shapes, steps: int, warmup: int, ours_overrides, rbg_variant=False,
        flax_unrolled=True) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from transformer_jax import metrics, rng  # pylint: disable=g-import-not-at-top
  from transformer_jax.bench import runner, train_step as ours  # pylint: disable=g-import-not-at-top
  from transformer_jax.config import ModelConfig  # pylint: disable=g-import-not-at-top
  variants = [("threefry (as flax)", list(ours_overrides))]
  if rbg_variant:
    variants.append(("rbg", list(ours_overrides) + ["train.dropout_rng_impl=rbg"]))
  configs = [ours.train_config("base")[0] for _ in variants]
  for config, (_, overrides) in zip(configs, variants):  # mistakes: before anything is timed
    ours.apply_overrides(config, overrides)
  cfg = ModelConfig.from_config(configs[0].model)  # the variants differ only in the dropout PRNG
  models, train = load_flax_wmt(folder)
  before = runner.machine_load()
  peak = metrics.measure_peak_flops(np.dtype("float32"))
  print(f"peak (float32 2048^2 jnp.dot): {peak / 1e9:.1f} GFLOP/s", flush=True)
  entries = []
  for shape in shapes:
    rows, length = ours.parse_shape(shape)
    flops = metrics.train_flops(cfg, rows, length, length)
    print(f"{shape}: compiling the flax WMT example's step and ours "
          f"({', '.join(name for name, _ in variants)}) ...", flush=True)
    theirs = FlaxStepper(models, train, rows, length)
    compile_and_first = theirs()
    mine = [ours.Stepper("base", shape, overrides) for _, overrides in variants]
    flax_steppers = [theirs]
    if flax_unrolled and rng.unroll_threefry_on_cpu():  # compiled after: their step, our lowering
      flax_steppers.append(FlaxStepper(models, train, rows, length))
      unrolled_compile = flax_steppers[-1]()
    print(f"{shape}: {warmup} warm-up step(s) each, then {steps} rounds of one step each ...",
          flush=True)
    samples = ours.time_interleaved([*flax_steppers, *mine], steps, warmup)
    flax_entry = theirs.entry(compile_and_first, samples[0], flops, peak)
    print(f"  flax WMT: {flax_entry['step_s']['median']:.3f} s/step, "
          f"{flax_entry['target_tokens_per_s']:.0f} tok/s, MFU {flax_entry['mfu']:.1%}", flush=True)
    unrolled_entry = None
    if len(flax_steppers) > 1:
      unrolled_entry = flax_steppers[1].entry(unrolled_compile, samples[1], flops, peak)
      print(f"  flax WMT with our unrolled threefry lowering: "
            f"{unrolled_entry['step_s']['median']:.3f} s/step", flush=True)
    del theirs, flax_steppers
    entries_ours = []
    for (name, _), stepper, own in zip(variants, mine, samples[-len(mine):]):
      e = stepper.entry(own, warmup, peak)
      stepper.close()
      e["variant"] = name
      e["speedup"] = e["target_tokens_per_s"] / flax_entry["target_tokens_per_s"]
      e["speedup_per_round"] = [f / o for f, o in zip(samples[0], own)]
      print(f"  ours, {name}: {e['step_s']['median']:.3f} s/step, "
            f"{e['target_tokens_per_s']:.0f} tok/s, MFU {e['mfu']:.1%}, {e['speedup']:.2f}x "
            f"(per round: {', '.join(f'{x:.2f}' for x in e['speedup_per_round'])})", flush=True)
      entries_ours.append(e)
    entries.append({"shape": shape, "model_flops_per_step": flops, "flax_wmt": flax_entry,
                    "flax_wmt_unrolled_threefry": unrolled_entry, "transformer_jax": entries_ours})
  after = runner.machine_load()
  return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "command": "python -m experiments.bench_flax_wmt " + " ".join(sys.argv[1:]),
          "machine": runner.machine(), **runner.idle_record(before, after),
          "peak_flops_per_s": peak, "ours_overrides": list(ours_overrides),
          "interleaved": True, "warmup_steps": warmup, "entries": entries}


def markdown(r: dict) -> str:
  from transformer_jax.bench import report  # pylint: disable=g-import-not-at-top
  lines = report.header("The flax WMT example's train step and ours, side by side", r)
  lines += [f"Peak: {r['peak_flops_per_s'] / 1e9:.1f} GFLOP/s (float32 2048x2048 jnp.dot, same "
            "run).", ""]
  lines += ["Both at base size, vocabulary 32000 shared, fp32, dropout 0.1 on residuals, attention "
            "weights and ReLU outputs, label smoothing 0.1, Adam(0.9, 0.98, 1e-9), the same batch "
            f"of random ids. Ours with `{','.join(r['ours_overrides'])}`. Model FLOPs = "
            "`metrics.train_flops` (3 x forward matmul FLOPs) for both; MFU against the peak above. "
            f"After {r['warmup_steps']} warm-up step(s) each, the steps are timed in rounds of one "
            "step of each, in turn, so that a drift of the machine's speed hits both alike; "
            "'per round' is the range of flax's step time over ours within a round.",
            "", "| batch | flax WMT s/step (median; min) | tok/s | MFU | ours: dropout PRNG | "
            "s/step (median; min) | tok/s | MFU | speed-up (medians) | per round |",
            "|---|---|---|---|---|---|---|---|---|---|"]
  for e in r["entries"]:
    f = e["flax_wmt"]
    for o in e["transformer_jax"]:
      lines.append(f"| {e['shape']} | {f['step_s']['median']:.3f}; {f['step_s']['min']:.3f} | "
                   f"{f['target_tokens_per_s']:.0f} | {f['mfu']:.1%} | {o['variant']} | "
                   f"{o['step_s']['median']:.3f}; {o['step_s']['min']:.3f} | "
                   f"{o['target_tokens_per_s']:.0f} | {o['mfu']:.1%} | **{o['speedup']:.2f}x** | "
                   f"{min(o['speedup_per_round']):.2f}-{max(o['speedup_per_round']):.2f}x |")
  for e in r["entries"]:
    u, ref = e.get("flax_wmt_unrolled_threefry"), e["transformer_jax"][0]
    if u:
      lines += ["", f"{e['shape']}, for reference: flax's step compiled with the unrolled threefry "
                f"lowering that our step registers (`transformer_jax/rng.py`; theirs as shipped "
                f"uses jax's rolled CPU loops): {u['step_s']['median']:.3f} s/step, "
                f"{u['target_tokens_per_s']:.0f} tok/s, MFU {u['mfu']:.1%}; ours ({ref['variant']}) "
                f"is {ref['target_tokens_per_s'] / u['target_tokens_per_s']:.2f}x that."]
  lines += ["", "Compile (flax: compile + first step; ours: compile only, per variant): " + ", ".join(
      f"{e['shape']} {e['flax_wmt']['compile_and_first_step_s']:.1f} s / " + " and ".join(
          f"{o['compile_s']:.1f} s" for o in e["transformer_jax"]) for e in r["entries"]), ""]
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    print(f"error: unexpected arguments {' '.join(argv[1:])}", file=sys.stderr)
    sys.exit(2)
  from transformer_jax import errors  # pylint: disable=g-import-not-at-top
  if not _FLAX_WMT_DIR.value:
    print("error: --flax_wmt_dir is required (a checkout of flax's examples/wmt)", file=sys.stderr)
    sys.exit(2)
  try:
    r = run(_FLAX_WMT_DIR.value, _SHAPES.value, _STEPS.value, _WARMUP.value, _OURS_OVERRIDES.value,
            _RBG.value, _FLAX_UNROLLED.value)
  except (FileNotFoundError, *errors.USER_ERRORS) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  text = markdown(r)
  if _OUT.value:
    with open(_OUT.value + ".json", "w") as f:
      json.dump(r, f, indent=2)
    with open(_OUT.value + ".md", "w") as f:
      f.write(text + "\n")
  print(text)


if __name__ == "__main__":
  from transformer_jax import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.reexec_with_malloc_settings()  # the same process settings for both steps
  app.run(main)
