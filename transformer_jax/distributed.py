"""Multi-host start-up on JAX's own distributed runtime.

- Cloud TPU VMs (several workers) and SLURM jobs (several tasks): `jax.distributed.initialize()`
  finds the coordinator, process count and index by itself.
- Anywhere else: the coordinator address, process count and process id come from flags
  (--coordinator_address, --num_processes, --process_id) or from the environment variables
  JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID.
- A single process needs nothing.
"""

from __future__ import annotations

import os

import jax
from absl import logging

from transformer_jax.config import ConfigError


def _env_int(name):
  value = os.environ.get(name)
  if value is None:
    return None
  try:
    return int(value)
  except ValueError:
    raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def _in_multi_worker_cluster() -> bool:
  if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_JOB_ID" in os.environ:
    return True
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return "," in hosts or "MEGASCALE_COORDINATOR_ADDRESS" in os.environ


def initialize(coordinator_address=None, num_processes=None, process_id=None) -> None:
  """Joins the cluster (once); a no-op for a single process."""
  coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  num_processes = num_processes if num_processes is not None else _env_int("JAX_NUM_PROCESSES")
  process_id = process_id if process_id is not None else _env_int("JAX_PROCESS_ID")
  explicit = [coordinator_address, num_processes, process_id]
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise ConfigError("a multi-host run needs all of --coordinator_address, --num_processes and "
                        "--process_id (or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID)")
    if not 0 <= process_id < num_processes:
      raise ConfigError(f"--process_id={process_id} must be in [0, {num_processes})")
    if num_processes == 1:
      return
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  elif _in_multi_worker_cluster():
    jax.distributed.initialize()
  else:
    return
  logging.info("process %d of %d, %d local / %d global devices", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
