"""The one Markdown table writer: evaluation reports, sweep tables and benchmark reports use it."""

from __future__ import annotations

from typing import Any, Sequence


def cell(value: Any, digits: int = 2) -> str:
  """A table cell: floats with `digits` decimals, None as blank, '|' escaped."""
  if value is None:
    return ""
  if isinstance(value, float):
    return f"{value:.{digits}f}"
  return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 2) -> str:
  """A GitHub Markdown table (ending in a newline) of `rows` under `header`."""
  lines = ["| " + " | ".join(cell(h) for h in header) + " |",
           "|" + "---|" * len(header)]
  for row in rows:
    if len(row) != len(header):
      raise ValueError(f"table row has {len(row)} cells for {len(header)} columns: {row!r}")
    lines.append("| " + " | ".join(cell(v, digits) for v in row) + " |")
  return "\n".join(lines) + "\n"
