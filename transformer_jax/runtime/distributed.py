"""Multi-host start-up on JAX's distributed runtime, and the few cross-process helpers.

`initialize` (called by the CLI before anything touches JAX) finds the cluster from, in order:
the --coordinator_address/--num_processes/--process_id flags or the JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID variables (all three or none); SLURM inside `srun` with more
than one task; a Cloud TPU VM slice; else a single process. TRANSFORMER_JAX_DISTRIBUTED=0 skips
SLURM and TPU detection, e.g. for a one-process debugging run inside an allocation. CPU clusters
use gloo collectives. How SLURM tasks get their GPUs: launch/README.md.
"""

from __future__ import annotations

import os
from typing import Callable, TypeVar

import jax
from absl import logging

from transformer_jax.runtime.exceptions import ConfigError

T = TypeVar("T")
DISABLE_ENV = "TRANSFORMER_JAX_DISTRIBUTED"
JIT_CACHE_ENV = "TRANSFORMER_JAX_JIT_CACHE"


def enable_compilation_cache() -> None:
  """Compiled steps are reused across runs and restarts (TRANSFORMER_JAX_JIT_CACHE='' disables)."""
  path = os.environ.get(JIT_CACHE_ENV,
                        os.path.join(os.path.expanduser("~"), ".cache", "transformer_jax", "jit"))
  if path:
    jax.config.update("jax_compilation_cache_dir", path)
    # Programs that compile faster than this are not written (a user's setting wins).
    min_secs = os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1.0")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_secs))


def _env_int(name):
  value = os.environ.get(name)
  if value in (None, ""):
    return None
  try:
    return int(value)
  except ValueError:
    raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def in_slurm_job_step() -> bool:
  """Inside an `srun` step of more than one task (the batch script itself is one task)."""
  env = os.environ
  needed = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID")
  return all(k in env for k in needed) and int(env.get("SLURM_NTASKS", "1") or 1) > 1


def on_cloud_tpu_vm() -> bool:
  """A Cloud TPU VM (or a GKE TPU pod): jax finds the other workers itself."""
  env = os.environ
  if env.get("TPU_WORKER_HOSTNAMES") or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return True
  try:  # the same probe jax uses (accelerator type file / libtpu); private, hence guarded
    from jax._src.clusters import cloud_tpu_cluster  # pylint: disable=g-import-not-at-top
    return bool(cloud_tpu_cluster.running_in_cloud_tpu_vm)
  except (ImportError, AttributeError):
    return bool(env.get("TPU_ACCELERATOR_TYPE"))


def _use_gloo_on_cpu() -> None:
  """Cross-process collectives on CPU need an implementation (jax >= 0.5 defaults to gloo)."""
  try:
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except AttributeError:
    pass


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Joins the cluster (once; a no-op when already joined or for a single process)."""
  if jax.distributed.is_initialized():
    return
  coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
  num_processes = num_processes if num_processes is not None else _env_int("JAX_NUM_PROCESSES")
  process_id = process_id if process_id is not None else _env_int("JAX_PROCESS_ID")
  explicit = [coordinator_address, num_processes, process_id]
  timeout = _env_int("JAX_INITIALIZATION_TIMEOUT") or 300
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise ConfigError("a multi-host run needs all of --coordinator_address, --num_processes and "
                        "--process_id (or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, "
                        "JAX_PROCESS_ID)")
    if num_processes < 1:
      raise ConfigError(f"--num_processes={num_processes} must be >= 1")
    if not 0 <= process_id < num_processes:
      raise ConfigError(f"--process_id={process_id} must be in [0, {num_processes})")
    if ":" not in coordinator_address:
      raise ConfigError(f"--coordinator_address={coordinator_address!r} must be host:port")
    if num_processes == 1:
      return
    _use_gloo_on_cpu()
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               initialization_timeout=timeout)
  elif os.environ.get(DISABLE_ENV, "1") in ("0", "false", "off"):
    return
  elif in_slurm_job_step():
    _use_gloo_on_cpu()
    jax.distributed.initialize(initialization_timeout=timeout)
  elif on_cloud_tpu_vm():
    jax.distributed.initialize(initialization_timeout=timeout)
  else:
    return
  logging.info("process %d of %d: %d local / %d global devices", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())


def barrier(name: str) -> None:
  """Waits until every process got here (a no-op for one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def process_zero_first(name: str, fn: Callable[[], T]) -> T:
  """Runs fn on process 0, then (after a barrier) on the others: for work that writes shared
  files once (e.g. training the vocabulary into WORKDIR/vocab) and that others then just load.
  """
  if jax.process_count() == 1:
    return fn()
  if jax.process_index() == 0:
    result = fn()
    barrier(name)
    return result
  barrier(name)
  return fn()


def agree(sigterm: bool, out_of_time: bool, checkpoint_due: bool) -> tuple[bool, bool, bool]:
  """The training loop's stop/save decisions, the same on every process at the same step.

  A process that decides alone can hang a cluster: it enters Orbax's save barrier while the
  others enter the next step's all-reduce. So, with several processes, one small all-gather per
  step: SIGTERM anywhere stops everyone (preemption notices reach the hosts of a TPU slice at
  different moments), and the clock-based decisions (wall-time limit, minute checkpoints) are
  process 0's. This plays the role of JAX's `reached_preemption_sync_point`, which relies on
  JAX's own SIGTERM notifier (and the coordination service's preemption manager); one mechanism
  here covers the signal and the clocks alike.
  """
  if jax.process_count() == 1:
    return sigterm, out_of_time, checkpoint_due
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  flags = np.asarray(multihost_utils.process_allgather(
      np.array([sigterm, out_of_time, checkpoint_due], np.int32)))
  return bool(flags[:, 0].any()), bool(flags[0, 1]), bool(flags[0, 2])
