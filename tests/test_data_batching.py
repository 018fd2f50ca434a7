"""Batch plans and assembly on synthetic token lengths (no data files needed)."""

from __future__ import annotations

import collections

import grain
import numpy as np
import pytest

from transformer_jax.data import batching, pipeline
from transformer_jax.data.token_cache import TokenizedSplit


def _synthetic(n: int, seed: int = 0, max_len: int = 30) -> TokenizedSplit:
  """n examples; example i's tokens are distinct per example (ids >= 3), ending in EOS."""
  rng = np.random.default_rng(seed)
  parts = {}
  for side in ("source", "target"):
    lens = rng.integers(2, max_len, size=n)
    ids = [np.r_[3 + (np.arange(k - 1) + 7 * i) % 997, 1].astype(np.int32) for i, k in enumerate(lens)]
    parts[side] = (np.concatenate(ids), np.r_[0, np.cumsum(lens)].astype(np.int64))
  return TokenizedSplit(parts["source"][0], parts["source"][1], parts["target"][0], parts["target"][1])


def _planner(tok, mode, **kw):
  args = dict(mode=mode, seed=3, tokens_per_batch=256, max_source_len=32, max_target_len=32,
              row_multiple=2)
  args.update(kw)
  return batching.TrainPlanner(tok.source_lengths, tok.target_lengths, np.arange(len(tok)), **args)


def test_bucket_plan_covers_each_example_once_within_budget():
  tok = _synthetic(500)
  specs, nxt, row = _planner(tok, "bucket").epoch_batches(0)
  assert (nxt, row) == (1, 0)
  ids = np.concatenate([s.example_ids for s in specs])
  assert sorted(ids.tolist()) == list(range(500))
  partial = 0
  for s in specs:
    assert s.num_rows % 2 == 0 and s.num_rows * max(s.source_len, s.target_len) <= 256
    assert s.source_len % 8 == 0 and s.target_len % 8 == 0
    assert (tok.source_lengths[s.example_ids] <= s.source_len).all()
    assert (tok.target_lengths[s.example_ids] <= s.target_len).all()
    partial += len(s.example_ids) < s.num_rows
  assert partial <= 1  # left-overs move up a bucket: one partial batch per epoch at most


@pytest.mark.parametrize("max_len,count", [(256, 8), (100, 8), (32, 4), (16, 8), (256, 1)])
def test_bucket_lengths_are_few_and_cover_every_length(max_len, count):
  b = batching.bucket_lengths(max_len, count)
  assert len(b) <= count and b == sorted(set(b)) and b[-1] == batching.round_up(max_len)
  assert all(x % batching.LENGTH_STEP == 0 for x in b)
  lengths = np.arange(1, max_len + 1)
  got = batching.bucket_of(lengths, b)
  assert (got >= lengths).all()                    # every length fits its bucket
  assert set(got.tolist()) <= set(b)               # and only those lengths occur


def test_bucket_mode_compiles_at_most_num_buckets_shapes():
  """Long sentences (up to 256 tokens) in 8 buckets: every batch of several epochs has one of
  the planner's announced shapes, and there are at most 8 of them (not one per multiple of 8)."""
  tok = _synthetic(3000, max_len=250)
  planner = _planner(tok, "bucket", tokens_per_batch=4096, max_source_len=256, max_target_len=256,
                     num_buckets=8)
  shapes = set(planner.batch_shapes())
  assert len(shapes) <= 8
  seen = set()
  for epoch in range(3):
    specs, _, _ = planner.epoch_batches(epoch)
    seen |= {(s.num_rows, s.source_len, s.target_len) for s in specs}
  assert seen <= shapes and len(seen) >= 4
  eval_specs = batching.eval_plan(tok.source_lengths, tok.target_lengths, rows=64,
                                  max_source_len=256, max_target_len=256, num_buckets=8)
  assert len({(s.source_len, s.target_len) for s in eval_specs}) <= 8 * 8


