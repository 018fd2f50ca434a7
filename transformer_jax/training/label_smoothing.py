"""Label-smoothed cross-entropy (paper §5.4, epsilon_ls = 0.1), padding excluded.

The target puts 1 - eps on the reference token and eps evenly on the other V - 1. The smoothed
loss subtracts that distribution's entropy (as tensor2tensor), so a perfect model scores 0; the
reference token's NLL (whose exponential is Table 3's perplexity) is returned alongside. No
one-hot [B, T, V] is built; `chunked_cross_entropy_sums` also never builds the [B, T, V] logits,
scoring chunks of positions in turn (the same loss up to rounding, in less memory).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def smoothing_constant(vocab_size: int, epsilon: float) -> float:
  """Entropy of the smoothed target distribution, -sum q log q."""
  confidence, low = 1.0 - epsilon, epsilon / (vocab_size - 1)
  return -(confidence * np.log(confidence) + (vocab_size - 1) * low * np.log(low + 1e-20)) if epsilon else 0.0


def cross_entropy_sums(logits_BxTxV: jnp.ndarray, targets_BxT: jnp.ndarray, weights_BxT: jnp.ndarray,
                       epsilon: float):
  """Returns (smoothed loss sum, NLL sum, weight sum) over the real tokens, float32."""
  vocab_size = logits_BxTxV.shape[-1]
  logits_BxTxV = logits_BxTxV.astype(jnp.float32)
  log_z_BxT = jax.nn.logsumexp(logits_BxTxV, axis=-1)
  target_logit_BxT = jnp.take_along_axis(logits_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
  nll_BxT = log_z_BxT - target_logit_BxT
  if epsilon:
    confidence, low = 1.0 - epsilon, epsilon / (vocab_size - 1)
    # sum_v -log p_v = V log Z - sum_v logit_v
    sum_neg_logp_BxT = vocab_size * log_z_BxT - jnp.sum(logits_BxTxV, axis=-1)
    loss_BxT = confidence * nll_BxT + low * (sum_neg_logp_BxT - nll_BxT)
    loss_BxT = loss_BxT - smoothing_constant(vocab_size, epsilon)
  else:
    loss_BxT = nll_BxT
  weights_BxT = weights_BxT.astype(jnp.float32)
  return jnp.sum(loss_BxT * weights_BxT), jnp.sum(nll_BxT * weights_BxT), jnp.sum(weights_BxT)


def chunked_cross_entropy_sums(hidden_BxTxD: jnp.ndarray, project, targets_BxT: jnp.ndarray,
                               weights_BxT: jnp.ndarray, epsilon: float, chunk: int):
  """cross_entropy_sums(project(hidden), ...) computed `chunk` positions at a time.

  `project` maps hidden states [B, c, D] to logits [B, c, V] (the pre-softmax projection). Each
  chunk's logits live only inside a jax.checkpoint'ed scan step, so neither the forward nor the
  backward pass holds more than [B, chunk, V] of them; the batch axis is kept whole, so its
  sharding over the mesh is unchanged. T is padded to a multiple of `chunk` with weight 0.
  """
  batch, length, _ = hidden_BxTxD.shape
  pad = (-length) % chunk
  if pad:
    hidden_BxTxD = jnp.pad(hidden_BxTxD, ((0, 0), (0, pad), (0, 0)))
    targets_BxT = jnp.pad(targets_BxT, ((0, 0), (0, pad)))
    weights_BxT = jnp.pad(weights_BxT, ((0, 0), (0, pad)))
  n = (length + pad) // chunk
  # [n, B, chunk, ...]: the scan runs over the chunks of positions.
  hidden_NxBxCxD = jnp.moveaxis(hidden_BxTxD.reshape(batch, n, chunk, -1), 1, 0)
  targets_NxBxC = jnp.moveaxis(targets_BxT.reshape(batch, n, chunk), 1, 0)
  weights_NxBxC = jnp.moveaxis(weights_BxT.reshape(batch, n, chunk), 1, 0)

  @jax.checkpoint
  def one_chunk(h_BxCxD, t_BxC, w_BxC):
    return cross_entropy_sums(project(h_BxCxD), t_BxC, w_BxC, epsilon)

  def body(totals, xs):
    return jax.tree.map(jnp.add, totals, one_chunk(*xs)), None

  zero = jnp.zeros((), jnp.float32)
  totals, _ = jax.lax.scan(body, (zero, zero, zero), (hidden_NxBxCxD, targets_NxBxC, weights_NxBxC))
  return totals

