"""Where the numbers go: TensorBoard event files, a JSON-lines log, the progress bar, model FLOPs.

Only process 0 writes: `WORKDIR/tb/` (tensorboardX, no TensorFlow: scalars, and a few decoded
dev sentences as text) and `WORKDIR/metrics.jsonl`, one JSON object per logged step. A run
limited by wall time shows its progress bar in time, not steps.
"""

from __future__ import annotations

import json
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.runtime import files
from transformer_jax.runtime.config import ModelConfig


class MetricsWriter:
  """Train and dev scalars to TensorBoard and metrics.jsonl, matching the checkpoints.

  A resumed run (`resume_step` > 0, or 0 for a run that starts over) first drops the lines of
  metrics.jsonl past the restored step (an atomic rewrite; a line cut short by a kill goes too),
  and its TensorBoard writer starts with purge_step = resume_step + 1, so TensorBoard discards
  the earlier events past that step: every step appears once. Files and folders are created at
  the first write, so a run that fails before logging leaves none. A file error in TensorBoard's
  writer thread (a full disk) is raised by the next write() instead of printed by the thread.
  """

  def __init__(self, workdir: str, resume_step: int = 0):
    self.enabled = jax.process_index() == 0
    self._workdir, self._resume_step = workdir, resume_step
    self._tb = self._jsonl = self._tb_error = self._previous_hook = None
    if self.enabled:
      truncate_jsonl(files.join(workdir, "metrics.jsonl"), resume_step)

  def _thread_error(self, args) -> None:
    tb, in_tensorboard = args.exc_traceback, False
    while tb is not None:
      in_tensorboard |= f"{os.sep}tensorboardX{os.sep}" in tb.tb_frame.f_code.co_filename
      tb = tb.tb_next
    if in_tensorboard and isinstance(args.exc_value, OSError):
      self._tb_error = args.exc_value
    else:
      self._previous_hook(args)

  def write(self, step: int, scalars: dict, prefix: str = "train") -> None:
    if not self.enabled:
      return
    if self._tb_error is not None:
      e = self._tb_error
      raise OSError(e.errno, e.strerror, files.join(self._workdir, "tb"))
    if self._tb is None:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      if files.is_remote(self._workdir):
        _register_store_writers()
      self._previous_hook, threading.excepthook = threading.excepthook, self._thread_error
      self._tb = SummaryWriter(files.join(self._workdir, "tb"), purge_step=self._resume_step + 1)
      self._jsonl = _JsonLines(files.join(self._workdir, "metrics.jsonl"))
    clean = {k: float(v) for k, v in scalars.items() if v is not None and np.ndim(v) == 0}
    for key, value in clean.items():
      self._tb.add_scalar(f"{prefix}/{key}", value, step)
    self._jsonl.write(json.dumps({"step": step, "split": prefix, "time": time.time(), **clean}) + "\n")

  def write_samples(self, step: int, sources, references, hypotheses, count: int = 4) -> None:
    """The first `count` decoded dev sentences (translations or trees) beside their sources and
    references, as TensorBoard text `dev/samples` (as the flax WMT example does); nothing when
    nothing was decoded. Written after `write` (which opens the writer) at the same step."""
    if not self.enabled or self._tb is None or not hypotheses:
      return
    text = "\n\n".join(
        f"**{i + 1}.** source: `{sources[i]}`  \nreference: `{references[i]}`  \n"
        f"output: `{hypotheses[i]}`" for i in range(min(count, len(hypotheses))))
    self._tb.add_text("dev/samples", text, step)

  def close(self):
    if self._tb is not None:
      try:
        self._jsonl.close()
        self._tb.close()
      finally:
        self._tb = None
        if self._tb_error is None:
          threading.excepthook = self._previous_hook


def _records(lines: list[str]):
  """(line, record) for each line of a metrics.jsonl that holds a whole row with an int step (a
  line cut short by a kill is skipped)."""
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if isinstance(record, dict) and isinstance(record.get("step"), int):
      yield line, record


def read_rows(workdir: str, split: str | None = None) -> list[dict]:
  """The rows of WORKDIR/metrics.jsonl in the order written (only `split`'s: "train" or "dev",
  when given); [] when there is no log yet. The one reader for every report and test."""
  path = files.join(workdir, "metrics.jsonl")
  if not files.exists(path):
    return []
  return [r for _, r in _records(files.read_text(path).splitlines())
          if split is None or r.get("split") == split]


def truncate_jsonl(path: str, last_step: int) -> None:
  """Keeps the lines of a metrics.jsonl whose step is <= last_step (rewritten atomically only
  when something is dropped; removed when nothing is left)."""
  if not files.exists(path):
    return
  lines = files.read_text(path).splitlines(keepends=True)
  kept = [line if line.endswith("\n") else line + "\n"
          for line, record in _records(lines) if record["step"] <= last_step]
  if len(kept) == len(lines) and all(a == b for a, b in zip(kept, lines)):
    return
  if not kept:
    files.remove(path)
    return
  files.write_text(path, "".join(kept))


class _JsonLines:
  """metrics.jsonl: a line-buffered append locally; in an object store each line rewrites the
  object (files.append_lines), so the file is always whole and current."""

  def __init__(self, path: str):
    self.path = path
    self._file = None if files.is_remote(path) else open(path, "a", buffering=1)

  def write(self, line: str) -> None:
    if self._file is None:
      files.append_lines(self.path, [line])
    else:
      self._file.write(line)

  def close(self) -> None:
    if self._file is not None:
      self._file.close()


