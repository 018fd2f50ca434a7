"""The battery: user mistakes and faults tried as a new user would, each checked for what the user
sees (exit status, one-line errors, no traceback) and what is left in the workdir.

  TRANSFORMER_JAX_DATA_DIR=/work/shared/data python -m experiments.checks.battery [--only=a,b] [--keep]

Every case runs the real CLI (`python -m transformer_jax.main`) on a tiny model
(tests/common.py's TINY_CLI_FLAGS) in a scratch folder, then checks its expectation (the cases:
experiments/checks/battery_faults.py, then the refusals of battery_cases.py). Results:
experiments/results/battery.md (a table: case, command, exit status, what the user saw, pass)
and battery.json (the same with the full checks, the command and the settings it ran:
battery_faults.settings, which provenance checks at HEAD). The disk-full case needs to mount a tmpfs
(root); it is recorded as skipped where that is not permitted.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
import time

from absl import flags

from experiments.checks.battery_cases import Run, tiny_flags
from experiments.checks.battery_faults import CASES, settings
from transformer_jax.runtime import cli, markdown
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import REPO
from transformer_jax.runtime.results import write_result

MODULE = "experiments.checks.battery"

_ONLY = flags.DEFINE_list("only", [], "Run only these cases (names as in the table).")
_KEEP = flags.DEFINE_bool("keep", False, "Keep the scratch folder (its path is printed).")
_OUT = flags.DEFINE_string("out", os.path.join(REPO, "experiments", "results"),
                           "Folder for battery.md and battery.json.")


# ------------------------------------------------------------------------------------- reporting

def _shown(r: Run | None) -> str:
  """The first line, every warning and error line, and the last line."""
  if r is None:
    return ""
  keep = [i for i, l in enumerate(r.lines)
          if i in (0, len(r.lines) - 1) or l.startswith(("warning:", "error:"))]
  parts, prev = [], None
  for i in keep:
    if prev is not None and i > prev + 1:
      parts.append("…")
    parts.append(r.lines[i])
    prev = i
  return " ⏎ ".join(parts)[:900]


def _hide(text: str, scratch: str) -> str:
  """The scratch folder as $SCRATCH, also where an elided message cut its path short."""
  return re.sub(r'[^\s="]*' + re.escape(os.path.basename(scratch)), "$SCRATCH", text)


def _command(r: Run | None, scratch: str) -> str:
  if r is None:
    return ""
  tiny = tiny_flags()
  args = [a for a in r.cmd[1:] if a not in tiny]
  text = _hide(" ".join(["python"] + args), scratch)
  return text + (" [tiny flags]" if any(a in tiny for a in r.cmd) else "")


def _row(name, expectation, res, scratch, seconds) -> dict:
  r = res["run"]
  return {"case": name, "expectation": expectation, "command": _command(r, scratch),
          "exit": None if r is None else r.returncode, "saw": _hide(_shown(r), scratch),
          "result": {True: "pass", False: "FAIL", None: "skipped"}[res["ok"]],
          "checks": res["checks"], "seconds": round(seconds, 1),
          "other_runs": [{"command": _command(o, scratch), "exit": o.returncode,
                          "last_line": _hide(o.last, scratch)} for o in res["others"]]}


def _write_report(results: list[dict], out: str, only: list[str]) -> str:
  os.makedirs(out, exist_ok=True)
  passed = sum(r["result"] == "pass" for r in results)
  header = ["case", "expected", "command", "exit", "what the user saw (first line, warnings and "
            "errors, last line)", "result"]
  rows = [[r["case"], r["expectation"], f"`{r['command']}`" if r["command"] else "", r["exit"],
           r["saw"], r["result"]] for r in results]
  failed = [f"- {r['case']}: " + "; ".join(k for k, v in r["checks"].items() if not v)
            for r in results if r["result"] == "FAIL"]
  command = shlex.join(["python", "-m", MODULE, *[a for a in sys.argv[1:]
                                                   if not a.startswith(("--out", "--keep"))]])
  text = ("# The battery: user mistakes and faults\n\n"
          f"`{command}` runs each case as a new user would (the CLI on a tiny "
          "model, `[tiny flags]` = tests/common.py's TINY_CLI_FLAGS) and checks what the user saw "
          "and what the workdir holds afterwards; every check of a case is in battery.json.\n\n"
          f"{passed} of {len(results)} cases pass.\n\n" + markdown.table(header, rows)
          + ("\nFailed checks:\n" + "\n".join(failed) + "\n" if failed else ""))
  write_result(os.path.join(out, "battery"),
               {"command": command, "settings": settings(only), "cases": results}, text)
  return f"{passed} of {len(results)} cases pass; {out}/battery.md"


def main(argv):
  del argv
  names = [n for n, _, _ in CASES]
  unknown = [n for n in _ONLY.value if n not in names]
  if unknown:
    raise ConfigError(f"--only: unknown case(s) {unknown}; cases: {', '.join(names)}")
  scratch = tempfile.mkdtemp(prefix="battery_")
  results = []
  for name, expectation, fn in CASES:
    if _ONLY.value and name not in _ONLY.value:
      continue
    t = time.time()
    try:
      res = fn(scratch)
    except Exception as e:  # noqa: BLE001 - a broken case is a failed case, recorded
      res = {"ok": False, "run": None, "checks": {f"case crashed: {type(e).__name__}: {e}": False},
             "others": []}
    results.append(_row(name, expectation, res, scratch, time.time() - t))
    print(f"{results[-1]['result']:7s} {name} ({results[-1]['seconds']} s)", flush=True)
  if _KEEP.value:
    print(f"scratch kept in {scratch}")
  else:
    shutil.rmtree(scratch, ignore_errors=True)
  print(_write_report(results, _OUT.value, _ONLY.value))


if __name__ == "__main__":
  cli.run(main, overrides=False)
