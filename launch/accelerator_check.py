"""The checks of a lent GPU host's first minutes, one process and one time box per stage.

  launch/accelerator_check.sh OUT                 # on the GPU host: configs/gpu.py, H200
  launch/accelerator_check.sh OUT --preset=cpu    # the rehearsal on a CPU: tiny models

launch/accelerator_check.sh prints nvidia-smi and installs the carried wheels (its stages 'host'
and 'wheels'), then runs this driver, which runs each stage below in a child process under the
stage's time box, so that a stage that fails, hangs or runs out of memory is one line in the
summary and the next stage still runs:
  env        jax.devices(), the backend (the GPU preset fails here when no GPU is visible) and the
             versions of the packages the library uses, the host's and the carried ones;
  imports    every module of transformer_jax and the benchmark modules the stages use, stopping
             at the first that does not import, named;
  base_step  the preset's base train step in its dtype (bf16 on the GPU): compile time, target
             tokens/s and MFU against a matrix product measured in the same process, with the MFU
             against the data sheet's peak beside it;
  memory     big's compiled train step against the device's memory limit (nothing allocated);
  attention  cuDNN against einsum attention on one bucketed, padded batch (loss and gradient
             agreement), then the step times of bucketed cuDNN, bucketed einsum and packed XLA
             attention at the preset's token budget (the paper's 25,000 tokens on the GPU);
  train      a short real Multi30k run (TRANSFORMER_JAX_DATA_DIR/multi30k) ending in a dev BLEU;
  decode     beam-4 translation of dev sentences with that run's model, timed on a second pass
             over the same batches, so compiling is excluded (the first pass compiles them).
Writes OUT/summary.json and OUT/summary.md through transformer_jax.runtime.results, beside the
shell's OUT/check.log and OUT/pip.log; exits with status 1 when any stage failed, 0 otherwise.
The stages' timings on a shared CPU mean nothing: the CPU preset exists to run every code path.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run as a script on a host where the repository is not installed
  sys.path.insert(0, REPO)

from absl import app, flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from launch.accelerator_stages import (  # pylint: disable=g-import-not-at-top,wrong-import-position
    PRESETS, STAGE_FUNCTIONS, one_line)
from transformer_jax.runtime import results  # pylint: disable=g-import-not-at-top,wrong-import-position

try:  # the project's error path; absent only when the carried wheels are (ml_collections)
  from transformer_jax.runtime import cli as _cli  # pylint: disable=g-import-not-at-top
except ImportError:
  _cli = None

CPU_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_parallel_codegen_split_count=1"
STAGES = ("env", "imports", "base_step", "memory", "attention", "train", "decode")
MAX_OTHER_FILES = 6  # OUT holds the summary's .json and .md and at most this many more


def define_flags() -> None:
  """The command's flags (defined only when it runs: tests import this module's functions)."""
  flags.DEFINE_string("out", None, "Folder for summary.json and summary.md.")
  flags.DEFINE_enum("preset", "gpu", list(PRESETS), "gpu: the lent H200's checks; cpu: the same "
                    "stages with tiny models, to rehearse the command.")
  flags.DEFINE_list("stages", list(STAGES), "Stages to run, in this order.")
  flags.DEFINE_multi_string("timebox", [], "NAME=SECONDS: another time box for a stage.")
  flags.DEFINE_string("shell_stages", "", "JSON lines of the shell's own stages (host, wheels), "
                      "put first in the summary.")
  flags.DEFINE_string("work", "", "Scratch folder the stages share (default: a new one).")
  flags.DEFINE_string("stage", "", "Internal: run this one stage in this process.")
  flags.DEFINE_string("stage_out", "", "Internal: where the stage writes its result.")


FLAGS = flags.FLAGS


def parse_timeboxes(preset: str, overrides) -> dict:
  """The preset's time boxes with NAME=SECONDS `overrides`."""
  from transformer_jax.runtime.exceptions import ConfigError  # pylint: disable=g-import-not-at-top
  boxes = dict(PRESETS[preset]["timebox"])
  for text in overrides:
    name, _, seconds = text.partition("=")
    try:
      value = float(seconds)
    except ValueError:
      value = -1.0
    if name not in boxes or value <= 0:
      raise ConfigError(f"--timebox={text}: expected NAME=SECONDS with NAME one of "
                        f"{', '.join(boxes)} and SECONDS > 0")
    boxes[name] = value
  return boxes


