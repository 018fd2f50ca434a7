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

from transformer_jax.config import ModelConfig
from transformer_jax.matmul import rows_matmul

_NEG_INF = -1e30  # large and finite: exp() underflows to exactly 0 in float32


def dot_product_attention(q_BxTxNxK, k_BxSxNxK, v_BxSxNxV, mask_Bx1xTxS=None, *,
                          dropout_rate=0.0, dropout_rng=None, deterministic=True,
                          impl="einsum", dtype=jnp.float32):
  """Returns (out [B, T, N, V], weights [B, N, T, S] or None for the fused implementation).

  The logits and the softmax are computed in float32 whatever the compute dtype; masked keys get
  exactly zero weight.
  """
  d_k = q_BxTxNxK.shape[-1]
  if impl == "dot_product_attention":
    out = jax.nn.dot_product_attention(q_BxTxNxK, k_BxSxNxK, v_BxSxNxV, mask=mask_Bx1xTxS,
                                       scale=d_k**-0.5)
    return out, None
  q_BxTxNxK = q_BxTxNxK * jnp.asarray(d_k**-0.5, q_BxTxNxK.dtype)
  logits_BxNxTxS = jnp.einsum("btnk,bsnk->bnts", q_BxTxNxK, k_BxSxNxK,
                              preferred_element_type=jnp.float32)
  if mask_Bx1xTxS is not None:
    logits_BxNxTxS = jnp.where(mask_Bx1xTxS, logits_BxNxTxS, _NEG_INF)
  weights_BxNxTxS = jax.nn.softmax(logits_BxNxTxS, axis=-1)
  if mask_Bx1xTxS is not None:  # rows with no key at all (padding queries) attend nothing
    weights_BxNxTxS = jnp.where(mask_Bx1xTxS, weights_BxNxTxS, 0.0)
  probs_BxNxTxS = weights_BxNxTxS.astype(dtype)
  if dropout_rate > 0.0 and not deterministic:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs_BxNxTxS.shape)
    probs_BxNxTxS = jnp.where(keep, probs_BxNxTxS / (1.0 - dropout_rate), 0.0).astype(dtype)
  out_BxTxNxV = jnp.einsum("bnts,bsnv->btnv", probs_BxNxTxS, v_BxSxNxV.astype(dtype))
  return out_BxTxNxV, weights_BxNxTxS


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
  def __call__(self, x_q_BxTxD, x_kv_BxSxD, mask_Bx1xTxS=None, deterministic=True):
    cfg = self.config
    q_BxTxNxK = self._project("query", x_q_BxTxD, cfg.d_k)
    q_BxTxNxK = nn.with_logical_constraint(q_BxTxNxK, ("batch", "length", "heads", "kv"))

    if self.incremental and self.kind == "cross":
      k, v = self._cross_cache(x_kv_BxSxD)
    elif self.incremental:
      k, v, mask_Bx1xTxS = self._self_cache(x_q_BxTxD, mask_Bx1xTxS)
    else:
      k, v = self._keys_values(x_kv_BxSxD)

    dropout_rng = None
    if cfg.attention_dropout_rate > 0.0 and not deterministic:
      dropout_rng = self.make_rng("dropout")
    out_BxTxNxV, weights = dot_product_attention(
        q_BxTxNxK, k, v, mask_Bx1xTxS, dropout_rate=cfg.attention_dropout_rate,
        dropout_rng=dropout_rng, deterministic=deterministic, impl=cfg.attention_impl,
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

  def _self_cache(self, x_BxTxD, mask_Bx1xTxS):
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
      return k_new, v_new, mask_Bx1xTxS
    if x_BxTxD.shape[1] != 1:
      raise ValueError(f"decoding takes one position per call, got {x_BxTxD.shape[1]}")
    i = index.value
    ck.value = jax.lax.dynamic_update_slice(ck.value, k_new.astype(kv_dtype), (0, i, 0, 0))
    cv.value = jax.lax.dynamic_update_slice(cv.value, v_new.astype(kv_dtype), (0, i, 0, 0))
    index.value = i + 1
    seen_1x1x1xS = (jnp.arange(self.max_decode_len) <= i)[None, None, None, :]
    mask = seen_1x1x1xS if mask_Bx1xTxS is None else jnp.logical_and(mask_Bx1xTxS, seen_1x1x1xS)
    return ck.value, cv.value, mask
