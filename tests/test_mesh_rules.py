"""Mesh and sharding rules, in-process on this machine's devices: mesh sizes, divisibility errors,
the logical-axis rules (DP, FSDP, Megatron TP) and the shardings they give the parameters.

The same training on 8 simulated devices is in test_sharding.py.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from tests.test_sharding import flat, tiny_mesh_config


def _fake_mesh(data, fsdp, tensor):
  return types.SimpleNamespace(shape={"data": data, "fsdp": fsdp, "tensor": tensor})


@pytest.mark.parametrize("mesh,devices,want", [
    ((-1, 1, 1), 8, (8, 1, 1)), ((2, -1, 2), 8, (2, 2, 2)), ((1, 1, -1), 4, (1, 1, 4)),
    ((2, 2, 2), 8, (2, 2, 2)), ((-1, 1, 1), 1, (1, 1, 1))])
def test_mesh_shape_resolves_the_rest(mesh, devices, want):
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  cfg = dict(zip(("data", "fsdp", "tensor"), mesh))
  assert sharding.mesh_shape(cfg, devices) == want


@pytest.mark.parametrize("mesh,devices,match", [
    ((2, 2, 1), 8, "multiply to 4, but there are 8 devices"),
    ((3, -1, 1), 8, "multiply to 3, which does not divide the 8 devices"),
    ((-1, -1, 1), 8, "at most one axis may be -1"),
    ((16, 1, 1), 8, "multiply to 16")])
def test_mesh_shape_errors(mesh, devices, match):
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.exceptions import ConfigError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match=match):
    sharding.mesh_shape(dict(zip(("data", "fsdp", "tensor"), mesh)), devices)


@pytest.mark.parametrize("change,mesh,match", [
    ({"num_heads": 6}, (1, 1, 4),
     "'model.num_heads'=6 is not divisible by the tensor-parallel size mesh.tensor=4"),
    ({"d_ff": 100}, (1, 1, 8), "'model.d_ff'=100"),
    ({"vocab_size": 1001}, (1, 1, 2), "'model.vocab_size'=1001"),
    ({"d_model": 36}, (1, 8, 1),
     "'model.d_model'=36 is not divisible by the FSDP size mesh.fsdp=8")])
def test_divisibility_errors(change, mesh, match):
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.exceptions import ConfigError  # pylint: disable=g-import-not-at-top
  config = tiny_mesh_config()
  for key, value in change.items():
    config.model[key] = value
  with pytest.raises(ConfigError, match=match.replace("(", r"\(")):
    sharding.check_divisibility(config, _fake_mesh(*mesh))
  sharding.check_divisibility(tiny_mesh_config(), _fake_mesh(*mesh))  # the tiny model divides 8


def test_batch_rows_and_padding():
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.exceptions import ConfigError  # pylint: disable=g-import-not-at-top
  mesh = _fake_mesh(2, 4, 2)
  sharding.check_batch_rows(16, mesh)
  with pytest.raises(ConfigError, match="12 rows, not divisible .* mesh.data\\*mesh.fsdp=8"):
    sharding.check_batch_rows(12, mesh)
  assert [sharding.padded_rows(n, mesh) for n in (1, 8, 9, 16)] == [8, 8, 16, 16]


def test_logical_rules_give_dp_fsdp_and_megatron_tp():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top

  def spec(*names, rules=sharding.LOGICAL_RULES):
    return nn.logical_to_mesh_axes(names, rules)

  # Activations: rows over both data-parallel axes; d_model whole; heads/d_ff/vocab over tensor.
  assert spec("batch", "length", "embed") == P(("data", "fsdp"), None, None)
  assert spec("batch", "length", "heads", "kv") == P(("data", "fsdp"), None, "tensor", None)
  assert spec("batch", "length", "mlp") == P(("data", "fsdp"), None, "tensor")
  assert spec("batch", "length", "vocab") == P(("data", "fsdp"), None, "tensor")
  # Parameters: d_model over fsdp (FSDP), Megatron column/row split over tensor.
  assert spec("embed", "heads", "kv") == P("fsdp", "tensor", None)
  assert spec("heads", "kv", "embed") == P("tensor", None, "fsdp")
  assert spec("embed", "mlp") == P("fsdp", "tensor")
  assert spec("mlp", "embed") == P("tensor", "fsdp")
  assert spec("vocab", "embed") == P("tensor", "fsdp")
  # Inference: weights whole along d_model, still split over tensor.
  assert spec("embed", "mlp", rules=sharding.INFERENCE_RULES) == P(None, "tensor")
  assert (spec("batch", "length", "embed", rules=sharding.INFERENCE_RULES)
          == P(("data", "fsdp"), None, None))


@pytest.mark.parametrize("pe_type,tie", [("sinusoidal", True), ("learned", False)])
def test_every_parameter_has_logical_axis_names(pe_type, tie):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.config import ModelConfig  # pylint: disable=g-import-not-at-top
  config = tiny_mesh_config()
  config.model.pe_type, config.model.tie_embeddings = pe_type, tie
  model_cfg = ModelConfig.from_config(config.model)
  boxed = sharding._abstract_params(model_cfg)  # pylint: disable=protected-access
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert len(leaves) > 20
  known = {name for name, _ in sharding.LOGICAL_RULES}
  for leaf in leaves:
    assert isinstance(leaf, nn.LogicallyPartitioned), leaf
    assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= known, leaf.names


def test_make_mesh_on_this_machine():
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import AxisType  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(tiny_mesh_config((-1, 1, 1)).mesh)
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  assert mesh.shape["data"] == jax.device_count() and mesh.devices.size == jax.device_count()
  assert all(t == AxisType.Auto for t in mesh.axis_types)  # flax's constraints need Auto axes


def test_param_shardings_for_inference_match_the_train_state():
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import step as step_lib
  config = tiny_mesh_config()
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  abstract, shardings = sharding.param_shardings(config, mesh)
  _, state_sh = step_lib.state_shardings(config, mesh)
  assert jax.tree.structure(shardings) == jax.tree.structure(state_sh.params)
  assert flat(shardings) == flat(state_sh.params)
  assert all(a.dtype == np.float32 and a.sharding is not None for a in jax.tree.leaves(abstract))
  _, inference = sharding.param_shardings(config, mesh, inference=True)
  assert tuple(flat(inference)["encoder.layer_0.ffn.wi.kernel"].spec) == (None, "tensor")
