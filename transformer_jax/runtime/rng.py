"""How the dropout PRNG (threefry2x32) is compiled on the CPU.

jax lowers threefry2x32 on the CPU with rolled loops, to keep compile times short: five `while`
iterations over the whole array, each writing its u32 operands to memory, which XLA cannot fuse
with the dropout mask. On TPU and GPU jax emits the 20 rounds unrolled, and XLA fuses them with
the mask and the select. Both lowerings compute the same function, so the random bits, and the
dropout masks, are identical.

Unrolled, the masks cost a fraction of what the rolled loops cost on the CPU; the price is
compile time. Measurements: experiments/results/archive/bench_summary.md.

`unroll_threefry_on_cpu()` registers jax's own unrolled lowering for the CPU platform. It uses jax
internals (`jax._src.random.threefry2x32`, `jax._src.interpreters.mlir`); if they have moved it
returns False and changes nothing. It is process-wide: every computation lowered afterwards uses
it. `train.unroll_threefry_on_cpu=False` keeps jax's default.
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
