"""The stages of launch/accelerator_check.py, each run in a child process under its own time box,
and the presets they run with: the lent GPU's (configs/gpu.py) and the CPU rehearsal's. Each stage
returns a dict of results with 'lines' for the summary, or raises: its one line is the stage's
message."""

from __future__ import annotations

import itertools
import json
import os
import platform
import time

from transformer_jax.runtime import results  # stdlib only: imports before the wheels

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOCK = os.path.join(REPO, "launch", "gpu_requirements.lock")
# Distributions the lent GPU host's image has (device/KINDS.md) that the library or the locked
# packages import; the lock file carries every other one (tests/test_accelerator_check.py).
HOST_PROVIDES = (
    "absl-py", "attrs", "click", "cloudpickle", "etils", "flax", "fsspec", "jax", "jaxlib",
    "joblib", "matplotlib", "ml-dtypes", "numpy", "optax", "orbax-checkpoint", "packaging",
    "protobuf", "psutil", "pyarrow", "pyyaml", "regex", "requests", "sacrebleu", "sentencepiece",
    "six", "tqdm", "typing-extensions", "wrapt", "zipp")
NEVER_CARRIED = ("jax", "jaxlib", "flax", "numpy")  # the host's CUDA build is what is checked
GPU_PLUGINS = ("jax-cuda13-plugin", "jax-cuda13-pjrt", "nvidia-cudnn-cu13")

# The CPU preset's model: tiny's in bfloat16 with one layer a side (compiling is most of a stage).
_CPU_MODEL = {"model.dtype": "bfloat16", "model.num_encoder_layers": 1,
              "model.num_decoder_layers": 1}

PRESETS = {
    "gpu": {
        "backend": "gpu",
        "base": ("configs/gpu.py:base,h200", {}),
        "big": ("configs/gpu.py:big,h200", {}),
        "cudnn": ("configs/gpu.py:base,h200,cudnn", {}),
        "bucket_length": 64,   # a typical WMT bucket; the packed rows keep data.max_target_len
        "steps": 10, "warmup": 2,
        "train": ("configs/multi30k.py:short", {
            "model.dtype": "bfloat16", "train.max_train_minutes": 0.75,
            "train.eval_bleu_sentences": 500, "train.checkpoint_every_minutes": 0.5,
            "train.progress_bar": False}),
        "decode_sentences": 1014, "beam_size": 4,
        # Seconds per stage; with the shell's 40 (launch/accelerator_check.sh) 8 minutes at most.
        "timebox": {"env": 20, "imports": 40, "base_step": 70, "memory": 50, "attention": 105,
                    "train": 120, "decode": 35},
    },
    "cpu": {
        "backend": "cpu",
        "base": ("configs/tiny.py", {**_CPU_MODEL, "model.attention_impl": "dot_product_attention",
                                     "data.batch_mode": "pack", "train.peak_flops": 1e11}),
        "big": ("configs/tiny.py", {**_CPU_MODEL, "model.d_model": 128, "model.d_ff": 256}),
        "cudnn": ("configs/tiny.py", {**_CPU_MODEL, "model.attention_impl": "cudnn",
                                      "data.batch_mode": "bucket", "train.peak_flops": 1e11}),
        "bucket_length": 32,
        "steps": 2, "warmup": 1,
        "train": ("configs/tiny.py", {
            "train.num_steps": 20, "train.eval_bleu_sentences": 16, "train.max_eval_batches": 1,
            "train.log_every_steps": 10, "train.eval_every_steps": 1000,
            "train.checkpoint_every_steps": 20, "train.progress_bar": False,
            "data.vocab_train_sentences": 4000, "model.vocab_size": 300,
            "model.num_encoder_layers": 1, "model.num_decoder_layers": 1}),
        "decode_sentences": 16, "beam_size": 4,
        "timebox": {"env": 60, "imports": 90, "base_step": 90, "memory": 60, "attention": 150,
                    "train": 150, "decode": 90},
    },
}


def one_line(e: BaseException) -> str:
  """The exception as one line: its type and its message's first line, and the missing module
  behind it when a package turned a failed import into another error."""
  text = str(e).strip().splitlines()
  line = f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
  cause, seen = e.__cause__ or e.__context__, 0
  while cause is not None and seen < 10:
    if isinstance(cause, ModuleNotFoundError) and str(cause) not in line:
      return f"{line} (after {type(cause).__name__}: {cause})"
    cause, seen = cause.__cause__ or cause.__context__, seen + 1
  return line


