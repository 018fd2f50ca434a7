"""Stage 4: token-budget batch plans (paper §5.1) and their assembly into padded numpy batches.

:func:`select_for_training` picks the training examples (non-empty, within the max lengths). A
plan entry, :class:`BatchSpec`, lists which examples go to which row of one *global* batch and
the padded lengths. Planning works on token lengths only, so an epoch's plan is a few numpy calls;
:class:`BatchAssembler` then gathers the token ids of one process's rows into int32 arrays.

- bucket mode: each example goes to the shortest of a few fixed bucket lengths (``bucket_lengths``:
  ``data.num_buckets`` lengths spaced geometrically up to the max length, so the train step
  compiles at most that many shapes) that holds max(source, target length); a batch of bucket
  length L has ``rows = tokens_per_batch // L`` rows (a multiple of the row multiple), so it holds
  about tokens_per_batch source and target tokens, padding included. The left-over examples of a
  bucket move up to the next (longer) bucket, so only the last batch of an epoch is partial
  (padded with empty rows). A bucket's sources are padded only to the longest source of it and
  of the shorter buckets (``bucket_source_lengths``, a multiple of LENGTH_STEP), not to L:
  where targets are much longer than sources (a parser's linearized trees) the encoder and
  cross-attention then skip most of the padding, with the same examples in the same rows.
  Evaluation batches use the same lengths.
- pack mode: several pairs per row of (max_source_len, max_target_len) tokens, first-fit over a
  window of open rows, with segment ids and per-segment positions. Rows stream across epoch ends,
  so no batch is partial: the last batch of epoch e is completed with the first rows of epoch e+1.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
from absl import logging

from transformer_jax.runtime.exceptions import DataError
from transformer_jax.runtime.special_ids import EOS_ID

LENGTH_STEP = 8      # padded lengths are multiples of this (few distinct shapes to compile)
PACK_WINDOW = 16     # open rows that first-fit packing considers


def select_for_training(tokenized, max_source_len: int, max_target_len: int) -> np.ndarray:
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


@dataclasses.dataclass(frozen=True)
class BatchSpec:
  """One global batch: example example_ids[i] goes to row rows[i] (rows non-decreasing)."""

  example_ids: np.ndarray  # int32 [n]
  rows: np.ndarray         # int32 [n]
  num_rows: int
  source_len: int
  target_len: int
  epochs: np.ndarray | None = None  # int32 [n]: whose sampled segmentation (None: the fixed one)


def round_up(n, step: int = LENGTH_STEP):
  return -(-n // step) * step


def bucket_lengths(max_len: int, count: int, shortest: int = 2 * LENGTH_STEP) -> list[int]:
  """`count` padded lengths from `shortest` to round_up(max_len), spaced geometrically (equal
  relative padding per bucket), multiples of LENGTH_STEP; fewer when they coincide."""
  top = round_up(max_len)
  if count <= 1 or top <= shortest:
    return [top]
  ratio = (top / shortest) ** (1.0 / (count - 1))
  lengths = {min(top, round_up(int(np.ceil(shortest * ratio**i)))) for i in range(count - 1)}
  return sorted(lengths | {top})


def bucket_of(lengths_N: np.ndarray, buckets: list[int]) -> np.ndarray:
  """The shortest bucket length that holds each length (the longest for anything beyond)."""
  b = np.asarray(buckets)
  return b[np.minimum(np.searchsorted(b, lengths_N), len(b) - 1)]


def bucket_source_lengths(src_lengths: np.ndarray, tgt_lengths: np.ndarray, example_ids: np.ndarray,
                          buckets: list[int], max_source_len: int) -> dict[int, int]:
  """The padded source length of each bucket length L: the longest source among the examples of
  L and of every shorter bucket (left-overs move up), rounded up to a multiple of LENGTH_STEP, at
  most min(L, max_source_len). Depends on the lengths only, so every epoch has the same shapes."""
  src_N = src_lengths[example_ids]
  key_N = bucket_of(np.maximum(src_N, tgt_lengths[example_ids]), buckets)
  out, longest = {}, 1
  for length in buckets:
    own_N = src_N[key_N == length]
    longest = max(longest, int(own_N.max()) if len(own_N) else 0)
    out[length] = min(length, max_source_len, round_up(longest))
  return out


def rows_per_batch(tokens_per_batch: int, length: int, row_multiple: int) -> int:
  """Rows of `length` tokens that fit the budget, rounded down to a multiple of row_multiple."""
  rows = (tokens_per_batch // length) // row_multiple * row_multiple
  if rows < row_multiple:
    logging.log_first_n(logging.WARNING, "tokens_per_batch=%d holds fewer than %d rows of length %d;"
                        " using %d rows (over budget)", 3, tokens_per_batch, row_multiple, length,
                        row_multiple)
  return max(rows, row_multiple)


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
  return np.random.default_rng([seed, epoch])


def bucket_plan(src_lengths: np.ndarray, tgt_lengths: np.ndarray, example_ids: np.ndarray, *,
                tokens_per_batch: int, max_source_len: int, max_target_len: int,
                row_multiple: int, rng: np.random.Generator, num_buckets: int,
                source_lengths: dict[int, int] | None = None) -> list[BatchSpec]:
  """One epoch of length-bucketed batches over example_ids, shuffled by rng. `source_lengths`:
  each bucket length's padded source length (bucket_source_lengths; default the bucket length)."""
  perm_N = rng.permutation(example_ids).astype(np.int32)
  buckets = bucket_lengths(max(max_source_len, max_target_len), num_buckets)
  key_N = bucket_of(np.maximum(src_lengths[perm_N], tgt_lengths[perm_N]), buckets)
  perm_N = perm_N[np.argsort(key_N, kind="stable")]
  key_N = np.sort(key_N, kind="stable")
  specs, carry = [], np.zeros([0], np.int32)
  bounds = np.flatnonzero(np.diff(key_N)) + 1
  for group, length in zip(np.split(perm_N, bounds), key_N[np.r_[0, bounds]] if len(key_N) else []):
    ls, lt = min(int(length), max_source_len), min(int(length), max_target_len)
    rows = rows_per_batch(tokens_per_batch, max(ls, lt), row_multiple)
    if source_lengths is not None:
      ls = source_lengths[int(length)]
    pool = np.concatenate([carry, group])
    full = len(pool) // rows
    for b in range(full):
      specs.append(BatchSpec(pool[b * rows:(b + 1) * rows], np.arange(rows, dtype=np.int32),
                             rows, ls, lt))
    carry = pool[full * rows:]
  if len(carry):  # the one partial batch of the epoch: filled up with empty rows
    specs.append(BatchSpec(carry, np.arange(len(carry), dtype=np.int32), rows, ls, lt))
  return [specs[i] for i in rng.permutation(len(specs))]


