"""Two processes on 127.0.0.1 form one JAX cluster and train like one process would.

The real CLI (`python -m transformer_jax.main ... --coordinator_address --num_processes
--process_id`) on real data (Multi30k) with a tiny model and a data-parallel mesh over the two
processes' CPU devices (gloo collectives). Each process loads only its half of every global
batch; the global arrays are assembled with `jax.make_array_from_process_local_data`. The
result must equal a one-process run over two devices (the same global batches and mesh shape),
the Orbax checkpoints must be written jointly, and restarting both processes must resume.

The start-up logic itself (`distributed.initialize`: flags, environment, SLURM, Cloud TPU) is
checked in-process with `jax.distributed.initialize` replaced by a recorder.
"""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.common import DATA_DIR, REPO, requires_data, TINY_CLI_FLAGS, xla_flags
from transformer_jax.training import metrics


FLAGS = [
    *TINY_CLI_FLAGS,
    "--config.mesh.data=-1", "--config.mesh.fsdp=1", "--config.mesh.tensor=1",
]
TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices_per_process: int):
  env = dict(os.environ, TRANSFORMER_JAX_DATA_DIR=DATA_DIR, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = xla_flags(f"--xla_force_host_platform_device_count={devices_per_process}")
  for key in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    env.pop(key, None)
  env["TRANSFORMER_JAX_DISTRIBUTED"] = "0"  # never auto-join a SLURM/TPU cluster CI runs in
  return env


def _start(workdir, steps, *, devices, cluster=None, extra=()):
  cmd = [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}", *FLAGS,
         f"--config.train.num_steps={steps}", *extra]
  if cluster:
    address, index = cluster
    cmd += [f"--coordinator_address={address}", "--num_processes=2", f"--process_id={index}"]
  return subprocess.Popen(cmd, cwd=REPO, env=_env(devices), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _finish(procs):
  """Waits for all; on a timeout or a failure kills the rest and shows every output."""
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=TIMEOUT_S)[0])
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    pytest.fail("a process did not finish in time:\n" + "\n".join(
        (p.communicate()[0] or "")[-3000:] for p in procs))
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, f"exit {p.returncode}:\n{out[-4000:]}"
  return outputs


def _pair(workdir, steps, extra_procs=()):
  address = f"127.0.0.1:{_free_port()}"
  procs = [_start(workdir, steps, devices=1, cluster=(address, i)) for i in range(2)]
  return _finish(procs + list(extra_procs))


def _metrics(workdir, split="train"):
  return {r["step"]: r for r in metrics.read_rows(workdir, split)}


def _steps(workdir):
  return sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())


def _params(workdir, step):
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import checkpoint  # pylint: disable=g-import-not-at-top
  params, _, _ = checkpoint.load_params(os.path.join(workdir, "checkpoints"), step)
  return {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def _assert_params_close(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=key)


@requires_data
@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_train_like_one_and_resume(tmp_path):
  two, one = str(tmp_path / "two_processes"), str(tmp_path / "one_process")
  # The one-process reference (2 devices, 6 steps) runs beside the 2-process run (4 steps).
  reference = _start(one, 6, devices=2)
  out_first = _pair(two, 4, extra_procs=[reference])
  assert _steps(two) == [2, 4]
  assert "resuming" not in out_first[0]

  # Same global batches and mesh shape (data=2): the same losses and parameters.
  m2, m1 = _metrics(two), _metrics(one)
  for step in (2, 4):
    assert m2[step]["loss"] == pytest.approx(m1[step]["loss"], rel=1e-5), step
    assert m2[step]["nll"] == pytest.approx(m1[step]["nll"], rel=1e-5), step
  assert _metrics(two, "dev")[4]["tokens"] > 0
  _assert_params_close(_params(two, 4), _params(one, 4))

  # Both processes restart on the same workdir: they resume from step 4 and end where the
  # uninterrupted one-process run ended.
  out_second = _pair(two, 6)
  for out in out_second:
    assert "resuming from the checkpoint at step 4" in out
  assert _steps(two) == [2, 4, 6]
  assert _metrics(two)[6]["loss"] == pytest.approx(_metrics(one)[6]["loss"], rel=1e-5)
  _assert_params_close(_params(two, 6), _params(one, 6))


# ----------------------------------------------------------------------------- hosts that agree


def _wait_for_step(workdir, step, procs, timeout=TIMEOUT_S):
  """Blocks until metrics.jsonl has a train line at or past `step` (the processes are stepping)."""
  import time  # pylint: disable=g-import-not-at-top
  deadline = time.time() + timeout
  while time.time() < deadline:
    if any(p.poll() is not None for p in procs):
      pytest.fail("a process ended early:\n" + "\n".join((p.communicate()[0] or "")[-3000:]
                                                          for p in procs))
    if any(s >= step for s in _metrics(workdir)):
      return
    time.sleep(0.5)
  pytest.fail(f"no step {step} within {timeout} s")


@requires_data
@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigterm_to_one_process_stops_both_at_the_same_step(tmp_path):
  """SIGTERM reaches one host only (as on a TPU slice): both save the same step, exit 0, and the
  checkpoint is whole. Deciding alone, the signalled process would enter the save barrier while
  the other entered the next all-reduce: a hang. (That a pair resumes from a checkpoint both
  wrote is test_two_processes_train_like_one_and_resume's.)"""
  import signal  # pylint: disable=g-import-not-at-top
  w = str(tmp_path / "run")
  address = f"127.0.0.1:{_free_port()}"
  extra = ["--config.train.log_every_steps=1", "--config.train.checkpoint_every_steps=100000"]
  procs = [_start(w, 100_000, devices=1, cluster=(address, i), extra=extra) for i in range(2)]
  _wait_for_step(w, 3, procs)
  procs[1].send_signal(signal.SIGTERM)
  outputs = _finish(procs)
  saved = _steps(w)
  assert len(saved) == 1, saved
  # Process 0 reports (it was not signalled); both exited 0 (_finish) after one joint save.
  assert f"SIGTERM: saved a checkpoint at step {saved[0]}; exiting" in outputs[0], outputs[0][-2000:]
  assert all(np.isfinite(v).all() for v in _params(w, saved[0]).values())  # committed and loads


@requires_data
@pytest.mark.slow
@pytest.mark.multiprocess
def test_time_limit_and_minute_checkpoints_fire_at_the_same_step(tmp_path):
  """Clock-based decisions are process 0's: with checkpoints every ~0.3 s and a 15-second limit,
  both processes save the same steps (the joint Orbax save needs both) and stop together. The
  limit counts the first step's compilation, which took more than 6 s on a slow, loaded CPU
  (then the limit and the first minute checkpoint fell on step 1, and only one was saved)."""
  w = str(tmp_path / "run")
  address = f"127.0.0.1:{_free_port()}"
  extra = ["--config.train.checkpoint_every_steps=100000", "--config.train.keep_checkpoints=100",
           "--config.train.checkpoint_every_minutes=0.005", "--config.train.max_train_minutes=0.25"]
  procs = [_start(w, 100_000, devices=1, cluster=(address, i), extra=extra) for i in range(2)]
  outputs = _finish(procs)
  saved = _steps(w)
  assert len(saved) >= 2, saved  # minute checkpoints, then the one at the limit
  assert f"train.max_train_minutes reached: saved a checkpoint at step {saved[-1]}" in outputs[0], (
      outputs[0][-2000:])


# ----------------------------------------------------------------------------- start-up logic

CLUSTER_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "SLURM_JOB_ID",
               "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
               "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS", "TPU_ACCELERATOR_TYPE",
               "TRANSFORMER_JAX_DISTRIBUTED", "JAX_INITIALIZATION_TIMEOUT")


