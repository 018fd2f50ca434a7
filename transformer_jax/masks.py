"""Attention masks. Every mask is boolean [B, 1, Lq, Lk]: True where a query may attend a key.

- padding: keys (and queries) that are padding (token id 0) take no part;
- causal: decoder position t sees positions <= t only (paper §3.2.3);
- segments: in packed rows, attention never crosses from one example to another.
"""

from __future__ import annotations

import jax.numpy as jnp

from transformer_jax.special_ids import PAD_ID


def padding_mask(query_tokens_BxQ: jnp.ndarray, key_tokens_BxK: jnp.ndarray) -> jnp.ndarray:
  """True where both the query and the key are real tokens."""
  q_BxQ = query_tokens_BxQ != PAD_ID
  k_BxK = key_tokens_BxK != PAD_ID
  return (q_BxQ[:, None, :, None] & k_BxK[:, None, None, :])


def causal_mask(length: int) -> jnp.ndarray:
  """[1, 1, L, L]: query t may attend keys 0..t."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def segment_mask(query_segments_BxQ: jnp.ndarray, key_segments_BxK: jnp.ndarray) -> jnp.ndarray:
  """True where query and key belong to the same packed example."""
  return query_segments_BxQ[:, None, :, None] == key_segments_BxK[:, None, None, :]


def combine(*masks) -> jnp.ndarray:
  """Logical AND of the masks that are not None (broadcasting), or None."""
  out = None
  for m in masks:
    if m is not None:
      out = m if out is None else jnp.logical_and(out, m)
  return out


def encoder_self_mask(inputs_BxS, inputs_segments_BxS=None):
  seg = None if inputs_segments_BxS is None else segment_mask(inputs_segments_BxS, inputs_segments_BxS)
  return combine(padding_mask(inputs_BxS, inputs_BxS), seg)


def decoder_self_mask(targets_BxT, targets_segments_BxT=None):
  """Causal + padding (+ segments). Decoder inputs are shifted right, so their first token is
  0 (the start symbol): padding is read from the *targets* (which end in EOS, not 0)."""
  seg = None if targets_segments_BxT is None else segment_mask(targets_segments_BxT, targets_segments_BxT)
  return combine(padding_mask(targets_BxT, targets_BxT), causal_mask(targets_BxT.shape[1]), seg)


def cross_mask(targets_BxT, inputs_BxS, targets_segments_BxT=None, inputs_segments_BxS=None):
  seg = None
  if targets_segments_BxT is not None and inputs_segments_BxS is not None:
    seg = segment_mask(targets_segments_BxT, inputs_segments_BxS)
  return combine(padding_mask(targets_BxT, inputs_BxS), seg)
