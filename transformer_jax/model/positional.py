"""Positional encodings (paper §3.5): the fixed sinusoids and the learned table of Table 3 row E.

PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)),
interleaved as in the paper (tensor2tensor concatenates them: a fixed permutation of the same).
Sinusoids cover any length a decoder is built for, so the output limit "input length + 50"
holds for every input; a learned table has exactly `max_len` rows.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from transformer_jax.runtime.config import ModelConfig


def sinusoidal_table(max_len: int, d_model: int) -> np.ndarray:
  """The paper's encoding for positions 0..max_len-1, float32 [max_len, d_model]."""
  pos_Lx1 = np.arange(max_len, dtype=np.float64)[:, None]
  two_i = np.arange(0, d_model, 2, dtype=np.float64)
  angle_LxH = pos_Lx1 / np.power(10000.0, two_i / d_model)
  pe_LxD = np.zeros((max_len, d_model), dtype=np.float64)
  pe_LxD[:, 0::2] = np.sin(angle_LxH)
  pe_LxD[:, 1::2] = np.cos(angle_LxH)
  return pe_LxD.astype(np.float32)


class PositionalEncoding(nn.Module):
  """Maps integer positions [B, L] to encodings [B, L, d_model] to add to the embeddings."""

  config: ModelConfig
  length: int = 0  # positions to cover beyond model.max_len (sinusoids only): a decode buffer

  @nn.compact
  def __call__(self, positions_BxL: jnp.ndarray) -> jnp.ndarray:
    cfg = self.config
    if cfg.pe_type == "sinusoidal":
      table_LxD = jnp.asarray(sinusoidal_table(max(cfg.max_len, self.length), cfg.d_model))
    else:  # 'learned' (Table 3 row E)
      table_LxD = self.param(
          "pos_embedding",
          nn.with_logical_partitioning(nn.initializers.normal(stddev=cfg.d_model**-0.5),
                                       ("pos", "embed")),
          (cfg.max_len, cfg.d_model), jnp.float32)
    # Positions past the table are padding only (real ones are validated against max_len): they
    # take the last row rather than jnp.take's NaN fill, which masks would turn into 0 * NaN.
    return jnp.take(table_LxD, positions_BxL, axis=0, mode="clip").astype(cfg.dtype)
