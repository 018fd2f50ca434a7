"""Scaled dot-product attention and multi-head attention (paper §3.2), with a KV cache.

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

`num_heads`, `d_k` and `d_v` are independent (Table 3 rows A and B), so the projections are
d_model -> h*d_k (queries, keys), d_model -> h*d_v (values) and h*d_v -> d_model (output).
The projections have no bias, as in tensor2tensor.

Decoding (`incremental=True`) keeps, in the 'cache' collection:
- self-attention: the keys/values of every position decoded so far, in a [B, max_decode_len]
  buffer written one position per step, so a step projects one token, not the whole prefix;
- cross-attention: the keys/values of the encoder output, projected once when the cache is
  created and reused at every step.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from transformer_jax.config import ConfigError, ModelConfig
from transformer_jax.masks import Mask
from transformer_jax.matmul import rows_matmul

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
  exactly zero weight, and so do queries that have no key at all (padding rows).
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
  logits_BxNxTxS = jnp.einsum("btnk,bsnk->bnts", q_BxTxNxK, k_BxSxNxK,
                              preferred_element_type=jnp.float32)
  if dense is not None:
    logits_BxNxTxS = jnp.where(dense, logits_BxNxTxS, _NEG_INF)
  weights_BxNxTxS = jax.nn.softmax(logits_BxNxTxS, axis=-1)
  if dense is not None:  # rows with no key at all (padding queries) attend nothing
    weights_BxNxTxS = jnp.where(dense, weights_BxNxTxS, 0.0)
  probs_BxNxTxS = weights_BxNxTxS.astype(dtype)
  if dropout_rate > 0.0 and not deterministic:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs_BxNxTxS.shape)
    probs_BxNxTxS = jnp.where(keep, probs_BxNxTxS / (1.0 - dropout_rate), 0.0).astype(dtype)
  out_BxTxNxV = jnp.einsum("bnts,bsnv->btnv", probs_BxNxTxS, v_BxSxNxV.astype(dtype))
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

  def _project(self, name, x_BxLxD, size):
    cfg = self.config
    w_DxNxK = self.param(
        name, nn.with_logical_partitioning(_proj_init(0, (1, 2)), ("embed", "heads", "kv")),
        (cfg.d_model, cfg.num_heads, size), jnp.float32)
    w_DxH = w_DxNxK.astype(cfg.dtype).reshape(cfg.d_model, cfg.num_heads * size)
    with jax.named_scope("projection"):
      out_BxLxH = rows_matmul(x_BxLxD.astype(cfg.dtype), w_DxH)
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
    if self.incremental and self.kind == "cross":
      k, v = self._cross_cache(x_kv_BxSxD)
    elif self.incremental:
      k, v, mask = self._self_cache(x_q_BxTxD, mask)
    else:
      k, v = self._keys_values(x_kv_BxSxD)
    if self.incremental and impl == "cudnn":
      _log_once("attention: decoding runs XLA's jax.nn.dot_product_attention (one query against "
                "the KV cache; cuDNN's kernel is for whole sequences)")
      impl = "dot_product_attention"

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
      out_BxTxD = rows_matmul(out_BxTxH, w_NxVxD.astype(cfg.dtype).reshape(-1, cfg.d_model))
    return nn.with_logical_constraint(out_BxTxD, ("batch", "length", "embed"))

  def _cross_cache(self, x_kv_BxSxD):
    """Encoder keys/values: projected when the cache is created, then read at every step."""
    if not self.has_variable("cache", "cross_key"):
      k, v = self._keys_values(x_kv_BxSxD)
      self.variable("cache", "cross_key", lambda: k)
      self.variable("cache", "cross_value", lambda: v)
      return k, v
    return self.get_variable("cache", "cross_key"), self.get_variable("cache", "cross_value")

  def _self_cache(self, x_BxTxD, mask: Mask | None):
    """Writes this step's key/value at the cache index and attends over positions <= index."""
    cfg = self.config
    creating = not self.has_variable("cache", "cached_key")
    batch = x_BxTxD.shape[0]
    kv_dtype = jnp.dtype(cfg.dtype)
    ck = self.variable("cache", "cached_key", jnp.zeros,
                       (batch, self.max_decode_len, cfg.num_heads, cfg.d_k), kv_dtype)
    cv = self.variable("cache", "cached_value", jnp.zeros,
                       (batch, self.max_decode_len, cfg.num_heads, cfg.d_v), kv_dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    k_new, v_new = self._keys_values(x_BxTxD)
    if creating:  # cache creation: nothing decoded yet, the output is discarded
      return k_new, v_new, mask
    if x_BxTxD.shape[1] != 1:
      raise ValueError(f"decoding takes one position per call, got {x_BxTxD.shape[1]}")
    i = index.value
    ck.value = jax.lax.dynamic_update_slice(ck.value, k_new.astype(kv_dtype), (0, i, 0, 0))
    cv.value = jax.lax.dynamic_update_slice(cv.value, v_new.astype(kv_dtype), (0, i, 0, 0))
    index.value = i + 1
    seen_1x1x1xS = (jnp.arange(self.max_decode_len) <= i)[None, None, None, :]
    dense = seen_1x1x1xS if mask is None or mask.dense is None else jnp.logical_and(mask.dense, seen_1x1x1xS)
    return ck.value, cv.value, Mask(dense)
