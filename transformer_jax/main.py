"""The command line: flags only, one entry point for the whole workflow (README, "The workflow").

  python -m transformer_jax.main --config=configs/base.py --workdir=DIR           # train
  python -m transformer_jax.main --workdir=DIR2 --branch_from=DIR --step=2700     # branch
  python -m transformer_jax.main --mode=average --workdir=DIR --average=5
  python -m transformer_jax.main --mode=eval --workdir=DIR --split=validation,test --average=5
  python -m transformer_jax.main --mode=translate --workdir=DIR < text
  python -m transformer_jax.main --mode=vocab --config=configs/base.py --workdir=DIR

`--config.KEY=VALUE` overrides the config file's keys when training; for eval and translate they
apply to the checkpoint's own config (`decode.*`, `data.*`, `mesh.*` only). User mistakes print
one line starting with 'error:' and exit with status 2.
"""

from __future__ import annotations

from absl import flags

from transformer_jax.runtime import cli, config as config_lib, exceptions, files as files_lib, host_memory, overrides as overrides_lib

_CONFIG = flags.DEFINE_string("config", None, "Run config file for training, e.g. "
                              "configs/multi30k.py, configs/multi30k.py:short or "
                              "configs/multi30k.py:fast_cpu.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Folder for checkpoints, vocabulary and logs.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval", "translate", "average", "vocab"],
                          "What to do with the workdir (vocab: only train the run's "
                          "vocabulary into it, as training starts by doing).")
_SPLIT = flags.DEFINE_list("split", None, "Eval: configured splits (validation, test), comma "
                           "separated; default test unless --source/--reference are given.")
_SOURCE = flags.DEFINE_multi_string("source", [], "Eval: source file of a test set (plain or "
                                    ".gz, one sentence a line); repeat with --reference.")
_REFERENCE = flags.DEFINE_multi_string("reference", [], "Eval: reference file, one per --source.")
_TOKENIZED_REFERENCE = flags.DEFINE_multi_string(
    "tokenized_reference", [], "Eval: an already tokenized reference file per --source (e.g. "
    "t2t's newstest2013.tok.de): the paper's tokenized BLEU scores against it, as get_ende_bleu.sh.")
_BLEU_SENTENCES = flags.DEFINE_integer("bleu_sentences", 0, "Eval: translate only the first N "
                                       "sentences of each set (0: all); perplexity uses all.",
                                       lower_bound=0)
_COMPARE = flags.DEFINE_string("compare", "", "Eval: another system (a workdir, an eval .json or "
                               "a hypotheses file): paired bootstrap p-values for BLEU and chrF.")
_ENSEMBLE = flags.DEFINE_list("ensemble", [], "Eval/translate: other workdirs (comma separated) "
                              "whose models decode together with --workdir's, their next-token "
                              "probabilities averaged; trained from one copied vocab/; each "
                              "uses its newest checkpoint or the average of its last --average.")
_AVERAGE = flags.DEFINE_integer("average", None, "Average the last K checkpoints "
                                "(eval/translate: default 0, none; --mode=average: default 5).",
                                lower_bound=0)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to use (default: the newest); with "
                             "--average, the newest of the averaged ones; with --branch_from, "
                             "the source's checkpoint the branch starts from.", lower_bound=0)
_BRANCH_FROM = flags.DEFINE_string("branch_from", None, "Train: continue this workdir's checkpoint "
                                   "--step in --workdir (a new folder) with its config; "
                                   "--config.* may change only steps, cool-down and cadence "
                                   "(transformer_jax/training/branch.py).")
_INPUT = flags.DEFINE_string("input", "-", "Text to translate, one sentence a line ('-': stdin).")
_OUTPUT = flags.DEFINE_string("output", "-", "Where translations go ('-': stdout).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 for multi-host runs outside TPU/SLURM.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in a multi-host run.")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout", 100, "Multi-host: seconds without a heartbeat after which JAX's "
    "coordination service declares a process dead and the others stop (docs/scaling.md)",
    lower_bound=1)


