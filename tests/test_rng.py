"""rng.unroll_threefry_on_cpu: the unrolled threefry lowering gives the same bits, without loops."""

import subprocess
import sys

import jax

from tests.common import REPO
from transformer_jax.runtime import rng

_MASKS = """
import jax, numpy as np, sys
{setup}
key = jax.random.fold_in(jax.random.key(7), 3)
f = jax.jit(lambda k: jax.random.bernoulli(k, 0.9, (3, 257, 33)))
print("".join("1" if b else "0" for b in np.asarray(f(key)).ravel()))
print("while" in f.lower(key).compile().as_text())
"""


def _masks(setup: str):
  p = subprocess.run([sys.executable, "-c", _MASKS.format(setup=setup)], cwd=REPO, check=True,
                     capture_output=True, text=True, timeout=120)
  bits, has_while = p.stdout.split()
  return bits, has_while == "True"


def test_unrolled_threefry_gives_the_same_dropout_masks_without_loops():
  rolled, rolled_while = _masks("")
  unrolled, unrolled_while = _masks("from transformer_jax.runtime import rng; assert rng.unroll_threefry_on_cpu()")
  assert rolled_while and not unrolled_while  # the change is real on this jax
  assert unrolled == rolled
  assert 0.85 < rolled.count("1") / len(rolled) < 0.95


def test_the_train_step_uses_it_unless_switched_off():
  from configs import tiny
  from transformer_jax.model import sharding
  from transformer_jax.training import step
  config = tiny.get_config()
  assert config.train.unroll_threefry_on_cpu
  mesh = sharding.make_mesh(config.mesh)
  step.jit_train_step(config, mesh, step.state_shardings(config, mesh)[1])
  assert rng.unroll_threefry_on_cpu()  # cached: registered by the step above
  key = jax.random.key(1)
  text = jax.jit(lambda k: jax.random.bits(k, (64,))).lower(key).compile().as_text()
  assert "while" not in text
