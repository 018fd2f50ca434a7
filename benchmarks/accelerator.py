"""Accelerator acceptance: does this GPU/TPU host run the preset as it should?

  python -m benchmarks.accelerator --config=configs/gpu.py:base,h100
  python -m benchmarks.accelerator --config=configs/tpu.py:base,v5e

On one host, with every local device in the preset's mesh, it checks and prints:
1. the devices and backend JAX sees;
2. the preset's train step (bf16 in the GPU/TPU presets) compiling on a synthetic batch of the
   preset's token budget (bucketed rows padded as real ones are: train_step.synthetic_batch):
   compile time, step time, target tokens/s and MFU against a matrix product in the model's
   dtype measured in the same run (`matmul_peak`), with the MFU against the preset's data-sheet
   `train.peak_flops` beside it;
3. which attention implementation ran, with the reason when cuDNN was asked for but not used
   (`attention.choices()`); on a GPU it also times the other layout (bucketed rows with cuDNN
   attention against packed rows with XLA attention), so the preset's choice can be checked here;
4. memory headroom for `--memory_config` (default: the same preset with 'big'): the compiled
   big train step's per-device bytes (XLA's memory analysis: arguments + outputs - aliased +
   temporaries) against the device's memory limit, without allocating the big model.
Writes OUT.json and OUT.md (benchmarks/report.py's header: machine, load, date, command).
On a CPU it runs the same checks (useful to test the command; the numbers mean little).
"""

if __name__ == "__main__":
  from transformer_jax.runtime import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.reexec_with_malloc_settings()

import shlex
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags, logging

from transformer_jax.model import attention, sharding
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime import cli
from transformer_jax.runtime.config import ModelConfig, validate
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import load
from transformer_jax.runtime.special_ids import PAD_ID
from transformer_jax.training import metrics, step
from transformer_jax.training.label_smoothing import cross_entropy_sums

from benchmarks import settings as settings_lib, train_step

