"""Nested configs and their dotted keys ('model.d_k'), both ways: the one flatten and nest that
overrides, branches, sweeps and result files use."""

from __future__ import annotations

from typing import Any, Mapping

import ml_collections


def flatten(tree: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
  """ConfigDict or dict -> {'model.d_k': 16, ...}, sections recursed, in the tree's order."""
  out = {}
  for key, value in (tree.items() if tree is not None else ()):
    if isinstance(value, (Mapping, ml_collections.ConfigDict)):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def parent(config: ml_collections.ConfigDict, key: str) -> tuple[ml_collections.ConfigDict, str]:
  """(the section holding dotted `key`, its last part); missing sections are created."""
  node = config
  *parents, leaf = key.split(".")
  for p in parents:
    if p not in node:
      node[p] = ml_collections.ConfigDict()
    node = node[p]
  return node, leaf


def nest(flat: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """{'model.d_k': 16} -> ConfigDict(model=ConfigDict(d_k=16))."""
  out = ml_collections.ConfigDict()
  for key, value in flat.items():
    node, leaf = parent(out, key)
    node[leaf] = value
  return out
