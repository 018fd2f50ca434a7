"""The input side on the real Multi30k files: TFDS builder, SentencePiece, token-budget batches,
epoch coverage, resumable iterator state, multi-process sharding, packing, eval batches (of a
split, or of texts read from any two files).

Needs TRANSFORMER_JAX_DATA_DIR (CI: ../shared/data); everything is prepared in a module-scoped
temp folder, so the vocabulary (1000 BPE pieces) is trained once.
"""

from __future__ import annotations

import collections
import os
import pathlib
import re
import sys

import numpy as np
import pytest

from tests.common import requires_data
# config, tmp and tok are module-scoped fixtures: each module builds its own
from tests.data_fixtures import (  # noqa: F401
    config, rows_as_examples, tmp, tok, with_data)
from transformer_jax.data import batching, pipeline, sources, token_cache, tokenizer
from transformer_jax.runtime.exceptions import DataError

# One xdist worker runs the module, so its vocabulary is trained once (conftest).
pytestmark = [requires_data, pytest.mark.xdist_group(__name__)]


# ----------------------------------------------------------------------------- TFDS + text


def test_builder_yields_every_pair_without_tensorflow(config):
  sizes = {split: len(sources.split_source(config, split)) for split in sources.SPLITS}
  assert sizes == {"train": 29000, "validation": 1014, "test": 1000}
  info = next(pathlib.Path(sources.cache_root(config)).glob("parallel_text/*/1.0.0/dataset_info.json"))
  mtime = info.stat().st_mtime_ns
  sources.split_source(config, "train")  # prepared once, then reused
  assert info.stat().st_mtime_ns == mtime
  assert "tensorflow" not in sys.modules


def test_texts_are_cleaned_and_in_file_order(config):
  src, tgt = sources.load_split_texts(config, "train")
  assert len(src) == len(tgt) == 29000
  assert src[0] == "Two young, White males are outside near many bushes."
  assert all(t == " ".join(t.split()) for t in src + tgt)  # stripped, no tabs or double spaces
  assert "\t" not in tgt[7365] and tgt[7365].startswith('"')
  assert not [s for s in src if "&amp;" in s or "&#" in s]
  raw, _ = sources.load_split_texts(with_data(config, html_unescape=False), "train")
  assert sum("&amp;" in s for s in raw) > 0
  assert sources.clean_text("  a\t b &amp; c  ", html_unescape=True) == "a b & c"


# ----------------------------------------------------------------------------- SentencePiece


