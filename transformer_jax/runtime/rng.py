"""How the dropout PRNG (threefry2x32) is compiled on the CPU.

jax lowers threefry2x32 on the CPU with rolled loops, to keep compile times short, and XLA cannot
fuse those with the dropout mask; on TPU and GPU it emits the rounds unrolled and fused. Both
lowerings compute the same function, so the dropout masks are identical.

`unroll_threefry_on_cpu()` registers jax's own unrolled lowering for the CPU platform: cheaper
masks, longer compiles. It uses jax internals; if they have moved it returns False and changes
nothing. It is process-wide. `train.unroll_threefry_on_cpu=False` keeps jax's default.
"""

from __future__ import annotations

import functools

from absl import logging


@functools.cache
def unroll_threefry_on_cpu() -> bool:
  """Registers the unrolled threefry2x32 lowering for the CPU; True if it is in place."""
  try:
    from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
    from jax._src.random import threefry2x32  # pylint: disable=g-import-not-at-top
    mlir.register_lowering(threefry2x32.threefry2x32_p, threefry2x32._threefry2x32_lowering_rule,
                           platform="cpu")
  except (ImportError, AttributeError) as e:
    logging.warning("keeping jax's rolled threefry lowering on the CPU (%s)", e)
    return False
  return True
