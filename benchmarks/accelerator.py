"""Accelerator acceptance: does this GPU/TPU host run the preset as it should? (~5 minutes)

  python -m benchmarks.accelerator --config=configs/gpu.py:base,h100
  python -m benchmarks.accelerator --config=configs/tpu.py:base,v5e

On one host, with every local device in the preset's mesh, it checks and prints:
1. the devices and backend JAX sees;
2. the preset's train step (bf16 in the GPU/TPU presets) compiling on a synthetic batch of the
   preset's token budget: compile time, step time, target tokens/s and MFU against the preset's
   `train.peak_flops` per device (measured with a jnp.dot when the preset gives none);
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

import jax
import numpy as np
from absl import flags, logging

from transformer_jax.model import attention, sharding
from transformer_jax.runtime import cli
from transformer_jax.training import metrics, step
from transformer_jax.runtime.config import ModelConfig, validate
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import load

from benchmarks import report, train_step

FLAGS = flags.FLAGS


def define_flags():
  """The command's flags (defined only when it runs: tests import this module's functions)."""
  flags.DEFINE_string("config", "configs/gpu.py:base", "the preset CONFIG_FILE[:ARG]")
  flags.DEFINE_string("memory_config", "", "preset whose memory headroom is checked (default: "
                      "--config with its first argument replaced by 'big'; 'none' to skip)")
  flags.DEFINE_integer("steps", 10, "timed train steps", lower_bound=1)
  flags.DEFINE_integer("warmup", 2, "untimed steps after compiling", lower_bound=0)
  flags.DEFINE_integer("length", 0, "row length of the synthetic batch (default: the preset's "
                       "data.max_target_len)", lower_bound=0)
  flags.DEFINE_string("out", "experiments/results/accelerator",
                      "writes OUT.json and OUT.md ('' to write nothing)")


def big_spec(spec: str) -> str:
  path, _, arg = spec.partition(":")
  rest = arg.split(",")[1:] if arg else []
  return f"{path}:{','.join(['big', *rest])}"


def batch_shape(config, devices: int, length: int = 0) -> tuple[int, int]:
  """Rows x length holding about the preset's tokens_per_batch, rows a multiple of `devices`."""
  length = length or config.data.max_target_len
  rows = max(1, round(config.data.tokens_per_batch / length / devices)) * devices
  return rows, length


def time_step(config, description: str, length: int, steps: int, warmup: int) -> dict:
  """Compiles and times the preset's train step; the benchmark's entry plus the attention lines."""
  devices = jax.device_count()
  rows, length = batch_shape(config, devices, length)
  stepper = train_step.Stepper(description, rows, length, config=config, description=description)
  (samples,) = train_step.time_interleaved([stepper], steps, warmup)
  peak = config.train.peak_flops or metrics.measure_peak_flops(
      np.dtype(stepper.model_cfg.dtype))
  entry = stepper.entry(samples, warmup, peak)
  stepper.close()
  entry["peak_flops_per_device"] = peak
  return entry


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


def run(override_args) -> dict:
  config = load(FLAGS.config, override_args)
  memory_spec = FLAGS.memory_config or big_spec(FLAGS.config)
  memory_config = None if memory_spec == "none" else load(memory_spec, override_args)
  model_cfg = ModelConfig.from_config(config.model)
  attention.check_backend(model_cfg)  # cuDNN asked for on a CPU: one line, before any work
  result = {**report.start(shlex.join(["python", "-m", "benchmarks.accelerator", *sys.argv[1:]])),
            "config": FLAGS.config, "overrides": list(override_args),
            "devices": {"backend": jax.default_backend(), "count": jax.device_count(),
                        "kind": jax.devices()[0].device_kind,
                        "processes": jax.process_count()}}
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind} "
        f"({jax.default_backend()})", flush=True)
  entries = [time_step(config, FLAGS.config, FLAGS.length, FLAGS.steps, FLAGS.warmup)]
  if jax.default_backend() == "gpu":  # the other attention/layout pairing, for comparison
    other = config.copy_and_resolve_references()
    if model_cfg.attention_impl == "cudnn":
      other.model.attention_impl, other.data.batch_mode = "dot_product_attention", "pack"
    else:
      other.model.attention_impl, other.data.batch_mode = "cudnn", "bucket"
    validate(other)
    entries.append(time_step(other, f"{FLAGS.config} with attention_impl="
                             f"{other.model.attention_impl}, batch_mode={other.data.batch_mode}",
                             FLAGS.length, FLAGS.steps, FLAGS.warmup))
  for e in entries:
    print(f"{e['config']}: {e['batch']['shape']}, compile {e['compile_s']:.1f} s, "
          f"{e['step_s']['median']:.3f} s/step, {e['target_tokens_per_s']:,.0f} target tok/s, "
          f"MFU {e['mfu']:.1%}; attention: {'; '.join(e['attention'])}", flush=True)
  result["train"] = entries
  if memory_config is not None:
    print(f"memory: compiling {memory_spec} ...", flush=True)
    result["memory"] = dict(memory_headroom(memory_config), config=memory_spec)
  return report.finish(result)


def markdown(r: dict) -> str:
  d = r["devices"]
  lines = report.header("Accelerator acceptance", r) + [
      f"Devices: {d['count']} x {d['kind']} ({d['backend']}, {d['processes']} process(es)); "
      "MFU against each entry's peak per device: " + ", ".join(
          f"{e['peak_flops_per_device'] / 1e12:.1f} TFLOP/s" for e in r["train"]) + ".", "",
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
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(argv[1:])}")
  result = run(cli.OVERRIDE_ARGS)
  report.write(result, markdown(result), FLAGS.out)


if __name__ == "__main__":
  define_flags()
  cli.run(main, verbosity=logging.WARNING)