def read_lock(path: str = LOCK) -> dict:
  """{distribution: version} of the lock file's NAME==VERSION lines."""
  out = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      req = line.split("#", 1)[0].strip()
      if req:
        name, _, version = req.partition("==")
        out[name.strip()] = version.strip()
  return out


def _config(spec_overrides):
  from transformer_jax.runtime.overrides import load  # pylint: disable=g-import-not-at-top
  spec, overrides = spec_overrides
  return load(spec, [f"--config.{k}={v}" for k, v in overrides.items()])


def _spec_text(spec_overrides) -> str:
  spec, overrides = spec_overrides
  return " ".join([spec, *(f"{k}={v}" for k, v in overrides.items())])


# The stages, each run in a child process: a dict of results, with 'lines' for the summary.

def stage_env(preset: dict, work: str) -> dict:
  """Devices, backend and package versions; fails when the preset's backend is not there."""
  del work
  import importlib.metadata as md  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  devices = [str(d) for d in jax.devices()]
  print(f"jax.devices(): {devices}", flush=True)
  versions, missing = {}, []
  lock = read_lock()
  for dist in (*HOST_PROVIDES, *GPU_PLUGINS, *lock):
    try:
      versions[dist] = md.version(dist)
    except md.PackageNotFoundError:
      versions[dist] = None
      if dist not in GPU_PLUGINS or preset["backend"] == "gpu":
        missing.append(dist)
  for dist, version in versions.items():
    print(f"  {dist}=={version}", flush=True)
  other = [f"{d} {versions[d]} (lock {v})" for d, v in lock.items()
           if versions.get(d) not in (None, v)]
  result = {"backend": jax.default_backend(), "devices": devices,
            "device_kind": jax.devices()[0].device_kind, "python": platform.python_version(),
            "versions": versions, "not_the_locked_version": other,
            "lines": [f"{len(devices)} x {jax.devices()[0].device_kind} ({jax.default_backend()}); "
                      f"python {platform.python_version()}, jax {versions.get('jax')}, "
                      f"jaxlib {versions.get('jaxlib')}, flax {versions.get('flax')}, "
                      f"numpy {versions.get('numpy')}"]}
  if jax.default_backend() != preset["backend"]:
    raise RuntimeError(f"no {preset['backend'].upper()} visible: jax.devices() = {devices}")
  if missing:
    raise RuntimeError(f"packages missing: {', '.join(missing)}")
  return result


def library_modules() -> list[str]:
  """Every module of transformer_jax, then the benchmark and launch modules the stages use."""
  import pkgutil  # pylint: disable=g-import-not-at-top
  import transformer_jax  # pylint: disable=g-import-not-at-top
  names = ["transformer_jax"] + sorted(
      m.name for m in pkgutil.walk_packages(transformer_jax.__path__, "transformer_jax."))
  return names + ["benchmarks.train_step", "benchmarks.accelerator", "launch.flops"]


def stage_imports(preset: dict, work: str) -> dict:
  """Imports every module; the first one that fails is the stage's message."""
  del preset, work
  import importlib  # pylint: disable=g-import-not-at-top
  names = library_modules()
  for name in names:
    try:
      importlib.import_module(name)
    except Exception as e:  # noqa: BLE001  any failure, named
      raise RuntimeError(f"import {name}: {one_line(e)}") from e
  return {"modules": len(names), "lines": [f"{len(names)} modules imported"]}


def _jit_cache(work: str) -> None:
  """One persistent compilation cache for the stages (decode reuses the train run's search)."""
  os.environ.setdefault("TRANSFORMER_JAX_JIT_CACHE", os.path.join(work, "jit_cache"))
  from transformer_jax.runtime import distributed  # pylint: disable=g-import-not-at-top
  distributed.enable_compilation_cache()


