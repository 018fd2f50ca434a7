"""The one writer of result files: JSON records and the Markdown reports beside them.

Every file is written whole (files.write_text: a temporary file, then a rename), so an interrupted
writer leaves the old file or the new one, never a part; `write_once` never replaces a file, for
results that must not be overwritten.
"""

from __future__ import annotations

import json
import os
import platform
from typing import Any

from transformer_jax.runtime import files


def json_text(obj: Any) -> str:
  """The JSON text every result file holds (values json cannot write become strings)."""
  return json.dumps(obj, indent=1, default=str, ensure_ascii=False)


def read_json(path: str) -> Any:
  """The JSON in `path`, or None when it is missing or unreadable."""
  try:
    return json.loads(files.read_text(path))
  except (OSError, ValueError):
    return None


def write_json(path: str, obj: Any) -> None:
  """Writes `obj` to `path` whole, replacing it."""
  files.write_text(path, json_text(obj))


def write_markdown(path: str, text: str) -> None:
  """Writes a Markdown report to `path` whole, replacing it (one final newline)."""
  files.write_text(path, text.rstrip("\n") + "\n")


def write_once(path: str, obj: Any) -> bool:
  """Writes `obj` to local `path` whole unless `path` exists (then nothing); True if written."""
  text = json_text(obj)  # an object json cannot write fails here, before any file exists
  tmp = files.temp_path(path)
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.link(tmp, path)  # fails when `path` exists: a result is never replaced
    return True
  except FileExistsError:
    return False
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_result(stem: str, obj: Any, markdown: str | None = None) -> None:
  """`stem`.json and, given text, `stem`.md beside it, each written whole. The Markdown is written
  last, so a report on disk always has its JSON."""
  write_json(stem + ".json", obj)
  if markdown is not None:
    write_markdown(stem + ".md", markdown)


def machine(cpuinfo: str = "/proc/cpuinfo") -> dict:
  """This machine: the CPU (/proc/cpuinfo's model name, family and model, and its widest vector
  instructions: cloud VMs name Zen 3 and Zen 4 alike "AMD EPYC", and XLA's kernels and speed
  differ between AVX2 and AVX-512), its cores, the accelerator-free platform."""
  info = {}
  try:
    with open(cpuinfo) as f:
      for line in f:
        key, _, value = line.partition(":")
        if not line.strip():
          break  # the first processor is enough
        info.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  cpu = info.get("model name") or platform.processor() or platform.machine()
  flags = (info.get("flags") or info.get("Features", "")).split()  # x86, arm
  isa = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("asimd", "NEON"))
              if flag in flags), "")
  details = [f"family {info['cpu family']} model {info['model']}"] if "cpu family" in info else []
  details += [isa] if isa else []
  return {"cpu": f"{cpu} ({', '.join(details)})" if details else cpu, "cores": os.cpu_count(),
          "platform": platform.platform(terse=True)}
