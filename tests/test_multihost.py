"""Two processes on 127.0.0.1 form one JAX cluster and train like one process would.

The real CLI (`python -m transformer_jax.main ... --coordinator_address --num_processes
--process_id`) on real data (Multi30k) with a tiny model and a data-parallel mesh over the two
processes' CPU devices (gloo collectives). Each process loads only its half of every global
batch; the global arrays are assembled with `jax.make_array_from_process_local_data`. The
result must equal a one-process run over two devices (the same global batches and mesh shape),
the Orbax checkpoints must be written jointly, and restarting both processes must resume.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.common import DATA_DIR, requires_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [requires_data, pytest.mark.slow, pytest.mark.multiprocess]

FLAGS = [
    "--config=configs/tiny.py",
    "--config.model.d_model=32", "--config.model.d_ff=64", "--config.model.num_heads=2",
    "--config.model.d_k=16", "--config.model.d_v=16", "--config.model.vocab_size=300",
    "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
    "--config.data.tokens_per_batch=512", "--config.data.max_source_len=32",
    "--config.data.max_target_len=32",
    "--config.train.log_every_steps=2", "--config.train.eval_every_steps=1000",
    "--config.train.max_eval_batches=1", "--config.train.checkpoint_every_steps=2",
    "--config.train.keep_checkpoints=10", "--config.train.progress_bar=False",
    "--config.train.peak_flops=1e11",
    "--config.mesh.data=-1", "--config.mesh.fsdp=1", "--config.mesh.tensor=1",
]
TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices_per_process: int):
  env = dict(os.environ, TRANSFORMER_JAX_DATA_DIR=DATA_DIR, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices_per_process}"
  for key in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    env.pop(key, None)
  env["TRANSFORMER_JAX_DISTRIBUTED"] = "0"  # never auto-join a SLURM/TPU cluster CI runs in
  return env


def _start(workdir, steps, *, devices, cluster=None):
  cmd = [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}", *FLAGS,
         f"--config.train.num_steps={steps}"]
  if cluster:
    cmd += [f"--coordinator_address={cluster[0]}", "--num_processes=2", f"--process_id={cluster[1]}"]
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
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r for r in rows if r["split"] == split}


def _steps(workdir):
  return sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())


def _params(workdir, step):
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax import checkpoint  # pylint: disable=g-import-not-at-top
  params, _, _ = checkpoint.load_params(os.path.join(workdir, "checkpoints"), step)
  return {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def _assert_params_close(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=key)


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
