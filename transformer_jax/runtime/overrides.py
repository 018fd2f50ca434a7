"""Run configs from files and the command line: the one `--config.KEY=VALUE` override parser.

The one way a run config is built from the command line (training CLI, eval/translate on top of
a checkpoint's config, the sweep runner, the benchmarks): a config file (`configs/*.py`, with an
optional `:variant`), then overrides parsed with the schema's types (transformer_jax/runtime/config.py),
each mistake one ConfigError line naming the file, line or key.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import sys
from typing import Any, Mapping, Sequence

import ml_collections

from transformer_jax.runtime import dotted
from transformer_jax.runtime.config import default_config, did_you_mean, validate
from transformer_jax.runtime.exceptions import ConfigError


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OVERRIDE_PREFIX = "--config."


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """A run config from 'configs/multi30k.py' or 'configs/multi30k.py:short' (a variant argument).

  A missing file, a file that does not import, one without get_config(), or a get_config() that
  raises (e.g. an unknown variant) is a ConfigError naming the file and the reason.
  """
  path, arg = split_variant(spec)
  module = load_python_file(path, "config file")
  try:
    config = module.get_config(arg) if arg else module.get_config()
  except ConfigError as e:
    raise ConfigError(f"config file {spec}: {e}") from None
  except Exception as e:  # noqa: BLE001 - a user's file: its reason, one line
    raise ConfigError(f"config file {spec}: {type(e).__name__}: {_first_line(e)}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f"config file {spec}: get_config() returned {type(config).__name__}, "
                      "not an ml_collections.ConfigDict")
  return config


def split_variant(spec: str) -> tuple[str, str]:
  """('configs/multi30k.py', 'short') from 'configs/multi30k.py:short': the variant is what
  follows the last ':' after the file name (a ':' in a folder's name stays in the path), and
  there is none when `spec` itself names a file."""
  if _find(spec) is not None:
    return spec, ""
  path, colon, arg = spec.rpartition(":")
  if not colon or "/" in arg or os.sep in arg:
    return spec, ""
  return path, arg


def _find(path: str) -> str | None:
  return next((p for p in ([path] if os.path.isabs(path) else [path, os.path.join(REPO, path)])
               if os.path.isfile(p)), None)


def load_python_file(path: str, what: str):
  """Imports a user's Python file (a run config, a sweep) with one-line errors naming it."""
  found = _find(path)
  if found is None:
    raise ConfigError(f"{what} {path} not found")
  if REPO not in sys.path:
    sys.path.insert(0, REPO)  # config and sweep files import `configs`, `experiments`
  name = "_user_file_" + re.sub(r"\W", "_", os.path.abspath(found))
  spec = importlib.util.spec_from_file_location(name, found)
  if spec is None or spec.loader is None:
    raise ConfigError(f"{what} {path} is not a Python file")
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except ConfigError:
    raise
  except SyntaxError as e:
    raise ConfigError(f"{what} {path}, line {e.lineno}: syntax error: {e.msg}") from None
  except Exception as e:  # noqa: BLE001
    raise ConfigError(f"{what} {path} cannot be loaded: {type(e).__name__}: {_first_line(e)}") from None
  if not hasattr(module, "get_config"):
    raise ConfigError(f"{what} {path} has no get_config() function")
  return module


def _first_line(e: BaseException) -> str:
  text = (e.args[0] if isinstance(e, KeyError) and e.args else str(e)).__str__().strip()
  return text.splitlines()[0] if text else type(e).__name__


def split_override_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """(the `--config.KEY=VALUE` arguments, the rest): overrides are taken out before absl parses."""
  overrides, rest = [], []
  for arg in argv:
    (overrides if arg.startswith(OVERRIDE_PREFIX) else rest).append(arg)
  return overrides, rest


def schema_default(key: str):
  """The schema's default for a dotted key ('train.num_steps'); ConfigError naming the first
  unknown part with the nearest valid key."""
  node = default_config()
  parts = key.split(".")
  for i, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      options = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      raise ConfigError(f"unknown config key '{'.'.join(parts[:i + 1])}'{did_you_mean(part, options)}")
    node = node[part]
  if isinstance(node, ml_collections.ConfigDict):
    raise ConfigError(f"config key '{key}' is a section, not a value")
  return node


def parse_value(key: str, text: str):
  """The text of an override parsed as the schema's type for `key` (bools: true/false/1/0)."""
  ref = schema_default(key)
  try:
    if isinstance(ref, bool):
      low = text.strip().lower()
      if low not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(text)
      return low in ("true", "1", "yes")
    if isinstance(ref, int):
      return int(text)
    if isinstance(ref, float):
      value = float(text)
  except ValueError:
    raise ConfigError(f"config key '{key}' must be {type(ref).__name__}, got {text!r}") from None
  if isinstance(ref, float):
    if not math.isfinite(value):  # 'nan', 'inf': no key means them
      raise ConfigError(f"config key '{key}' must be a finite number, got {text!r}")
    return value
  return text


def parse_overrides(args: Sequence[str]) -> dict[str, Any]:
  """['--config.train.num_steps=50'] (or 'train.num_steps=50') -> {'train.num_steps': 50}:
  keys checked against the schema, values typed by it; later arguments win."""
  out = {}
  for arg in args:
    body = arg[len(OVERRIDE_PREFIX):] if arg.startswith(OVERRIDE_PREFIX) else arg
    key, eq, text = body.partition("=")
    if not eq or not key:
      raise ConfigError(f"override {arg!r} must look like --config.section.key=value")
    try:
      out[key] = parse_value(key, text)
    except ConfigError as e:
      raise ConfigError(f"{e} (in {arg.split('=')[0]})") from None
  return out


def apply_overrides(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]
                    ) -> ml_collections.ConfigDict:
  """Sets each dotted key of `overrides` in `config` (in place; returns it). Keys must be in the
  schema; an int given for a float key becomes a float. Call validate() afterwards."""
  for key, value in overrides.items():
    ref = schema_default(key)
    node, leaf = dotted.parent(config, key)
    if isinstance(ref, float) and isinstance(value, int) and not isinstance(value, bool):
      value = float(value)
    try:
      if leaf in node:
        node[leaf] = value
      else:
        setattr(node, leaf, value)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
      raise ConfigError(f"config key '{key}' cannot take {value!r} ({type(e).__name__})") from None
  return config


def load(spec: str, override_args: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """load_config_file(spec) with the `--config.KEY=VALUE` arguments applied, validated."""
  config = load_config_file(spec)
  apply_overrides(config, parse_overrides(override_args))
  return validate(config)
