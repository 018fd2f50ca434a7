"""Does every committed result still regenerate at HEAD? Resolves the commands results record.

  python -m experiments.provenance                     # experiments/results/, archive skipped
  python -m experiments.provenance --results=DIR       # another folder

For each JSON under the folder (not under `archive/`, whose files ran at the commit its README
names), the check re-resolves the command the result records with this checkout's configs and
compares the settings key by key with those the result recorded:
- a sweep's run (`<row>_seed<k>.json`: `protocol.resolved`, `commands.sweep`, `commands.train`):
  the sweep command's row at its scale must give the same protocol (experiments/row_runs.py),
  and the training command the same resolved settings;
- a run's report (experiments/report_run.py: `command`, the training command, and `config`, the
  run's config.json): the command must resolve to that config.
Resolving trains nothing (seconds for the whole folder). A result that records a command but not
its settings, or no command, is listed as unchecked; one whose settings differ ("drift", with the
first key), whose command no longer parses, or whose JSON does not load fails the check (exit 1).
Nothing is rewritten: a drifted result is re-pinned (its command names what it needs) or moved
to experiments/results/archive/ with the commit it ran at.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
import sys

from absl import app, flags

from experiments import results_files, row_runs, sweeps
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import REPO, load, parse_overrides

_RESULTS = flags.DEFINE_string("results", os.path.join(REPO, "experiments", "results"),
                               "Folder of committed results (its archive/ is skipped).")
ARCHIVE = "archive"
# Keys of a run's config.json that say where and how visibly it ran, not what it computed.
PLACE_KEYS = frozenset(("data.data_dir", "data.tfds_data_dir",
                        "data.num_workers", "train.progress_bar", "train.peak_flops"))
FAILING = ("drift", "error")
_OURS = ("transformer_jax", "experiments", "benchmarks", "launch", "configs")


@dataclasses.dataclass
class Finding:
  path: str
  status: str   # ok | drift | error | unchecked
  detail: str

  def line(self, root: str) -> str:
    return f"{self.status:9s} {os.path.relpath(self.path, root)}: {self.detail}"


def _module_args(command: str, module: str) -> list[str]:
  """The arguments after `-m <module>` in a recorded shell command (env prefixes, `&&` chains
  and the python path allowed); ConfigError if the command does not run that module."""
  try:
    words = shlex.split(command)
  except ValueError as e:
    raise ConfigError(f"the recorded command does not parse as a shell line ({e})") from None
  for i in range(len(words) - 1):
    if words[i] == "-m" and words[i + 1] == module:
      rest = words[i + 2:]
      return rest[:rest.index("&&")] if "&&" in rest else rest
  raise ConfigError(f"the recorded command does not run `python -m {module}`")


def _flag(args: list[str], name: str, default: str = "") -> str:
  value = default
  for a in args:
    if a.startswith(f"--{name}="):
      value = a.split("=", 1)[1]
  return value


def _missing_program(command: str) -> str:
  """The `python -m MODULE` or `python FILE.py` of ours that a recorded command runs and this
  checkout lacks; '' if it has it (or the command runs something else)."""
  try:
    words = shlex.split(command)
  except ValueError:
    return ""
  for i, word in enumerate(words[:-1]):
    nxt = words[i + 1]
    if word == "-m" and nxt.split(".")[0] in _OURS:
      if not os.path.exists(os.path.join(REPO, *nxt.split("."))) and not os.path.exists(
          os.path.join(REPO, *nxt.split(".")) + ".py"):
        return f"`python -m {nxt}`"
    elif os.path.basename(word).startswith("python") and nxt.endswith(".py") and nxt.split("/")[0] in _OURS:
      if not os.path.exists(os.path.join(REPO, nxt)):
        return f"`python {nxt}`"
  return ""


def resolve_training_command(command: str) -> dict:
  """The flat, validated run config a `python -m transformer_jax.main` command trains."""
  args = _module_args(command, "transformer_jax.main")
  spec = _flag(args, "config")
  if not spec:
    raise ConfigError("the recorded training command names no --config")
  overrides = [a for a in args if a.startswith("--config.")]
  return row_runs.flatten(load(spec, overrides))


def settings_difference(recorded: dict, resolved: dict, ignore=frozenset()) -> str:
  """The first key whose value differs ('key: X recorded, Y at HEAD'); a key the code gained
  later at its default is no difference, a key it lost is."""
  key = results_files.differing_key(resolved, recorded, ignore)
  if key is None:
    return ""
  at_head = f"{resolved[key]!r} at HEAD" if key in resolved else "no such key at HEAD"
  return f"{key}: {recorded.get(key)!r} recorded, {at_head}"


@functools.lru_cache(maxsize=None)
def _sweep(spec: str):
  """A sweep file, loaded once per check (a folder holds many runs of one sweep)."""
  return sweeps.load_sweep(spec)


def _check_sweep_result(data: dict) -> tuple[str, str]:
  protocol, commands = data["protocol"], data.get("commands") or {}
  if not commands.get("sweep") and not commands.get("train"):
    return "unchecked", "a sweep result without recorded commands"
  if commands.get("sweep"):
    args = _module_args(commands["sweep"], "experiments.run")
    sweep = _sweep(_flag(args, "sweep"))
    res = row_runs.resolve(sweep, protocol["row"], _flag(args, "scale", "cpu"),
                           parse_overrides([a for a in args if a.startswith("--config.")]),
                           _flag(args, "base_config"))
    bleu = int(_flag(args, "bleu_sentences", "-1"))
    if bleu >= 0:
      res = dataclasses.replace(res, bleu_sentences=bleu)
    diff = results_files.protocol_difference(row_runs.protocol(res, sweep), protocol)
    if diff:
      return "drift", f"the sweep command at HEAD: {diff}"
  if commands.get("train"):
    resolved = resolve_training_command(commands["train"])
    diff = settings_difference(protocol["resolved"], resolved, row_runs.BOOKKEEPING_KEYS)
    if diff:
      return "drift", f"the training command at HEAD: {diff}"
  return "ok", f"row {protocol['row']} at scale {protocol['scale']}, {len(protocol['resolved'])} settings"


def check_result(path: str) -> Finding:
  """One result file's finding; never raises for a bad file."""
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    return Finding(path, "error", f"does not load as JSON ({str(e).splitlines()[0]})")
  try:
    if isinstance(data, dict) and isinstance(data.get("protocol"), dict) and "resolved" in data["protocol"]:
      return Finding(path, *_check_sweep_result(data))
    if isinstance(data, dict) and isinstance(data.get("config"), dict) and data.get("command"):
      recorded = row_runs.flatten(data["config"])
      diff = settings_difference(recorded, resolve_training_command(data["command"]), PLACE_KEYS)
      if diff:
        return Finding(path, "drift", f"the training command at HEAD: {diff}")
      return Finding(path, "ok", f"{_flag(_module_args(data['command'], 'transformer_jax.main'), 'config')}, "
                                 f"{len(recorded)} settings")
    commands = [data["command"]] if isinstance(data, dict) and data.get("command") else [
        v["command"] for v in (data.values() if isinstance(data, dict) else [])
        if isinstance(v, dict) and isinstance(v.get("command"), str)]
    if commands:
      gone = next(filter(None, map(_missing_program, commands)), "")
      if gone:
        return Finding(path, "drift", f"the recorded command runs {gone}, which HEAD does not have")
      return Finding(path, "unchecked", "records commands but not the settings they resolved to")
    return Finding(path, "unchecked", "records no command")
  except ConfigError as e:
    return Finding(path, "error", f"the recorded command no longer resolves: {e}")
  except (KeyError, TypeError, ValueError) as e:
    return Finding(path, "error", f"malformed result ({type(e).__name__}: {e})")


