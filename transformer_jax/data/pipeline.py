"""Stage 5, what training and evaluation call: the checkpointable train iterator, eval batches.

Train: the split's token ids (token_cache; with data.bpe_dropout, sampled afresh each epoch) are
filtered and planned epoch by epoch (batching.TrainPlanner: deterministic from config.seed and the
epoch number). Each epoch is a ``grain.MapDataset`` over its plan, mapped by the BatchAssembler
(gather, pad, stack) and read with grain's prefetching threads (or ``data.num_workers``
processes). The iterator's state is its position, ``{'epoch', 'start_row', 'batch'}``:
``get_state()/set_state()`` and orbax ``grain.checkpoint.CheckpointSave/CheckpointRestore``
resume exactly where a run stopped.

Batches are dicts of int32 numpy arrays: 'inputs' [B, Ls], 'targets' [B, Lt] (ids ending in EOS,
pad 0), 'inputs_segmentation'/'targets_segmentation' (1, 2, ... per packed example; 0 at pad),
'inputs_position'/'targets_position' (0-based within the example; 0 at pad). B is this process's
share of the global batch; eval batches add 'example_index' [B] (-1 for padding rows).

Eval: every example of a split (or of given texts) once, sorted by length, cut rather than
dropped when longer than the max lengths.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import grain
import numpy as np
from absl import flags, logging

from transformer_jax.data import batching, sources, token_cache
from transformer_jax.data.batching import BatchAssembler, TrainPlanner

STATE_KEYS = ("epoch", "start_row", "batch")


def _row_multiple(batch_multiple: int, process_count: int) -> int:
  if batch_multiple < 1 or process_count < 1:
    raise ValueError(f"batch_multiple={batch_multiple} and process_count={process_count} must be >= 1")
  return math.lcm(batch_multiple, process_count)


class TrainBatchIterator(grain.DatasetIterator):
  """Endless iterator of this process's training batches; its state is its position."""

  def __init__(self, planner: TrainPlanner, assembler: BatchAssembler,
               read_options: grain.ReadOptions, num_workers: int = 0):
    super().__init__()
    self.planner = planner  # the batch plan (read by the benchmark to size an epoch)
    self._assembler = assembler
    self._read_options, self._num_workers = read_options, num_workers
    self._epoch, self._start_row, self._batch = 0, 0, 0
    self._next_epoch = self._next_start_row = 0
    self._it = None

  def _open_epoch(self):
    specs, self._next_epoch, self._next_start_row = self.planner.epoch_batches(
        self._epoch, self._start_row)
    ds = grain.MapDataset.source(specs)[self._batch:].map(self._assembler)
    it_ds = ds.to_iter_dataset(self._read_options)
    if self._num_workers > 0:
      if not flags.FLAGS.is_parsed():  # grain's worker processes read absl flags
        flags.FLAGS.mark_as_parsed()
      it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=self._num_workers))
    self._it = iter(it_ds)
    logging.log_every_n(logging.INFO, "train epoch %d: %d batches", 10, self._epoch, len(specs))

  def __next__(self) -> dict[str, np.ndarray]:
    while True:
      if self._it is None:
        self._open_epoch()
      try:
        batch = next(self._it)
      except StopIteration:
        self._close_epoch()
        self._epoch, self._start_row, self._batch = self._next_epoch, self._next_start_row, 0
        continue
      self._batch += 1
      return batch

  def _close_epoch(self):
    if self._it is not None and hasattr(self._it, "close"):
      self._it.close()
    self._it = None

  def get_state(self) -> dict[str, Any]:
    return {"epoch": self._epoch, "start_row": self._start_row, "batch": self._batch,
            "plan": self.planner.fingerprint()}

  def set_state(self, state: dict[str, Any]) -> None:
    if state.get("plan") != self.planner.fingerprint():
      # Printed, not logged: the CLI shows only errors from absl logging by default, and a changed
      # plan (another mesh, batch size or data) silently changes which batches come next.
      print(f"warning: the checkpoint's data position was made for another batch plan "
            f"({state.get('plan')}, now {self.planner.fingerprint()}): the run continues from the "
            "same epoch and batch number, but the batch order differs from the original run",
            file=sys.stderr, flush=True)
    self._close_epoch()
    self._epoch, self._start_row, self._batch = (int(state[k]) for k in STATE_KEYS)

  def close(self) -> None:
    self._close_epoch()
    super().close()


