"""Does every committed result still regenerate at HEAD? Resolves the commands results record.

  python -m experiments.harness.provenance              # every results/ folder under experiments/
  python -m experiments.harness.provenance --results=DIR       # one folder

For each JSON under experiments/results/ and every study's results/ (not under `archive/`,
whose files ran at the commit its README names), the check re-resolves the command the result
records with this checkout and compares the settings key by key with those it recorded:
- a sweep's run (`<row>_seed<k>.json`: `protocol.resolved`, `commands.sweep`, `commands.train`):
  the sweep command's row at its scale must give the same protocol (experiments/harness/
  resolve.py), and the training command the same resolved settings;
- a run's report (experiments/harness/run_report.py: `command`, the training command, and
  `config`, the run's config.json): the command must resolve to that config;
- any other result recording `command` and `settings` (a sweep's report, the battery, a
  benchmark): the resolver of the module its command runs (RESOLVERS; `benchmarks.settings`
  for `python -m benchmarks...`, where that module exists) must give the same settings.
A recorded path or module that has since moved is read through the studies' FORMER_PATHS and
FORMER_MODULES. Resolving trains nothing. A result that records a command but not its
settings, or no command, is listed as unchecked; one whose settings differ ("drift", with the
first key), whose command no longer parses, or whose JSON does not load fails (exit 1).
Nothing is rewritten: a drifted result is re-pinned or moved to an archive/ with its commit.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib
import importlib.util
import json
import os
import re
import shlex
import sys

from absl import flags

from experiments.harness import records, resolve, study
from transformer_jax.runtime import cli
from transformer_jax.runtime.dotted import flatten
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import load, parse_overrides, REPO

_RESULTS = flags.DEFINE_string("results", "", "Folder of committed results (its archive/ is "
                               "skipped); default: every results/ folder under experiments/.")
ARCHIVE = "archive"
# Keys of a run's config.json that say where and how visibly it ran, not what it computed.
PLACE_KEYS = frozenset(("data.data_dir", "data.tfds_data_dir",
                        "data.num_workers", "train.progress_bar", "train.peak_flops"))
# Keys training fills from the run's vocabulary (recorded by its fingerprint), not set by a command.
VOCABULARY_KEYS = frozenset(("model.word_starts",))
FAILING = ("drift", "error")
_OURS = ("transformer_jax", "experiments", "benchmarks", "launch", "configs")
RUNNER = "experiments.harness.runner"
# Entry points that moved: the module a recorded command ran -> the module now.
FORMER_MODULES = {"experiments.run": RUNNER, "experiments.report_run": "experiments.harness.run_report",
                  "experiments.battery": "experiments.checks.battery",
                  "experiments.provenance": "experiments.harness.provenance"}


def results_folders() -> list[str]:
  """experiments/results/ and every study's results/ folder."""
  return [os.path.join(REPO, "experiments", "results")] + sorted(
      glob.glob(os.path.join(REPO, "experiments", "*", "results")))


@functools.lru_cache(maxsize=None)
def _former_paths() -> dict[str, str]:
  return study.former_paths()


def current(command: str) -> str:
  """A recorded shell command with moved modules and paths (FORMER_MODULES, the studies'
  FORMER_PATHS) replaced by where they are now."""
  for old, new in FORMER_MODULES.items():
    command = re.sub(rf"(-m\s+){re.escape(old)}(?=\s|$)", rf"\g<1>{new}", command)
  for old, new in _former_paths().items():
    command = re.sub(rf"(=){re.escape(old)}(?=[\s:]|$)", rf"\g<1>{new}", command)
  return command


@dataclasses.dataclass
class Finding:
  path: str
  status: str   # ok | drift | error | unchecked
  detail: str

  def line(self, root: str) -> str:
    return f"{self.status:9s} {os.path.relpath(self.path, root)}: {self.detail}"


def _module_args(command: str, module: str) -> list[str]:
  """The arguments after `-m <module>` in a recorded shell command (env prefixes, `&&` chains
  and the python path allowed; moved paths read as they are now); ConfigError if the command
  does not run that module."""
  try:
    words = shlex.split(current(command))
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
    words = shlex.split(current(command))
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
  return flatten(load(spec, overrides))


def settings_difference(recorded: dict, resolved: dict, ignore=frozenset(), schema_key=None) -> str:
  """The first key whose value differs ('key: X recorded, Y at HEAD'); a key the code gained
  later at its default is no difference, a key it lost is."""
  key = records.differing_key(resolved, recorded, ignore, schema_key)
  if key is None:
    return ""
  at_head = f"{resolved[key]!r} at HEAD" if key in resolved else "no such key at HEAD"
  return f"{key}: {recorded.get(key)!r} recorded, {at_head}"


@functools.lru_cache(maxsize=None)
def _sweep(spec: str):
  """A sweep file, loaded once per check (a folder holds many runs of one sweep)."""
  return study.load_sweep(spec)


