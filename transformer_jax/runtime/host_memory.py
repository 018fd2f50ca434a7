"""Host memory: keep the CPU backend's per-step buffers mapped between steps (glibc malloc).

XLA's CPU client allocates each execution's large temporary buffer from its worker threads;
glibc serves such a request with a fresh mmap and unmaps it on free, so every step page-faults
every page anew. With all threads in the main arena, no mmap for large blocks and no trimming,
the next step reuses the freed memory.

glibc reads these settings at start-up, so the entry points re-execute themselves once with them
in the environment (`reexec_with_malloc_settings`, before jax is imported): only on Linux with
glibc when JAX will use the CPU. `TRANSFORMER_JAX_MALLOC=0` turns it off. The cost: memory freed
by one step stays with the process (its peak is the same).
"""

from __future__ import annotations

import glob
import os
import platform
import sys

MALLOC_SETTINGS = {
    "MALLOC_ARENA_MAX": "1",                 # every thread allocates from the main (brk) heap
    "MALLOC_MMAP_MAX_": "0",                 # large blocks come from the heap, not from mmap
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),  # freed memory is kept for the next step
}
SWITCH = "TRANSFORMER_JAX_MALLOC"


def _cpu_backend(env) -> bool:
  platforms = env.get("JAX_PLATFORMS", "")
  if platforms:
    return platforms.split(",")[0].strip() == "cpu"
  return not (glob.glob("/dev/nvidia[0-9]*") or glob.glob("/dev/accel[0-9]*")
              or glob.glob("/dev/vfio/[0-9]*"))


def wanted(env=None) -> bool:
  """Whether this process should run with MALLOC_SETTINGS (and does not yet)."""
  env = os.environ if env is None else env
  if env.get(SWITCH, "1") == "0" or platform.system() != "Linux":
    return False
  if platform.libc_ver()[0] != "glibc" or not _cpu_backend(env):
    return False
  return any(env.get(k) != v for k, v in MALLOC_SETTINGS.items())


def reexec_with_malloc_settings():
  """Re-executes the command line (sys.orig_argv) with MALLOC_SETTINGS, once; call before jax."""
  if not wanted():
    return
  env = dict(os.environ, **MALLOC_SETTINGS)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
