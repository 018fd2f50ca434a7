"""Weight matmuls as 2-D matrix products over flattened rows.

Every weight matmul in the model (the Q/K/V and output projections, the FFN, the pre-softmax
projection) multiplies activations [B, L, D] by a weight [D, F]. Written as a 3-D `dot_general`,
the weight gradient contracts over two dimensions (B and L); XLA then canonicalises that dot with
a transposed copy of the output gradient, one [F, B*L] copy per weight per step (1 GiB per step
for the base model at 8x128 on the CPU). Flattening [B, L] to B*L rows first (a free reshape of a
row-major array) makes every product, forward and backward, a plain 2-D matmul whose gradient
needs no copy. The contraction is the same, so the maths is unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rows_matmul(x_BxLxD: jax.Array, w_DxF: jax.Array, preferred_element_type=None) -> jax.Array:
  """x [..., D] @ w [D, F] -> [..., F], computed as one [rows, D] x [D, F] matmul."""
  *lead, d = x_BxLxD.shape
  y_RxF = jnp.dot(x_BxLxD.reshape(-1, d), w_DxF, preferred_element_type=preferred_element_type)
  return y_RxF.reshape(*lead, w_DxF.shape[-1])
