"""The settings a benchmark command resolves to: what each result records beside its command.

A benchmark result holds `command` (the `python -m benchmarks[.MODULE] ...` line that wrote it)
and `settings`, flat dotted keys of everything that command fixed about what was measured:
- `benchmark.NAME`: the benchmark's own flags and constants that change the measurement (not
  where it writes);
- `LABEL.KEY`: a run config the benchmark built (LABEL has no dot, e.g. `train:base`,
  `decode:base`, `data:multi30k`; KEY is the run config's dotted key, e.g. `model.d_model`),
  without the keys that only say where data lives (PLACE_KEYS).

`resolve(command)` recomputes those settings from the command line with this checkout's code and
configs, without running anything, through the same function the benchmark used when it wrote
the result; so a result whose recorded settings differ from `resolve(command)` would not
regenerate at HEAD.
"""

from __future__ import annotations

import importlib
import json
import shlex
from typing import Any, Mapping, Sequence

from absl import flags
import ml_collections

from transformer_jax.runtime import dotted
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import split_override_args
from transformer_jax.runtime.results import json_text

# `python -m MODULE` -> the module that defines its flags and settings.
ENTRY_POINTS = {
    "benchmarks": "benchmarks.__main__",
    "benchmarks.accelerator": "benchmarks.accelerator",
    "benchmarks.core_budget": "benchmarks.core_budget",
    "benchmarks.ctranslate2_decode": "benchmarks.ctranslate2_decode",
    "benchmarks.epoch_cost": "benchmarks.epoch_cost",
    "benchmarks.export_agreement": "benchmarks.export_agreement",
    "benchmarks.flax_wmt": "benchmarks.flax_wmt",
    "benchmarks.flax_wmt_decode": "benchmarks.flax_wmt_decode",
    "benchmarks.parallel_runs": "benchmarks.parallel_runs",
    "benchmarks.parse_decode": "benchmarks.parse_decode",
    "benchmarks.parser_peer": "benchmarks.parser_peer",
}
# Run-config keys that say where the data is read from or prepared, not what is measured: they
# differ between machines (TRANSFORMER_JAX_DATA_DIR) and runs (temporary folders).
PLACE_KEYS = frozenset(("data.data_dir", "data.tfds_data_dir"))


def normalized(settings: Mapping[str, Any]) -> dict[str, Any]:
  """`settings` as its JSON file holds them (tuples as lists, ...), so that recorded and resolved
  settings compare equal."""
  return json.loads(json_text(dict(settings)))


def config_settings(label: str, config: ml_collections.ConfigDict | Mapping[str, Any],
                    section: str | None = None) -> dict[str, Any]:
  """{'LABEL.model.d_model': 512, ...}: `config` (or only its `section`) flattened, PLACE_KEYS
  left out."""
  assert "." not in label, f"a settings label has no dot: {label!r}"
  tree = {section: config[section]} if section else config
  return {f"{label}.{k}": v for k, v in dotted.flatten(tree).items() if k not in PLACE_KEYS}


def config_key(key: str) -> str | None:
  """The run-config key inside a settings key ('train:base.model.d_model' -> 'model.d_model'),
  e.g. to look up its schema default; None for the benchmark's own ('benchmark.steps')."""
  label, _, rest = key.partition(".")
  return None if label == "benchmark" or not rest else rest


def benchmark_settings(values: Mapping[str, Any]) -> dict[str, Any]:
  """{'benchmark.steps': 5, ...}: the benchmark's own resolved flags and constants."""
  return {f"benchmark.{k}": v for k, v in values.items()}


def _module_and_args(command: str) -> tuple[str, list[str]]:
  """('benchmarks.flax_wmt', [its arguments]) of a recorded shell line (environment assignments
  before python and a trailing `&& ...` allowed)."""
  try:
    words = shlex.split(command)
  except ValueError as e:
    raise ConfigError(f"benchmark command {command!r} does not parse as a shell line ({e})"
                      ) from None
  for i, word in enumerate(words[:-1]):
    if word == "-m" and words[i + 1].split(".")[0] == "benchmarks":
      module, rest = words[i + 1], words[i + 2:]
      if module not in ENTRY_POINTS:
        raise ConfigError(f"benchmark command {command!r}: `python -m {module}` is not a "
                          f"benchmark entry point (use {', '.join(ENTRY_POINTS)})")
      return module, rest[:rest.index("&&")] if "&&" in rest else rest
  raise ConfigError(f"not a benchmark command (python -m benchmarks[.MODULE] ...): {command!r}")


def _absl_flag_names() -> frozenset[str]:
  """absl's own flags (--verbosity, --logtostderr, ...): every entry point accepts them, and
  none changes what is measured."""
  names = set()
  for module, defined in flags.FLAGS.flags_by_module_dict().items():
    if module.startswith("absl."):
      for f in defined:
        names.update((f.name, f.short_name) if f.short_name else (f.name,))
  return frozenset(names)


def _without_absl_flags(args: Sequence[str]) -> list[str]:
  names = _absl_flag_names()

  def named(arg):
    name = arg.lstrip("-").split("=", 1)[0]
    return arg.startswith("-") and (name in names or (name.startswith("no") and name[2:] in names))
  return [a for a in args if not named(a)]


def parse_command(command: str) -> tuple[Any, flags.FlagValues, list[str]]:
  """(the entry module, its flags parsed from `command` in a FlagValues of their own, the
  --config.KEY=VALUE arguments); a flag mistake is one ConfigError line."""
  module_name, args = _module_and_args(command)
  module = importlib.import_module(ENTRY_POINTS[module_name])
  overrides, rest = split_override_args(args)
  values = flags.FlagValues()
  module.define_flags(values)
  try:
    extra = values([module_name, *_without_absl_flags(rest)])
  except flags.Error as e:
    raise ConfigError(f"benchmark command `python -m {module_name}`: "
                      f"{str(e).splitlines()[0]}") from None
  if len(extra) > 1:
    raise ConfigError(f"benchmark command `python -m {module_name}`: unexpected arguments "
                      f"{' '.join(extra[1:])}")
  return module, values, overrides


def resolve(command: str) -> dict[str, Any]:
  """The settings the recorded benchmark `command` resolves to at this checkout (its entry
  module's `settings`); nothing is run. A command that is not a benchmark's, an unknown flag or
  a bad override is one ConfigError line."""
  module, values, overrides = parse_command(command)
  return module.settings(values, overrides)
