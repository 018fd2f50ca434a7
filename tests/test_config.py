"""The run-config validator, the one override parser and config-file loading."""

import os
import subprocess
import sys

import pytest

from tests.common import REPO
from transformer_jax.runtime import overrides
from transformer_jax.runtime.config import default_config, validate
from transformer_jax.runtime.exceptions import ConfigError


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
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  width_of = {"vocab": "vocab_size", "heads": "num_heads", "mlp": "d_ff", "embed": "d_model",
              "kv": "d_k", "pos": "max_len"}
  split = {}
  for logical, mesh_axes in sharding.LOGICAL_RULES:
    axes = mesh_axes if isinstance(mesh_axes, tuple) else (mesh_axes,)
    for axis in axes:
      if axis in ("tensor", "fsdp") and logical in width_of:
        split.setdefault(axis, set()).add(width_of[logical])
  from transformer_jax.runtime.config import SHARDED_DIMS  # pylint: disable=g-import-not-at-top
  assert split == {axis: set(names) for axis, _, names in SHARDED_DIMS}


# ----------------------------------------------------------------------------- the one override parser

def test_overrides_are_typed_by_the_schema():
  out = overrides.parse_overrides(["--config.train.num_steps=50", "model.pre_ln=true",
                                    "--config.train.learning_rate_scale=2", "--config.data.dataset=x"])
  assert out == {"train.num_steps": 50, "model.pre_ln": True, "train.learning_rate_scale": 2.0,
                 "data.dataset": "x"}
  assert isinstance(out["train.learning_rate_scale"], float)
  c = overrides.apply_overrides(default_config(), out)
  assert c.train.num_steps == 50 and c.model.pre_ln is True


@pytest.mark.parametrize("arg,match", [
    ("--config.model.d_modle=64", r"unknown config key 'model.d_modle' \(did you mean 'd_model'\?\)"),
    ("--config.modle.d_model=64", r"unknown config key 'modle' \(did you mean 'model'\?\)"),
    ("--config.model.pre_ln=ture", "config key 'model.pre_ln' must be bool, got 'ture'"),
    ("--config.train.num_steps=1.5", "config key 'train.num_steps' must be int"),
    ("--config.model=3", "config key 'model' is a section"),
    ("--config.model.d_model", "must look like --config.section.key=value"),
])
def test_override_mistakes_are_one_line(arg, match):
  with pytest.raises(ConfigError, match=match) as e:
    overrides.parse_overrides([arg])
  assert "\n" not in str(e.value)


def test_config_file_mistakes_name_the_file_and_the_reason(tmp_path):
  broken = tmp_path / "broken.py"
  broken.write_text("def get_config(:\n  pass\n")
  raising = tmp_path / "raising.py"
  raising.write_text("def get_config(variant=''):\n  raise ValueError(f'unknown variant {variant!r}')\n")
  cases = [("configs/nope.py", "config file configs/nope.py not found"),
           (str(broken), f"config file {broken}, line 1: syntax error"),
           (f"{raising}:long", "ValueError: unknown variant 'long'"),
           ("configs/multi30k.py:long", "unknown variant 'long'")]
  for spec, match in cases:
    with pytest.raises(ConfigError) as e:
      overrides.load_config_file(spec)
    assert match in str(e.value) and "\n" not in str(e.value), (spec, str(e.value))


def test_multi30k_fast_cpu_variant_changes_only_the_regularisation():
  """`configs/multi30k.py:fast_cpu` is the recipe with dropout 0.3 and weight decay 0.2 (lever 36)."""
  from transformer_jax.runtime.dotted import flatten  # pylint: disable=g-import-not-at-top
  fast_config = overrides.load_config_file("configs/multi30k.py:fast_cpu")
  validate(fast_config)
  base, fast = flatten(overrides.load_config_file("configs/multi30k.py")), flatten(fast_config)
  changed = {key: (value, fast[key]) for key, value in base.items() if fast[key] != value}
  assert changed == {"model.dropout_rate": (0.2, 0.3), "train.weight_decay": (0.1, 0.2)}


def test_a_colon_in_a_folder_name_is_part_of_the_path(tmp_path):
  folder = tmp_path / "runs:v2"
  folder.mkdir()
  (folder / "cfg.py").write_text("from configs import multi30k\n\n\ndef get_config(variant=''):\n"
                                 "  return multi30k.get_config(variant) if variant else "
                                 "multi30k.get_config()\n")
  path = str(folder / "cfg.py")
  assert overrides.split_variant(path) == (path, "")
  assert overrides.split_variant(path + ":short") == (path, "short")
  assert overrides.split_variant("configs/multi30k.py:short") == ("configs/multi30k.py", "short")
  assert overrides.load_config_file(path).train.num_steps == overrides.load_config_file(
      "configs/multi30k.py").train.num_steps


@pytest.mark.parametrize("key,value,match", [
    ("seed", -1, "'seed' must be in"), ("seed", 2**40, "'seed' must be in"),
    ("decode.alpha", float("nan"), "finite"), ("train.peak_flops", float("inf"), "finite")])
def test_values_outside_a_fields_domain_are_refused(key, value, match):
  config = default_config()
  overrides.apply_overrides(config, {key: value})
  with pytest.raises(ConfigError, match=match):
    validate(config)


@pytest.mark.parametrize("args,expected", [
    (["--config=configs/tiny.py", "--config.model.d_modle=64"], "did you mean 'd_model'"),
    (["--config=configs/no_such.py"], "no_such.py"),
    (["--config=configs/tiny.py", "--step=3"], "--step is not for --mode=train"),
    (["--mode=eval", "--split=dev"], "--split=dev"),
])
def test_cli_mistakes_in_flags_and_config_are_reported_before_jax_starts(tmp_path, args, expected):
  """A `jax` that cannot be imported shadows the real one: the error is the user's, one line."""
  poisoned = tmp_path / "jax"
  poisoned.mkdir()
  (poisoned / "__init__.py").write_text("raise ImportError('jax was imported')\n")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
  result = subprocess.run([sys.executable, "-m", "transformer_jax.main",
                           f"--workdir={tmp_path / 'run'}", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
  assert lines[0].startswith("error:") and expected in lines[0], lines
  assert not (tmp_path / "run").exists()
