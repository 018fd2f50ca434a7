"""The run-config validator: model widths against the fixed mesh axes that split them."""

import pytest

from transformer_jax.config import ConfigError, default_config, validate


@pytest.mark.parametrize("mesh,model,match", [
    ({"tensor": 8}, {"num_heads": 4},
     "config key 'model.num_heads'=4 is not divisible by the tensor-parallel size mesh.tensor=8"),
    ({"tensor": 4}, {"d_ff": 1026}, "config key 'model.d_ff'=1026 is not divisible"),
    ({"tensor": 8}, {"vocab_size": 37001}, "config key 'model.vocab_size'=37001 is not divisible"),
    ({"fsdp": 3}, {}, "config key 'model.d_model'=512 is not divisible by the FSDP size mesh.fsdp=3"),
])
def test_width_not_divisible_by_its_mesh_axis_names_the_key(mesh, model, match):
  c = default_config()
  c.mesh.update(mesh)
  c.model.update(model)
  with pytest.raises(ConfigError, match=match) as e:
    validate(c)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("mesh,model", [
    ({"tensor": 8}, {}),                        # h=8, d_ff=2048, vocab 37000
    ({"tensor": 4}, {"d_k": 3, "d_v": 5}),      # d_k, d_v are never split
    ({"fsdp": 4}, {"num_heads": 3, "d_ff": 7}),  # fsdp splits d_model only
    ({"data": 1, "tensor": -1}, {"num_heads": 7}),  # -1: sized and checked once the mesh exists
])
def test_widths_that_split_evenly_pass(mesh, model):
  c = default_config()
  c.mesh.update(mesh)
  c.model.update(model)
  assert validate(c) is c


def test_sharded_dims_follow_the_sharding_rules():
  """config.SHARDED_DIMS restates which widths sharding.LOGICAL_RULES splits; they must agree."""
  from transformer_jax import sharding  # pylint: disable=g-import-not-at-top
  width_of = {"vocab": "vocab_size", "heads": "num_heads", "mlp": "d_ff", "embed": "d_model",
              "kv": "d_k", "pos": "max_len"}
  split = {}
  for logical, mesh_axes in sharding.LOGICAL_RULES:
    axes = mesh_axes if isinstance(mesh_axes, tuple) else (mesh_axes,)
    for axis in axes:
      if axis in ("tensor", "fsdp") and logical in width_of:
        split.setdefault(axis, set()).add(width_of[logical])
  from transformer_jax.config import SHARDED_DIMS  # pylint: disable=g-import-not-at-top
  assert split == {axis: set(names) for axis, _, names in SHARDED_DIMS}