def run_child_stage(name: str, preset_name: str, work: str, out_path: str) -> int:
  """Runs one stage in this process and writes {status, message, result} to `out_path`."""
  t = time.perf_counter()
  try:
    result = STAGE_FUNCTIONS[name](PRESETS[preset_name], work)
    record = {"status": "ok", "result": result}
  except Exception as e:  # noqa: BLE001  every failure is one line of the summary
    traceback.print_exc()
    record = {"status": "failed", "message": one_line(e)}
    partial = results.read_json(os.path.join(work, f"{name}_partial.json"))
    if partial:
      record["result"] = partial
  record["seconds"] = time.perf_counter() - t
  results.write_json(out_path, record)
  sys.stdout.flush()
  sys.stderr.flush()
  # At once: a background thread (an Orbax save, grain's workers) must not hold the stage.
  os._exit(0)  # pylint: disable=protected-access


def run_stage(name: str, seconds: float, preset_name: str, work: str) -> dict:
  """The stage `name` in a child process of its own session, killed with its children when it
  runs past `seconds`; its output goes to this process's, prefixed by the stage's name."""
  out_path = os.path.join(work, f"stage_{name}.json")
  if os.path.exists(out_path):
    os.remove(out_path)
  cmd = [sys.executable, os.path.abspath(__file__), f"--stage={name}", f"--stage_out={out_path}",
         f"--preset={preset_name}", f"--work={work}"]
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  if preset_name == "cpu" and "XLA_FLAGS" not in env:  # the rehearsal runs code paths: compile fast
    env["XLA_FLAGS"] = CPU_XLA_FLAGS
  env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
  t = time.monotonic()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", env=env, cwd=REPO, start_new_session=True)
  tail = collections.deque(maxlen=8)

  def copy_output():
    for line in proc.stdout:
      sys.stdout.write(f"[{name}] {line}")
      sys.stdout.flush()
      tail.append(line.rstrip("\n"))
  reader = threading.Thread(target=copy_output, daemon=True)
  reader.start()
  timed_out = False
  try:
    rc = proc.wait(timeout=seconds)
  except subprocess.TimeoutExpired:
    timed_out = True
    try:
      os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and what it started
    except ProcessLookupError:
      pass
    rc = proc.wait()
  reader.join(timeout=5)
  elapsed = time.monotonic() - t
  record = results.read_json(out_path) if not timed_out else None
  if timed_out:
    record = {"status": "failed", "message": f"over its time box of {seconds:g} s (killed)"}
  elif record is None:
    last = next((line for line in reversed(tail) if line.strip()), "")
    record = {"status": "failed", "message": f"the stage's process exited with status {rc} "
                                             f"before writing its result; last line: {last[:300]}"}
  record.update(name=name, seconds=elapsed, timebox_s=seconds)
  print(f"== {name}: {record['status']} in {elapsed:.1f} s (box {seconds:g} s)"
        + (f": {record['message']}" if record.get("message") else ""), flush=True)
  for line in (record.get("result") or {}).get("lines", []):
    print(f"   {line}", flush=True)
  return record


def _shell_records(path: str) -> list[dict]:
  records = []
  if path and os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      for line in f:
        if line.strip():
          try:
            records.append(json.loads(line))
          except ValueError:
            records.append({"name": "shell", "status": "failed",
                            "message": f"unreadable stage line {line.strip()[:200]!r}"})
  return records


