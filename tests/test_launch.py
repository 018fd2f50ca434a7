"""The launch scripts: their dry runs print the expected commands and run nothing; shellcheck.

`gcloud` and `srun` are replaced by stubs that record any call, so a dry run that executed
something would be caught.
"""

import os
import shutil
import stat
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU = os.path.join(REPO, "launch", "tpu_vm.sh")
SLURM = os.path.join(REPO, "launch", "slurm.sbatch")


@pytest.fixture
def stub_env(tmp_path):
  """PATH with gcloud/srun/sbatch stubs that log their calls to tmp_path/calls."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for name in ("gcloud", "srun", "sbatch"):
    stub = bin_dir / name
    stub.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {tmp_path}/calls\n")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
  env["USER"] = "tester"
  env.pop("TPU_ZONE", None)
  env.pop("SETUP", None)
  env.pop("GPUS_PER_NODE", None)
  return env, tmp_path / "calls"


def _run(script, args, env):
  return subprocess.run(["bash", script, *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=60)


def _commands(stdout):
  return [line[2:] for line in stdout.splitlines() if line.startswith("+ ")]


def test_tpu_vm_dry_run_prints_the_whole_lifecycle(stub_env):
  env, calls = stub_env
  out = _run(TPU, ["--dry-run", "--zone", "europe-west4-b", "--type", "v5litepod-16", "--spot",
                   "--nfs", "10.1.2.3:/share", "configs/tpu.py:big", "/mnt/shared/runs/big",
                   "--", "--config.train.num_steps=10"], env)
  assert out.returncode == 0, out.stderr
  cmds = _commands(out.stdout)
  assert len(cmds) == 6, cmds
  create, archive, scp, setup, train, delete = cmds
  assert create == ("gcloud compute tpus tpu-vm create transformer-jax-tester "
                    "--zone=europe-west4-b --accelerator-type=v5litepod-16 "
                    "--version=v2-alpha-tpuv5-lite --spot")
  assert archive.startswith(f"git -C {REPO} archive --format=tar.gz --output=")
  assert scp.startswith("gcloud compute tpus tpu-vm scp ") and "--worker=all" in scp
  assert "--worker=all" in setup
  assert "pip install -q -e ~/transformer_jax 'jax[tpu]'" in setup.replace("'\\''", "'")
  assert "sudo mount -t nfs -o rw,hard 10.1.2.3:/share /mnt/shared" in setup
  assert train.startswith("gcloud compute tpus tpu-vm ssh transformer-jax-tester "
                          "--zone=europe-west4-b --worker=all '--command=")
  assert ("python3 -m transformer_jax.main --config=configs/tpu.py:big "
          "--workdir=/mnt/shared/runs/big --config.train.num_steps=10") in train
  assert "export TRANSFORMER_JAX_DATA_DIR=/mnt/shared/data" in train
  assert "--command=set -o pipefail && " in train  # the trainer's exit status, not tee's
  assert delete == ("gcloud compute tpus tpu-vm delete transformer-jax-tester "
                    "--zone=europe-west4-b --quiet")
  assert not calls.exists(), calls.read_text()


def test_tpu_vm_reuse_and_keep(stub_env):
  env, calls = stub_env
  out = _run(TPU, ["--dry-run", "--reuse", "--keep", "--name", "mine", "--project", "p1",
                   "configs/tpu.py", "/mnt/w"], env)
  assert out.returncode == 0, out.stderr
  cmds = _commands(out.stdout)
  assert not any(" create " in c or " delete " in c for c in cmds), cmds
  assert all("--project=p1" in c for c in cmds if c.startswith("gcloud"))
  assert "kept mine" in out.stdout
  assert not calls.exists()


def test_a_bucket_workdir_stays_a_url_and_brings_its_package(stub_env):
  env, calls = stub_env
  tpu = _run(TPU, ["--dry-run", "configs/tpu.py", "gs://my-bucket/runs/base"], env)
  assert tpu.returncode == 0, tpu.stderr
  _, _, _, setup, train, _ = _commands(tpu.stdout)
  assert "pip install -q -e ~/transformer_jax 'jax[tpu]' gcsfs" in setup.replace("'\\''", "'")
  assert "--workdir=gs://my-bucket/runs/base" in train
  slurm = _run(SLURM, ["--dry-run", "configs/gpu.py", "gs://my-bucket/runs/base"],
               dict(env, HOME="/home/tester"))
  assert slurm.returncode == 0, slurm.stderr
  (srun,) = _commands(slurm.stdout)  # no 'mkdir -p gs://...'
  assert "TRANSFORMER_JAX_CACHE_DIR=/home/tester/.cache/transformer_jax" in srun
  assert "--workdir=gs://my-bucket/runs/base" in srun
  assert not calls.exists()


@pytest.mark.parametrize("args,message", [
    (["--dry-run", "configs/tpu.py"], "expected CONFIG and WORKDIR"),
    (["--dry-run", "--bogus", "configs/tpu.py", "/w"], "unknown option --bogus"),
    (["--dry-run", "configs/missing.py", "/w"], "configs/missing.py not found")])
def test_tpu_vm_usage_errors(stub_env, args, message):
  env, calls = stub_env
  out = _run(TPU, args, env)
  assert out.returncode == 2 and message in out.stderr
  assert not calls.exists()


def test_slurm_dry_run_one_task_per_node(stub_env):
  env, calls = stub_env
  out = _run(SLURM, ["--dry-run", "configs/gpu.py:big", "/shared/runs/big",
                     "--config.train.num_steps=5"], dict(env, SLURM_JOB_NUM_NODES="4"))
  assert out.returncode == 0, out.stderr
  mkdir, srun = _commands(out.stdout)
  assert mkdir == "mkdir -p /shared/runs/big"
  assert srun.startswith("srun --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 "
                         "--kill-on-bad-exit=1")
  assert "JAX_LOCAL_DEVICE_IDS=0,1,2,3,4,5,6,7" in srun
  assert "TRANSFORMER_JAX_CACHE_DIR=/shared/runs/big/cache" in srun
  assert (f"bash -c 'cd {REPO} && python -m transformer_jax.main --config=configs/gpu.py:big "
          "--workdir=/shared/runs/big --config.train.num_steps=5'") in srun
  assert not calls.exists()


def test_slurm_dry_run_one_task_per_gpu_with_setup(stub_env):
  env, calls = stub_env
  env = dict(env, GPUS_PER_NODE="4", SETUP="source ~/venv/bin/activate",
             TRANSFORMER_JAX_DATA_DIR="/data")
  out = _run(SLURM, ["--dry-run", "--per-gpu", "configs/gpu.py", "/shared/w"], env)
  assert out.returncode == 0, out.stderr
  setup, _, srun = _commands(out.stdout)
  assert setup == "source ~/venv/bin/activate"
  assert "--ntasks-per-node=4 --gpus-per-node=4" in srun
  assert "JAX_LOCAL_DEVICE_IDS" not in srun  # JAX gives task i the GPU SLURM_LOCALID=i
  assert "TRANSFORMER_JAX_DATA_DIR=/data" in srun
  assert "&& source ~/venv/bin/activate && python -m transformer_jax.main" in srun
  assert not calls.exists()


def test_slurm_usage_errors(stub_env):
  env, _ = stub_env
  assert _run(SLURM, ["--dry-run", "configs/gpu.py"], env).returncode == 2
  assert "not found" in _run(SLURM, ["--dry-run", "configs/x.py", "/w"], env).stderr
  assert "Usage:" in _run(SLURM, ["--help"], env).stdout
  assert "Usage:" in _run(TPU, ["--help"], env).stdout


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("script", [TPU, SLURM])
def test_shellcheck_clean(script):
  out = subprocess.run(["shellcheck", "--shell=bash", script], capture_output=True, text=True,
                       timeout=60)
  assert out.returncode == 0, out.stdout + out.stderr


def test_flops_report_compares_with_the_paper():
  import sys  # pylint: disable=g-import-not-at-top
  out = subprocess.run([sys.executable, "-m", "launch.flops"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  rows = {line.split("|")[1].strip() + "/" + line.split("|")[2].strip(): line
          for line in out.stdout.splitlines() if line.startswith("| b")}
  assert "| 63.0M | 9.54e+12 | 100,000 | 9.54e+17 | 3.3e+18" in rows["base/63.0M"]
  assert "| 214.2M | 3.23e+13 | 300,000 | 9.69e+18 | 2.3e+19" in rows["big/214.2M"]
  assert "data=64" in rows["base/TPU v5e-64"] and "data=8" in rows["big/8x H100 SXM"]