def test_tokenizer_round_trip_and_special_ids(config, tok, tmp):
  assert tok.vocab_size == 1000
  assert (tok.pad_id, tok.eos_id, tok.unk_id) == (0, 1, 2)
  assert [tok.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
  src, tgt = sources.load_split_texts(config, "validation")
  texts = src + tgt
  same = sum(tok.decode(tok.encode(t)) == t for t in texts)
  assert same >= 0.99 * len(texts)
  assert all(tok.decode(tok.encode(t)) == t for t in texts if t.isascii())
  ids = tok.encode_with_eos(src[0])
  assert ids[-1] == tok.eos_id and tok.eos_id not in ids[:-1] and ids[:-1] == tok.encode(src[0])
  assert tok.decode(ids + [5, 6, 0, 0]) == src[0]
  assert tok.decode(np.array(ids[:-1] + [0, 7])) == src[0]
  # Stored in the workdir, reused (not retrained), nothing else left there.
  path = tmp / "workdir" / "vocab" / "spm.model"
  mtime = path.stat().st_mtime_ns
  again = tokenizer.load_or_train_tokenizer(config, str(tmp / "workdir"))
  assert again.sha == tok.sha and path.stat().st_mtime_ns == mtime
  assert os.listdir(path.parent) == ["spm.model"]


# ----------------------------------------------------------------------------- train batches


def _kept_examples(config, tok):
  tokd = token_cache.tokenized_split(config, tok, "train")
  keep = batching.select_for_training(tokd, config.data.max_source_len, config.data.max_target_len)
  return tokd, keep, collections.Counter(
      (tuple(tokd.source(i).tolist()), tuple(tokd.target(i).tolist())) for i in keep)


@pytest.mark.parametrize("budget,multiple", [(1024, 4), (4096, 8)])
def test_bucket_batches_respect_the_token_budget(config, tok, budget, multiple):
  c = with_data(config, tokens_per_batch=budget, batch_mode="bucket")
  it = pipeline.make_train_iterator(c, tok, batch_multiple=multiple)
  real_tokens = all_tokens = 0
  for _ in range(200):
    batch = next(it)
    b, ls = batch["inputs"].shape
    lt = batch["targets"].shape[1]
    assert b * ls <= budget and b * lt <= budget and b % multiple == 0
    assert ls % 8 == 0 and lt % 8 == 0 and ls <= 64 and lt <= 64
    assert all(v.dtype == np.int32 for v in batch.values())
    for name in ("inputs", "targets"):
      ids, seg, pos = batch[name], batch[f"{name}_segmentation"], batch[f"{name}_position"]
      real = ids != 0
      np.testing.assert_array_equal(seg, real.astype(np.int32))
      np.testing.assert_array_equal(pos, np.where(real, np.arange(ids.shape[1]), 0))
      n = real.sum(1)
      rows = n > 0
      assert (ids[rows, n[rows] - 1] == tok.eos_id).all()
    real_tokens += (batch["targets"] != 0).sum()
    all_tokens += batch["targets"].size
  assert real_tokens > 0.75 * all_tokens  # buckets keep padding small


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_an_epoch_holds_every_example_exactly_once(config, tok, mode):
  c = with_data(config, tokens_per_batch=2048, batch_mode=mode)
  _, keep, expected = _kept_examples(c, tok)
  assert len(keep) > 28000
  it = pipeline.make_train_iterator(c, tok, batch_multiple=2)
  seen = []
  if mode == "bucket":
    n_batches = len(it.planner.epoch_batches(0)[0])
    for _ in range(n_batches):
      seen += rows_as_examples(next(it))
    assert it.get_state()["batch"] == n_batches
  else:
    n_rows = len(it.planner._epoch_rows(0))
    rows = []
    while len(rows) < n_rows:
      batch = next(it)
      rows += [{k: v[i:i + 1] for k, v in batch.items()} for i in range(batch["inputs"].shape[0])]
    for r in rows[:n_rows]:
      seen += rows_as_examples(r)
  got = collections.Counter(seen)
  assert sum(got.values()) == len(keep)  # count
  assert got == expected                # and content: nothing lost, nothing duplicated


def test_epochs_are_shuffled_differently_and_deterministically(config, tok):
  c = with_data(config, tokens_per_batch=2048)
  a = pipeline.make_train_iterator(c, tok)
  b = pipeline.make_train_iterator(c, tok)
  first = [next(a) for _ in range(3)]
  for x, y in zip(first, [next(b) for _ in range(3)]):
    np.testing.assert_array_equal(x["inputs"], y["inputs"])
  e0, _, _ = a.planner.epoch_batches(0)
  e1, _, _ = a.planner.epoch_batches(1)
  assert [s.example_ids[:5].tolist() for s in e0[:3]] != [s.example_ids[:5].tolist() for s in e1[:3]]
  c1 = c.copy_and_resolve_references()
  c1.seed = 1
  other = pipeline.make_train_iterator(c1, tok)
  assert [next(other)["inputs"].tolist() for _ in range(3)] != [x["inputs"].tolist() for x in first]


def _assert_same(xs, ys):
  assert len(xs) == len(ys)
  for x, y in zip(xs, ys):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize("mode,bpe_dropout", [("bucket", 0.0), ("pack", 0.0), ("pack", 0.1)])
def test_resume_from_saved_state_gives_identical_batches(config, tok, mode, bpe_dropout):
  c = with_data(config, tokens_per_batch=4096, batch_mode=mode, bpe_dropout=bpe_dropout)
  it = pipeline.make_train_iterator(c, tok, batch_multiple=2)
  n_epoch = len(it.planner.epoch_batches(0)[0])
  for _ in range(n_epoch - 3):  # stop just before an epoch boundary
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(8)]  # crosses into epoch 1
  assert it.get_state()["epoch"] == 1
  fresh = pipeline.make_train_iterator(c, tok, batch_multiple=2)
  fresh.set_state(state)
  _assert_same([next(fresh) for _ in range(8)], expected)