def pack_rows(src_lengths: np.ndarray, tgt_lengths: np.ndarray, example_ids: np.ndarray, *,
              source_len: int, target_len: int, rng: np.random.Generator,
              window: int = PACK_WINDOW) -> list[list[int]]:
  """Packs shuffled examples into rows of (source_len, target_len) tokens, first-fit over the
  `window` most recent open rows (the fullest row is closed when the window overflows)."""
  perm = rng.permutation(example_ids).tolist()
  src, tgt = src_lengths.tolist(), tgt_lengths.tolist()
  rows: list[list[int]] = []
  open_rows: list[list] = []  # [free source, free target, members]
  for i in perm:
    s, t = src[i], tgt[i]
    for row in open_rows:
      if row[0] >= s and row[1] >= t:
        row[0] -= s
        row[1] -= t
        row[2].append(i)
        break
    else:
      open_rows.append([source_len - s, target_len - t, [i]])
      if len(open_rows) > window:
        fullest = min(range(len(open_rows)), key=lambda k: min(open_rows[k][0], open_rows[k][1]))
        rows.append(open_rows.pop(fullest)[2])
  rows.extend(r[2] for r in open_rows)
  return [rows[i] for i in rng.permutation(len(rows))]


def _rows_spec(rows: list[list[int]], num_rows: int, source_len: int, target_len: int,
               row_epochs: list[int] | None = None) -> BatchSpec:
  sizes = [len(r) for r in rows]
  ids = np.fromiter((i for r in rows for i in r), np.int32)
  row_of = np.repeat(np.arange(len(rows), dtype=np.int32), sizes)
  epochs = None if row_epochs is None else np.repeat(np.asarray(row_epochs, np.int32), sizes)
  return BatchSpec(ids, row_of, num_rows, source_len, target_len, epochs)