def stage_base_step(preset: dict, work: str) -> dict:
  """The base train step: compile time, tokens/s, MFU against the measured peak and the sheet's."""
  from benchmarks import accelerator  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.config import ModelConfig  # pylint: disable=g-import-not-at-top
  _jit_cache(work)
  config = _config(preset["base"])
  peak = accelerator.matmul_peak(ModelConfig.from_config(config.model).dtype)
  print(f"matmul peak: {peak['flops_per_s'] / 1e12:.3g} TFLOP/s ({peak['dtype']}, n={peak['n']})",
        flush=True)
  e = accelerator.time_step(config, _spec_text(preset["base"]), 0, preset["steps"],
                            preset["warmup"], peak["flops_per_s"])
  results.write_json(os.path.join(work, "peak.json"), peak)
  sheet = e["datasheet_peak_flops_per_device"]
  return {"matmul_peak": peak, "entry": e, "lines": [
      f"{e['config']}: {e['batch']['shape']}{' packed' if e['batch']['packed'] else ''}, "
      f"compile {e['compile_s']:.1f} s, {e['step_s']['median'] * 1e3:.1f} ms/step, "
      f"{e['target_tokens_per_s']:,.0f} target tok/s",
      f"MFU {e['mfu']:.1%} of the measured {peak['dtype']} matmul peak "
      f"({peak['flops_per_s'] / 1e12:.3g} TFLOP/s, n={peak['n']})"
      + (f"; {e['mfu_datasheet']:.1%} of the data sheet's {sheet / 1e12:.3g} TFLOP/s"
         if sheet else ""),
      "; ".join(e["attention"])]}


def stage_memory(preset: dict, work: str) -> dict:
  """Big's compiled train step against the device's memory limit."""
  from benchmarks import accelerator  # pylint: disable=g-import-not-at-top
  _jit_cache(work)
  m = accelerator.memory_headroom(_config(preset["big"]))
  gib = lambda b: "n/a" if b is None else f"{b / 2**30:.2f} GiB"
  headroom = f"{m['headroom']:.0%}" if "headroom" in m else "n/a (no device limit reported)"
  return {**m, "config": _spec_text(preset["big"]), "lines": [
      f"{_spec_text(preset['big'])} at {m['batch']}: step needs {gib(m.get('step_bytes'))} per "
      f"device of {gib(m.get('device_bytes_limit'))}; headroom {headroom} "
      f"(compiled in {m['compile_s']:.1f} s)"]}


AGREEMENT_TOLERANCE = {"loss_rel_diff": 1e-2, "grad_norm_rel_diff": 2e-2, "grad_rel_diff": 5e-2}


def agreement_verdict(agreement: dict) -> list[str]:
  """What is wrong with an attention_agreement result: a non-finite loss or gradient, or a
  difference over AGREEMENT_TOLERANCE (bfloat16's rounding); empty when they agree."""
  problems = []
  for impl, e in agreement["impls"].items():
    if not e["finite"]:
      problems.append(f"{impl}: non-finite loss or gradient")
    for key, limit in AGREEMENT_TOLERANCE.items():
      if key in e and not e[key] <= limit:
        problems.append(f"{impl}: {key} {e[key]:.2e} > {limit:g}")
  return problems


def stage_attention(preset: dict, work: str) -> dict:
  """cuDNN against einsum on a padded bucketed batch, then three layouts' step times."""
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import accelerator, train_step  # pylint: disable=g-import-not-at-top
  _jit_cache(work)
  cudnn = _config(preset["cudnn"])
  devices = jax.device_count()
  rows, length = accelerator.batch_shape(cudnn, devices, preset["bucket_length"])
  agreement = accelerator.attention_agreement(cudnn, rows, length)
  problems = agreement_verdict(agreement)
  e = agreement["impls"]["einsum"]
  lines = [f"agreement on {agreement['batch']} ({agreement['empty_rows']} empty rows, "
           f"{agreement['dtype']}): loss {agreement['impls']['cudnn']['loss']:.4f} vs "
           f"{e['loss']:.4f} (rel {e['loss_rel_diff']:.1e}), grad norm rel "
           f"{e['grad_norm_rel_diff']:.1e}, gradient rel {e['grad_rel_diff']:.1e}",
           "cudnn ran: " + "; ".join(agreement["impls"]["cudnn"]["attention"] or ["(cached)"])]
  einsum = cudnn.copy_and_resolve_references()
  einsum.model.attention_impl = "einsum"
  packed = _config(preset["base"])
  layouts = [("bucketed cudnn", cudnn, rows, length),
             ("bucketed einsum", einsum, rows, length),
             ("packed " + packed.model.attention_impl, packed,
              *accelerator.batch_shape(packed, devices))]
  steppers = [train_step.Stepper(name, r, n, config=c, description=name)
              for name, c, r, n in layouts]
  samples = train_step.time_interleaved(steppers, preset["steps"], preset["warmup"])
  peak = results.read_json(os.path.join(work, "peak.json"))
  peak_flops = peak["flops_per_s"] if peak else None
  entries = []
  for stepper, s in zip(steppers, samples):
    entry = stepper.entry(s, preset["warmup"], peak_flops)
    stepper.close()
    entries.append(entry)
    mfu = f", MFU {entry['mfu']:.1%}" if entry["mfu"] else ""
    lines.append(f"{entry['name']} {entry['batch']['shape']}: {entry['step_s']['median'] * 1e3:.1f} "
                 f"ms/step, {entry['target_tokens_per_s']:,.0f} target tok/s{mfu}, compile "
                 f"{entry['compile_s']:.1f} s")
  result = {"agreement": agreement, "steps": entries, "lines": lines}
  if problems:
    results.write_json(os.path.join(work, "attention_partial.json"), result)
    raise RuntimeError("cuDNN and einsum disagree: " + "; ".join(problems))
  return result