def test_bpe_dropout_samples_each_epoch_afresh_and_reproducibly(config, tok):
  """data.bpe_dropout: a training pair's pieces differ between epochs, are the same for the same
  epoch in another process (another SampledSegmentation, or one rebuilt from its state, as grain's
  worker processes do), are finer than the fixed segmentation on the whole, and decode to the same
  text; with data.bpe_dropout_target False the targets keep the fixed segmentation."""
  import copy  # pylint: disable=g-import-not-at-top  (__getstate__/__setstate__, as grain ships it)
  c = with_data(config, bpe_dropout=0.1)
  fixed = token_cache.tokenized_split(c, tok, "train")
  seg = token_cache.SampledSegmentation(c, tok)
  e0, e1 = seg(0), seg(1)
  again = copy.deepcopy(token_cache.SampledSegmentation(c, tok))(0)
  for name in ("source_ids", "source_offsets", "target_ids", "target_offsets"):
    np.testing.assert_array_equal(getattr(again, name), getattr(e0, name))
  assert len(e0) == len(e1) == len(fixed)
  assert not np.array_equal(e0.source_lengths, e1.source_lengths)
  assert e0.target_lengths.sum() > 1.05 * fixed.target_lengths.sum()
  for i in range(0, len(fixed), 97):
    assert tok.decode(e0.source(i)) == tok.decode(fixed.source(i))
    assert tok.decode(e1.target(i)) == tok.decode(fixed.target(i))
  other_seed = c.copy_and_resolve_references()
  other_seed.seed += 1
  assert not np.array_equal(token_cache.SampledSegmentation(other_seed, tok)(0).source_ids[:5000],
                            e0.source_ids[:5000])
  source_only = token_cache.SampledSegmentation(with_data(c, bpe_dropout_target=False), tok)(0)
  np.testing.assert_array_equal(source_only.source_ids, e0.source_ids)  # the same source draw
  np.testing.assert_array_equal(source_only.target_ids, fixed.target_ids)
  np.testing.assert_array_equal(source_only.target_offsets, fixed.target_offsets)


class _UnreadableRecords:
  """A split's records that may be counted but not read."""

  def __init__(self, n):
    self.n = n

  def __len__(self):
    return self.n

  def __getitems__(self, ids):
    raise AssertionError("read the TFDS records")


