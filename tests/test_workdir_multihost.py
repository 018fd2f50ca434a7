"""A two-process cluster (the real CLI, two processes on 127.0.0.1) on a workdir another run
holds: process 0 is refused by the lock and its decision reaches process 1, so both stop with
one line and exit 2; neither hangs waiting for the other."""

import json
import os
import socket
import subprocess

import pytest

from tests.common import requires_data
from tests.test_multihost import _free_port, _start, TIMEOUT_S

pytestmark = [requires_data, pytest.mark.slow]


def test_a_held_workdir_stops_every_process_of_a_cluster(tmp_path):
  workdir = tmp_path / "held"
  workdir.mkdir()
  holder = subprocess.Popen(["sleep", "600"])  # a live process on this host holds the lock
  try:
    (workdir / "workdir.lock").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": holder.pid, "started": "2026-01-01T00:00:00+00:00",
         "command": "main.py --workdir=held", "purpose": "training", "token": "x"}))
    before = sorted(os.listdir(workdir))
    address = f"127.0.0.1:{_free_port()}"
    procs = [_start(str(workdir), 2, devices=1, cluster=(address, i)) for i in range(2)]
    try:
      outputs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      pytest.fail("a process hung on a refused workdir")
  finally:
    holder.kill()
    holder.wait()
  for i, (p, out) in enumerate(zip(procs, outputs)):
    lines = out.strip().splitlines()
    assert p.returncode == 2 and "Traceback" not in out, f"process {i}: {out[-3000:]}"
    assert lines[-1].startswith("error: workdir"), lines
  assert f"in use by pid {holder.pid}" in outputs[0].strip().splitlines()[-1]
  assert sorted(os.listdir(workdir)) == before