def _check_sweep_result(data: dict) -> tuple[str, str]:
  protocol, commands = data["protocol"], data.get("commands") or {}
  if not commands.get("sweep") and not commands.get("train"):
    return "unchecked", "a sweep result without recorded commands"
  if commands.get("sweep"):
    args = _module_args(commands["sweep"], RUNNER)
    sweep = _sweep(_flag(args, "sweep"))
    res = resolve.resolve(sweep, protocol["row"], _flag(args, "scale", "cpu"),
                           parse_overrides([a for a in args if a.startswith("--config.")]),
                           _flag(args, "base_config"))
    bleu = int(_flag(args, "bleu_sentences", "-1"))
    if bleu >= 0:
      res = dataclasses.replace(res, bleu_sentences=bleu)
    diff = records.protocol_difference(resolve.protocol(res, sweep), protocol)
    if diff:
      return "drift", f"the sweep command at HEAD: {diff}"
  if commands.get("train"):
    resolved = resolve_training_command(commands["train"])
    # A row scored on another's run (resolve.shared_training) gives its decode settings to the
    # evaluation: the result is what both recorded commands ran.
    evaluation = shlex.split(commands.get("eval", ""))
    resolved.update(parse_overrides([a for a in evaluation if a.startswith("--config.decode.")]))
    average = [a.split("=", 1)[1] for a in evaluation if a.startswith("--average=")]
    if average:
      resolved["decode.average_checkpoints"] = int(average[0])
    diff = settings_difference(protocol["resolved"], resolved,
                               resolve.BOOKKEEPING_KEYS | VOCABULARY_KEYS)
    if diff:
      return "drift", f"the training command at HEAD: {diff}"
  return "ok", f"row {protocol['row']} at scale {protocol['scale']}, {len(protocol['resolved'])} settings"


def _scored_average(data: dict, head: dict) -> dict:
  """A run's report records its checkpoint's config, but scores the average of the checkpoints
  its --average chose (`averaged_checkpoints`): where that is the average HEAD's config decodes
  with, the run's result is what HEAD gives, whatever its checkpoint's config said."""
  k = data.get("averaged_checkpoints")
  key = "decode.average_checkpoints"
  if isinstance(k, int) and head[key] == (k if k > 1 else 0):
    return {key: head[key]}
  return {}


def _runner_settings(command: str) -> dict:
  from experiments.harness import runner  # pylint: disable=g-import-not-at-top  (its flags)
  return runner.report_settings(_module_args(command, RUNNER))


def _battery_settings(command: str) -> dict:
  from experiments.checks import battery_faults  # pylint: disable=g-import-not-at-top
  only = _flag(_module_args(command, "experiments.checks.battery"), "only")
  return battery_faults.settings([n for n in only.split(",") if n] or None)


def _benchmark_settings(command: str) -> dict | None:
  """benchmarks.settings.resolve(command), or None where this checkout has no such module."""
  if importlib.util.find_spec("benchmarks") is None or importlib.util.find_spec(
      "benchmarks.settings") is None:
    return None
  return importlib.import_module("benchmarks.settings").resolve(current(command))


# The module a recorded command runs -> (what resolves its settings at HEAD, keys to ignore).
RESOLVERS = {
    RUNNER: (_runner_settings, frozenset()),
    "experiments.checks.battery": (_battery_settings, frozenset()),
    "transformer_jax.main": (resolve_training_command,
                             resolve.BOOKKEEPING_KEYS | PLACE_KEYS | VOCABULARY_KEYS),
}


def _entry_module(command: str) -> str:
  words = shlex.split(current(command))
  return next((words[i + 1] for i in range(len(words) - 1) if words[i] == "-m"), "")


def _check_settings(command: str, recorded: dict) -> tuple[str, str]:
  """A result's recorded `settings` against what its `command` resolves to at HEAD."""
  gone = _missing_program(command)
  if gone:
    return "drift", f"the recorded command runs {gone}, which HEAD does not have"
  module, schema_key = _entry_module(command), None
  if module.split(".")[0] == "benchmarks":
    resolved, ignore = _benchmark_settings(command), frozenset()
    if resolved is None:
      return "unchecked", "a benchmark's settings (benchmarks.settings is not in this checkout)"
    schema_key = importlib.import_module("benchmarks.settings").config_key
  elif module in RESOLVERS:
    resolve_fn, ignore = RESOLVERS[module]
    resolved = resolve_fn(command)
  else:
    return "unchecked", f"records settings, but nothing resolves `python -m {module}`"
  diff = settings_difference(recorded, json.loads(json.dumps(resolved, default=str)), ignore,
                             schema_key)
  if diff:
    return "drift", f"the recorded command at HEAD: {diff}"
  return "ok", f"`python -m {module}`, {len(recorded)} settings"


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
      recorded, head = flatten(data["config"]), resolve_training_command(data["command"])
      recorded.update(_scored_average(data, head))
      diff = settings_difference(recorded, head, PLACE_KEYS | VOCABULARY_KEYS)
      if diff:
        return Finding(path, "drift", f"the training command at HEAD: {diff}")
      return Finding(path, "ok", f"{_flag(_module_args(data['command'], 'transformer_jax.main'), 'config')}, "
                                 f"{len(recorded)} settings")
    if isinstance(data, dict) and isinstance(data.get("settings"), dict) and isinstance(
        data.get("command"), str):
      return Finding(path, *_check_settings(data["command"], data["settings"]))
    bench = _benchmark_record(data)
    if bench:
      return Finding(path, *_check_settings(*bench))
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


def _benchmark_record(data) -> tuple[str, dict] | None:
  """(command, settings) of a benchmark result recording `settings` beside `commands`."""
  if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
    return None
  commands = data.get("commands")
  commands = list(commands.values()) if isinstance(commands, dict) else commands
  command = next((c for c in commands or [] if isinstance(c, str) and "-m benchmarks" in c), "")
  return (command, data["settings"]) if command else None


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
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  roots = [_RESULTS.value] if _RESULTS.value else results_folders()
  findings, archived = [], 0
  for root in roots:
    more, skipped = check_folder(root)
    findings, archived = findings + more, archived + skipped
  shown = _RESULTS.value or os.path.join(REPO, "experiments")
  for finding in findings:
    print(finding.line(shown))
  print(summary(findings, archived))
  sys.exit(1 if any(f.status in FAILING for f in findings) else 0)


if __name__ == "__main__":
  cli.run(main, overrides=False)