def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values` (flags.FLAGS when it runs; a fresh set to resolve a
  recorded command). Defined only then: tests import this module's functions."""
  def define(kind, name, default, help_text, **kwargs):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values, **kwargs)
  define("string", "config", "configs/gpu.py:base", "the preset CONFIG_FILE[:ARG]")
  define("string", "memory_config", "", "preset whose memory headroom is checked (default: "
         "--config with its first argument replaced by 'big'; 'none' to skip)")
  define("integer", "steps", 10, "timed train steps", lower_bound=1)
  define("integer", "warmup", 2, "untimed steps after compiling", lower_bound=0)
  define("integer", "length", 0, "row length of the synthetic batch (default: the preset's "
         "data.max_target_len)", lower_bound=0)
  define("string", "out", "experiments/results/accelerator",
         "writes OUT.json and OUT.md ('' to write nothing)")


def configs(values: flags.FlagValues, override_args):
  """(the preset's config, the memory check's spec and config, None for 'none'), overridden and
  validated."""
  config = load(values.config, override_args)
  memory_spec = values.memory_config or big_spec(values.config)
  memory_config = None if memory_spec == "none" else load(memory_spec, override_args)
  return config, memory_spec, memory_config


def _settings(values: flags.FlagValues, config, memory_spec: str, memory_config) -> dict:
  own = {k: values[k].value for k in ("config", "steps", "warmup", "length")}
  own["memory_config"] = memory_spec
  out = {**settings_lib.benchmark_settings(own), **settings_lib.config_settings("preset", config)}
  if memory_config is not None:
    out.update(settings_lib.config_settings("memory", memory_config))
  return settings_lib.normalized(out)


def settings(values: flags.FlagValues, override_args) -> dict:
  """What a run with these flags and overrides checks (benchmarks/settings.py); the attention
  and layout pairing timed beside it on a GPU follows from the preset."""
  return _settings(values, *configs(values, override_args))


def big_spec(spec: str) -> str:
  path, _, arg = spec.partition(":")
  rest = arg.split(",")[1:] if arg else []
  return f"{path}:{','.join(['big', *rest])}"


def batch_shape(config, devices: int, length: int = 0) -> tuple[int, int]:
  """Rows x length holding about the preset's tokens_per_batch, rows a multiple of `devices`."""
  length = length or config.data.max_target_len
  rows = max(1, round(config.data.tokens_per_batch / length / devices)) * devices
  return rows, length


def matmul_peak(dtype="bfloat16", n: int = 0, repeats: int = 10) -> dict:
  """FLOP/s of an n x n x n matrix product on the default device, float32 accumulation as the
  model's products: the ceiling MFU is measured against. Random operands (zeros or constants can
  run faster than real data), two sets used in turn, compile and a warm-up excluded, the median
  of `repeats` timed products; n defaults to 8192 on an accelerator and 1024 on a CPU."""
  n = n or (1024 if jax.default_backend() == "cpu" else 8192)
  keys = jax.random.split(jax.random.key(0), 4)
  operands = [jax.random.normal(k, (n, n), jnp.float32).astype(dtype) for k in keys]
  f = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
  for i in range(3):
    f(operands[2 * (i % 2)], operands[2 * (i % 2) + 1]).block_until_ready()
  samples = []
  for i in range(repeats):
    a, b = operands[2 * (i % 2)], operands[2 * (i % 2) + 1]
    t = time.perf_counter()
    f(a, b).block_until_ready()
    samples.append(time.perf_counter() - t)
  median = float(np.median(samples))
  return {"flops_per_s": 2.0 * n**3 / median, "n": n, "dtype": str(np.dtype(dtype)),
          "median_s": median, "repeats": repeats}


def time_step(config, description: str, length: int, steps: int, warmup: int,
              peak: float | None = None) -> dict:
  """Compiles and times the preset's train step; the benchmark's entry plus the attention lines.
  MFU is against `peak` (default: matmul_peak in the model's dtype, measured now), and
  `mfu_datasheet` against the preset's `train.peak_flops` (a data sheet's figure) when it has one."""
  devices = jax.device_count()
  rows, length = batch_shape(config, devices, length)
  stepper = train_step.Stepper(description, rows, length, config=config, description=description)
  (samples,) = train_step.time_interleaved([stepper], steps, warmup)
  peak = peak or matmul_peak(stepper.model_cfg.dtype)["flops_per_s"]
  entry = stepper.entry(samples, warmup, peak)
  stepper.close()
  datasheet = config.train.peak_flops or None
  entry["peak_flops_per_device"] = peak
  entry["datasheet_peak_flops_per_device"] = datasheet
  entry["mfu_datasheet"] = (metrics.mfu(entry["model_flops_per_s"], datasheet, entry["devices"])
                            if datasheet else None)
  return entry


def attention_agreement(config, rows: int, length: int, impls=("cudnn", "einsum"),
                        seed: int = 0) -> dict:
  """Loss and gradients of one set of parameters on one bucketed, padded batch
  (train_step.synthetic_batch: rows of varied lengths and an empty filler row) under each
  attention implementation, without dropout; per implementation the loss per target token, the
  gradient norm, whether both are finite and the attention that ran, and the relative
  differences of the later ones from the first. A NaN in a padding position (an empty row's
  softmax over no keys) shows as a non-finite gradient even where the loss ignores that row.
  Where cuDNN is not available, 'cudnn' runs the same call through XLA (attention.py)."""
  base = config.copy_and_resolve_references()
  base.data.batch_mode = "bucket"
  base.model.dropout_rate = base.model.attention_dropout_rate = 0.0
  batch = {k: jnp.asarray(v) for k, v in train_step.synthetic_batch(base, rows, length, seed).items()}
  init = base.copy_and_resolve_references()
  init.model.attention_impl = impls[-1]  # the parameters do not depend on it; its log line does
  params = nn.meta.unbox(step.init_state(init, jax.random.key(seed)).params)
  weights = (batch["targets"] != PAD_ID).astype(jnp.float32)
  out = {"batch": f"{rows}x{length}", "empty_rows": int((weights.sum(-1) == 0).sum()),
         "target_tokens": int(weights.sum()), "dtype": base.model.dtype, "impls": {}}
  grads = {}
  for impl in impls:
    cfg = base.copy_and_resolve_references()
    cfg.model.attention_impl = impl
    model = Transformer(ModelConfig.from_config(cfg.model))

    def loss_fn(p, model=model):
      logits = model.apply({"params": p}, inputs_BxS=batch["inputs"], targets_BxT=batch["targets"],
                           deterministic=True)
      loss_sum, _, tokens = cross_entropy_sums(logits, batch["targets"], weights,
                                               cfg.train.label_smoothing)
      return loss_sum / jnp.maximum(tokens, 1.0)
    logged = len(attention.choices())
    loss, g = jax.jit(jax.value_and_grad(loss_fn))(params)
    grads[impl] = g
    finite = bool(jnp.isfinite(loss)) and all(bool(jnp.all(jnp.isfinite(x)))
                                              for x in jax.tree.leaves(g))
    out["impls"][impl] = {"loss": float(loss), "grad_norm": float(optax.tree.norm(g)),
                          "finite": finite, "attention": attention.choices()[logged:] or [
                              line for line in attention.choices() if impl in line][:1]}
  first = impls[0]
  ref = out["impls"][first]
  for impl in impls[1:]:
    e = out["impls"][impl]
    diff = jax.tree.map(lambda a, b: a.astype(jnp.float32) - b.astype(jnp.float32),
                        grads[impl], grads[first])
    e["loss_rel_diff"] = abs(e["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-30)
    e["grad_norm_rel_diff"] = abs(e["grad_norm"] - ref["grad_norm"]) / max(ref["grad_norm"], 1e-30)
    e["grad_rel_diff"] = float(optax.tree.norm(diff)) / max(ref["grad_norm"], 1e-30)
  return out


def memory_headroom(config) -> dict:
  """Per-device bytes of the compiled train step (nothing allocated) and the device's limit."""
  mesh = sharding.make_mesh(config.mesh)
  abstract_state, state_sh = step.state_shardings(config, mesh)
  rows, length = batch_shape(config, mesh.devices.size)
  batch = train_step.synthetic_batch(config, rows, length)
  batch_sh = sharding.batch_sharding(mesh)
  abstract_batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sh)
                    for k, v in batch.items()}
  fn = step.jit_train_step(config, mesh, state_sh)
  t = time.perf_counter()
  with sharding.mesh_context(mesh):
    compiled = fn.jitted.lower(abstract_state, abstract_batch).compile()
  out = {"compile_s": time.perf_counter() - t, "batch": f"{rows}x{length}"}
  memory = train_step.compiled_memory(compiled)
  if memory:
    out.update(step_bytes=train_step.step_bytes(memory), temp_bytes=memory["temp_bytes"])
  stats = jax.local_devices()[0].memory_stats() or {}
  if "bytes_limit" in stats:
    out["device_bytes_limit"] = int(stats["bytes_limit"])
    if "step_bytes" in out:
      out["headroom"] = 1.0 - out["step_bytes"] / out["device_bytes_limit"]
  return out


def run(values: flags.FlagValues, override_args, command: str) -> dict:
  """The checks of the module docstring; the JSON-able result."""
  # Imported here: benchmarks/report.py imports the data pipeline, which the timing functions
  # above (launch/accelerator_check.py's stages) do without.
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  config, memory_spec, memory_config = configs(values, override_args)
  model_cfg = ModelConfig.from_config(config.model)
  attention.check_backend(model_cfg)  # cuDNN asked for on a CPU: one line, before any work
  result = {**report.start(command, _settings(values, config, memory_spec, memory_config)),
            "config": values.config, "overrides": list(override_args),
            "devices": {"backend": jax.default_backend(), "count": jax.device_count(),
                        "kind": jax.devices()[0].device_kind,
                        "processes": jax.process_count()}}
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind} "
        f"({jax.default_backend()})", flush=True)
  result["matmul_peak"] = matmul_peak(model_cfg.dtype)
  peak = result["matmul_peak"]["flops_per_s"]
  entries = [time_step(config, values.config, values.length, values.steps, values.warmup, peak)]
  if jax.default_backend() == "gpu":  # the other attention/layout pairing, for comparison
    other = config.copy_and_resolve_references()
    if model_cfg.attention_impl == "cudnn":
      other.model.attention_impl, other.data.batch_mode = "dot_product_attention", "pack"
    else:
      other.model.attention_impl, other.data.batch_mode = "cudnn", "bucket"
    validate(other)
    entries.append(time_step(other, f"{values.config} with attention_impl="
                             f"{other.model.attention_impl}, batch_mode={other.data.batch_mode}",
                             values.length, values.steps, values.warmup, peak))
  for e in entries:
    print(f"{e['config']}: {e['batch']['shape']}, compile {e['compile_s']:.1f} s, "
          f"{e['step_s']['median']:.3f} s/step, {e['target_tokens_per_s']:,.0f} target tok/s, "
          f"MFU {e['mfu']:.1%}; attention: {'; '.join(e['attention'])}", flush=True)
  result["train"] = entries
  if memory_config is not None:
    print(f"memory: compiling {memory_spec} ...", flush=True)
    result["memory"] = dict(memory_headroom(memory_config), config=memory_spec)
  return report.finish(result)


def peak_text(r: dict) -> str:
  """What MFU is measured against: the measured matrix-product peak, the data sheet's beside it."""
  m, e = r.get("matmul_peak"), r["train"][0]
  text = (f"a {m['dtype']} {m['n']}^3 matrix product measured in this run, "
          f"{m['flops_per_s'] / 1e12:.1f} TFLOP/s per device" if m else
          f"{e['peak_flops_per_device'] / 1e12:.1f} TFLOP/s per device")
  sheet = e.get("datasheet_peak_flops_per_device")
  if sheet:
    text += (f" (against the data sheet's {sheet / 1e12:.0f} TFLOP/s: MFU " + ", ".join(
        f"{x['mfu_datasheet']:.1%}" for x in r["train"] if x.get("mfu_datasheet")) + ")")
  return text


def markdown(r: dict) -> str:
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  d = r["devices"]
  lines = report.header("Accelerator acceptance", r) + [
      f"Devices: {d['count']} x {d['kind']} ({d['backend']}, {d['processes']} process(es)); "
      f"MFU against {peak_text(r)}.", "",
      "## Train step", "", *train_step.markdown(r["train"])]
  if r.get("memory"):
    m = r["memory"]
    gib = lambda b: f"{b / 2**30:.2f} GiB" if b is not None else "n/a"
    headroom = f"{m['headroom']:.0%}" if "headroom" in m else "n/a (the device reports no limit)"
    lines += ["## Memory", "",
              f"{m['config']} at {m['batch']}: the compiled train step needs "
              f"{gib(m.get('step_bytes'))} per device (temporaries {gib(m.get('temp_bytes'))}); "
              f"device limit {gib(m.get('device_bytes_limit'))}; headroom {headroom}."]
  return "\n".join(lines) + "\n"


def main(argv):
  from benchmarks import report  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(argv[1:])}")
  command = shlex.join(["python", "-m", "benchmarks.accelerator", *sys.argv[1:]])
  result = run(flags.FLAGS, cli.OVERRIDE_ARGS, command)
  report.write(result, markdown(result), flags.FLAGS.out)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  cli.run(main, verbosity=logging.WARNING)
