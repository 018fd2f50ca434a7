"""`python -m benchmarks.accelerator` (the accelerator acceptance command) on whatever backend
the suite runs on: the checks it runs and reports, its one-line refusal of cuDNN attention where
there is no GPU, the padded batches it times, and cuDNN against einsum attention on one."""

import json
import math
import subprocess
import sys

import jax
import numpy as np
import pytest

from benchmarks import accelerator, settings, train_step
from launch import accelerator_stages
from transformer_jax.runtime.overrides import load
from transformer_jax.runtime.special_ids import EOS_ID, PAD_ID

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
  assert settings.resolve(r["command"]) == r["settings"]
  assert r["settings"]["preset.model.d_v"] == 16 and r["settings"]["memory.model.d_v"] == 16
  gpu = jax.default_backend() == "gpu"
  assert r["devices"]["backend"] == jax.default_backend() and r["devices"]["count"] >= 1
  assert len(r["train"]) == (2 if gpu else 1)  # the other attention/layout pairing on a GPU
  e = r["train"][0]
  rows, length = (int(x) for x in e["batch"]["shape"].split("x"))
  assert length == 64 and rows * length == pytest.approx(1024, rel=0.5)  # tiny's token budget
  assert e["step_s"]["median"] > 0 and e["target_tokens_per_s"] > 0
  assert 0 < e["mfu"] and math.isfinite(e["mfu"])
  assert e["peak_flops_per_device"] == r["matmul_peak"]["flops_per_s"] > 0  # measured in the run
  assert e["datasheet_peak_flops_per_device"] is None and e["mfu_datasheet"] is None  # tiny has none
  assert e["mfu"] == pytest.approx(e["model_flops_per_s"] / e["peak_flops_per_device"] / e["devices"])
  assert e["attention"] == [
      "attention: jax.nn.dot_product_attention (XLA's implementation) with a dense mask"]
  m = r["memory"]
  assert m["config"] == "configs/tiny.py" and m["step_bytes"] > m["temp_bytes"] > 0
  text = (tmp_path / "acc.md").read_text()
  assert "# Accelerator acceptance" in text and "target tok/s" in text and "## Memory" in text


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN runs on a GPU")
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


def _tiny(**overrides):
  args = ["--config.model.dtype=bfloat16", "--config.model.num_encoder_layers=1",
          "--config.model.num_decoder_layers=1"]
  return load("configs/tiny.py", args + [f"--config.{k}={v}" for k, v in overrides.items()])


def test_bucketed_synthetic_batches_are_padded_as_real_ones():
  b = train_step.synthetic_batch(_tiny(), 12, 32)
  assert set(b) == {"inputs", "targets"}
  for ids in b.values():
    lengths = (ids != PAD_ID).sum(-1)
    assert lengths[-1] == 0 and np.all(ids[-1] == PAD_ID)  # the empty filler row
    assert np.all(lengths[:-1] >= 2) and len(set(lengths[:-1].tolist())) > 3  # varied lengths
    for row, n in zip(ids[:-1], lengths[:-1]):  # right-padded, EOS last
      assert row[n - 1] == EOS_ID and np.all(row[:n - 1] > 2) and np.all(row[n:] == PAD_ID)
  longer = np.maximum((b["inputs"] != 0).sum(-1), (b["targets"] != 0).sum(-1))[:-1]
  assert np.all(longer >= 16)  # a bucket of length 32 holds pairs whose longer side is >= 16
  assert (train_step.synthetic_batch(_tiny(), 4, 32, empty_rows=0)["inputs"] != 0).sum(-1).min() > 0


def test_cudnn_and_einsum_agree_on_a_padded_batch():
  """Off a GPU 'cudnn' runs jax.nn.dot_product_attention's XLA path with the same lengths, so
  this checks the comparison itself (and that an empty row poisons no gradient)."""
  r = accelerator.attention_agreement(_tiny(**{"model.attention_impl": "cudnn",
                                               "data.batch_mode": "bucket"}), 8, 32)
  assert r["empty_rows"] == 1 and r["dtype"] == "bfloat16" and r["batch"] == "8x32"
  cudnn, einsum = r["impls"]["cudnn"], r["impls"]["einsum"]
  assert cudnn["finite"] and einsum["finite"] and cudnn["loss"] > 0 and cudnn["grad_norm"] > 0
  assert any("sequence lengths" in line for line in cudnn["attention"]), cudnn["attention"]
  assert einsum["attention"] == ["attention: einsum (written out, XLA fuses it)"]
  assert accelerator_stages.agreement_verdict(r) == [], r
  assert einsum["loss_rel_diff"] < 1e-2 and einsum["grad_rel_diff"] < 5e-2


def test_the_verdict_names_a_nan_and_a_disagreement():
  r = {"impls": {"cudnn": {"finite": False},
                 "einsum": {"finite": True, "loss_rel_diff": 0.5, "grad_norm_rel_diff": 0.0,
                            "grad_rel_diff": float("nan")}}}
  assert accelerator_stages.agreement_verdict(r) == [
      "cudnn: non-finite loss or gradient", "einsum: loss_rel_diff 5.00e-01 > 0.01",
      "einsum: grad_rel_diff nan > 0.05"]


def test_the_matmul_peak_is_measured_on_random_operands():
  m = accelerator.matmul_peak("bfloat16", n=256, repeats=2)
  assert m["n"] == 256 and m["dtype"] == "bfloat16" and m["flops_per_s"] > 0
  assert m["flops_per_s"] == pytest.approx(2 * 256**3 / m["median_s"])