def stage_train(preset: dict, work: str) -> dict:
  """A short real Multi30k run from a fresh workdir; its final dev metrics."""
  from transformer_jax import train  # pylint: disable=g-import-not-at-top
  _jit_cache(work)
  config = _config(preset["train"])
  workdir = os.path.join(work, "train_workdir")
  t = time.perf_counter()
  dev = train.train_and_evaluate(config, workdir)
  seconds = time.perf_counter() - t
  steps = _last_train_step(workdir)
  if "bleu" not in dev:
    raise RuntimeError(f"the run ended without a dev BLEU (dev metrics: {sorted(dev)})")
  return {"config": _spec_text(preset["train"]), "dev": dev, "seconds": seconds, "steps": steps,
          "workdir": workdir, "lines": [
              f"{_spec_text(preset['train'])}: {steps} steps in {seconds:.0f} s (vocabulary, "
              f"compiling and the dev evaluation included); dev BLEU {dev['bleu']:.2f} on "
              f"{config.train.eval_bleu_sentences or 'all'} sentences, dev perplexity "
              f"{dev.get('perplexity', float('nan')):.2f}"]}


def _last_train_step(workdir: str):
  """The last step in the run's metrics.jsonl (None when there is none)."""
  path = os.path.join(workdir, "metrics.jsonl")
  step = None
  try:
    with open(path, encoding="utf-8") as f:
      for line in f:
        step = json.loads(line).get("step", step)
  except (OSError, ValueError):
    return None
  return step


def stage_decode(preset: dict, work: str) -> dict:
  """Warm beam search: a first pass over dev sentences compiles every batch shape, a second pass
  over the same sentences is timed."""
  from transformer_jax.inference.translate import Translator  # pylint: disable=g-import-not-at-top
  from transformer_jax.data import sources  # pylint: disable=g-import-not-at-top
  _jit_cache(work)
  workdir = os.path.join(work, "train_workdir")
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    raise RuntimeError(f"no trained workdir at {workdir} (the train stage did not finish)")
  translator = Translator.from_workdir(workdir, override_args=[
      f"--config.decode.beam_size={preset['beam_size']}"])
  data_dir = os.environ.get("TRANSFORMER_JAX_DATA_DIR", "")
  lines = sources.open_lines(os.path.join(data_dir, "multi30k", "val.en.gz"))
  sentences = [line.decode("utf-8", "replace")
               for line in itertools.islice(lines, preset["decode_sentences"])]
  ids = translator.encode(sentences)
  t = time.perf_counter()
  translator.translate_ids(ids)
  first = time.perf_counter() - t
  steps_before = translator.decoder_steps
  t = time.perf_counter()
  outputs = translator.translate_ids(ids)
  warm = time.perf_counter() - t
  steps = translator.decoder_steps - steps_before
  return {"sentences": len(sentences), "beam_size": translator.beam_size,
          "batch_size": translator.batch_size, "first_pass_s": first, "warm_s": warm,
          "sentences_per_s": len(sentences) / warm, "decoder_steps": steps,
          "output_tokens": sum(len(o) for o in outputs), "lines": [
              f"beam {translator.beam_size}, batches of {translator.batch_size}: "
              f"{len(sentences) / warm:.1f} sentences/s warm ({len(sentences)} dev sentences in "
              f"{warm:.2f} s; the first pass, compiling included, {first:.2f} s)"]}


STAGE_FUNCTIONS = {"env": stage_env, "imports": stage_imports, "base_step": stage_base_step,
                   "memory": stage_memory, "attention": stage_attention, "train": stage_train,
                   "decode": stage_decode}
