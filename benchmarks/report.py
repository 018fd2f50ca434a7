"""The head every benchmark result starts with (date, command, the settings it resolved to, the
machine and whether it was idle), its report header, the one way results are written, and the
report of `python -m benchmarks` (its parts' sections from their modules)."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
import time

from absl import flags

from transformer_jax.runtime import cli, results
from transformer_jax.runtime.exceptions import ConfigError

from benchmarks import decoding, input_pipeline, train_step


def machine() -> dict:
  """results.machine() (CPU model, cores, platform) plus python, jax, the backend and the devices
  of this process."""
  import jax  # pylint: disable=g-import-not-at-top
  return dict(results.machine(), python=platform.python_version(), jax=jax.__version__,
              backend=jax.default_backend(), devices=[str(d) for d in jax.devices()])


def others_busy(seconds: float = 2.0) -> float | None:
  """Share of all CPUs busy over `seconds` while this process sleeps, i.e. used by other
  processes (Linux /proc/stat; None elsewhere). Unlike the load average it does not lag: a job
  that just ended does not count."""
  def sample():
    with open("/proc/stat") as f:
      v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]  # total, idle + iowait
  try:
    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
  except (OSError, ValueError, IndexError):
    return None
  return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def machine_load() -> dict:
  """The load average and the CPU share of other processes (others_busy), now."""
  return {"load": list(os.getloadavg()), "others_busy": others_busy()}


def start(command: str, settings: dict) -> dict:
  """The head of a result: date, the command and the settings it resolved to
  (benchmarks/settings.py: `resolve(command)` gives them again), machine, and the load just
  before the run."""
  before = machine_load()
  return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "command": command, "settings": settings, "machine": machine(),
          "load_before": before["load"], "others_busy_before": before["others_busy"]}


def finish(result: dict) -> dict:
  """Adds the load just after the run and `idle`: other processes used < 10% of the CPUs just
  before and just after (the load average < 0.5 where /proc/stat is not available)."""
  after = machine_load()
  result.update(load_after=after["load"], others_busy_after=after["others_busy"])
  busy = (result["others_busy_before"], after["others_busy"])
  if None in busy:
    result["idle"] = max(result["load_before"][0], after["load"][0]) < 0.5
  else:
    result["idle"] = max(busy) < 0.10
  return result


def _share(x) -> str:
  return "n/a" if x is None else f"{x:.0%}"


def header(title: str, r: dict) -> list[str]:
  """Title, date, command, machine and its load, and a warning when it was not idle."""
  m = r["machine"]
  lines = [f"# {title}", "", f"Date: {r['date']}  ", f"Command: `{r['command']}`  ",
           f"Machine: {m['cpu']}, {m['cores']} cores, jax {m['jax']} on {m['backend']}; load "
           f"average {r['load_before'][0]:.2f} before, {r['load_after'][0]:.2f} after; "
           f"{_share(r['others_busy_before'])} before and {_share(r['others_busy_after'])} after "
           "of the CPUs used by other processes", ""]
  if not r["idle"]:
    lines += ["**Not idle: the machine was shared with other jobs during this run, so the "
              "times below are not representative (re-run when no other job runs).**", ""]
  return lines


def main(argv, module: str, settings, run, markdown_of) -> None:
  """The body of a benchmark module's `main`: no stray arguments, the settings its flags and
  overrides resolve to (`settings(values, override_args)`), `run(values, command, settings)`,
  then its report `markdown_of(result)` written to --out."""
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  values = flags.FLAGS
  recorded = settings(values, cli.OVERRIDE_ARGS)
  command = shlex.join(["python", "-m", module, *sys.argv[1:]])
  r = run(values, command, recorded)
  if values.out:
    write(r, markdown_of(r), values.out)


def write(result: dict, text: str, out: str) -> None:
  """Prints the report `text`; writes OUT.json and OUT.md, each whole (nothing when `out` is
  '')."""
  print(text)
  if out:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    results.write_result(out, result, text)


def markdown(r: dict) -> str:
  """The report of `python -m benchmarks`, from its JSON result."""
  lines = header("Benchmark: train step, decoding, input pipeline", r)
  if r["train"]:
    p = r["peak"]
    overrides = {k: v for e in r["train"] for k, v in e["overrides"].items()}
    lines += [
        "## Train step", "",
        f"Peak (same run): {p['flops_per_s'] / 1e9:.1f} GFLOP/s, jitted {p['dtype']} "
        f"{p['n']}x{p['n']} jnp.dot, best of 5. Model FLOPs = `metrics.train_flops` (3 x "
        "forward matmul FLOPs, attention over padded lengths included). Tokens = non-pad "
        "target tokens. Peak RSS is the process's high-water mark after each entry (entries "
        "run in the order shown)."
        + (f" Overrides: `{', '.join(f'{k}={v}' for k, v in overrides.items())}`."
           if overrides else ""), "",
        *train_step.markdown(r["train"])]
  if r["decode"]:
    lines += decoding.markdown(r["decode"])
  if r["data"]:
    lines += input_pipeline.markdown(r["data"])
  return "\n".join(lines).rstrip("\n") + "\n"