def test_bpe_dropout_reads_the_cleaned_training_texts_from_their_cache(config, tok, tmp, caplog,
                                                                       monkeypatch):
  """Each epoch of BPE-dropout reads the training texts from the UTF-8 cache the first epoch
  wrote (TFDS's records untouched), text for text what the split reads; where the cache cannot
  be written, from the split, with a warning."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  src = sources.split_source(config, "train")
  expected = list(src.chunks(5000))
  assert list(token_cache.cached_text_chunks(config, src, "train", 5000)) == expected  # writes
  unreadable = dataclasses.replace(src, records=_UnreadableRecords(len(src)))
  assert list(token_cache.cached_text_chunks(config, unreadable, "train", 5000)) == expected
  assert any("ü" in t or "ß" in t for _, targets in expected for t in targets)  # not ASCII only
  monkeypatch.setattr(sources, "split_source", lambda *_: unreadable)
  assert len(token_cache.SampledSegmentation(with_data(config, bpe_dropout=0.1), tok)(0)) == len(src)
  blocked = dataclasses.replace(src, dataset_id="blocked")
  (tmp / "tfds" / "text_cache").mkdir(exist_ok=True)
  (tmp / "tfds" / "text_cache" / "blocked").write_text("a file where the cache's folder goes")
  with caplog.at_level("WARNING"):
    first = next(token_cache.cached_text_chunks(config, blocked, "train", 5000))
  assert first == expected[0] and "cannot cache texts in" in caplog.text


def test_bpe_dropout_needs_a_bpe_vocabulary(config):
  from transformer_jax.runtime.config import validate  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.exceptions import ConfigError
  for bad, msg in (({"bpe_dropout": 0.1, "vocab_type": "unigram"}, "needs data.vocab_type='bpe'"),
                   ({"bpe_dropout": 1.0}, "must be a rate in [0, 1)")):
    with pytest.raises(ConfigError, match=re.escape(msg)):
      validate(with_data(config, **bad))


def test_resume_through_an_orbax_checkpoint_manager(config, tok, tmp):
  import grain
  import orbax.checkpoint as ocp
  c = with_data(config, tokens_per_batch=2048, batch_mode="pack")
  it = pipeline.make_train_iterator(c, tok)
  for _ in range(7):
    next(it)
  directory = tmp / "ckpt"
  with ocp.CheckpointManager(directory, item_names=("data",),
                             item_handlers={"data": grain.checkpoint.CheckpointHandler()}) as mgr:
    mgr.save(7, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    mgr.wait_until_finished()
  expected = [next(it) for _ in range(4)]
  fresh = pipeline.make_train_iterator(c, tok)
  with ocp.CheckpointManager(directory, item_names=("data",),
                             item_handlers={"data": grain.checkpoint.CheckpointHandler()}) as mgr:
    mgr.restore(7, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
  _assert_same([next(fresh) for _ in range(4)], expected)


@pytest.mark.parametrize("mode", ["bucket", "pack"])
def test_each_process_gets_its_rows_of_the_global_batch(config, tok, mode):
  c = with_data(config, tokens_per_batch=2048, batch_mode=mode)
  full = pipeline.make_train_iterator(c, tok, batch_multiple=4)
  parts = [pipeline.make_train_iterator(c, tok, batch_multiple=4, process_index=p, process_count=2)
           for p in range(2)]
  for _ in range(5):
    g = next(full)
    locals_ = [next(p) for p in parts]
    n = g["inputs"].shape[0]
    for p, local in enumerate(locals_):
      for k in g:
        np.testing.assert_array_equal(local[k], g[k][p * n // 2:(p + 1) * n // 2])


def test_packed_rows_have_consistent_segments_and_positions(config, tok):
  c = with_data(config, tokens_per_batch=2048, batch_mode="pack")
  it = pipeline.make_train_iterator(c, tok)
  multi = 0
  for _ in range(20):
    batch = next(it)
    assert batch["inputs"].shape == (32, 64) and batch["targets"].shape == (32, 64)
    for b in range(32):
      for name in ("inputs", "targets"):
        ids, seg, pos = (batch[name][b], batch[f"{name}_segmentation"][b], batch[f"{name}_position"][b])
        n = int((seg > 0).sum())
        assert (ids[n:] == 0).all() and (seg[n:] == 0).all() and (pos[n:] == 0).all()
        assert (ids[:n] != 0).all() and (np.diff(seg[:n]) >= 0).all() and (np.diff(seg[:n]) <= 1).all()
        starts = np.r_[0, np.flatnonzero(np.diff(seg[:n])) + 1]
        assert seg[0] == 1 or n == 0
        for s0, s1 in zip(starts, np.r_[starts[1:], n]):
          np.testing.assert_array_equal(pos[s0:s1], np.arange(s1 - s0))  # restart per segment
          assert ids[s1 - 1] == tok.eos_id and tok.eos_id not in ids[s0:s1 - 1]
      assert batch["inputs_segmentation"][b].max() == batch["targets_segmentation"][b].max()
      multi += batch["inputs_segmentation"][b].max() > 1
  assert multi > 0.5 * 20 * 32


@pytest.mark.parametrize("words", [False, True])
def test_packed_row_logits_equal_each_example_alone(config, tok, words):
  """Packing changes no example's logits; with model.word_positions each segment counts its
  own words from zero, and model.word_pointer reads its own segment's source."""
  import jax
  import jax.numpy as jnp
  from transformer_jax.runtime.config import ModelConfig
  from transformer_jax.model.transformer import Transformer
  packed = with_data(config, tokens_per_batch=1024, batch_mode="pack")
  batch = next(pipeline.make_train_iterator(packed, tok))
  row = int(np.argmax(batch["inputs_segmentation"].max(1)))
  assert batch["inputs_segmentation"][row].max() >= 2
  mcfg = ModelConfig(vocab_size=1000, d_model=32, num_heads=2, d_k=16, d_v=16, d_ff=64,
                     num_encoder_layers=1, num_decoder_layers=1, max_len=64,
                     word_positions=words, word_pointer=words,
                     word_starts=tok.word_start_ids() if words else ())
  model = Transformer(mcfg)
  r = {k: jnp.asarray(v[row:row + 1]) for k, v in batch.items()}
  params = jax.jit(model.init)(jax.random.PRNGKey(0), r["inputs"], r["targets"])
  packed = jax.jit(model.apply)(params, r["inputs"], r["targets"], r["inputs_position"],
                                r["targets_position"], r["inputs_segmentation"], r["targets_segmentation"])
  # Each example alone, in its own (padded) row: one batch of k rows.
  k = int(r["inputs_segmentation"].max())
  src_alone, tgt_alone = np.zeros([k, 64], np.int32), np.zeros([k, 64], np.int32)
  masks = []
  for seg in range(1, k + 1):
    s = np.asarray(r["inputs"][0][r["inputs_segmentation"][0] == seg])
    masks.append(np.asarray(r["targets_segmentation"][0] == seg))
    src_alone[seg - 1, :len(s)] = s
    tgt_alone[seg - 1, :masks[-1].sum()] = np.asarray(r["targets"][0])[masks[-1]]
  alone = jax.jit(model.apply)(params, src_alone, tgt_alone)
  for seg, tmask in enumerate(masks):
    np.testing.assert_allclose(np.asarray(packed[0][tmask]), np.asarray(alone[seg][:tmask.sum()]),
                               atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- eval batches


def test_eval_batches_keep_every_example(config, tok):
  tokd = token_cache.tokenized_split(config, tok, "validation")
  batches = pipeline.make_eval_batches(config, tok, "validation", batch_multiple=3)
  rows = batches[0]["inputs"].shape[0]
  assert rows % 3 == 0 and rows >= config.data.eval_batch_size
  assert all(b["inputs"].shape[0] == rows for b in batches)
  index = np.concatenate([b["example_index"] for b in batches])
  assert sorted(index[index >= 0].tolist()) == list(range(1014))
  last = batches[-1]
  pad = last["example_index"] < 0
  assert pad.sum() == len(batches) * rows - 1014
  assert (last["inputs"][pad] == 0).all() and (last["targets"][pad] == 0).all()
  for b in batches[:3]:
    for i, ex in enumerate(b["example_index"]):
      s = tokd.source(ex)
      np.testing.assert_array_equal(b["inputs"][i][:len(s)], s)
      assert (b["inputs"][i][len(s):] == 0).all()
  # Split across two processes: the halves of each global batch.
  halves = [pipeline.make_eval_batches(config, tok, "validation", batch_multiple=2,
                                       process_index=p, process_count=2) for p in range(2)]
  whole = pipeline.make_eval_batches(config, tok, "validation", batch_multiple=2)
  for k in whole[0]:
    np.testing.assert_array_equal(np.concatenate([halves[0][0][k], halves[1][0][k]]), whole[0][k])


def test_eval_examples_longer_than_the_limit_are_cut_not_dropped(config, tok):
  c = with_data(config, max_source_len=16, max_target_len=16)
  batches = pipeline.make_eval_batches(c, tok, "validation")
  assert sum((b["example_index"] >= 0).sum() for b in batches) == 1014
  for b in batches:
    assert b["inputs"].shape[1] <= 16 and b["targets"].shape[1] <= 16
    real = b["example_index"] >= 0
    n = (b["inputs"] != 0).sum(1)
    assert (b["inputs"][real, n[real] - 1] == tok.eos_id).all()


def test_pack_plans_fill_rows(config, tok):
  tokd, keep, _ = _kept_examples(config, tok)
  planner = batching.TrainPlanner(tokd.source_lengths, tokd.target_lengths, keep, mode="pack",
                                  seed=0, tokens_per_batch=4096, max_source_len=64,
                                  max_target_len=64, row_multiple=1)
  specs, _, _ = planner.epoch_batches(0)
  assert len({(s.num_rows, s.source_len, s.target_len) for s in specs}) == 1
  real = sum(int(tokd.target_lengths[s.example_ids].sum()) for s in specs)
  assert real > 0.85 * sum(s.num_rows * s.target_len for s in specs)


# ----------------------------------------------------------------------------- any test set


def test_eval_batches_of_given_texts_equal_those_of_the_split(config, tok):
  """A test set read from its files scores exactly like the configured split it is."""
  src_path, ref_path = sources.local_split_files(config, "validation")
  texts = sources.read_parallel_files(src_path, ref_path, html_unescape=config.data.html_unescape)
  assert texts == sources.load_split_texts(config, "validation")
  got = pipeline.make_eval_batches(config, tok, None, texts=texts, batch_multiple=2)
  _assert_same(got, pipeline.make_eval_batches(config, tok, "validation", batch_multiple=2))
  for split, given in ((None, None), ("validation", texts)):
    with pytest.raises(ValueError):
      pipeline.make_eval_batches(config, tok, split, texts=given)


def test_load_tokenizer_loads_the_workdir_vocabulary_and_never_trains(tok, tmp):
  assert tokenizer.load_tokenizer(str(tmp / "workdir")).sha == tok.sha
  empty = tmp / "no-vocab"
  empty.mkdir()
  with pytest.raises(DataError) as e:
    tokenizer.load_tokenizer(str(empty))
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith(f"{empty} has no vocabulary ({empty / 'vocab'})")
  assert "train first" in msg and not os.listdir(empty)
