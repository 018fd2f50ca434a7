"""Stage 3: cleaned pairs -> token ids, ragged int32 arrays (EOS appended), cached as ``.npy``.

A split's cache lives next to the prepared TFDS data (``<cache_root>/token_cache/<dataset>/``),
keyed by split, vocabulary hash and cleaning, written to a temp folder and renamed into place,
and memory-mapped when read, so a run over a large corpus tokenizes it only once. Texts given
directly (a test set read from files) are tokenized the same way, in memory. With BPE-dropout
(``data.bpe_dropout``), :class:`SampledSegmentation` tokenizes the training split afresh each
epoch, in memory, from its cleaned texts, which the first epoch caches as UTF-8 bytes beside the
token caches (``<cache_root>/text_cache/``): decoding TFDS records in Python costs more than
sampling their segmentation.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import shutil
import tempfile
import threading
from typing import Iterable, Iterator

import numpy as np
from absl import logging

from transformer_jax.data import sources
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.runtime.exceptions import DataError
from transformer_jax.runtime.special_ids import EOS_ID

_FILES = ("source_ids", "source_offsets", "target_ids", "target_offsets")
_TEXT_FILES = ("source_bytes", "source_offsets", "target_bytes", "target_offsets")


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
  return TokenizedSplit(**_load_arrays(cache_dir, _FILES), cache_dir=cache_dir)


def _load_arrays(cache_dir: str, names: tuple[str, ...]) -> dict[str, np.ndarray]:
  return {name: np.load(os.path.join(cache_dir, name + ".npy"), mmap_mode="r") for name in names}


def _cached_arrays(cache_dir: str, names: tuple[str, ...], build, what: str):
  """(arrays `names` memory-mapped from cache_dir, True), built by `build()` and saved there
  first (into a temp folder renamed into place) when missing; (the built arrays, False) when
  the cache cannot be written."""
  if all(os.path.isfile(os.path.join(cache_dir, name + ".npy")) for name in names):
    return _load_arrays(cache_dir, names), True
  arrays = build()
  try:
    os.makedirs(os.path.dirname(cache_dir), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(cache_dir), prefix=".tmp-")
    for name in names:
      np.save(os.path.join(tmp, name + ".npy"), arrays[name])
    try:
      os.rename(tmp, cache_dir)  # atomic; another process may have won the race
    except OSError:
      shutil.rmtree(tmp, ignore_errors=True)
    return _load_arrays(cache_dir, names), True
  except OSError as e:
    logging.warning("cannot cache %s in %s (%s); keeping them in memory", what, cache_dir, e)
    return arrays, False


def _ragged(ids_per_example: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
  lengths = np.fromiter((len(x) + 1 for x in ids_per_example), np.int64, len(ids_per_example))
  flat = np.fromiter(itertools.chain.from_iterable(x + [EOS_ID] for x in ids_per_example),
                     np.int32, int(lengths.sum()))
  return flat, np.concatenate([[0], np.cumsum(lengths)])


def _concat_ragged(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
  flats = [flat for flat, _ in parts]
  lengths = [np.diff(offsets) for _, offsets in parts]
  all_lengths = np.concatenate(lengths) if lengths else np.zeros([0], np.int64)
  return (np.concatenate(flats) if flats else np.zeros([0], np.int32),
          np.concatenate([[0], np.cumsum(all_lengths)]).astype(np.int64))


def tokenize_pairs(tokenizer, chunks: Iterable[tuple[list[str], list[str]]], *,
                   bpe_dropout: tuple[float, float] = (0.0, 0.0),
                   seed: tuple[int, ...] = ()) -> TokenizedSplit:
  """Token ids of chunks of (source texts, target texts), converted into numpy chunk by chunk
  (a WMT-size corpus never sits in Python lists). A side with a BPE-dropout rate in
  `bpe_dropout` (source, target) gets a segmentation sampled reproducibly from `seed` (each chunk
  and side its own stream)."""
  src_parts, tgt_parts = [], []
  for k, (s_chunk, t_chunk) in enumerate(chunks):
    for side, chunk, parts in ((0, s_chunk, src_parts), (1, t_chunk, tgt_parts)):
      rate = bpe_dropout[side]
      stream = int(np.random.SeedSequence([*seed, k, side]).generate_state(1)[0]) if rate else 0
      parts.append(_ragged(tokenizer.encode_batch(chunk, bpe_dropout=rate, seed=stream)))
  return TokenizedSplit(*_concat_ragged(src_parts), *_concat_ragged(tgt_parts))


class SampledSegmentation:
  """BPE-dropout for training (Provilkov et al. 2020): `self(epoch)` is the training split
  tokenized with each BPE merge skipped with probability data.bpe_dropout (on the source side
  only with data.bpe_dropout_target False), sampled afresh for each epoch and the same on every
  process and every resume (seeded by config.seed and the epoch). Evaluation and decoding keep
  the fixed segmentation. The last few epochs are kept in memory; worker processes
  (data.num_workers) rebuild them from the config."""

  KEEP = 3  # the epoch being read, the next one a packed batch reaches into, one spare

  def __init__(self, config, tokenizer, reader: sources.SplitReader | None = None):
    self.config, self.tokenizer, self.reader = config, tokenizer, reader
    p = float(config.data.bpe_dropout)
    self.bpe_dropout = (p, p if config.data.bpe_dropout_target else 0.0)  # (source, target)
    self.seed = int(config.seed)
    self.name = "bpe_dropout{:g}/{:g}".format(*self.bpe_dropout)  # joins the plan's fingerprint
    self._epochs: collections.OrderedDict[int, TokenizedSplit] = collections.OrderedDict()
    self._lock = threading.Lock()
    self._source = None  # the training split's records, opened once on first use

  def __call__(self, epoch: int) -> TokenizedSplit:
    with self._lock:
      if epoch not in self._epochs:
        logging.info("BPE-dropout %s: sampling the training split's segmentation for epoch %d",
                     self.bpe_dropout, epoch)
        if self._source is None:
          self._source = sources.split_source(self.config, "train", self.reader)
        self._epochs[epoch] = tokenize_pairs(
            self.tokenizer, cached_text_chunks(self.config, self._source, "train"),
            bpe_dropout=self.bpe_dropout, seed=(self.seed, epoch))
        while len(self._epochs) > self.KEEP:
          self._epochs.popitem(last=False)
      return self._epochs[epoch]

  def __getstate__(self):
    return {"config": self.config, "model_proto": self.tokenizer.model_proto,
            "reader": self.reader}

  def __setstate__(self, state):
    self.__init__(state["config"], Tokenizer(state["model_proto"]), state["reader"])


def tokenized_texts(tokenizer, source_texts: list[str], target_texts: list[str]) -> TokenizedSplit:
  """Given aligned texts (already cleaned) as token ids; not cached."""
  if len(source_texts) != len(target_texts):
    raise DataError(f"{len(source_texts)} source texts but {len(target_texts)} references")
  step = sources.CHUNK
  return tokenize_pairs(tokenizer, ((source_texts[i:i + step], target_texts[i:i + step])
                                    for i in range(0, len(source_texts), step)))


def tokenized_split(config, tokenizer, split: str, src: sources.SplitSource | None = None,
                    reader: sources.SplitReader | None = None) -> TokenizedSplit:
  """The whole split tokenized (nothing filtered), from the cache when there; `src`: the split's
  source when the caller has opened it already, else read by `reader` (sources.split_source)."""
  if src is None:  # not `src or ...`: a SplitSource has a length, and an empty one is falsy
    src = sources.split_source(config, split, reader)
  cache_dir = os.path.join(sources.cache_root(config), "token_cache", src.dataset_id,
                           f"{split}-{tokenizer.sha}-{src.cleaning}")
  def build():
    logging.info("tokenizing %s split (%d pairs)", split, len(src))
    tokenized = tokenize_pairs(tokenizer, src.chunks())
    return {name: getattr(tokenized, name) for name in _FILES}
  arrays, on_disk = _cached_arrays(cache_dir, _FILES, build, "token ids")
  return TokenizedSplit(**arrays, cache_dir=cache_dir if on_disk else None)


def _utf8_ragged(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
  encoded = [t.encode("utf-8") for t in texts]
  lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
  return np.frombuffer(b"".join(encoded), np.uint8), np.concatenate([[0], np.cumsum(lengths)])


def _utf8_texts(data: np.ndarray, offsets: np.ndarray, start: int, stop: int) -> list[str]:
  ends = np.asarray(offsets[start:stop + 1]) - offsets[start]
  blob = bytes(data[offsets[start]:offsets[stop]])
  return [blob[a:b].decode("utf-8") for a, b in zip(ends[:-1].tolist(), ends[1:].tolist())]


def cached_text_chunks(config, src: sources.SplitSource, split: str,
                       chunk: int = sources.CHUNK) -> Iterator[tuple[list[str], list[str]]]:
  """src.chunks() (the split's cleaned texts in order), read from UTF-8 bytes under
  <cache_root>/text_cache/, which the first call writes (the split read once, then saved)."""
  cache_dir = os.path.join(sources.cache_root(config), "text_cache", src.dataset_id,
                           f"{split}-{src.cleaning}")
  def build():
    logging.info("caching the cleaned texts of the %s split (%d pairs)", split, len(src))
    parts = ([], [])
    for pair in src.chunks(chunk):
      for side, texts in enumerate(pair):
        parts[side].append(_utf8_ragged(texts))
    (sd, so), (td, to) = (_concat_ragged(p) for p in parts)
    # (astype only for an empty split, whose concatenation is int32; no copy otherwise)
    return {"source_bytes": sd.astype(np.uint8, copy=False), "source_offsets": so,
            "target_bytes": td.astype(np.uint8, copy=False), "target_offsets": to}
  arrays, _ = _cached_arrays(cache_dir, _TEXT_FILES, build, "texts")
  n = len(arrays["source_offsets"]) - 1
  for start in range(0, n, chunk):
    stop = min(n, start + chunk)
    yield tuple(_utf8_texts(arrays[f"{side}_bytes"], arrays[f"{side}_offsets"], start, stop)
                for side in ("source", "target"))