def _mix(config, tokenized, part_sizes, keep_N: np.ndarray, verbose: bool) -> np.ndarray:
  """The kept training examples with the corpus's own (the first of `part_sizes`, the training
  split's parts) repeated data.upsample_primary times; prints each part's share of the epoch's
  target tokens."""
  starts = np.cumsum([0, *part_sizes])
  part_N = np.searchsorted(starts, keep_N, side="right") - 1
  k = config.data.upsample_primary
  mixed_N = np.concatenate([keep_N[part_N == 0]] * k + [keep_N[part_N > 0]])
  if verbose:
    names = [f"{config.data.local_corpus}/{config.data.train_files}",
             *sources.extra_train_files(config)]
    tokens = [float(tokenized.target_lengths[keep_N[part_N == p]].sum()) * (k if p == 0 else 1)
              for p in range(len(names))]
    print("training data: " + ", ".join(
        f"{name} {int((part_N == p).sum())} pairs{f' x{k}' if p == 0 and k > 1 else ''} "
        f"({100 * tokens[p] / sum(tokens):.0f}% of target tokens)"
        for p, name in enumerate(names)), flush=True)
  return mixed_N


def make_train_iterator(config, tokenizer, *, batch_multiple: int = 1, process_index: int = 0,
                        process_count: int = 1,
                        reader: sources.SplitReader | None = None) -> TrainBatchIterator:
  """Endless token-budget training batches (data.batch_mode 'bucket' or 'pack') of this process.

  Every process plans the same global batches of about data.tokens_per_batch source and target
  tokens, with a row count that is a multiple of lcm(batch_multiple, process_count), and
  assembles its own rows [p*n/P, (p+1)*n/P). `reader`: the task's (sources.split_source).
  """
  d = config.data
  src = sources.split_source(config, "train", reader)
  tokenized = token_cache.tokenized_split(config, tokenizer, "train", src)
  keep_N = batching.select_for_training(tokenized, d.max_source_len, d.max_target_len)
  if d.extra_train_files:
    keep_N = _mix(config, tokenized, src.part_sizes, keep_N, verbose=process_index == 0)
  segmentation = (token_cache.SampledSegmentation(config, tokenizer, reader) if d.bpe_dropout
                  else None)
  planner = TrainPlanner(
      tokenized.source_lengths, tokenized.target_lengths, keep_N, mode=d.batch_mode,
      seed=config.seed, tokens_per_batch=d.tokens_per_batch, max_source_len=d.max_source_len,
      max_target_len=d.max_target_len, row_multiple=_row_multiple(batch_multiple, process_count),
      num_buckets=d.num_buckets, segmentation=segmentation)
  shapes = planner.batch_shapes()
  if process_index == 0:  # what compiles: one train step per batch shape
    print(f"training batches: {d.batch_mode} mode, {len(shapes)} shape(s) (rows x source x "
          f"target): {', '.join(f'{r}x{s}x{t}' for r, s, t in shapes)}", flush=True)
  assembler = BatchAssembler(tokenized, process_index=process_index, process_count=process_count,
                             segmentation=segmentation)
  read_options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)
  return TrainBatchIterator(planner, assembler, read_options, num_workers=d.num_workers)


def make_eval_batches(config, tokenizer, split: str | None = "validation", *,
                      texts: tuple[list[str], list[str]] | None = None, batch_multiple: int = 1,
                      process_index: int = 0, process_count: int = 1,
                      reader: sources.SplitReader | None = None) -> list[dict[str, np.ndarray]]:
  """Every example of a split, or of `texts=(sources, references)` when given (cleaned aligned
  texts, e.g. from sources.read_parallel_files; then split=None), in
  batches of data.eval_batch_size global rows (rounded up to a multiple of
  lcm(batch_multiple, process_count)), sorted by length; the last batch is padded with empty rows
  ('example_index' -1, otherwise the example's index). Examples longer than data.max_*_len are
  cut (EOS kept). `reader`: the task's (sources.split_source)."""
  if (split is None) == (texts is None):
    raise ValueError(f"make_eval_batches takes a split or texts, not both or neither "
                     f"(split={split!r})")
  d = config.data
  if texts is None:
    tok = token_cache.tokenized_split(config, tokenizer, split, reader=reader)
  else:
    tok = token_cache.tokenized_texts(tokenizer, *texts)
  rows = batching.round_up(d.eval_batch_size, _row_multiple(batch_multiple, process_count))
  src_N, tgt_N = tok.source_lengths, tok.target_lengths
  cut = int(((src_N > d.max_source_len) | (tgt_N > d.max_target_len)).sum())
  if cut:
    logging.info("%s: %d of %d pairs longer than data.max_source_len/max_target_len are cut",
                 split or "texts", cut, len(tok))
  specs = batching.eval_plan(src_N, tgt_N, rows=rows, num_buckets=d.num_buckets,
                             max_source_len=d.max_source_len,
                             max_target_len=d.max_target_len)
  assembler = BatchAssembler(tok, process_index=process_index, process_count=process_count,
                             example_index=True)
  return list(grain.MapDataset.source(specs).map(assembler))
