"""The word pointer (`model.word_pointer`, a deviation): the encoder's output at the next word
the decoder writes, projected and added to the decoder's input.

For a target that writes the source's words in order (a parser's leaves), the decoder's next
choices (which phrases to open before the next word, which to close after it) depend most on
that word in its context. Word positions (positional.py) let attention find it by a learned
index embedding, which the few long sentences train poorly; the pointer reads it exactly: the
next word's index (the words the decoder's inputs have written) selects the encoder output at
that word's first piece. Past the last word it reads nothing (zeros).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.model.positional import word_counts, word_start_mask
from transformer_jax.runtime.config import ModelConfig


def source_word_index(inputs_BxS, cfg: ModelConfig, segments_BxS=None) -> jnp.ndarray:
  """int32 [B, S]: the word index (from 0, per segment of a packed row) at each source token
  that begins a word, -1 at every other token (later pieces, EOS, padding)."""
  counts_BxS = word_counts(inputs_BxS, cfg.word_starts, cfg.vocab_size, segments_BxS)
  return jnp.where(word_start_mask(inputs_BxS, cfg.word_starts, cfg.vocab_size),
                   counts_BxS - 1, -1)


class WordPointer(nn.Module):
  """Maps the next word's index at each decoder position [B, T] to the projected encoder output
  at that word [B, T, d_model]. Incremental decoding projects the encoder output once, when the
  cache is made, and keeps it with the source's word indices under this module's cache (one per
  row, the same for every beam of a sentence, as the cross-attention keys/values)."""

  config: ModelConfig
  incremental: bool = False

  @nn.compact
  def __call__(self, next_word_BxT, encoded_BxSxD, inputs_BxS, source_segments_BxS=None,
               segments_BxT=None):
    cfg = self.config
    if self.incremental and self.has_variable("cache", "memory"):
      memory_BxSxD = self.get_variable("cache", "memory")
      words_BxS = self.get_variable("cache", "words")
    else:
      memory_BxSxD = nn.DenseGeneral(
          cfg.d_model, use_bias=False, dtype=cfg.dtype, param_dtype=jnp.float32,
          name="projection", kernel_init=nn.with_logical_partitioning(
              nn.initializers.xavier_uniform(), ("embed", None)))(encoded_BxSxD)
      words_BxS = source_word_index(inputs_BxS, cfg, source_segments_BxS)
      if self.incremental:
        self.variable("cache", "memory", lambda: memory_BxSxD)
        self.variable("cache", "words", lambda: words_BxS)
    pick_BxTxS = words_BxS[:, None, :] == next_word_BxT[:, :, None]
    if segments_BxT is not None and source_segments_BxS is not None:
      pick_BxTxS &= segments_BxT[:, :, None] == source_segments_BxS[:, None, :]
    out_BxTxD = jnp.einsum("bts,bsd->btd", pick_BxTxS.astype(memory_BxSxD.dtype), memory_BxSxD)
    return nn.with_logical_constraint(out_BxTxD, ("batch", "length", "embed"))
