"""Attention masks, boolean [B, 1, Lq, Lk]: True where a query may attend a key.

Padding (token id 0) takes no part; the decoder is causal (paper §3.2.3); in packed rows
attention never crosses from one example to another. Each attention layer gets a `Mask`: the
dense array (for the einsum and XLA paths) and, for unpacked batches, the same mask said
structurally (causal or not, per-row lengths), which is what cuDNN's fused kernel takes.
"""

from __future__ import annotations

import flax.struct
import jax.numpy as jnp

from transformer_jax.runtime.special_ids import PAD_ID


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


@flax.struct.dataclass
class Mask:
  """One attention mask in two forms.

  dense: boolean [B, 1, Lq, Lk] (or broadcastable), True where a query may attend a key.
  q_lengths, kv_lengths: int32 [B] real lengths of right-padded rows, or None when the rows are
    packed (several examples per row: only the dense form can say that).
  is_causal: query t may attend keys <= t (on top of the lengths).
  """

  dense: jnp.ndarray | None
  q_lengths: jnp.ndarray | None = None
  kv_lengths: jnp.ndarray | None = None
  is_causal: bool = flax.struct.field(pytree_node=False, default=False)

  @property
  def has_lengths(self) -> bool:
    return self.q_lengths is not None and self.kv_lengths is not None


def lengths(tokens_BxL: jnp.ndarray) -> jnp.ndarray:
  """int32 [B]: real tokens per right-padded row."""
  return jnp.sum(tokens_BxL != PAD_ID, axis=-1, dtype=jnp.int32)


def encoder_self_mask(inputs_BxS, inputs_segments_BxS=None) -> Mask:
  if inputs_segments_BxS is not None:
    return Mask(combine(padding_mask(inputs_BxS, inputs_BxS),
                        segment_mask(inputs_segments_BxS, inputs_segments_BxS)))
  n_B = lengths(inputs_BxS)
  return Mask(padding_mask(inputs_BxS, inputs_BxS), n_B, n_B)


def decoder_self_mask(targets_BxT, targets_segments_BxT=None) -> Mask:
  """Causal + padding (+ segments). Decoder inputs are shifted right, so their first token is
  0 (the start symbol): padding is read from the *targets* (which end in EOS, not 0)."""
  dense = combine(padding_mask(targets_BxT, targets_BxT), causal_mask(targets_BxT.shape[1]))
  if targets_segments_BxT is not None:
    return Mask(combine(dense, segment_mask(targets_segments_BxT, targets_segments_BxT)),
                is_causal=True)
  n_B = lengths(targets_BxT)
  return Mask(dense, n_B, n_B, is_causal=True)


def cross_mask(targets_BxT, inputs_BxS, targets_segments_BxT=None, inputs_segments_BxS=None) -> Mask:
  dense = padding_mask(targets_BxT, inputs_BxS)
  if targets_segments_BxT is not None and inputs_segments_BxS is not None:
    return Mask(combine(dense, segment_mask(targets_segments_BxT, inputs_segments_BxS)))
  if targets_segments_BxT is not None or inputs_segments_BxS is not None:
    return Mask(dense)  # packed on one side: no per-row lengths
  return Mask(dense, lengths(targets_BxT), lengths(inputs_BxS))
