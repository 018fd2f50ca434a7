"""Weight matmuls as 2-D matrix products over flattened rows.

Every weight matmul in the model (the Q/K/V and output projections, the FFN, the pre-softmax
projection) multiplies activations [B, L, D] by a weight [D, F]. Written as a 3-D `dot_general`,
the weight gradient contracts over two dimensions (B and L); XLA then canonicalises that dot with
a transposed copy of the output gradient, one [F, B*L] copy per weight per step (1 GiB per step
for the base model at 8x128 on the CPU). Flattening [B, L] to B*L rows first (a free reshape of a
row-major array) makes every product, forward and backward, a plain 2-D matmul whose gradient
needs no copy. The contraction is the same, so the maths is unchanged.

bfloat16 compute (`model.dtype='bfloat16'`): the products take bfloat16 operands, accumulate in
float32 and return the compute dtype (float32 where asked: the logits, the attention logits).
Their gradients are written out (`_bf16_einsum`) so that every product of the
backward pass is one that XLA's CPU backend hands to its bfloat16 kernels (YNNPACK, on AMX or
AVX512-BF16 units). Those take [M, K] x [K, N] operands laid out row-major and bfloat16 on both
sides; autodiff would instead multiply a float32 cotangent by a bfloat16 operand, and contract
the weight gradient x^T g over x's leading dimension, and XLA silently computes both in float32
(or, for some batched forms, fails at run time). Here the cotangent is rounded to bfloat16 and
the transposed operand is copied to row-major first (a cheap copy; a layout constraint on the
CPU only, TPU and GPU compilers pick their own layouts). What it buys: time_to_quality.md.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.layout import Layout, with_layout_constraint


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
  is slower than float32 (the multi30k step 1.41x slower on an AMD EPYC with AVX2 only:
  experiments/results/bench_bf16/bfloat16_amd.md); None otherwise (backend: JAX's default)."""
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
  """x itself, laid out row-major on the CPU (elsewhere the compiler chooses)."""
  if jax.default_backend() != "cpu":
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