def check_folder(root: str) -> tuple[list[Finding], int]:
  """(findings for every JSON under `root` outside archive/, number of archived JSON files)."""
  if not os.path.isdir(root):
    raise ConfigError(f"--results={root}: no such folder")
  findings, archived = [], 0
  for folder, dirs, names in os.walk(root):
    dirs.sort()
    in_archive = os.path.relpath(folder, root).split(os.sep)[0] == ARCHIVE
    for name in sorted(n for n in names if n.endswith(".json") and n != "references.json"):
      if in_archive:
        archived += 1
      else:
        findings.append(check_result(os.path.join(folder, name)))
  return findings, archived


def summary(findings: list[Finding], archived: int) -> str:
  counts = {s: sum(f.status == s for f in findings) for s in ("ok", "drift", "error", "unchecked")}
  return (f"{len(findings)} result files: {counts['ok']} regenerate at HEAD, {counts['drift']} "
          f"drifted, {counts['error']} unreadable or unresolvable, {counts['unchecked']} record no "
          f"settings to check; {archived} archived (skipped)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    findings, archived = check_folder(_RESULTS.value)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  for finding in findings:
    print(finding.line(_RESULTS.value))
  print(summary(findings, archived))
  sys.exit(1 if any(f.status in FAILING for f in findings) else 0)


if __name__ == "__main__":
  app.run(main)
