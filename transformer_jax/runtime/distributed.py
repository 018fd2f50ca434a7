"""Multi-host start-up on JAX's distributed runtime, and the few cross-process helpers.

`initialize` (called by the CLI before anything touches JAX) finds the cluster from, in order:
the --coordinator_address/--num_processes/--process_id flags or the JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID variables (all three or none); SLURM inside `srun` with more
than one task; a Cloud TPU VM slice; else a single process. TRANSFORMER_JAX_DISTRIBUTED=0 skips
SLURM and TPU detection, e.g. for a one-process debugging run inside an allocation. CPU clusters
use gloo collectives. How SLURM tasks get their GPUs: launch/README.md.

A lost process (killed, out of memory, its host rebooted) stops the others within a bounded
time. Its connections close, so the next collective with it (every step's all-reduce and
`agree`) fails at once: `stop_if_process_lost` turns that into one line `error: lost process N
...` and exit status LOST_PROCESS_EXIT, before any cleanup that would wait for it. A process
that is gone without closing its connections (a hung or unplugged host), or a loss noticed
outside a collective (inside a checkpoint's barrier), is declared dead by JAX's coordination
service after `--heartbeat_timeout` seconds without a heartbeat
(`jax.distributed.initialize(heartbeat_timeout_seconds=...)`); JAX then aborts the survivors
itself, with its own message. The restarted processes resume from the newest checkpoint all of
them wrote (Orbax commits a step only once every process has written it).

Work that process 0 does first (`process_zero_first`) reports its outcome through the
coordination service's key-value store, so that a refusal on one process (a bad dev file) stops
every process with the same one line and exit 2.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Callable, NoReturn, TypeVar

import jax
from absl import logging

from transformer_jax.runtime import exceptions
from transformer_jax.runtime.exceptions import ConfigError

T = TypeVar("T")
DISABLE_ENV = "TRANSFORMER_JAX_DISTRIBUTED"
JIT_CACHE_ENV = "TRANSFORMER_JAX_JIT_CACHE"
# Exit status of a process that stops because another one of its run was lost: EX_TEMPFAIL of
# sysexits.h ("try again later"), distinct from a user error's 2 and a crash's 1; restarting
# every process with the same command resumes the run.
LOST_PROCESS_EXIT = 75
# JAX's own default: long enough for a host stalled in a long compilation, a garbage collection
# or a slow checkpoint write on shared storage not to be declared dead.
DEFAULT_HEARTBEAT_TIMEOUT_S = 100
# A refused process_zero_first step is re-raised on the others as the same type.
_RERAISED = {cls.__name__: cls for cls in (*exceptions.USER_ERRORS, exceptions.DataError,
                                           exceptions.WorkdirBusy, exceptions.SaveError)}
_LOST_LOCK = threading.Lock()
_ZERO_FIRST_CALLS: dict[str, int] = {}


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
               process_id: int | None = None, heartbeat_timeout: int | None = None) -> None:
  """Joins the cluster (once; a no-op when already joined or for a single process).

  `heartbeat_timeout`: seconds without a heartbeat after which the coordination service
  declares a process dead and the others stop (default DEFAULT_HEARTBEAT_TIMEOUT_S)."""
  if jax.distributed.is_initialized():
    return
  coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
  num_processes = num_processes if num_processes is not None else _env_int("JAX_NUM_PROCESSES")
  process_id = process_id if process_id is not None else _env_int("JAX_PROCESS_ID")
  explicit = [coordinator_address, num_processes, process_id]
  timeout = _env_int("JAX_INITIALIZATION_TIMEOUT") or 300
  if heartbeat_timeout is not None and (isinstance(heartbeat_timeout, bool) or not isinstance(
      heartbeat_timeout, int) or heartbeat_timeout < 1):
    raise ConfigError(f"--heartbeat_timeout must be an integer > 0, got {heartbeat_timeout!r}")
  timeouts = {"initialization_timeout": timeout,
              "heartbeat_timeout_seconds": heartbeat_timeout or DEFAULT_HEARTBEAT_TIMEOUT_S}
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
                               num_processes=num_processes, process_id=process_id, **timeouts)
  elif os.environ.get(DISABLE_ENV, "1") in ("0", "false", "off"):
    return
  elif in_slurm_job_step():
    _use_gloo_on_cpu()
    jax.distributed.initialize(**timeouts)
  elif on_cloud_tpu_vm():
    jax.distributed.initialize(**timeouts)
  else:
    return
  logging.info("process %d of %d: %d local / %d global devices", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())


def _one_line(text: str, limit: int = 300) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _lost(who: str, detail: str) -> NoReturn:
  """One line and exit LOST_PROCESS_EXIT, at once: no cleanup that would wait for the lost
  process (Orbax's barriers, JAX's shutdown barrier at exit). The first thread to get here
  prints; any other waits on the lock until the process is gone."""
  with _LOST_LOCK:
    sys.stdout.flush()
    print(f"error: lost {who} of the run's {jax.process_count()} ({_one_line(detail)}); "
          "stopping. Restart every process with the same command: the run resumes from the "
          "newest checkpoint all of them wrote", file=sys.stderr, flush=True)
    os._exit(LOST_PROCESS_EXIT)  # pylint: disable=protected-access


# Markers of a collective or coordination call that failed because a peer went away.
_PEER_FAILURE = ("Gloo", "Connection reset", "Connection closed", "Connection refused",
                 "coordination service", "NCCL", "heartbeat", "Socket closed")


def exit_if_process_lost(error: BaseException) -> None:
  """Stops this process with one line (exit LOST_PROCESS_EXIT) if `error` is a collective that
  failed because another process of the run is gone; returns otherwise."""
  if jax.process_count() < 2 or not isinstance(error, jax.errors.JaxRuntimeError):
    return
  text = str(error)
  if not any(marker in text for marker in _PEER_FAILURE):
    return
  detail = next((line for line in text.splitlines() if line.strip()), text)
  if jax.process_count() == 2:  # the connection that closed was the other process's
    _lost(f"process {1 - jax.process_index()}", detail)
  _lost("a process", detail)  # which of several: the other processes' lines name theirs


@contextlib.contextmanager
def stop_if_process_lost():
  """`with distributed.stop_if_process_lost():` turns a collective that failed because another
  process is gone into one line and exit LOST_PROCESS_EXIT, before any cleanup on the way out
  (which would wait for the lost process) runs."""
  try:
    yield
  except BaseException as e:  # pylint: disable=broad-except
    exit_if_process_lost(e)
    raise


def _client():
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  return jax_distributed.global_state.client  # as jax's multihost_utils and Orbax reach it


def _publish(key: str, fn: Callable[[], T]) -> T:
  """Runs fn and stores its outcome under `key`: 'ok', or the refusal's type and message."""
  try:
    result = fn()
  except exceptions.USER_ERRORS as e:
    _client().key_value_set(key, f"{type(e).__name__}\n{e}")
    raise
  except BaseException as e:
    _client().key_value_set(key, f"TrainingError\n{type(e).__name__}: {_one_line(e)}")
    raise
  _client().key_value_set(key, "ok")
  return result