class TrainPlanner:
  """Deterministic per-epoch plans of global training batches (same on every process).

  `epoch_batches(epoch, start_row)` gives the batches of an epoch (pack mode: starting at row
  `start_row`, the rows before it having gone into the previous epoch's last batch) and where the
  next epoch starts.

  With a `segmentation` (BPE-dropout: a callable giving epoch e's TokenizedSplit, sampled afresh
  per epoch), epoch e is planned on its own token lengths (pairs that no longer fit the max
  lengths sit that epoch out) and each batch records the epoch of each example (BatchSpec.epochs)
  for the assembler; the lengths given here then only size the fingerprint.
  """

  def __init__(self, src_lengths, tgt_lengths, example_ids, *, mode: str, seed: int,
               tokens_per_batch: int, max_source_len: int, max_target_len: int, row_multiple: int,
               num_buckets: int = 8, segmentation=None):
    self.segmentation = segmentation
    self.src_lengths, self.tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
    self.example_ids = np.asarray(example_ids, np.int32)
    self.mode, self.seed = mode, seed
    self.tokens_per_batch, self.row_multiple = tokens_per_batch, row_multiple
    self.max_source_len, self.max_target_len = max_source_len, max_target_len
    self.num_buckets = num_buckets
    self.pack_rows_per_batch = rows_per_batch(tokens_per_batch, max(max_source_len, max_target_len),
                                              row_multiple)
    # Sources padded to their own bucket (bucket_source_lengths); with a sampled segmentation the
    # lengths change each epoch, so sources keep the full bucket length and the shapes stay few.
    self.source_lengths = None
    if mode == "bucket" and segmentation is None and len(self.example_ids):
      self.source_lengths = bucket_source_lengths(
          self.src_lengths, self.tgt_lengths, self.example_ids,
          bucket_lengths(max(max_source_len, max_target_len), num_buckets), max_source_len)
    self._rows_cache: collections.OrderedDict[int, list[list[int]]] = collections.OrderedDict()

  def fingerprint(self) -> str:
    """Identifies the plan's inputs; a restored state from another plan is flagged."""
    return (f"{self.mode}:{len(self.example_ids)}:{int(self.src_lengths.sum())}:"
            f"{int(self.tgt_lengths.sum())}:{self.seed}:{self.tokens_per_batch}:"
            f"{self.max_source_len}:{self.max_target_len}:{self.row_multiple}"
            + (f":b{self.num_buckets}" if self.mode == "bucket" else "")
            + (f":{self.segmentation.name}" if self.segmentation is not None else ""))

  def batch_shapes(self) -> list[tuple[int, int, int]]:
    """Every (rows, source length, target length) a training batch can have: what compiles."""
    longest = max(self.max_source_len, self.max_target_len)
    if self.mode == "pack":
      return [(self.pack_rows_per_batch, self.max_source_len, self.max_target_len)]
    return [(rows_per_batch(self.tokens_per_batch, min(b, longest), self.row_multiple),
             self.source_lengths[b] if self.source_lengths else min(b, self.max_source_len),
             min(b, self.max_target_len))
            for b in bucket_lengths(longest, self.num_buckets)]

  def _examples(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source lengths, target lengths, example ids to train on) of the epoch."""
    if self.segmentation is None:
      return self.src_lengths, self.tgt_lengths, self.example_ids
    tok = self.segmentation(epoch)
    keep = select_for_training(tok, self.max_source_len, self.max_target_len)
    return tok.source_lengths, tok.target_lengths, keep

  def _epoch_rows(self, epoch: int) -> list[list[int]]:
    if epoch not in self._rows_cache:
      self._rows_cache[epoch] = pack_rows(
          *self._examples(epoch), source_len=self.max_source_len,
          target_len=self.max_target_len, rng=epoch_rng(self.seed, epoch))
      while len(self._rows_cache) > 2:  # this epoch and the next one
        self._rows_cache.popitem(last=False)
    return self._rows_cache[epoch]

  def epoch_batches(self, epoch: int, start_row: int = 0) -> tuple[list[BatchSpec], int, int]:
    """(batches, next epoch, its start row)."""
    sampled = self.segmentation is not None
    if self.mode == "bucket":
      specs = bucket_plan(*self._examples(epoch),
                          tokens_per_batch=self.tokens_per_batch, max_source_len=self.max_source_len,
                          max_target_len=self.max_target_len, row_multiple=self.row_multiple,
                          rng=epoch_rng(self.seed, epoch), num_buckets=self.num_buckets,
                          source_lengths=self.source_lengths)
      if sampled:
        specs = [dataclasses.replace(s, epochs=np.full(len(s.example_ids), epoch, np.int32))
                 for s in specs]
      return specs, epoch + 1, 0
    b, ls, lt = self.pack_rows_per_batch, self.max_source_len, self.max_target_len
    rows = self._epoch_rows(epoch)[start_row:]
    specs = [_rows_spec(rows[i:i + b], b, ls, lt, [epoch] * b if sampled else None)
             for i in range(0, len(rows) - b + 1, b)]
    tail = rows[len(rows) // b * b:]
    tail_epochs = [epoch] * len(tail)
    next_epoch, next_row = epoch + 1, 0
    while tail:  # complete the last batch with the next epoch's first rows
      more = self._epoch_rows(next_epoch)
      take = min(b - len(tail), len(more))
      tail, next_row = tail + more[:take], take
      tail_epochs += [next_epoch] * take
      if len(tail) == b:
        specs.append(_rows_spec(tail, b, ls, lt, tail_epochs if sampled else None))
        break
      next_epoch += 1
    if next_row == len(self._epoch_rows(next_epoch)):
      next_epoch, next_row = next_epoch + 1, 0
    return specs, next_epoch, next_row


def eval_plan(src_lengths: np.ndarray, tgt_lengths: np.ndarray, *, rows: int, max_source_len: int,
              max_target_len: int, num_buckets: int = 8) -> list[BatchSpec]:
  """Every example once, sorted by length, in batches of `rows` rows (the last one padded), padded
  to the bucket lengths (few shapes to compile)."""
  order = np.lexsort((tgt_lengths, src_lengths)).astype(np.int32)
  src_buckets = bucket_lengths(max_source_len, num_buckets)
  tgt_buckets = bucket_lengths(max_target_len, num_buckets)
  specs = []
  for start in range(0, len(order), rows):
    ids = order[start:start + rows]
    ls = min(int(bucket_of(np.array([src_lengths[ids].max()]), src_buckets)[0]), max_source_len)
    lt = min(int(bucket_of(np.array([tgt_lengths[ids].max()]), tgt_buckets)[0]), max_target_len)
    specs.append(BatchSpec(ids, np.arange(len(ids), dtype=np.int32), rows, ls, lt))
  return specs


class BatchAssembler:
  """Turns a BatchSpec into one process's numpy batch (rows [p*n/P, (p+1)*n/P) of the global
  batch): 'inputs', 'targets', '*_segmentation', '*_position' int32 [rows, length]; with
  `example_index`, also 'example_index' [rows] (-1 for empty rows). Examples longer than the
  padded length are cut, keeping EOS last (eval only; training plans never need it). A spec
  with `epochs` takes each example's ids from that epoch's `segmentation(epoch)` (BPE-dropout)."""

  def __init__(self, tokenized, *, process_index: int = 0, process_count: int = 1,
               example_index: bool = False, segmentation=None):
    self.tokenized, self.segmentation = tokenized, segmentation
    self.process_index, self.process_count = process_index, process_count
    self.example_index = example_index

  def __call__(self, spec: BatchSpec) -> dict[str, np.ndarray]:
    n_local = spec.num_rows // self.process_count
    lo = self.process_index * n_local
    sel = (spec.rows >= lo) & (spec.rows < lo + n_local)
    ids_N, rows_N = spec.example_ids[sel], spec.rows[sel] - lo
    if spec.epochs is None:
      parts = [(self.tokenized, slice(None))]
    else:  # rows are whole in one epoch, so the epochs' fills add up without overlap
      epochs_N = spec.epochs[sel]
      parts = [(self.segmentation(int(e)), epochs_N == e) for e in np.unique(epochs_N)]
    batch = {}
    for name, length in (("inputs", spec.source_len), ("targets", spec.target_len)):
      fills = [_fill(*((tok.source_ids, tok.source_offsets) if name == "inputs"
                       else (tok.target_ids, tok.target_offsets)),
                     ids_N[in_N], rows_N[in_N], n_local, length) for tok, in_N in parts]
      arrays = fills[0] if len(fills) == 1 else [sum(x) for x in zip(*fills)]
      batch[name], batch[f"{name}_segmentation"], batch[f"{name}_position"] = arrays
    if self.example_index:
      index_B = np.full([n_local], -1, np.int32)
      index_B[rows_N] = ids_N
      batch["example_index"] = index_B
    return batch


def _fill(flat, offsets, ids_N, rows_N, num_rows: int, length: int):
  """Scatters the examples' tokens into [num_rows, length] ids, segment ids and positions."""
  starts_N = np.asarray(offsets[ids_N], np.int64)
  full_N = np.asarray(offsets[ids_N + 1], np.int64) - starts_N
  lens_N = np.minimum(full_N, length)
  n = len(ids_N)
  first_N = np.r_[True, rows_N[1:] != rows_N[:-1]] if n else np.zeros([0], bool)
  idx_N = np.arange(n)
  row_first_N = np.maximum.accumulate(np.where(first_N, idx_N, 0)) if n else idx_N
  seg_N = idx_N - row_first_N + 1
  excl_N = np.cumsum(lens_N) - lens_N
  col0_N = excl_N - excl_N[row_first_N] if n else excl_N
  tok_T = np.repeat(idx_N, lens_N)
  pos_T = np.arange(len(tok_T)) - excl_N[tok_T]
  r_T, c_T = rows_N[tok_T], col0_N[tok_T] + pos_T
  ids_BxL = np.zeros([num_rows, length], np.int32)
  seg_BxL = np.zeros([num_rows, length], np.int32)
  pos_BxL = np.zeros([num_rows, length], np.int32)
  ids_BxL[r_T, c_T] = flat[starts_N[tok_T] + pos_T]
  seg_BxL[r_T, c_T] = seg_N[tok_T]
  pos_BxL[r_T, c_T] = pos_T
  cut_N = full_N > lens_N
  if cut_N.any():
    ids_BxL[rows_N[cut_N], col0_N[cut_N] + lens_N[cut_N] - 1] = EOS_ID
  return ids_BxL, seg_BxL, pos_BxL
