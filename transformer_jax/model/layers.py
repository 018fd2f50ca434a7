"""The encoder and decoder layers (paper §3.1) and the position-wise FFN (§3.3).

Post-LN, as the paper: x = LayerNorm(x + Dropout(Sublayer(x))). Pre-LN (`pre_ln=True`, a named
deviation): x = x + Dropout(Sublayer(LayerNorm(x))), with a final LayerNorm on each stack
(transformer.py).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.model.attention import MultiHeadAttention
from transformer_jax.model.matmul import dense_dot_general
from transformer_jax.runtime.config import ModelConfig


def layer_norm(cfg: ModelConfig, name: str) -> nn.LayerNorm:
  # Flax computes the statistics in float32 even for a bfloat16 compute dtype.
  return nn.LayerNorm(epsilon=cfg.layer_norm_epsilon, dtype=cfg.dtype, param_dtype=jnp.float32,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
                      name=name)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2, inner size d_ff."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, deterministic=True):
    cfg = self.config
    init = nn.initializers.xavier_uniform()
    batch, length, _ = x_BxLxD.shape
    # Dense over B*L rows: 2-D matmuls, whose weight gradients need no transposed copy (matmul.py).
    h_RxF = nn.Dense(
        cfg.d_ff, dtype=cfg.dtype, param_dtype=jnp.float32, name="wi",
        dot_general=dense_dot_general,
        kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(
            x_BxLxD.reshape(batch * length, -1))
    h_BxLxF = nn.relu(h_RxF).reshape(batch, length, cfg.d_ff)
    h_BxLxF = nn.with_logical_constraint(h_BxLxF, ("batch", "length", "mlp"))
    h_BxLxF = nn.Dropout(cfg.relu_dropout_rate)(h_BxLxF, deterministic=deterministic)
    out_RxD = nn.Dense(
        cfg.d_model, dtype=cfg.dtype, param_dtype=jnp.float32, name="wo",
        dot_general=dense_dot_general,
        kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(
            h_BxLxF.reshape(batch * length, cfg.d_ff))
    return nn.with_logical_constraint(out_RxD.reshape(batch, length, cfg.d_model),
                                      ("batch", "length", "embed"))


class SublayerConnection(nn.Module):
  """Residual connection + dropout + LayerNorm around one sub-layer, post-LN or pre-LN."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, sublayer, deterministic=True):
    cfg = self.config
    norm = layer_norm(cfg, "norm")
    y_BxLxD = sublayer(norm(x_BxLxD) if cfg.pre_ln else x_BxLxD)
    y_BxLxD = nn.Dropout(cfg.dropout_rate)(y_BxLxD, deterministic=deterministic)
    out_BxLxD = x_BxLxD + y_BxLxD
    return out_BxLxD if cfg.pre_ln else norm(out_BxLxD)


class EncoderLayer(nn.Module):
  """Self-attention, then FFN; each wrapped in a SublayerConnection."""

  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxSxD, mask_Bx1xSxS, deterministic=True):
    cfg = self.config
    attn = MultiHeadAttention(cfg, kind="self", name="self_attention")
    x_BxSxD = SublayerConnection(cfg, name="attention_block")(
        x_BxSxD, lambda h: attn(h, h, mask_Bx1xSxS, deterministic), deterministic)
    ffn = FeedForward(cfg, name="ffn")
    return SublayerConnection(cfg, name="ffn_block")(
        x_BxSxD, lambda h: ffn(h, deterministic), deterministic)


class DecoderLayer(nn.Module):
  """Masked self-attention, cross-attention over the encoder output, then FFN."""

  config: ModelConfig
  incremental: bool = False
  max_decode_len: int = 0
  beam_size: int = 1  # decoding: rows are sentences x beams (row b*beam_size + j)

  @nn.compact
  def __call__(self, y_BxTxD, encoded_BxSxD, self_mask, cross_mask, deterministic=True):
    cfg = self.config
    self_attn = MultiHeadAttention(cfg, kind="self", incremental=self.incremental,
                                   max_decode_len=self.max_decode_len, beam_size=self.beam_size,
                                   name="self_attention")
    y_BxTxD = SublayerConnection(cfg, name="self_attention_block")(
        y_BxTxD, lambda h: self_attn(h, h, self_mask, deterministic), deterministic)
    cross_attn = MultiHeadAttention(cfg, kind="cross", incremental=self.incremental,
                                    name="cross_attention")
    y_BxTxD = SublayerConnection(cfg, name="cross_attention_block")(
        y_BxTxD, lambda h: cross_attn(h, encoded_BxSxD, cross_mask, deterministic), deterministic)
    ffn = FeedForward(cfg, name="ffn")
    return SublayerConnection(cfg, name="ffn_block")(
        y_BxTxD, lambda h: ffn(h, deterministic), deterministic)