def main(argv):
  mode, overrides = _MODE.value, cli.OVERRIDE_ARGS
  if len(argv) > 1:
    raise exceptions.ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  if _WORKDIR.value is None:
    raise exceptions.ConfigError("--workdir is required")
  for flag in (_WORKDIR, _BRANCH_FROM, _CONFIG, _INPUT, _OUTPUT):  # '--workdir=$UNSET'
    if flag.value is not None and not flag.value.strip():
      raise exceptions.ConfigError(f"--{flag.name} is empty (an unset shell variable?); give a path")
  if mode == "average" and _AVERAGE.value == 0:
    raise exceptions.ConfigError("--average=0: --mode=average needs K >= 1 checkpoints (default 5)")
  average = _AVERAGE.value if _AVERAGE.value is not None else (5 if mode == "average" else 0)
  workdir = files_lib.resolve(_WORKDIR.value)  # gs:// stays a URL; its package is checked now
  if mode not in ("train", "vocab") and _CONFIG.value:
    raise exceptions.ConfigError(f"--config is for --mode=train or vocab; --mode={mode} uses the "
                                 "checkpoint's config (override decode settings with --config.decode.*)")
  if _ENSEMBLE.value and mode not in ("eval", "translate"):
    raise exceptions.ConfigError(f"--ensemble is for --mode=eval or translate, not --mode={mode}")
  # Flags and the config file are checked before JAX is imported: a mistake in them is reported
  # at once, and the entry point re-executes itself with its malloc settings (host_memory)
  # before JAX is loaded.
  config = None
  if _BRANCH_FROM.value is not None:
    if mode != "train" or _CONFIG.value or _STEP.value is None:
      raise exceptions.ConfigError("--branch_from is for --mode=train, with --step and without "
                                   "--config (the branch keeps the source run's config)")
  elif mode in ("train", "vocab"):
    if _STEP.value is not None:
      raise exceptions.ConfigError(f"--step is not for --mode={mode} (training from a "
                                   "checkpoint of another run: --branch_from with --step)")
    if _CONFIG.value is None:
      raise exceptions.ConfigError(f"--config is required for --mode={mode}")
    config = overrides_lib.load(_CONFIG.value, overrides)
  elif mode == "eval":
    splits, files = _eval_sets()
  from transformer_jax.runtime import distributed  # pylint: disable=g-import-not-at-top
  distributed.enable_compilation_cache()
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                         heartbeat_timeout=_HEARTBEAT.value)
  if _BRANCH_FROM.value is not None:
    from transformer_jax.training import branch  # pylint: disable=g-import-not-at-top
    config = branch.prepare(files_lib.resolve(_BRANCH_FROM.value), _STEP.value, workdir,
                            overrides_lib.parse_overrides(overrides))
  if mode in ("train", "vocab"):
    from transformer_jax import train  # pylint: disable=g-import-not-at-top
    if mode == "train":
      train.train_and_evaluate(config, workdir)
    else:
      print(f"vocabulary in {train.prepare_vocabulary(config, workdir)}")
  elif mode == "average":
    from transformer_jax.training import averaging  # pylint: disable=g-import-not-at-top
    files_lib.check_exists(workdir, "--workdir")
    out = averaging.average_workdir(workdir, average, step=_STEP.value)
    print(f"averaged checkpoints written to {out}")
  elif mode == "eval":
    from transformer_jax.inference import evaluate  # pylint: disable=g-import-not-at-top
    evaluate.evaluate_workdir(workdir, splits=splits, files=files,
                              average=average, step=_STEP.value, override_args=overrides,
                              bleu_sentences=_BLEU_SENTENCES.value, compare=_COMPARE.value,
                              ensemble=_ENSEMBLE.value)
  else:
    from transformer_jax.inference import translate  # pylint: disable=g-import-not-at-top
    translate.translate_files(workdir, _INPUT.value, _OUTPUT.value, step=_STEP.value,
                              average=average, override_args=overrides,
                              ensemble=_ENSEMBLE.value)


def _eval_sets():
  """--mode=eval's configured splits and (source, reference, tokenized reference) files."""
  if len(_SOURCE.value) != len(_REFERENCE.value):
    raise exceptions.ConfigError(f"{len(_SOURCE.value)} --source but {len(_REFERENCE.value)} "
                                 "--reference flags; give one --reference per --source")
  tokenized = _TOKENIZED_REFERENCE.value
  if tokenized and len(tokenized) != len(_SOURCE.value):
    raise exceptions.ConfigError(f"{len(tokenized)} --tokenized_reference but "
                                 f"{len(_SOURCE.value)} --source flags; give one per --source")
  splits = _SPLIT.value if _SPLIT.value is not None else ([] if _SOURCE.value else ["test"])
  for split in splits:
    if split not in ("validation", "test"):
      raise exceptions.ConfigError(f"--split={split}: expected validation or test (or give "
                                   "--source/--reference files)")
  files = list(zip(_SOURCE.value, _REFERENCE.value, tokenized or [""] * len(_SOURCE.value)))
  return splits, files


if __name__ == "__main__":
  host_memory.reexec_with_malloc_settings()  # before jax starts: no page faults per step on CPU
  cli.run(main)
