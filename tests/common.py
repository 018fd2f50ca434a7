"""Shared test settings: where the real data is (the same setting users and CI use), the XLA
flags the suite compiles with, and a tiny model for CLI runs."""

import importlib.metadata
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Absolute, so that links and files the tests make elsewhere (tmp_path) still reach it when the
# README's command gives it relative to the repository (TRANSFORMER_JAX_DATA_DIR=../shared/data).
DATA_DIR = os.path.abspath(os.environ["TRANSFORMER_JAX_DATA_DIR"]) if os.environ.get(
    "TRANSFORMER_JAX_DATA_DIR") else ""

requires_data = pytest.mark.skipif(
    not (DATA_DIR and os.path.isdir(os.path.join(DATA_DIR, "multi30k"))),
    reason="set TRANSFORMER_JAX_DATA_DIR to the shared data folder (CI sets ../shared/data)")

# XLA compilation is most of the suite's time on a 2-core CPU. Two code-generation steps take
# the most of it, and the suite turns both down: LLVM's optimisation of the generated CPU code
# (level 0), and the MLIR fusion emitters, which the suite swaps for XLA's older emitter of the
# same fusions (a fifth to a third less time again: test_model 109 -> 71 s, test_decode and
# test_workflow_cli 272 -> 218 s, on a Zen 3 EPYC). XLA's own passes (fusion, layouts, SPMD
# partitioning, collectives), through which a mistake in our code would show, run as for users,
# and so do the library kernels matmuls call; both emitters keep IEEE float semantics (no
# fast-math), so only the speed of the tiny test models' machine code and the last bits of some
# sums change (the suite's tolerances are relative). The suite also compiles each program as one
# LLVM module, not split into parts compiled in parallel (xla_cpu_parallel_codegen_split_count
# =1): with two test workers on two cores the split buys no parallelism, only its cost (the
# one-device and 2x2x2-mesh train steps of test_sharding: 19.2 -> 16.8 CPU-s, mean of 4 each;
# the suite's CPU time 1807 -> 1661 s). TRANSFORMER_JAX_TEST_XLA_FLAGS='' runs the suite with
# XLA's defaults.
def _jaxlib_before(major: int, minor: int) -> bool:
  try:
    version = importlib.metadata.version("jaxlib")
  except importlib.metadata.PackageNotFoundError:
    return False
  return tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < (major, minor)


# jaxlib 0.11's XLA no longer knows the fusion-emitter switch (an unknown XLA flag is fatal).
SUITE_XLA_FLAGS = os.environ.get(
    "TRANSFORMER_JAX_TEST_XLA_FLAGS",
    "--xla_backend_optimization_level=0"
    + (" --xla_cpu_use_fusion_emitters=false" if _jaxlib_before(0, 11) else "")
    + " --xla_cpu_parallel_codegen_split_count=1")


def xla_flags(*extra: str) -> str:
  """XLA_FLAGS for a process the suite starts: the suite's flags and `extra`."""
  return " ".join(f for f in (SUITE_XLA_FLAGS, *extra) if f)


# A tiny model for CLI runs in subprocesses (a few seconds per run once compiled).
TINY_CLI_FLAGS = [
    "--config=configs/tiny.py",
    "--config.model.d_model=32", "--config.model.d_ff=64", "--config.model.num_heads=2",
    "--config.model.d_k=16", "--config.model.d_v=16", "--config.model.vocab_size=300",
    "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
    "--config.data.tokens_per_batch=512", "--config.data.max_source_len=32",
    "--config.data.max_target_len=32",
    "--config.data.num_buckets=1",  # one train-step shape to compile, not three
    "--config.train.log_every_steps=2", "--config.train.eval_every_steps=1000",
    "--config.train.max_eval_batches=1", "--config.train.checkpoint_every_steps=2",
    "--config.train.keep_checkpoints=10", "--config.train.progress_bar=False",
    "--config.train.peak_flops=1e11",
    # 300 pieces from 4000 sentences: the same code path as the whole corpus in a tenth of the time.
    "--config.data.vocab_train_sentences=4000",
]


def table_row(md: str, first: str) -> list[str]:
  """The cells of the Markdown table row whose first cell is `first`."""
  for line in md.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if line.startswith("|") and cells[0] == first:
      return cells
  raise AssertionError(f"no table row {first!r}")


def stack_layers(model_cfg, params):
  """The inverse of model.transformer.unstack_layers: an unrolled model's parameters laid out
  for `model_cfg` with scan_layers=True, to compare a scanned model with its unrolled twin."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  out = dict(params)
  for stack, n in (("encoder", model_cfg.num_encoder_layers), ("decoder", model_cfg.num_decoder_layers)):
    tree = {k: v for k, v in params[stack].items() if not k.startswith("layer_")}
    tree["layers"] = {"layer": jax.tree.map(lambda *xs: jnp.stack(xs),
                                            *[params[stack][f"layer_{i}"] for i in range(n)])}
    out[stack] = tree
  return out