@pytest.fixture
def recorded(monkeypatch):
  """Calls of jax.distributed.initialize, recorded instead of made; a clean environment."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime import distributed  # pylint: disable=g-import-not-at-top
  calls = []
  for key in CLUSTER_ENV:
    monkeypatch.delenv(key, raising=False)
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(distributed, "on_cloud_tpu_vm",
                      lambda: bool(os.environ.get("TPU_WORKER_HOSTNAMES")))
  monkeypatch.setattr(distributed.logging, "info", lambda *a, **k: None)
  return calls


def test_single_process_needs_nothing(recorded):
  from transformer_jax.runtime import distributed  # pylint: disable=g-import-not-at-top
  distributed.initialize()
  assert recorded == []


def test_explicit_flags_and_environment(recorded, monkeypatch):
  from transformer_jax.runtime import distributed  # pylint: disable=g-import-not-at-top
  distributed.initialize("10.0.0.1:1234", 4, 3)
  assert recorded[-1] == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4,
                          "process_id": 3, "initialization_timeout": 300,
                          "heartbeat_timeout_seconds": 100}
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "host0:999")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "1")
  monkeypatch.setenv("JAX_INITIALIZATION_TIMEOUT", "60")
  distributed.initialize()
  assert recorded[-1] == {"coordinator_address": "host0:999", "num_processes": 2,
                          "process_id": 1, "initialization_timeout": 60,
                          "heartbeat_timeout_seconds": 100}
  distributed.initialize("host0:999", 1, 0)  # one process: nothing to join
  assert len(recorded) == 2


@pytest.mark.parametrize("args,env,match", [
    (("h:1", None, 0), {}, "needs all of --coordinator_address, --num_processes and --process_id"),
    ((None, 2, None), {}, "needs all of"),
    (("h:1", 2, 2), {}, r"--process_id=2 must be in \[0, 2\)"),
    (("h:1", 0, 0), {}, "--num_processes=0 must be >= 1"),
    (("hostonly", 2, 0), {}, "must be host:port"),
    ((None, None, None), {"JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES='two' is not an integer"),
])
def test_bad_cluster_settings_are_config_errors(recorded, monkeypatch, args, env, match):
  from transformer_jax.runtime import distributed  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.exceptions import ConfigError  # pylint: disable=g-import-not-at-top
  for key, value in env.items():
    monkeypatch.setenv(key, value)
  with pytest.raises(ConfigError, match=match):
    distributed.initialize(*args)
  assert recorded == []


def test_slurm_and_tpu_are_detected(recorded, monkeypatch):
  from transformer_jax.runtime import distributed  # pylint: disable=g-import-not-at-top
  slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[01-02]", "SLURM_PROCID": "1",
           "SLURM_LOCALID": "0", "SLURM_NTASKS": "2"}
  for key, value in slurm.items():
    monkeypatch.setenv(key, value)
  distributed.initialize()
  assert recorded == [{"initialization_timeout": 300,  # jax reads SLURM_* itself
                       "heartbeat_timeout_seconds": 100}]
  monkeypatch.setenv("SLURM_NTASKS", "1")  # the batch script itself, or a 1-task job
  distributed.initialize()
  assert len(recorded) == 1
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w0,w1,w2,w3")
  distributed.initialize()
  assert len(recorded) == 2
  monkeypatch.setenv("TRANSFORMER_JAX_DISTRIBUTED", "0")  # opt out of auto-detection
  distributed.initialize()
  assert len(recorded) == 2


def test_process_zero_first_single_process():
  from transformer_jax.runtime import distributed  # pylint: disable=g-import-not-at-top
  order = []
  assert distributed.process_zero_first("x", lambda: order.append(1) or "done") == "done"
  distributed.barrier("noop")
  assert order == [1]
