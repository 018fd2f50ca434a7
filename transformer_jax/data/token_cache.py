"""A split tokenized once: ragged int32 token arrays (EOS appended), cached as ``.npy`` files.

The cache lives next to the prepared TFDS data (``<cache_root>/token_cache/<dataset>/``), keyed by
split, vocabulary hash and cleanup options, written to a temp folder and renamed into place, and
memory-mapped when read, so a run over a large corpus tokenizes it only once.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import tempfile

import numpy as np
from absl import logging

from transformer_jax.data import DataError, datasets

_FILES = ("source_ids", "source_offsets", "target_ids", "target_offsets")


@dataclasses.dataclass
class TokenizedSplit:
  """Every example of a split; example i's source is source_ids[source_offsets[i]:...[i+1]]."""

  source_ids: np.ndarray      # int32 [total source tokens], each example ends in EOS
  source_offsets: np.ndarray  # int64 [n + 1]
  target_ids: np.ndarray
  target_offsets: np.ndarray
  cache_dir: str | None = None  # when set, pickling ships the path, not the arrays

  def __len__(self) -> int:
    return len(self.source_offsets) - 1

  @property
  def source_lengths(self) -> np.ndarray:
    return np.diff(self.source_offsets)

  @property
  def target_lengths(self) -> np.ndarray:
    return np.diff(self.target_offsets)

  def source(self, i: int) -> np.ndarray:
    return np.asarray(self.source_ids[self.source_offsets[i]:self.source_offsets[i + 1]])

  def target(self, i: int) -> np.ndarray:
    return np.asarray(self.target_ids[self.target_offsets[i]:self.target_offsets[i + 1]])

  def __getstate__(self):  # grain worker processes re-open the memory map
    if self.cache_dir:
      return {"cache_dir": self.cache_dir}
    return dataclasses.asdict(self)

  def __setstate__(self, state):
    if set(state) == {"cache_dir"}:
      state = dataclasses.asdict(_load(state["cache_dir"]))
    self.__dict__.update(state)


def _load(cache_dir: str) -> TokenizedSplit:
  arrays = {name: np.load(os.path.join(cache_dir, name + ".npy"), mmap_mode="r") for name in _FILES}
  return TokenizedSplit(**arrays, cache_dir=cache_dir)


def _ragged(ids_per_example: list[list[int]], eos_id: int) -> tuple[np.ndarray, np.ndarray]:
  lengths = np.fromiter((len(x) + 1 for x in ids_per_example), np.int64, len(ids_per_example))
  flat = np.fromiter(itertools.chain.from_iterable(x + [eos_id] for x in ids_per_example),
                     np.int32, int(lengths.sum()))
  return flat, np.concatenate([[0], np.cumsum(lengths)])


def _concat_ragged(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
  flats = [flat for flat, _ in parts]
  lengths = [np.diff(offsets) for _, offsets in parts]
  all_lengths = np.concatenate(lengths) if lengths else np.zeros([0], np.int64)
  return (np.concatenate(flats) if flats else np.zeros([0], np.int32),
          np.concatenate([[0], np.cumsum(all_lengths)]).astype(np.int64))


def _tokenize_source(config, tokenizer, src: datasets.SplitSource) -> TokenizedSplit:
  """Tokenizes chunk by chunk into numpy (a WMT-size corpus never sits in Python lists)."""
  src_parts, tgt_parts = [], []
  unescape = config.data.html_unescape
  for s_chunk, t_chunk in datasets.iter_raw_pairs(src):
    src_parts.append(_ragged(tokenizer.encode_batch(
        [datasets.clean_text(s, unescape) for s in s_chunk]), tokenizer.eos_id))
    tgt_parts.append(_ragged(tokenizer.encode_batch(
        [datasets.clean_text(t, unescape) for t in t_chunk]), tokenizer.eos_id))
  return TokenizedSplit(*_concat_ragged(src_parts), *_concat_ragged(tgt_parts))


def tokenized_split(config, tokenizer, split: str, use_cache: bool = True) -> TokenizedSplit:
  """The whole split tokenized (nothing filtered), from the cache when there."""
  src = datasets.split_source(config, split)
  opts = "html" if config.data.html_unescape else "raw"
  cache_dir = os.path.join(datasets.cache_root(config), "token_cache", src.dataset_id,
                           f"{split}-{tokenizer.sha}-{opts}")
  if use_cache and all(os.path.isfile(os.path.join(cache_dir, f + ".npy")) for f in _FILES):
    return _load(cache_dir)
  logging.info("tokenizing %s split (%d pairs)", split, len(src))
  tokenized = _tokenize_source(config, tokenizer, src)
  if not use_cache:
    return tokenized
  try:
    os.makedirs(os.path.dirname(cache_dir), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(cache_dir), prefix=".tmp-")
    for name in _FILES:
      np.save(os.path.join(tmp, name + ".npy"), getattr(tokenized, name))
    try:
      os.rename(tmp, cache_dir)  # atomic; another process may have won the race
    except OSError:
      shutil.rmtree(tmp, ignore_errors=True)
    return _load(cache_dir)
  except OSError as e:
    logging.warning("cannot cache token ids in %s (%s); keeping them in memory", cache_dir, e)
    return tokenized


def select_for_training(tokenized: TokenizedSplit, max_source_len: int,
                        max_target_len: int) -> np.ndarray:
  """Ids of the examples kept for training: both sides non-empty and within the max lengths
  (counted in tokens including EOS). Logs what was dropped; DataError when nothing is left."""
  s_N, t_N = tokenized.source_lengths, tokenized.target_lengths
  empty_N = (s_N <= 1) | (t_N <= 1)
  long_N = ~empty_N & ((s_N > max_source_len) | (t_N > max_target_len))
  keep = np.flatnonzero(~empty_N & ~long_N).astype(np.int32)
  logging.info("training pairs: %d kept, %d empty dropped, %d longer than max_source_len=%d / "
               "max_target_len=%d dropped", len(keep), int(empty_N.sum()), int(long_N.sum()),
               max_source_len, max_target_len)
  if not len(keep):
    raise DataError(f"no training pairs left after filtering ({len(s_N)} pairs: {int(empty_N.sum())} "
                    f"empty, {int(long_N.sum())} longer than data.max_source_len={max_source_len} or "
                    f"data.max_target_len={max_target_len} tokens)")
  return keep