def test_bucket_mode_pads_sources_to_their_own_length_not_the_targets():
  """Targets ~2.5x their sources (linearized trees): each bucket's sources are padded to the
  longest source of it and of the shorter buckets, so less source padding, with the same examples
  in the same rows and the same target lengths as padding sources to the bucket length; the
  shapes are the announced ones in every epoch."""
  rng = np.random.default_rng(0)
  src_N = rng.integers(2, 100, size=2000)
  tgt_N = np.minimum(250, (src_N * rng.uniform(2.0, 3.0, size=2000)).astype(int))
  args = dict(mode="bucket", seed=3, tokens_per_batch=4096, max_source_len=128,
              max_target_len=256, row_multiple=2, num_buckets=8)
  tight = batching.TrainPlanner(src_N, tgt_N, np.arange(2000), **args)
  loose = batching.TrainPlanner(src_N, tgt_N, np.arange(2000), **args)
  loose.source_lengths = None  # every source padded to its bucket's length, as for translation
  for epoch in range(2):
    a, _, _ = tight.epoch_batches(epoch)
    b, _, _ = loose.epoch_batches(epoch)
    assert [(s.example_ids.tolist(), s.rows.tolist(), s.num_rows, s.target_len) for s in a] == \
           [(s.example_ids.tolist(), s.rows.tolist(), s.num_rows, s.target_len) for s in b]
    assert all(s.source_len % 8 == 0 and (src_N[s.example_ids] <= s.source_len).all() for s in a)
    assert {(s.num_rows, s.source_len, s.target_len) for s in a} <= set(tight.batch_shapes())
  padded = lambda specs: sum(s.num_rows * s.source_len for s in specs)  # noqa: E731
  assert padded(a) < 0.7 * padded(b)


@pytest.mark.parametrize("n", [3, 7, 40])  # epochs with fewer rows than one batch, too
def test_pack_rows_stream_across_epochs(n):
  tok = _synthetic(n, max_len=20)
  planner = _planner(tok, "pack", tokens_per_batch=4 * 32, row_multiple=1)
  rows_per_epoch = [planner._epoch_rows(e) for e in range(12)]  # pylint: disable=protected-access
  stream = [tuple(r) for rows in rows_per_epoch for r in rows]
  got, epoch, start = [], 0, 0
  while len(got) < len(stream) - 8 * 4 and epoch < 6:
    specs, epoch, start = planner.epoch_batches(epoch, start)
    for s in specs:
      assert s.num_rows == 4 and len(np.unique(s.rows)) == 4  # never a partial batch
      got += [tuple(s.example_ids[s.rows == r].tolist()) for r in range(4)]
  assert got == stream[:len(got)]
  epoch0 = collections.Counter(i for r in rows_per_epoch[0] for i in r)
  assert epoch0 == collections.Counter(range(n))


def test_assembler_packs_segments_and_shards_rows():
  tok = _synthetic(50)
  spec = batching.BatchSpec(np.array([4, 9, 2, 7], np.int32), np.array([0, 0, 1, 3], np.int32), 4, 64, 64)
  full = batching.BatchAssembler(tok)(spec)
  row0 = full["inputs"][0]
  n4, n9 = tok.source_lengths[4], tok.source_lengths[9]
  np.testing.assert_array_equal(row0[:n4], tok.source(4))
  np.testing.assert_array_equal(row0[n4:n4 + n9], tok.source(9))
  np.testing.assert_array_equal(full["inputs_segmentation"][0][:n4 + n9 + 1], [1] * n4 + [2] * n9 + [0])
  np.testing.assert_array_equal(full["inputs_position"][0][:n4 + n9], np.r_[np.arange(n4), np.arange(n9)])
  assert (full["inputs"][2] == 0).all() and (full["targets_segmentation"][2] == 0).all()
  halves = [batching.BatchAssembler(tok, process_index=p, process_count=2)(spec) for p in range(2)]
  for k in full:
    np.testing.assert_array_equal(np.concatenate([halves[0][k], halves[1][k]]), full[k])