def _outcome(key: str, index: int) -> None:
  """Waits for process `index`'s outcome under `key`; its refusal is raised here too. No time
  limit: process 0's work may be long (a vocabulary, a dataset to prepare), and a lost process
  stops this one through the heartbeat (_on_service_error)."""
  client = _client()
  while True:
    try:
      value = client.blocking_key_value_get(key, 60_000)
      break
    except jax.errors.JaxRuntimeError as e:
      if "DEADLINE_EXCEEDED" not in str(e):
        exit_if_process_lost(e)
        raise
  if value != "ok":
    kind, _, message = value.partition("\n")
    raise _RERAISED.get(kind, exceptions.TrainingError)(message)


def barrier(name: str) -> None:
  """Waits until every process got here (a no-op for one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def process_zero_first(name: str, fn: Callable[[], T]) -> T:
  """Runs fn on process 0, then on the others: for work that writes shared files once (e.g.
  training the vocabulary into WORKDIR/vocab) and that others then just load.

  Each outcome goes through the coordination service's key-value store instead of a barrier:
  when fn raises on one process (process 0 first), every process raises the same error (a user
  error is then the same one line and exit 2 everywhere) instead of waiting for a process that
  left. Every process calls it with the same names in the same order."""
  if jax.process_count() == 1:
    return fn()
  _ZERO_FIRST_CALLS[name] = call = _ZERO_FIRST_CALLS.get(name, 0) + 1
  prefix, index = f"transformer_jax/zero_first/{name}/{call}", jax.process_index()
  if index != 0:
    _outcome(f"{prefix}/0", 0)
  result = _publish(f"{prefix}/{index}", fn)
  for other in range(1, jax.process_count()):
    if other != index:
      _outcome(f"{prefix}/{other}", other)
  return result


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
