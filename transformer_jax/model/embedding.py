"""Token embeddings (paper §3.4): one matrix shared by the source embedding, the target
embedding and the pre-softmax projection, with the embeddings multiplied by sqrt(d_model).

`tie_embeddings=False` gives three separate matrices (a named deviation).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.model.matmul import rows_matmul
from transformer_jax.runtime.config import ModelConfig


class Embedding(nn.Module):
  """`embed(ids)` -> sqrt(d_model) * E[ids]; `attend(x)` -> x E^T (logits over the vocabulary)."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.table_VxD = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=cfg.d_model**-0.5),
                                     ("vocab", "embed")),
        (cfg.vocab_size, cfg.d_model), jnp.float32)

  def embed(self, ids_BxL: jnp.ndarray) -> jnp.ndarray:
    cfg = self.config
    table_VxD = nn.with_logical_constraint(self.table_VxD, ("vocab", None))  # gathered over fsdp
    x_BxLxD = jnp.take(table_VxD, ids_BxL, axis=0).astype(cfg.dtype)
    return x_BxLxD * jnp.asarray(cfg.d_model**0.5, cfg.dtype)

  def attend(self, x_BxLxD: jnp.ndarray) -> jnp.ndarray:
    cfg = self.config
    with jax.named_scope("vocab_projection"):
      return rows_matmul(x_BxLxD.astype(cfg.dtype), self.table_VxD.astype(cfg.dtype).T,
                         preferred_element_type=jnp.float32)