def test_assembler_cuts_long_examples_keeping_eos():
  tok = _synthetic(10, max_len=30)
  i = int(np.argmax(tok.source_lengths))
  spec = batching.BatchSpec(np.array([i], np.int32), np.array([0], np.int32), 2, 8, 8)
  batch = batching.BatchAssembler(tok, example_index=True)(spec)
  np.testing.assert_array_equal(batch["inputs"][0], np.r_[tok.source(i)[:7], 1])
  np.testing.assert_array_equal(batch["example_index"], [i, -1])


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_iterator_state_resumes_exactly(mode):
  tok = _synthetic(300)
  def make():
    return pipeline.TrainBatchIterator(_planner(tok, mode), batching.BatchAssembler(tok),
                                       grain.ReadOptions(num_threads=2, prefetch_buffer_size=4))
  it = make()
  states, batches = [], []
  for _ in range(120):  # several epochs
    states.append(it.get_state())
    batches.append(next(it))
  assert it.get_state()["epoch"] >= 2
  for k in (0, 17, 41, 97):
    fresh = make()
    fresh.set_state(states[k])
    for want in batches[k:k + 10]:
      got = next(fresh)
      for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_a_state_from_another_plan_warns_on_the_console(capsys):
  """After a mesh change the row multiple differs: the restored position is used, and the user
  is told on stderr (absl warnings are hidden at the CLI's default verbosity)."""
  tok = _synthetic(200)
  def make(row_multiple):
    return pipeline.TrainBatchIterator(_planner(tok, "pack", row_multiple=row_multiple),
                                       batching.BatchAssembler(tok), grain.ReadOptions())
  state = make(2).get_state()
  make(2).set_state(state)
  assert "warning:" not in capsys.readouterr().err
  make(4).set_state(state)
  err = capsys.readouterr().err
  assert err.startswith("warning: the checkpoint's data position was made for another batch plan")


class _Resampled:
  """A stand-in for token_cache.SampledSegmentation: another synthetic segmentation per epoch
  (other lengths and tokens for the same example ids)."""

  name = "resampled"

  def __init__(self, n):
    self.n, self.calls = n, collections.Counter()

  def __call__(self, epoch):
    self.calls[epoch] += 1
    return _synthetic(self.n, seed=100 + epoch)


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_resampled_segmentations_plan_and_fill_each_epoch_from_its_own_tokens(mode):
  """BPE-dropout's plan: epoch e is planned on segmentation(e)'s lengths, and every example of a
  batch (a packed batch reaching into the next epoch too) is filled from its own epoch's ids."""
  n = 40
  seg = _Resampled(n)
  tok0 = _synthetic(n)
  planner = _planner(tok0, mode, tokens_per_batch=4 * 32, row_multiple=1, segmentation=seg)
  assembler = batching.BatchAssembler(tok0, segmentation=seg)
  epoch, start, mixed = 0, 0, 0
  while epoch < 4:
    e0 = epoch
    specs, epoch, start = planner.epoch_batches(epoch, start)
    if mode == "bucket":
      ids = np.concatenate([s.example_ids for s in specs])
      assert sorted(ids.tolist()) == list(range(n))  # each pair once an epoch
    for s in specs:
      assert s.epochs is not None and set(s.epochs.tolist()) <= {e0, e0 + 1, e0 + 2}
      mixed += len(set(s.epochs.tolist())) > 1
      batch = assembler(s)
      for r in range(s.num_rows):
        in_row = s.rows == r
        want = [seg(int(e)).source(int(i)) for i, e in zip(s.example_ids[in_row], s.epochs[in_row])]
        want = np.concatenate(want) if want else np.zeros([0], np.int32)
        np.testing.assert_array_equal(batch["inputs"][r][:len(want)], want)
        assert (batch["inputs"][r][len(want):] == 0).all()
        lengths = [len(seg(int(e)).target(int(i))) for i, e in zip(s.example_ids[in_row],
                                                                   s.epochs[in_row])]
        assert (batch["targets_segmentation"][r] > 0).sum() == sum(lengths)
  assert mode == "bucket" or mixed  # the test reached a batch that spans two epochs
  assert planner.fingerprint().endswith(":resampled")