class _StoreEventFile:
  """A TensorBoard event file in an object store, for tensorboardX: buffered, and written whole
  at each flush through files.py (stores have no append; tensorboardX's own gs:// writer does
  the same through google-cloud-storage, this one through fsspec like the rest of the run)."""

  def __init__(self, path: str):
    self.path, self.data = path, bytearray()

  def write(self, data: bytes) -> None:
    self.data += data

  def flush(self) -> None:
    files.write_bytes(self.path, bytes(self.data))

  def close(self) -> None:
    self.flush()


class _StoreEventFiles:
  def open(self, path):
    return _StoreEventFile(path)

  def directory_check(self, path):
    pass  # objects need no folders


def _register_store_writers() -> None:
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  for scheme in ("gs", "s3"):
    record_writer.register_writer_factory(scheme, _StoreEventFiles())


class Progress:
  """The console progress bar of the training loop (process 0 only, tqdm)."""

  def __init__(self, enabled: bool, num_steps: int, start_step: int, budget_minutes: float = 0.0):
    self._bar, self._budget = None, budget_minutes * 60.0
    self._start_step, self._start_time = start_step, time.time()
    if not enabled:
      return
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    if self._budget:
      self._bar = tqdm(total=round(self._budget), desc="train", unit="s", dynamic_ncols=True,
                       bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s "
                                  "of the time budget{postfix}")
    else:
      self._bar = tqdm(total=num_steps, initial=start_step, desc="train", unit="step",
                       dynamic_ncols=True)
    self._fields = {}

  def update(self, step: int, **fields) -> None:
    """After each step; `fields` (loss, ppl, ...) join the postfix until replaced."""
    if self._bar is None:
      return
    self._fields.update(fields)
    if self._budget:
      elapsed = time.time() - self._start_time
      rate = (step - self._start_step) / max(elapsed, 1e-9)
      self._bar.n = min(round(elapsed), self._bar.total)
      self._bar.set_postfix(dict(step=step, steps_s=f"{rate:.2f}", **self._fields), refresh=False)
      self._bar.refresh()
    else:
      self._bar.set_postfix(self._fields, refresh=False)
      self._bar.update(step - self._bar.n)

  def write(self, message: str) -> None:
    if jax.process_index() != 0:
      return
    if self._bar is not None:
      self._bar.write(message)
    else:
      print(message, flush=True)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


def forward_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
  """Matmul FLOPs (2 per multiply-add) of one forward pass on a [batch, len] padded batch.

  Counts every projection, both attention matmuls (QK^T and AV, over the full padded length),
  the FFNs and the pre-softmax projection; the embedding lookup, softmax and LayerNorm are not
  matmuls and are left out, as is customary. Training FLOPs are 3x this (forward + backward).
  """
  d, h, dk, dv, dff, v = cfg.d_model, cfg.num_heads, cfg.d_k, cfg.d_v, cfg.d_ff, cfg.vocab_size
  proj = 2 * d * h * (2 * dk + dv) + 2 * h * dv * d          # q, k, v and output, per token
  ffn = 2 * 2 * d * dff
  def attn(lq, lk):
    return 2 * h * lq * lk * (dk + dv)
  enc = cfg.num_encoder_layers * (src_len * (proj + ffn) + attn(src_len, src_len))
  cross_q = 2 * d * h * dk + 2 * h * dv * d                  # queries and output (per target)
  cross_kv = 2 * d * h * (dk + dv)                            # keys and values (per source)
  dec = cfg.num_decoder_layers * (tgt_len * (proj + ffn + cross_q) + src_len * cross_kv
                                  + attn(tgt_len, tgt_len) + attn(tgt_len, src_len))
  out = 2 * tgt_len * d * v
  return float(batch) * (enc + dec + out)


def train_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
  return 3.0 * forward_flops(cfg, batch, src_len, tgt_len)


def mfu(model_flops_per_second: float, peak_per_device: float, num_devices: int) -> float:
  """Model FLOPs utilisation of a step that runs on `num_devices` devices: the global model
  FLOP/s over the peak of all of them (`train.peak_flops` is per chip/GPU, as data sheets give
  it; `measure_peak_flops` measures one device)."""
  return model_flops_per_second / (peak_per_device * num_devices)


def measure_peak_flops(dtype=jnp.float32, n: int = 2048, repeats: int = 5) -> float:
  """FLOP/s of a large jnp.dot on one device (the default one): the per-device peak for MFU.
  float32 accumulation, as the model's products (a bfloat16 product with a bfloat16 result is
  not what XLA's CPU bfloat16 kernels take, and runs at float32 speed there)."""
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32))
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n**3 / best


class ProfileWindow:
  """A JAX profiler trace of `steps` train steps, starting `after` steps into this process's run
  (so compilation and warm-up stay out), written to WORKDIR/profile/ (TensorBoard's profile
  plugin or xprof open it). Every process traces its own host."""

  def __init__(self, workdir: str, first_step: int, after: int, steps: int, write=print):
    self.directory = files.join(workdir, "profile")
    self.start, self.stop = first_step + after, first_step + after + steps
    self.enabled, self.active, self.write = steps > 0, False, write

  def before_step(self, step: int) -> None:
    """Call before running step `step` + 1 (i.e. with the number of steps done)."""
    if self.enabled and not self.active and step == self.start:
      jax.profiler.start_trace(self.directory)
      self.active = True

  def after_step(self, step: int, outputs) -> None:
    """Call after step `step` (steps done); `outputs` are waited for before the trace stops."""
    if self.active and step >= self.stop:
      self.close(outputs)

  def close(self, outputs=None) -> None:
    if self.active:
      jax.block_until_ready(outputs)
      jax.profiler.stop_trace()
      self.active = False
      self.write(f"profile of steps {self.start + 1}-{self.stop} written to {self.directory}")

