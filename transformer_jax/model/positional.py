"""Positional encodings (paper §3.5): the fixed sinusoids and the learned table of Table 3 row E;
and word positions (`model.word_positions`, a deviation), a learned embedding of word indices.

PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)),
interleaved as in the paper (tensor2tensor concatenates them: a fixed permutation of the same).
Sinusoids cover any length a decoder is built for, so the output limit "input length + 50"
holds for every input; a learned table has exactly `max_len` rows.
"""

from __future__ import annotations

import flax.linen as nn
import jax
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


def word_start_mask(ids_BxL: jnp.ndarray, word_starts: tuple[int, ...],
                    vocab_size: int) -> jnp.ndarray:
  """bool [B, L]: whether each token begins a word (its id is in `word_starts`)."""
  starts_V = np.zeros([vocab_size], bool)
  starts_V[list(word_starts)] = True
  return jnp.take(jnp.asarray(starts_V), ids_BxL, axis=0)


def word_counts(ids_BxL: jnp.ndarray, word_starts: tuple[int, ...], vocab_size: int,
                segments_BxL: jnp.ndarray | None = None) -> jnp.ndarray:
  """int32 [B, L]: how many tokens that begin a word (ids in `word_starts`) lie at or before each
  position, counted afresh in every segment of a packed row."""
  is_start_BxL = word_start_mask(ids_BxL, word_starts, vocab_size).astype(jnp.int32)
  count_BxL = jnp.cumsum(is_start_BxL, axis=1)
  if segments_BxL is None:
    return count_BxL
  first_BxL = segments_BxL != jnp.pad(segments_BxL, ((0, 0), (1, 0)))[:, :-1]
  # the count before each segment's first token: non-decreasing along the row, so a running max
  before_BxL = jax.lax.cummax(jnp.where(first_BxL, count_BxL - is_start_BxL, 0), axis=1)
  return count_BxL - before_BxL


class WordPositions(nn.Module):
  """`model.word_positions`: a learned embedding of word indices, added to the token embeddings
  of both stacks (one table). A source token gets the index of its word; a decoder position the
  index of the next word to be written (the words its inputs have written so far). When the
  target writes the source's words in order (a parser's leaves), attention can find the next
  word by its index instead of by its spelling, which repeats ('$', ',', 'million'). The table
  is scaled as the scaled token embeddings (unit variance); indices past it take its last row."""

  config: ModelConfig

  @nn.compact
  def __call__(self, indices_BxL: jnp.ndarray) -> jnp.ndarray:
    cfg = self.config
    table_LxD = self.param(
        "word_embedding",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0), ("pos", "embed")),
        (cfg.max_len, cfg.d_model), jnp.float32)
    return jnp.take(table_LxD, indices_BxL, axis=0, mode="clip").astype(cfg.dtype)
