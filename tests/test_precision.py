"""Mixed precision (bf16 compute): what stays float32, checked on CPU; the TPU/GPU presets.

bfloat16 run: parameters, gradients and Adam's moments float32; matmuls take bfloat16; attention
logits and softmax, LayerNorm statistics and the logits/loss are float32.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from transformer_jax.model import sharding
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime.config import ModelConfig, validate
from transformer_jax.training import step as step_lib

# Element-wise and reduction primitives that make up softmax, log-softmax and LayerNorm.
STATISTICS_PRIMITIVES = ("exp", "log", "log1p", "reduce_sum", "reduce_max", "rsqrt", "sqrt",
                         "square", "integer_pow", "div")


def _tiny(dtype="bfloat16", attention_impl="einsum"):
  from configs import tiny  # pylint: disable=g-import-not-at-top
  c = tiny.get_config()
  c.model.dtype = dtype
  c.model.attention_impl = attention_impl
  c.model.num_encoder_layers = c.model.num_decoder_layers = 1
  return c


def _batch(rows=4, length=10, vocab=1000):
  rng = np.random.default_rng(0)
  inputs = rng.integers(3, vocab, (rows, length)).astype(np.int32)
  targets = rng.integers(3, vocab, (rows, length)).astype(np.int32)
  targets[0, -3:] = 0
  return {"inputs": inputs, "targets": targets}


def _primitive_dtypes(closed_jaxpr) -> collections.Counter:
  """(primitive, input dtypes) -> count over the jaxpr and every sub-jaxpr (pjit, custom_jvp)."""
  counts = collections.Counter()

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      dtypes = tuple(str(v.aval.dtype) for v in eqn.invars if hasattr(v.aval, "dtype"))
      counts[(eqn.primitive.name, dtypes)] += 1
      for value in eqn.params.values():
        for sub in (value if isinstance(value, (tuple, list)) else [value]):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            walk(inner)
  walk(closed_jaxpr.jaxpr)
  return counts


def _train_one_step(config):
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  _, state_sh = step_lib.state_shardings(config, mesh)
  state = step_lib.create_state(config, mesh, state_sh)
  train_fn = step_lib.jit_train_step(config, mesh, state_sh)
  return train_fn(state, sharding.global_batch(mesh, _batch()))


def test_bf16_run_keeps_params_and_adam_state_float32():
  state, metrics = _train_one_step(_tiny("bfloat16"))
  _, metrics32 = _train_one_step(_tiny("float32"))
  floats = [x for x in jax.tree.leaves((state.params, state.opt_state))
            if jnp.issubdtype(x.dtype, jnp.floating)]
  assert floats and all(x.dtype == jnp.float32 for x in floats)
  for key in ("loss_sum", "nll_sum", "grad_norm"):
    assert metrics[key].dtype == jnp.float32, key
  assert np.isfinite(float(metrics["loss_sum"]))
  # bf16 compute changes the loss only at bf16 precision.
  assert float(metrics["loss_sum"]) == pytest.approx(float(metrics32["loss_sum"]), rel=2e-2)


@pytest.mark.parametrize("attention_impl", ["einsum", "dot_product_attention"])
def test_bf16_forward_has_bf16_matmuls_and_float32_statistics(attention_impl):
  cfg = ModelConfig.from_config(_tiny("bfloat16", attention_impl).model)
  model = Transformer(cfg)
  ids = jnp.asarray(_batch()["inputs"])
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), ids, ids)["params"])
  jaxpr = jax.make_jaxpr(lambda p: model.apply({"params": p}, ids, ids))(params)
  counts = _primitive_dtypes(jaxpr)

  assert jaxpr.out_avals[0].dtype == jnp.float32  # logits
  matmuls = {d: n for (p, d), n in counts.items() if p == "dot_general"}
  assert matmuls and all(d == ("bfloat16", "bfloat16") for d in matmuls), matmuls
  low_precision_stats = {(p, d): n for (p, d), n in counts.items()
                         if p in STATISTICS_PRIMITIVES and "bfloat16" in d}
  assert not low_precision_stats, low_precision_stats
  # The statistics are there (softmax: exp + reduce_max; LayerNorm: reduce_sum + rsqrt).
  for prim in ("exp", "reduce_max", "reduce_sum", "rsqrt"):
    assert counts[(prim, ("float32",))] > 0, prim


@pytest.mark.parametrize("path,arg,impl,d_model,peak", [
    ("configs/tpu.py", "base", "einsum", 512, 197e12),
    ("configs/tpu.py", "big,v5p", "einsum", 1024, 459e12),
    ("configs/gpu.py", "base", "dot_product_attention", 512, 989e12),
    ("configs/gpu.py", "big,a100", "dot_product_attention", 1024, 312e12),
    ("configs/gpu.py", "base,h100,cudnn", "cudnn", 512, 989e12)])
def test_presets(path, arg, impl, d_model, peak):
  import importlib  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(path[:-3].replace("/", "."))
  c = validate(module.get_config(arg))
  assert c.model.dtype == "bfloat16" and c.model.attention_impl == impl
  assert c.model.d_model == d_model and c.train.peak_flops == peak
  assert (c.mesh.data, c.mesh.fsdp, c.mesh.tensor) == (-1, 1, 1)
  # cuDNN's kernel needs per-row lengths: bucketed rows; otherwise packed rows (measured better)
  assert c.data.batch_mode == ("bucket" if impl == "cudnn" else "pack")
  with pytest.raises(ValueError, match="base' or 'big"):
    module.get_config("huge")


def _bf16_values(rng, shape):
  """Random values that bfloat16 holds exactly (so float32 references see the same inputs)."""
  return jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)


def _rel(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("spec,shapes", [
    ("rows", ((3, 7, 24), (24, 40))),                                   # rows_matmul
    ("btnk,bsnk->bnts", ((2, 5, 3, 8), (2, 6, 3, 8))),                  # attention logits
    ("bnts,bsnv->btnv", ((2, 3, 5, 6), (2, 6, 3, 4)))])                 # attention x values
def test_bf16_products_and_their_written_out_gradients_match_float32(spec, shapes):
  # matmul.py writes the bfloat16 gradients out (for the CPU's bfloat16 kernels): they must be
  # the float32 gradients up to bfloat16 rounding of the cotangent and of the outputs.
  from transformer_jax.model import matmul  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  a, b = (_bf16_values(rng, s) for s in shapes)
  if spec == "rows":
    fn = lambda x, y: matmul.rows_matmul(x, y, preferred_element_type=jnp.float32)  # noqa: E731
    ref = lambda x, y: jnp.dot(x, y)  # noqa: E731
  else:
    fn = lambda x, y: matmul.einsum(spec, x, y)  # noqa: E731
    ref = lambda x, y: jnp.einsum(spec, x, y)  # noqa: E731
  out, vjp = jax.vjp(fn, a, b)
  a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
  out32, vjp32 = jax.vjp(ref, a32, b32)
  assert out.dtype == jnp.float32 and _rel(out, out32) < 1e-6  # float32 accumulation
  g = jnp.asarray(rng.standard_normal(out.shape), jnp.float32)
  grads, grads32 = vjp(g), vjp32(g)
  for got, want, x in zip(grads, grads32, (a, b)):
    assert got.dtype == jnp.bfloat16 and got.shape == x.shape
    assert _rel(got, want) < 1e-2, _rel(got, want)  # bfloat16: 8 bits of mantissa


def test_bf16_backward_multiplies_only_bfloat16_operands():
  # Autodiff would multiply float32 cotangents by bfloat16 operands (a product XLA's CPU backend
  # computes in float32, at a fraction of the bfloat16 kernels' speed): every product of the
  # gradient, forward and backward, takes two bfloat16 operands.
  cfg = ModelConfig.from_config(_tiny("bfloat16").model)
  model = Transformer(cfg)
  ids = jnp.asarray(_batch()["inputs"])
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), ids, ids)["params"])
  grad = jax.grad(lambda p: model.apply({"params": p}, ids, ids).sum())
  matmuls = {d: n for (p, d), n in _primitive_dtypes(jax.make_jaxpr(grad)(params)).items()
             if p == "dot_general"}
  assert matmuls and set(matmuls) == {("bfloat16", "bfloat16")}, matmuls


def test_bfloat16_on_a_cpu_without_bfloat16_units_is_warned_about(tmp_path):
  """matmul.slow_dtype_warning: bfloat16 compute on an x86 CPU whose flags name no bfloat16 unit
  (measured 1.41x slower than float32 there) gets a warning; with AMX or AVX512-BF16, in
  float32, or where the flags cannot be read (another OS or architecture), none."""
  from transformer_jax.model import matmul  # pylint: disable=g-import-not-at-top
  def cpuinfo(flags):
    path = tmp_path / f"cpuinfo_{len(flags)}"
    path.write_text("processor\t: 0\nmodel name\t: X\n" + (f"flags\t\t: {flags}\n" if flags else "")
                    + "\nprocessor\t: 1\n")
    return str(path)
  avx2 = cpuinfo("fpu sse2 avx fma avx2")
  assert matmul.cpu_has_bf16_units(avx2) is False
  assert matmul.cpu_has_bf16_units(cpuinfo("avx2 avx512f avx512_bf16 amx_tile amx_bf16")) is True
  assert matmul.cpu_has_bf16_units(cpuinfo("")) is None  # e.g. ARM: 'Features', no 'flags'
  assert matmul.cpu_has_bf16_units(str(tmp_path / "missing")) is None
  line = matmul.slow_dtype_warning("bfloat16", avx2, backend="cpu")
  assert line.startswith("model.dtype=bfloat16 on a CPU without bfloat16 matrix units"), line
  assert matmul.slow_dtype_warning("float32", avx2, backend="cpu") is None
  assert matmul.slow_dtype_warning("bfloat16", cpuinfo("avx512_bf16"), backend="cpu") is None
  assert matmul.slow_dtype_warning("bfloat16", avx2, backend="gpu") is None
