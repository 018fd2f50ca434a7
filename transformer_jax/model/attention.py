"""Scaled dot-product and multi-head attention (paper §3.2), with a KV cache for decoding.

`num_heads`, `d_k` and `d_v` are independent (Table 3 rows A and B); the projections have no
bias, as in tensor2tensor. Decoding (`incremental=True`) caches the self-attention keys and
values one position per step, with a table of which beam holds each position so that beam search
reorders hypotheses without copying the buffers, and the cross-attention keys and values once.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from transformer_jax.model import matmul
from transformer_jax.model.masks import Mask
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError

_NEG_INF = -1e30  # large and finite: exp() underflows to exactly 0 in float32


def dot_product_attention(q_BxTxNxK, k_BxSxNxK, v_BxSxNxV, mask: Mask | None = None, *,
                          dropout_rate=0.0, dropout_rng=None, deterministic=True,
                          impl="einsum", dtype=jnp.float32):
  """Returns (out [B, T, N, V], weights [B, N, T, S] or None for the fused implementations).

  impl: 'einsum' (written out here: the weights can be sown for attention maps),
    'dot_product_attention' (`jax.nn.dot_product_attention` with the dense mask: XLA's kernel),
    'cudnn' (`jax.nn.dot_product_attention(implementation='cudnn')` with is_causal and
    per-example lengths; see `_cudnn_unsupported` for when it falls back to the dense mask).
  The logits and the softmax are computed in float32 whatever the compute dtype; masked keys get
  exactly zero weight. A padding query (no key at all) outputs zeros with einsum and cudnn, and
  an average of the values with XLA's dense-mask kernel; no loss or later layer reads it.
  """
  d_k = q_BxTxNxK.shape[-1]
  dense = None if mask is None else mask.dense
  if impl == "cudnn":
    why = _cudnn_unsupported(q_BxTxNxK, mask)
    if why is None:
      implementation = "cudnn" if jax.default_backend() == "gpu" else "xla"
      _log_once(f"attention: jax.nn.dot_product_attention(implementation='{implementation}') "
                f"with is_causal={bool(mask and mask.is_causal)} and sequence lengths"
                + ("" if implementation == "cudnn" else
                   f" (no cuDNN on {jax.default_backend()}: XLA runs the same call)"))
      out = jax.nn.dot_product_attention(
          q_BxTxNxK, k_BxSxNxK, v_BxSxNxV, scale=d_k**-0.5,
          is_causal=bool(mask and mask.is_causal),
          query_seq_lengths=None if mask is None else mask.q_lengths,
          key_value_seq_lengths=None if mask is None else mask.kv_lengths,
          implementation=implementation)
      return out, None
    _log_once(f"attention: cuDNN not used ({why}); XLA's jax.nn.dot_product_attention with the "
              "dense mask runs instead", warning=True)
    impl = "dot_product_attention"
  if impl == "dot_product_attention":
    _log_once("attention: jax.nn.dot_product_attention (XLA's implementation) with a dense mask")
    out = jax.nn.dot_product_attention(q_BxTxNxK, k_BxSxNxK, v_BxSxNxV, mask=dense,
                                       scale=d_k**-0.5)
    return out, None
  _log_once("attention: einsum (written out, XLA fuses it)")
  q_BxTxNxK = q_BxTxNxK * jnp.asarray(d_k**-0.5, q_BxTxNxK.dtype)
  logits_BxNxTxS = matmul.einsum("btnk,bsnk->bnts", q_BxTxNxK, k_BxSxNxK)  # float32
  if dense is not None:
    logits_BxNxTxS = jnp.where(dense, logits_BxNxTxS, _NEG_INF)
  weights_BxNxTxS = jax.nn.softmax(logits_BxNxTxS, axis=-1)
  if dense is not None:  # rows with no key at all (padding queries) attend nothing
    weights_BxNxTxS = jnp.where(dense, weights_BxNxTxS, 0.0)
  probs_BxNxTxS = weights_BxNxTxS.astype(dtype)
  if dropout_rate > 0.0 and not deterministic:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs_BxNxTxS.shape)
    probs_BxNxTxS = jnp.where(keep, probs_BxNxTxS / (1.0 - dropout_rate), 0.0).astype(dtype)
  out_BxTxNxV = matmul.einsum("bnts,bsnv->btnv", probs_BxNxTxS,
                              v_BxSxNxV.astype(dtype)).astype(dtype)
  return out_BxTxNxV, weights_BxNxTxS


def _cudnn_unsupported(q_BxTxNxK, mask: Mask | None) -> str | None:
  """Why cuDNN's fused kernel cannot take this call (None: it can)."""
  if mask is not None and not mask.has_lengths:
    return "packed rows: a segment mask is not causal + lengths; data.batch_mode='bucket' allows it"
  if q_BxTxNxK.dtype not in (jnp.bfloat16, jnp.float16):
    return f"dtype {q_BxTxNxK.dtype}: cuDNN flash attention takes bfloat16 or float16"
  d_k, limit = q_BxTxNxK.shape[-1], _cudnn_max_head_size()
  if d_k % 8 or d_k > limit:
    return f"head size {d_k}: cuDNN flash attention takes multiples of 8 up to {limit}"
  return None


def _cudnn_max_head_size() -> int:
  device = jax.devices()[0]
  capability = getattr(device, "compute_capability", None)  # GPUs only, e.g. '9.0'
  return 256 if capability and float(capability) >= 9.0 else 128


def check_backend(model_cfg: ModelConfig) -> None:
  """Raises a one-line ConfigError when the configured attention cannot run on this backend."""
  if model_cfg.attention_impl == "cudnn" and jax.default_backend() != "gpu":
    raise ConfigError(f"config key 'model.attention_impl'='cudnn' needs an NVIDIA GPU, but JAX runs "
                      f"on {jax.default_backend()}; use 'einsum' or 'dot_product_attention'")


_LOGGED: dict[str, None] = {}  # the attention choices made so far in this process, in order


def _log_once(line: str, warning: bool = False) -> None:
  """Logs an implementation choice once per process (it is made at trace time, per layer)."""
  if line not in _LOGGED:
    _LOGGED[line] = None
    (logging.warning if warning else logging.info)("%s", line)


def choices() -> list[str]:
  """The attention implementation lines logged so far (for the benchmark's report)."""
  return list(_LOGGED)


def _proj_init(in_axis, out_axis):
  # Glorot-uniform over (fan_in, fan_out) of the flattened projection, as tensor2tensor.
  return nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=in_axis, out_axis=out_axis)


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W^Q_i, K W^K_i, V W^V_i).

  Attributes:
    config: the model config (h, d_k, d_v, d_model, dtype, attention implementation).
    kind: 'self' or 'cross' (only matters for the decode cache).
    incremental: use and update the KV cache (incremental decoding, one query position per call).
    max_decode_len: length of the self-attention cache buffer when decoding.
  """

  config: ModelConfig
  kind: str = "self"
  incremental: bool = False
  max_decode_len: int = 0
  beam_size: int = 1  # decoding: rows b*beam_size + j are the beams of sentence b

  def _project(self, name, x_BxLxD, size):
    cfg = self.config
    w_DxNxK = self.param(
        name, nn.with_logical_partitioning(_proj_init(0, (1, 2)), ("embed", "heads", "kv")),
        (cfg.d_model, cfg.num_heads, size), jnp.float32)
    w_DxH = w_DxNxK.astype(cfg.dtype).reshape(cfg.d_model, cfg.num_heads * size)
    with jax.named_scope("projection"):
      out_BxLxH = matmul.rows_matmul(x_BxLxD.astype(cfg.dtype), w_DxH)
    return out_BxLxH.reshape(*x_BxLxD.shape[:2], cfg.num_heads, size)

  def _keys_values(self, x_kv_BxSxD):
    cfg = self.config
    k = self._project("key", x_kv_BxSxD, cfg.d_k)
    v = self._project("value", x_kv_BxSxD, cfg.d_v)
    return (nn.with_logical_constraint(k, ("batch", "length", "heads", "kv")),
            nn.with_logical_constraint(v, ("batch", "length", "heads", "kv")))

  @nn.compact
  def __call__(self, x_q_BxTxD, x_kv_BxSxD, mask: Mask | None = None, deterministic=True):
    cfg = self.config
    q_BxTxNxK = self._project("query", x_q_BxTxD, cfg.d_k)
    q_BxTxNxK = nn.with_logical_constraint(q_BxTxNxK, ("batch", "length", "heads", "kv"))

    impl = cfg.attention_impl
    if self.incremental and self.kind == "self":
      out_BxTxNxV = self._cached_self_attention(x_q_BxTxD, q_BxTxNxK)
    elif self.incremental:
      out_BxTxNxV = self._cached_cross_attention(x_kv_BxSxD, q_BxTxNxK, mask)
    else:
      k, v = self._keys_values(x_kv_BxSxD)
      dropout_rng = None
      if cfg.attention_dropout_rate > 0.0 and not deterministic:
        dropout_rng = self.make_rng("dropout")
      out_BxTxNxV, weights = dot_product_attention(
          q_BxTxNxK, k, v, mask, dropout_rate=cfg.attention_dropout_rate,
          dropout_rng=dropout_rng, deterministic=deterministic, impl=impl,
          dtype=cfg.dtype)
      if weights is not None:  # for attention maps; costs nothing unless 'intermediates' is mutable
        self.sow("intermediates", "attention_weights", weights)

    w_NxVxD = self.param(
        "out", nn.with_logical_partitioning(_proj_init((0, 1), 2), ("heads", "kv", "embed")),
        (cfg.num_heads, cfg.d_v, cfg.d_model), jnp.float32)
    batch, length = out_BxTxNxV.shape[:2]
    out_BxTxH = out_BxTxNxV.reshape(batch, length, cfg.num_heads * cfg.d_v)
    with jax.named_scope("out_projection"):
      out_BxTxD = matmul.rows_matmul(out_BxTxH, w_NxVxD.astype(cfg.dtype).reshape(-1, cfg.d_model))
    return nn.with_logical_constraint(out_BxTxD, ("batch", "length", "embed"))

  def _cached_cross_attention(self, x_kv_NxSxD, q_NxTxHxK, mask: Mask | None):
    """Decoder cross-attention of one position over the encoder output, whose keys/values are
    projected when the cache is created and kept head-major [N, H, S, d] (so the per-step dots
    need no transposed copy of them). Whatever `model.attention_impl` says: decoding reads its
    caches with these one-query einsums (cuDNN's kernel is for whole sequences)."""
    cfg = self.config
    if not self.has_variable("cache", "cross_key"):
      k, v = self._keys_values(x_kv_NxSxD)
      self.variable("cache", "cross_key", lambda: jnp.transpose(k, (0, 2, 1, 3)))
      self.variable("cache", "cross_value", lambda: jnp.transpose(v, (0, 2, 1, 3)))
    k_NxHxSxK = self.get_variable("cache", "cross_key")
    v_NxHxSxV = self.get_variable("cache", "cross_value")
    d_k = q_NxTxHxK.shape[-1]
    q_NxHxK = q_NxTxHxK[:, 0] * jnp.asarray(d_k**-0.5, q_NxTxHxK.dtype)
    logits_NxHxS = jnp.einsum("nhd,nhsd->nhs", q_NxHxK, k_NxHxSxK,
                              preferred_element_type=jnp.float32)
    if mask is not None and mask.dense is not None:
      keep_Nx1xS = mask.dense[:, 0, 0][:, None, :]  # [N, 1, 1, S]: one query, source padding
      logits_NxHxS = jnp.where(keep_Nx1xS, logits_NxHxS, _NEG_INF)
    weights_NxHxS = jax.nn.softmax(logits_NxHxS, axis=-1).astype(cfg.dtype)
    out_NxHxV = jnp.einsum("nhs,nhsd->nhd", weights_NxHxS, v_NxHxSxV.astype(cfg.dtype))
    return out_NxHxV[:, None]

  def _cached_self_attention(self, x_NxTxD, q_NxTxHxK):
    """Decoder self-attention of one new position against the cache.

    Each row writes its key/value for position i into its own slot once, and `source_beams[n, s]`
    says which beam of row n's sentence holds position s of row n's history: beam search
    reorders hypotheses by permuting that small table (beam_search.reorder_cache), never the
    buffers, and attention reads the history through it (`cached_beam_attention`).

    The buffers are [heads, sentences, positions x beams, d]: head-major, so the per-step
    matmuls batch over heads and sentences; position-major, so a step writes one contiguous
    [beams, d] slice and the matmuls read the buffer as it is (a reshape between the in-place
    update and the read would make XLA copy the whole buffer every step).
    """
    cfg = self.config
    creating = not self.has_variable("cache", "cached_key")
    rows, length, k = x_NxTxD.shape[0], self.max_decode_len, self.beam_size
    if rows % k:
      raise ValueError(f"{rows} decoding rows are not sentences x {k} beams")
    kv_dtype = jnp.dtype(cfg.dtype)
    ck = self.variable("cache", "cached_key", jnp.zeros,
                       (cfg.num_heads, rows // k, length * k, cfg.d_k), kv_dtype)
    cv = self.variable("cache", "cached_value", jnp.zeros,
                       (cfg.num_heads, rows // k, length * k, cfg.d_v), kv_dtype)
    beams = self.variable("cache", "source_beams", jnp.zeros, (rows, length), jnp.int32)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    k_new, v_new = self._keys_values(x_NxTxD)
    if creating:  # cache creation: nothing decoded yet, the output is discarded
      return jnp.zeros(q_NxTxHxK.shape[:3] + (cfg.d_v,), cfg.dtype)
    if x_NxTxD.shape[1] != 1:
      raise ValueError(f"decoding takes one position per call, got {x_NxTxD.shape[1]}")
    i = index.value

    def slot(x_Nx1xHxD):  # this position of every row: [heads, sentences, beams, d]
      x_HxNxD = jnp.transpose(x_Nx1xHxD[:, 0].astype(kv_dtype), (1, 0, 2))
      return x_HxNxD.reshape(x_HxNxD.shape[0], rows // k, k, x_HxNxD.shape[-1])
    ck.value = jax.lax.dynamic_update_slice(ck.value, slot(k_new), (0, 0, i * k, 0))
    cv.value = jax.lax.dynamic_update_slice(cv.value, slot(v_new), (0, 0, i * k, 0))
    own_Nx1 = (jnp.arange(rows, dtype=jnp.int32) % k)[:, None]
    beams.value = jax.lax.dynamic_update_slice(beams.value, own_Nx1, (0, i))
    index.value = i + 1
    # Only the written prefix is read: the shortest of prefix_lengths(length) that holds
    # positions 0..i, so a step's cost follows the output so far, not the buffer's length.
    lengths = prefix_lengths(length)
    branches = [functools.partial(_prefix_attention, n, cfg.dtype) for n in lengths]
    bucket = jnp.searchsorted(jnp.asarray(lengths, jnp.int32), i + 1)
    return jax.lax.switch(bucket, branches, q_NxTxHxK[:, 0], ck.value, cv.value, beams.value,
                          i)[:, None]


PREFIX_LENGTHS = (16, 32, 64, 128, 256, 512, 1024)
# From this many beams on, each row's history is gathered (`gathered_beam_attention`) instead of
# scored against every beam's keys in one matmul (`cached_beam_attention`), whose work grows with
# the square of the beam: a parser's beam of 21 would do 21 times the necessary work.
GATHER_FROM_BEAMS = 8


def prefix_lengths(length: int) -> tuple[int, ...]:
  """The history lengths a decoder step may read, the last the whole buffer of `length`."""
  return tuple(n for n in PREFIX_LENGTHS if n < length) + (length,)


def _prefix_attention(n, dtype, q_NxHxK, k_HxBxMxK, v_HxBxMxV, beams_NxL, i):
  """Attention over the first n positions of the history (of which 0..i are written)."""
  beams = k_HxBxMxK.shape[2] // beams_NxL.shape[1]
  seen_S = jnp.arange(n) <= i
  if beams >= GATHER_FROM_BEAMS:
    return gathered_beam_attention(q_NxHxK, k_HxBxMxK, v_HxBxMxV, beams_NxL[:, :n], seen_S,
                                   dtype)
  return cached_beam_attention(q_NxHxK, k_HxBxMxK[:, :, :n * beams], v_HxBxMxV[:, :, :n * beams],
                               beams_NxL[:, :n], seen_S, dtype)


def gathered_beam_attention(q_NxHxK, k_HxBxMxK, v_HxBxMxV, beams_NxS, seen_S, dtype=jnp.float32):
  """cached_beam_attention for many beams: each row's keys and values for its first S
  positions gathered from the buffers (position s of row n: entry s * beams + beams_NxS[n, s]
  of its sentence's), then one query against its own S keys. Returns [N, H, V]."""
  heads, b, m, d_k = k_HxBxMxK.shape
  rows, length = beams_NxS.shape
  k = rows // b
  q_HxNxK = jnp.transpose(q_NxHxK * jnp.asarray(d_k**-0.5, q_NxHxK.dtype), (1, 0, 2))
  sentence_N = jnp.arange(rows, dtype=jnp.int32) // k
  flat_NxS = sentence_N[:, None] * m + jnp.arange(length, dtype=jnp.int32)[None, :] * k + beams_NxS
  keys_HxNxSxK = jnp.take(k_HxBxMxK.reshape(heads, b * m, d_k), flat_NxS, axis=1)
  logits_HxNxS = jnp.einsum("hnd,hnsd->hns", q_HxNxK, keys_HxNxSxK,
                            preferred_element_type=jnp.float32)
  logits_HxNxS = jnp.where(seen_S, logits_HxNxS, _NEG_INF)
  weights_HxNxS = jax.nn.softmax(logits_HxNxS, axis=-1).astype(dtype)
  values_HxNxSxV = jnp.take(v_HxBxMxV.reshape(heads, b * m, -1), flat_NxS, axis=1)
  out_HxNxV = jnp.einsum("hns,hnsd->hnd", weights_HxNxS, values_HxNxSxV.astype(dtype))
  return jnp.transpose(out_HxNxV, (1, 0, 2))


def cached_beam_attention(q_NxHxK, k_HxBxMxK, v_HxBxMxV, beams_NxS, seen_S, dtype=jnp.float32):
  """Attention of one query per row over cached positions whose keys/values may sit in other
  beams of the same sentence.

  Rows are sentences x beams (row n = b * beams + j). The buffers are [H, B, M, d] with
  M = positions x beams (m = s * beams + beam); position s of row n's history is the entry of
  beam beams_NxS[n, s]. Each query is scored against the keys of all beams of its sentence in
  one batched matmul ([beams x d] @ [d x M], reading each key once), the table picks per
  position the beam whose score counts, and the values are read the same way with the weights
  spread back over the beams. Returns [N, H, V]; logits and softmax in float32, unseen
  positions get zero weight (as dot_product_attention).
  """
  heads, b, m, d_k = k_HxBxMxK.shape
  rows, length = beams_NxS.shape
  k = rows // b
  d_v = v_HxBxMxV.shape[-1]
  q_HxBxJxK = jnp.transpose(q_NxHxK * jnp.asarray(d_k**-0.5, q_NxHxK.dtype), (1, 0, 2)).reshape(
      heads, b, k, d_k)
  pick_BxJxSxK = jax.nn.one_hot(beams_NxS.reshape(b, k, length), k, dtype=bool)
  all_HxBxJxM = jnp.einsum("hbjd,hbmd->hbjm", q_HxBxJxK, k_HxBxMxK,
                           preferred_element_type=jnp.float32)
  all_HxBxJxSxK = all_HxBxJxM.reshape(heads, b, k, length, k)
  logits_HxBxJxS = jnp.sum(jnp.where(pick_BxJxSxK[None], all_HxBxJxSxK, 0.0), axis=-1)
  logits_HxBxJxS = jnp.where(seen_S, logits_HxBxJxS, _NEG_INF)
  weights_HxBxJxS = jax.nn.softmax(logits_HxBxJxS, axis=-1)
  spread_HxBxJxM = jnp.where(pick_BxJxSxK[None], weights_HxBxJxS[..., None], 0.0).reshape(
      heads, b, k, m).astype(dtype)
  out_HxBxJxV = jnp.einsum("hbjm,hbmd->hbjd", spread_HxBxJxM, v_HxBxMxV.astype(dtype))
  return jnp.transpose(out_HxBxJxV.reshape(heads, rows, d_v), (1, 0, 2))
