"""Weight matmuls as 2-D matrix products over flattened rows.

Every weight matmul in the model multiplies activations [B, L, D] by a weight [D, F]. As a 3-D
`dot_general`, the weight gradient contracts over B and L, and XLA canonicalises it with a
transposed copy of the output gradient per weight per step. Flattening [B, L] to B*L rows first
(a free reshape) makes every product, forward and backward, a plain 2-D matmul with the same
contraction, so the maths is unchanged.

bfloat16 (`model.dtype='bfloat16'`): operands in bfloat16, accumulation in float32. The gradients
are written out (`_bf16_einsum`) so that every backward product has the row-major bfloat16
operands that XLA's CPU backend hands to its bfloat16 kernels; autodiff's mixed float32 x
bfloat16 products would silently run in float32 (docs/performance.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # x86 bfloat16 matrix units, as /proc/cpuinfo names them


def cpu_has_bf16_units(cpuinfo: str = "/proc/cpuinfo") -> bool | None:
  """Whether this x86 CPU has bfloat16 matrix units (its 'flags' line names one of
  BF16_CPU_FLAGS); None where that cannot be read (not Linux, not x86)."""
  try:
    with open(cpuinfo, encoding="utf-8", errors="replace") as f:
      flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
  except OSError:
    return None
  return None if flags is None else any(f in flags for f in BF16_CPU_FLAGS)


def slow_dtype_warning(dtype: str, cpuinfo: str = "/proc/cpuinfo",
                       backend: str | None = None) -> str | None:
  """A warning line when bfloat16 compute is asked for on a CPU without bfloat16 units, where it
  is slower than float32; None otherwise (backend: JAX's default)."""
  if (dtype != "bfloat16" or (backend or jax.default_backend()) != "cpu"
      or cpu_has_bf16_units(cpuinfo) is not False):
    return None
  return (f"model.dtype=bfloat16 on a CPU without bfloat16 matrix units ({cpuinfo} names none of "
          f"{', '.join(BF16_CPU_FLAGS)}): the multi30k step measured 1.41x slower than in "
          "float32 on such a CPU (experiments/results/bench_bf16/bfloat16_amd.md)")


def rows_matmul(x_BxLxD: jax.Array, w_DxF: jax.Array, preferred_element_type=None) -> jax.Array:
  """x [..., D] @ w [D, F] -> [..., F], computed as one [rows, D] x [D, F] matmul."""
  *lead, d = x_BxLxD.shape
  x_RxD = x_BxLxD.reshape(-1, d)
  if x_RxD.dtype == jnp.bfloat16 and w_DxF.dtype == jnp.bfloat16:
    y_RxF = einsum("rd,df->rf", x_RxD, w_DxF).astype(preferred_element_type or jnp.bfloat16)
  else:
    y_RxF = jnp.dot(x_RxD, w_DxF, preferred_element_type=preferred_element_type)
  return y_RxF.reshape(*lead, w_DxF.shape[-1])


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
  """`flax.linen.Dense(dot_general=...)`: its x @ kernel through `rows_matmul`."""
  (contract_lhs, contract_rhs), batch = dimension_numbers
  if tuple(contract_lhs) != (lhs.ndim - 1,) or tuple(contract_rhs) != (0,) or batch != ((), ()):
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
  return rows_matmul(lhs, rhs, preferred_element_type=preferred_element_type)


def _laid_out(x: jax.Array) -> jax.Array:
  """x itself, laid out row-major on the CPU (elsewhere the compiler chooses). The experimental
  layout API is imported only here, on the CPU: a jax that moved it costs the CPU's bfloat16
  kernels their operand layout, never an accelerator its import."""
  if jax.default_backend() != "cpu":
    return x
  try:
    from jax.experimental.layout import Layout, with_layout_constraint  # pylint: disable=g-import-not-at-top
  except ImportError:
    return x
  return with_layout_constraint(x, Layout(major_to_minor=tuple(range(x.ndim))))


def einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  """`jnp.einsum(spec, a, b)` with float32 accumulation (float32 out for bfloat16 operands), its
  bfloat16 gradients written out as the matmuls' (autodiff would multiply a float32 cotangent by
  a bfloat16 operand: a product the CPU's bfloat16 kernels do not take). Every index of an
  operand must appear in the other operand or the output."""
  if a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16:
    return _bf16_einsum(spec, a, b)
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bf16_einsum(spec, a, b):
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _bf16_einsum_fwd(spec, a, b):
  return _bf16_einsum(spec, a, b), (a, b)


def _bf16_einsum_bwd(spec, saved, g):
  a, b = saved
  inputs, out = spec.split("->")
  sa, sb = inputs.split(",")
  g = g.astype(jnp.bfloat16)
  return (_batched_matmul(g, out, b, sb, sa).astype(a.dtype),
          _batched_matmul(a, sa, g, out, sb).astype(b.dtype))


def _batched_matmul(x, xs: str, y, ys: str, out: str) -> jax.Array:
  """einsum(f'{xs},{ys}->{out}', x, y) as a batched [M, K] x [K, N] product of operands laid out
  so (batch, free, contracted) and (batch, contracted, free), float32 out: the form the CPU's
  bfloat16 kernels take (XLA would fold a plain transpose into the dot's dimension numbers)."""
  batch = [c for c in xs if c in ys and c in out]
  contracted = [c for c in xs if c in ys and c not in out]
  x_free, y_free = [c for c in xs if c not in ys], [c for c in ys if c not in xs]
  xs2, ys2 = "".join(batch + x_free + contracted), "".join(batch + contracted + y_free)
  x2, y2 = (_laid_out(jnp.einsum(f"{s}->{s2}", v)) if s != s2 else v
            for v, s, s2 in ((x, xs, xs2), (y, ys, ys2)))
  res = "".join(batch + x_free + y_free)
  return jnp.einsum(f"{res}->{out}", jnp.einsum(f"{xs2},{ys2}->{res}", x2, y2,
                                                 preferred_element_type=jnp.float32))


_bf16_einsum.defvjp(_bf16_einsum_fwd, _bf16_einsum_bwd)
