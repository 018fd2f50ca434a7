"""benchmarks.epoch_cost: its batches per compiled shape and the command's settings (the timed
run itself is a benchmark, not a test)."""

import numpy as np

from benchmarks import epoch_cost, settings
from transformer_jax.data import batching


def test_epoch_cost_pairs_each_bucket_with_its_sources_padded_to_the_bucket_length():
  """benchmarks.epoch_cost: one entry per bucket of the epoch, batch counts summing to the
  epoch's, each with the planner's source length and the bucket's (never shorter); the command
  resolves to its config's settings without running."""
  rng = np.random.default_rng(0)
  src_N = rng.integers(2, 100, size=1500)
  tgt_N = np.minimum(250, (src_N * rng.uniform(2.0, 3.0, size=1500)).astype(int))
  planner = batching.TrainPlanner(src_N, tgt_N, np.arange(1500), mode="bucket", seed=0,
                                  tokens_per_batch=4096, max_source_len=128, max_target_len=256,
                                  row_multiple=1)
  buckets = epoch_cost._buckets(planner)
  assert sum(b["batches"] for b in buckets) == len(planner.epoch_batches(0)[0])
  assert planner.source_lengths is not None  # left as it was
  assert all(b["source_len"] <= b["bucket_source_len"] == min(b["target_len"], 128)
             for b in buckets)
  assert any(b["source_len"] < b["bucket_source_len"] for b in buckets)
  assert all((src_N[b["spec"].example_ids] <= b["source_len"]).all() for b in buckets)
  got = settings.resolve("python -m benchmarks.epoch_cost --config=configs/wsj_parsing.py:sample "
                         "--steps=3 --out=")
  assert got["benchmark.steps"] == 3 and got["train.data.task"] == "parsing"
