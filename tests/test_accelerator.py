"""`python -m benchmarks.accelerator` (the accelerator acceptance command) on the CPU: the checks
it runs and reports, and its one-line refusal of cuDNN attention where there is no GPU."""

import json
import math
import subprocess
import sys

import pytest

from benchmarks import accelerator
from transformer_jax.runtime.overrides import load

from tests.common import REPO


def _run(*args, timeout=600):
  return subprocess.run([sys.executable, "-m", "benchmarks.accelerator", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout)


def test_acceptance_report_on_cpu(tmp_path):
  out = tmp_path / "acc"
  p = _run("--config=configs/tiny.py", "--memory_config=configs/tiny.py",
           "--config.model.attention_impl=dot_product_attention", "--config.model.d_v=16",
           "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
           "--steps=2", "--warmup=0", f"--out={out}")
  assert p.returncode == 0, p.stderr[-3000:]
  r = json.loads((tmp_path / "acc.json").read_text())
  assert r["devices"]["backend"] == "cpu" and r["devices"]["count"] >= 1
  (e,) = r["train"]  # no second pairing off a GPU
  rows, length = (int(x) for x in e["batch"]["shape"].split("x"))
  assert length == 64 and rows * length == pytest.approx(1024, rel=0.5)  # tiny's token budget
  assert e["step_s"]["median"] > 0 and e["target_tokens_per_s"] > 0
  assert 0 < e["mfu"] and math.isfinite(e["mfu"])
  assert e["peak_flops_per_device"] > 0
  assert e["mfu"] == pytest.approx(e["model_flops_per_s"] / e["peak_flops_per_device"] / e["devices"])
  assert e["attention"] == [
      "attention: jax.nn.dot_product_attention (XLA's implementation) with a dense mask"]
  m = r["memory"]
  assert m["config"] == "configs/tiny.py" and m["step_bytes"] > m["temp_bytes"] > 0
  text = (tmp_path / "acc.md").read_text()
  assert "# Accelerator acceptance" in text and "target tok/s" in text and "## Memory" in text


def test_cudnn_on_cpu_is_one_line_before_any_work():
  p = _run("--config=configs/gpu.py:base,h100,cudnn", "--out=", timeout=300)
  assert p.returncode == 2
  lines = p.stderr.strip().splitlines()
  assert len(lines) == 1 and "'model.attention_impl'='cudnn' needs an NVIDIA GPU" in lines[0], p.stderr


@pytest.mark.parametrize("spec,big", [("configs/gpu.py", "configs/gpu.py:big"),
                                      ("configs/gpu.py:base,a100", "configs/gpu.py:big,a100"),
                                      ("configs/tpu.py:base,v5e", "configs/tpu.py:big,v5e")])
def test_memory_check_defaults_to_big_of_the_same_preset(spec, big):
  assert accelerator.big_spec(spec) == big
  assert load(big).model.d_model == 1024


def test_batch_shape_follows_the_token_budget_and_divides_the_devices():
  config = load("configs/gpu.py:base")
  rows, length = accelerator.batch_shape(config, devices=8)
  assert length == config.data.max_target_len and rows % 8 == 0
  assert abs(rows * length - config.data.tokens_per_batch) <= 8 * length
