"""Every `python -m` entry point reports a mistake in its flags, its config file or an override as
one line `error: ...` with exit status 2 (runtime/cli.py), never a traceback or absl's FATAL."""

import random
import shutil
import subprocess
import sys

import pytest

from tests.common import REPO, requires_data, TINY_CLI_FLAGS
from transformer_jax.runtime import orbax_logs

BAD_OVERRIDE = "--config.model.d_model=abc"
NO_FILE = "no_such_config.py"

# Each entry point the README, docs, studies and benchmarks tell users to run.
ENTRY_POINTS = ("transformer_jax.main", "transformer_jax.tools.params",
                "transformer_jax.tools.attention_maps", "launch.flops", "launch.accelerator_check",
                "experiments.harness.runner", "experiments.harness.provenance",
                "experiments.harness.run_report", "experiments.checks.battery",
                "experiments.checks.parseval_crosscheck", "benchmarks", "benchmarks.accelerator",
                "benchmarks.flax_wmt", "benchmarks.flax_wmt_decode", "benchmarks.parallel_runs",
                "benchmarks.core_budget", "benchmarks.epoch_cost")

# (entry point, arguments, what the line says) for a missing config file and a bad override,
# where the entry point reads a run config, and an override where it reads none.
CONFIG_CASES = (
    ("transformer_jax.main", ["--workdir={tmp}", f"--config={NO_FILE}"], "not found"),
    ("transformer_jax.main", ["--workdir={tmp}", "--config=configs/multi30k.py", BAD_OVERRIDE],
     "must be int"),
    ("transformer_jax.tools.params", [f"--config={NO_FILE}"], "not found"),
    ("transformer_jax.tools.params", [BAD_OVERRIDE], "must be int"),
    ("transformer_jax.tools.attention_maps", ["--workdir={tmp}", "--out={tmp}/maps", BAD_OVERRIDE],
     "takes no --config"),
    ("launch.flops", [BAD_OVERRIDE], "takes no --config"),
    ("experiments.harness.runner", [f"--sweep={NO_FILE}", "--out={tmp}"], "not found"),
    ("experiments.harness.runner", ["--sweep=experiments/table3", "--out={tmp}", "--dry_run",
                                    BAD_OVERRIDE], "must be int"),
    ("benchmarks.accelerator", [f"--config={NO_FILE}", "--out={tmp}/b"], "not found"),
    ("benchmarks.accelerator", [BAD_OVERRIDE, "--out={tmp}/b"], "must be int"),
    ("benchmarks.parallel_runs", [f"--sweep={NO_FILE}", "--out={tmp}/b"], "not found"),
    ("benchmarks.core_budget", ["--workdir={tmp}", f"--config={NO_FILE}"], "not found"),
    ("benchmarks.core_budget", ["--workdir={tmp}", "--config=configs/wsj_parsing.py"],
     "max_train_minutes"),
    ("benchmarks.epoch_cost", [f"--config={NO_FILE}"], "not found"),
    ("benchmarks.epoch_cost", ["--config=configs/wsj_parsing.py:sample",
                               "--config.data.batch_mode=pack"], "batch_mode"),
)


def _run(module, args, tmp_path):
  cmd = [sys.executable, "-m", module, *(a.format(tmp=tmp_path) for a in args)]
  return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def _assert_one_line(result, says=""):
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
      result.returncode, result.stderr[-2000:])
  assert says in lines[0], lines[0]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_an_unknown_flag_is_one_line_and_exit_2(module, tmp_path):
  _assert_one_line(_run(module, ["--no_such_flag=1"], tmp_path), "no_such_flag")


@pytest.mark.parametrize("module,args,says", CONFIG_CASES,
                         ids=[f"{m}:{a[-1].split('=')[0]}" for m, a, _ in CONFIG_CASES])
def test_a_missing_config_file_or_bad_override_is_one_line_and_exit_2(module, args, says, tmp_path):
  _assert_one_line(_run(module, args, tmp_path), says)
  assert not list(tmp_path.iterdir())  # nothing written


def test_params_reads_the_config_before_jax_loads(tmp_path):
  """The flags and the config are checked before JAX is imported: a mistake is reported at once."""
  code = ("import sys, runpy; sys.argv = ['params', '--config=" + NO_FILE + "']\n"
          "try:\n  runpy.run_module('transformer_jax.tools.params', run_name='__main__')\n"
          "except SystemExit as e:\n  print(e.code, 'jax' in sys.modules)")
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
  assert result.stdout.split() == ["2", "False"], result.stdout + result.stderr


# ----------------------------------------------------------------------------- a trained workdir

TRAINED = pytest.mark.xdist_group("test_entry_points_trained")


def _main(*args):
  from tests.test_train_reliability import _env  # pylint: disable=g-import-not-at-top
  return subprocess.run([sys.executable, "-m", "transformer_jax.main", *args], cwd=REPO,
                        env=_env(), capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """Four steps of a tiny model, checkpoints at 2 and 4."""
  w = tmp_path_factory.mktemp("trained")
  result = _main(f"--workdir={w}", *TINY_CLI_FLAGS, "--config.train.num_steps=4")
  assert result.returncode == 0, result.stderr[-3000:]
  return w


@requires_data
@TRAINED
def test_eval_of_a_garbage_checkpoint_is_one_line(trained, tmp_path):
  """Orbax's aborted reads leave no 'Event loop is closed' traceback under the one line."""
  w = tmp_path / "w"
  shutil.copytree(trained, w)
  arrays = [p for p in (w / "checkpoints" / "4" / "state").rglob("*")
            if p.is_file() and p.parent.name == "d"]
  assert arrays
  rng = random.Random(0)
  for p in arrays:
    p.write_bytes(bytes(rng.randrange(256) for _ in range(p.stat().st_size)))
  result = _main("--mode=eval", f"--workdir={w}")
  _assert_one_line(result, "checkpoints/4")


@requires_data
@TRAINED
def test_a_resume_past_the_runs_end_says_so_and_exits_0(trained, tmp_path):
  w = tmp_path / "w"
  shutil.copytree(trained, w)
  result = _main(f"--workdir={w}", *TINY_CLI_FLAGS, "--config.train.num_steps=2")
  assert result.returncode == 0, result.stderr[-2000:]
  said = [l for l in result.stdout.splitlines() if l.startswith("nothing to train")]
  assert len(said) == 1 and "step 4" in said[0] and "train.num_steps=2" in said[0], result.stdout
  assert "recorded in" not in result.stdout and not (w / "config_changes.jsonl").exists()


def test_the_late_callbacks_of_aborted_reads_are_dropped_and_nothing_else():
  """tensorstore reports them through sys.excepthook (PyErr_Print) or sys.unraisablehook."""
  def call_soon_threadsafe():
    raise RuntimeError("Event loop is closed")

  def caught(fn):
    try:
      fn()
    except RuntimeError:
      return sys.exc_info()

  seen = []
  hook = orbax_logs.excepthook(lambda *exc: seen.append(exc[1]))
  hook(*caught(call_soon_threadsafe))
  hook(*caught(lambda: call_soon_threadsafe()))  # raised further down the traceback
  assert not seen
  other = caught(lambda: (_ for _ in ()).throw(RuntimeError("Event loop is closed")))
  hook(*other)
  assert seen == [other[1]]