def markdown(summary: dict) -> str:
  """The summary as a report: one row per stage, then each stage's lines."""
  from transformer_jax.runtime.markdown import table  # pylint: disable=g-import-not-at-top
  rows = []
  for r in summary["stages"]:
    box = r.get("timebox_s")
    rows.append([r["name"], r["status"], f"{r.get('seconds', 0):.1f}" + (f" / {box:g}" if box
                                                                            else ""),
                 r.get("message", "")])
  lines = [f"# Accelerator check ({summary['preset']} preset)", "",
           f"Date: {summary['date']}  ", f"Command: `{summary['command']}`  ",
           f"Host: {summary['host']}  ",
           f"Result: {'all stages passed' if summary['ok'] else 'failed: ' + ', '.join(summary['failed'])}",
           ""]
  if summary["preset"] == "cpu":
    lines += ["A rehearsal on a CPU: the stages' times say only that the command runs end to end; "
              "they are not measurements.", ""]
  lines += [table(["stage", "status", "seconds / time box", "message"], rows)]
  for r in summary["stages"]:
    detail = (r.get("result") or {}).get("lines", [])
    if detail:
      lines += [f"## {r['name']}", "", *(f"- {line}" for line in detail), ""]
  return "\n".join(lines) + "\n"


def drive(argv_command: str) -> int:
  """Runs the stages; writes the summary; 1 when a stage failed."""
  from transformer_jax.runtime.exceptions import ConfigError  # pylint: disable=g-import-not-at-top
  if not FLAGS.out:
    raise ConfigError("--out is required")
  unknown = [s for s in FLAGS.stages if s not in STAGES]
  if unknown:
    raise ConfigError(f"--stages: unknown {', '.join(unknown)}; use {', '.join(STAGES)}")
  boxes = parse_timeboxes(FLAGS.preset, FLAGS.timebox)
  os.makedirs(FLAGS.out, exist_ok=True)
  work = FLAGS.work or tempfile.mkdtemp(prefix="accelerator_check_")
  os.makedirs(work, exist_ok=True)
  started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  records = _shell_records(FLAGS.shell_stages)
  for name in FLAGS.stages:
    records.append(run_stage(name, boxes[name], FLAGS.preset, work))
  failed = [r["name"] for r in records if r["status"] != "ok"]
  summary = {"date": started, "command": argv_command, "preset": FLAGS.preset,
             "host": f"{platform.node()}, {platform.machine()}, python {platform.python_version()}",
             "ok": not failed, "failed": failed, "timeboxes_s": boxes, "stages": records,
             "total_s": sum(r.get("seconds", 0) for r in records)}
  _write_summary(os.path.join(FLAGS.out, "summary"), summary)
  print(f"accelerator check: {'ok' if not failed else 'FAILED: ' + ', '.join(failed)}; "
        f"{summary['total_s']:.0f} s of stages; summary in {FLAGS.out}/summary.md", flush=True)
  return 1 if failed else 0


def _write_summary(stem: str, summary: dict) -> None:
  results.write_result(stem, summary, markdown(summary))


def main(argv):
  if len(argv) > 1:
    from transformer_jax.runtime.exceptions import ConfigError  # pylint: disable=g-import-not-at-top
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.stage:
    if FLAGS.stage not in STAGE_FUNCTIONS or not FLAGS.stage_out:
      raise SystemExit(f"error: --stage={FLAGS.stage} needs a known stage and --stage_out")
    run_child_stage(FLAGS.stage, FLAGS.preset, FLAGS.work, FLAGS.stage_out)
    return
  command = shlex.join(["launch/accelerator_check.py", *sys.argv[1:]])
  sys.exit(drive(command))


if __name__ == "__main__":
  define_flags()
  if _cli is not None:
    _cli.run(main, overrides=False)
  else:  # without the carried wheels: still a summary, whose stages say what is missing
    app.run(main)
