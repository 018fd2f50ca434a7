"""Where the numbers go: TensorBoard event files, a JSON-lines log, and model FLOPs.

Only process 0 writes. `WORKDIR/tb/` holds the event files (tensorboardX, no TensorFlow) and
`WORKDIR/metrics.jsonl` one JSON object per logged step.
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config import ModelConfig


class MetricsWriter:

  def __init__(self, workdir: str):
    self.enabled = jax.process_index() == 0
    self._tb = None
    if self.enabled:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(os.path.join(workdir, "tb"))
      self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", buffering=1)

  def write(self, step: int, scalars: dict, prefix: str = "train") -> None:
    if not self.enabled:
      return
    clean = {k: float(v) for k, v in scalars.items() if v is not None and np.ndim(v) == 0}
    for key, value in clean.items():
      self._tb.add_scalar(f"{prefix}/{key}", value, step)
    self._jsonl.write(json.dumps({"step": step, "split": prefix, "time": time.time(), **clean}) + "\n")

  def write_text(self, step: int, tag: str, text: str) -> None:
    if self.enabled:
      self._tb.add_text(tag, text, step)

  def flush(self):
    if self.enabled:
      self._tb.flush()

  def close(self):
    if self.enabled:
      self._tb.close()
      self._jsonl.close()


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


def measure_peak_flops(dtype=jnp.float32, n: int = 2048, repeats: int = 5) -> float:
  """FLOP/s of a large jnp.dot on the default device: the peak used for MFU."""
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n**3 / best
