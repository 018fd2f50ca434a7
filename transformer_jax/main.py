"""Command line: flags only. One entry point for the whole workflow.

  python -m transformer_jax.main --config=configs/base.py --workdir=DIR            # train
  python -m transformer_jax.main --config=configs/base.py --config.model.num_heads=16 ...
  python -m transformer_jax.main --mode=average --workdir=DIR --average=5          # average
  python -m transformer_jax.main --mode=eval --workdir=DIR [--split=test] [--average=5]
  python -m transformer_jax.main --mode=translate --workdir=DIR [--input=FILE] < text

User mistakes (bad config keys or values, unusable workdirs or checkpoints, bad data) print one
line starting with 'error:' and exit with status 2, never a traceback.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder for checkpoints, vocabulary and logs.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval", "translate", "average"],
                          "What to do with the workdir.")
_SPLIT = flags.DEFINE_enum("split", "test", ["validation", "test"], "Split for --mode=eval.")
_AVERAGE = flags.DEFINE_integer("average", 0, "Average the last K checkpoints (eval/average).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to use (default: the newest).")
_INPUT = flags.DEFINE_string("input", "-", "Text to translate, one sentence a line ('-': stdin).")
_OUTPUT = flags.DEFINE_string("output", "-", "Where translations go ('-': stdout).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 for multi-host runs outside TPU/SLURM.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in a multi-host run.")


def _run(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  _enable_compilation_cache()
  from transformer_jax import distributed  # pylint: disable=g-import-not-at-top
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  if _WORKDIR.value is None:
    raise app.UsageError("--workdir is required")
  mode, workdir = _MODE.value, _WORKDIR.value
  if mode == "train":
    if _CONFIG.value is None:
      raise app.UsageError("--config is required for --mode=train")
    from transformer_jax import train  # pylint: disable=g-import-not-at-top
    train.train_and_evaluate(_CONFIG.value, workdir)
  elif mode == "average":
    from transformer_jax import averaging  # pylint: disable=g-import-not-at-top
    out = averaging.average_workdir(workdir, _AVERAGE.value or 5)
    print(f"averaged checkpoints written to {out}")
  elif mode == "eval":
    from transformer_jax import evaluate  # pylint: disable=g-import-not-at-top
    evaluate.evaluate_workdir(workdir, split=_SPLIT.value, average=_AVERAGE.value,
                              step=_STEP.value, overrides=_CONFIG.value)
  else:
    from transformer_jax import translate  # pylint: disable=g-import-not-at-top
    translate.translate_files(workdir, _INPUT.value, _OUTPUT.value, step=_STEP.value,
                              overrides=_CONFIG.value)


def _enable_compilation_cache():
  """Compiled steps are reused across runs and restarts (TRANSFORMER_JAX_JIT_CACHE='' disables)."""
  import os  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  path = os.environ.get("TRANSFORMER_JAX_JIT_CACHE",
                        os.path.join(os.path.expanduser("~"), ".cache", "transformer_jax", "jit"))
  if path:
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def main(argv):
  from transformer_jax import errors  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS["verbosity"].present:  # the console shows progress, our warnings, errors
    logging.set_verbosity(logging.ERROR)
  try:
    _run(argv)
  except errors.USER_ERRORS as e:
    logging.flush() if hasattr(logging, "flush") else None
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def _parse_flags(argv):
  """absl flag parsing, with config-override mistakes reported as one line."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    message = str(e).splitlines()[0]
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    message = _explain_bad_override(argv) or str(e).strip().splitlines()[0].strip("'\"")
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def _explain_bad_override(argv) -> str | None:
  """Names the first --config.a.b=... override whose key is not in the schema."""
  import difflib  # pylint: disable=g-import-not-at-top
  from transformer_jax.config import default_config  # pylint: disable=g-import-not-at-top
  for arg in argv[1:]:
    if not arg.startswith("--config."):
      continue
    path = arg[len("--config."):].split("=", 1)[0].split(".")
    node = default_config()
    for i, key in enumerate(path):
      if not hasattr(node, "keys") or key not in node:
        options = list(node.keys()) if hasattr(node, "keys") else []
        close = difflib.get_close_matches(key, options, n=1, cutoff=0.5)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"unknown config key '{'.'.join(path[:i + 1])}' in {arg.split('=')[0]}{hint}"
      node = node[key]
  return None


if __name__ == "__main__":
  from transformer_jax import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.reexec_with_malloc_settings()  # before jax starts: no page faults per step on CPU
  app.run(main, flags_parser=_parse_flags)
