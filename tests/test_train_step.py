"""The jitted train step: gradient accumulation is exact, dropout depends on (seed, step) only."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from transformer_jax.model import sharding
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.training import step


def _config(accum=1, dropout=0.0):
  c = tiny.get_config()
  c.model.vocab_size = 64
  c.model.d_model, c.model.d_ff, c.model.num_heads, c.model.d_k, c.model.d_v = 32, 64, 2, 16, 16
  c.model.num_encoder_layers = c.model.num_decoder_layers = 1
  c.model.dropout_rate = dropout
  c.train.grad_accum_steps = accum
  return c


def _batch(rng, rows, length=12):
  ids = rng.integers(3, 64, (rows, length)).astype(np.int32)
  ids[:, -3:] = 0  # some padding, so token weighting matters
  ids[0, 5:] = 0
  seg = (ids != 0).astype(np.int32)
  pos = np.where(seg, np.arange(length), 0).astype(np.int32)
  return {"inputs": ids, "targets": ids[:, ::-1].copy(), "inputs_segmentation": seg,
          "targets_segmentation": (ids[:, ::-1] != 0).astype(np.int32),
          "inputs_position": pos, "targets_position": pos[:, ::-1].copy()}


def _run(config, batches):
  mesh = sharding.make_mesh(config.mesh)
  _, sh = step.state_shardings(config, mesh)
  state = step.create_state(config, mesh, sh)
  fn = step.jit_train_step(config, mesh, sh)
  for b in batches:
    state, metrics = fn(state, sharding.global_batch(mesh, b))
  return state, metrics


def test_two_accumulated_micro_batches_equal_one_big_batch():
  rng = np.random.default_rng(0)
  b1, b2 = _batch(rng, 4), _batch(rng, 4)
  b2["targets"][1, 2:] = 0  # the micro-batches hold different token counts
  b2["targets_segmentation"][1, 2:] = 0
  big = {k: np.concatenate([b1[k], b2[k]]) for k in b1}
  acc_state, _ = _run(_config(accum=2), [b1, b2])
  one_state, _ = _run(_config(accum=1), [big])
  assert int(acc_state.step) == int(one_state.step) == 1
  for a, b in zip(jax.tree.leaves(acc_state.params), jax.tree.leaves(one_state.params)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_accumulation_applies_no_update_before_the_last_micro_batch():
  rng = np.random.default_rng(1)
  config = _config(accum=3)
  mesh = sharding.make_mesh(config.mesh)
  init = step.create_state(config, mesh)
  init_params = jax.tree.map(np.asarray, init.params)
  state, _ = _run(config, [_batch(rng, 4), _batch(rng, 4)])
  assert int(state.step) == 0 and int(state.micro_step) == 2
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(init_params)):
    np.testing.assert_array_equal(a, b)


def test_dropout_is_a_function_of_seed_and_step():
  rng = np.random.default_rng(2)
  batches = [_batch(rng, 4) for _ in range(2)]
  s1, m1 = _run(_config(dropout=0.3), batches)
  s2, m2 = _run(_config(dropout=0.3), batches)
  assert float(m1["loss_sum"]) == float(m2["loss_sum"])
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_array_equal(a, b)
  s3, m3 = _run(_config(dropout=0.0), batches)
  assert float(m3["loss_sum"]) != float(m1["loss_sum"])


def test_dropout_key_depends_on_seed_and_step():
  """Same parameters and batch: another step or another seed draws other dropout masks. (One
  initial state and one compiled step per config; the step donates its state, so each call
  starts from a host copy.)"""
  c0 = _config(dropout=0.3)
  c1 = _config(dropout=0.3)
  c1.seed = 1
  no_dropout = _config(dropout=0.0)
  mesh = sharding.make_mesh(c0.mesh)
  _, sh = step.state_shardings(c0, mesh)  # seed and dropout rate change no shape
  initial = jax.tree.map(np.asarray, step.create_state(c0, mesh, sh))
  batch = sharding.global_batch(mesh, _batch(np.random.default_rng(5), 4))

  def first_loss(train_step, micro_step=0):
    state = initial.replace(micro_step=np.int32(micro_step))
    return float(train_step(state, batch)[1]["loss_sum"])

  step0, step1, plain = (step.jit_train_step(c, mesh, sh) for c in (c0, c1, no_dropout))
  base = first_loss(step0)
  assert first_loss(step0) == base                     # deterministic
  assert first_loss(step0, micro_step=1) != base       # the step changes the masks
  assert first_loss(step1) != base                     # the seed changes the masks
  assert first_loss(plain) == first_loss(plain, micro_step=1)


def test_remat_per_layer_gives_the_same_step():
  """model.remat='layer' recomputes activations in the backward pass: same loss, gradient norm
  and parameters after two steps (with dropout: the recomputation draws the same masks)."""
  rng = np.random.default_rng(4)
  batches = [_batch(rng, 4) for _ in range(2)]
  plain = _config(dropout=0.2)
  remat = _config(dropout=0.2)
  remat.model.remat = "layer"
  s1, m1 = _run(plain, batches)
  s2, m2 = _run(remat, batches)
  np.testing.assert_allclose(float(m2["loss_sum"]), float(m1["loss_sum"]), rtol=1e-6)
  np.testing.assert_allclose(float(m2["grad_norm"]), float(m1["grad_norm"]), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("remat", ["none", "layer"])
def test_scan_layers_gives_the_same_steps_as_unrolled_layers(remat):
  """model.scan_layers stacks each stack's layers on a 'layers' axis and scans over them: from
  the same weights (tests.common.stack_layers), the same loss, gradient norm and parameters after two
  Adam steps (with and without remat), and the checkpoint layout is the stacked one."""
  from tests.common import stack_layers  # pylint: disable=g-import-not-at-top
  from transformer_jax.model.transformer import unstack_layers  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  batches = [_batch(rng, 4) for _ in range(2)]
  plain, scanned = _config(), _config()
  for c in (plain, scanned):
    c.model.num_encoder_layers, c.model.num_decoder_layers = 3, 2
    c.model.remat = remat
  scanned.model.scan_layers = True
  mesh = sharding.make_mesh(plain.mesh)
  state = step.create_state(plain, mesh)
  model_cfg = ModelConfig.from_config(scanned.model)
  s_state = step.create_state(scanned, mesh)
  assert jax.tree.map(jnp.shape, s_state.params["encoder"]["layers"]["layer"]["ffn"]["wi"]) == {
      "kernel": (3, 32, 64), "bias": (3, 64)}
  s_state = s_state.replace(params=stack_layers(model_cfg, jax.tree.map(jnp.copy, state.params)))
  outs = []
  for config, st in ((plain, state), (scanned, s_state)):
    _, sh = step.state_shardings(config, mesh)
    fn = step.jit_train_step(config, mesh, sh)
    for b in batches:
      st, metrics = fn(st, sharding.global_batch(mesh, b))
    outs.append((st, metrics))
  (s1, m1), (s2, m2) = outs
  np.testing.assert_allclose(float(m2["loss_sum"]), float(m1["loss_sum"]), rtol=1e-5)
  np.testing.assert_allclose(float(m2["grad_norm"]), float(m1["grad_norm"]), rtol=1e-5)
  _, unstacked = unstack_layers(model_cfg, s2.params)
  assert jax.tree.structure(unstacked) == jax.tree.structure(s1.params)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(unstacked)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_ensemble_eval_step_scores_the_mean_of_the_members_probabilities():
  """step.ensemble_eval_step: the NLL of the mean of two models' next-token probabilities,
  recomputed here in float64; an ensemble of one model with itself scores as eval_step does
  (label-smoothed loss included)."""
  from transformer_jax.model.transformer import Transformer  # pylint: disable=g-import-not-at-top
  config = _config()
  mesh = sharding.make_mesh(config.mesh)
  model_cfg = ModelConfig.from_config(config.model)
  params_a = step.create_state(config, mesh).params
  config_b = _config()
  config_b.seed = 1
  params_b = step.create_state(config_b, mesh).params
  batch = _batch(np.random.default_rng(3), 4)
  placed = sharding.global_batch(mesh, batch)
  ens = step.jit_ensemble_eval_step((model_cfg, model_cfg), config.train.label_smoothing, mesh)
  got = ens((params_a, params_b), placed)
  probs = [np.asarray(jax.nn.softmax(Transformer(model_cfg).apply(
      {"params": p}, **step._model_inputs(batch), deterministic=True)), np.float64)  # pylint: disable=protected-access
           for p in (params_a, params_b)]
  mean_BxTxV = (probs[0] + probs[1]) / 2
  targets = batch["targets"]
  target_p = np.take_along_axis(mean_BxTxV, targets[..., None], axis=-1)[..., 0]
  expected = -np.sum(np.log(target_p) * (targets != 0))
  np.testing.assert_allclose(float(got["nll_sum"]), expected, rtol=1e-5)
  assert float(got["tokens"]) == np.sum(targets != 0)
  _, shardings = step.state_shardings(config, mesh)
  alone = step.jit_eval_step(config, mesh, shardings.params)(params_a, placed)
  twice = ens((params_a, params_a), placed)
  for key in ("loss_sum", "nll_sum", "tokens"):
    np.testing.assert_allclose(float(twice[key]), float(alone[key]), rtol=1e-5)
