"""host_memory: entry points re-execute once with glibc settings that keep step buffers mapped."""

import os
import subprocess
import sys

import pytest

from tests.common import REPO
from transformer_jax.runtime import host_memory

_CPU = {"JAX_PLATFORMS": "cpu"}


def test_wanted_only_when_not_set_and_not_switched_off():
  if not host_memory.wanted(dict(_CPU)):
    pytest.skip("not Linux/glibc")
  assert not host_memory.wanted(dict(_CPU, **host_memory.MALLOC_SETTINGS))
  assert not host_memory.wanted(dict(_CPU, TRANSFORMER_JAX_MALLOC="0"))
  assert not host_memory.wanted({"JAX_PLATFORMS": "tpu"})
  assert not host_memory.wanted({"JAX_PLATFORMS": "cuda,cpu"})


_PROBE = """
import os, sys
from transformer_jax.runtime import host_memory
host_memory.reexec_with_malloc_settings()
print(os.environ.get("MALLOC_ARENA_MAX"), os.environ.get("MALLOC_MMAP_MAX_"), sys.argv[1:])
"""


@pytest.mark.parametrize("switch,expected", [("1", "1 0"), ("0", "None None")])
def test_reexec_keeps_the_command_line_and_runs_once(tmp_path, switch, expected):
  if not host_memory.wanted(dict(_CPU)):
    pytest.skip("not Linux/glibc")
  probe = tmp_path / "probe.py"
  probe.write_text(_PROBE)
  env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
  env.update(_CPU, TRANSFORMER_JAX_MALLOC=switch, PYTHONPATH=REPO)
  p = subprocess.run([sys.executable, str(probe), "--a=1", "b c"], env=env, capture_output=True,
                     text=True, timeout=60, check=True)
  assert p.stdout.splitlines() == [f"{expected} ['--a=1', 'b c']"]
