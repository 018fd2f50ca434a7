"""The paper's learning-rate schedule, optimizer settings and label-smoothed loss."""

import jax
import ml_collections
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import base, big
from transformer_jax.runtime.config import default_config, validate
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.training.label_smoothing import cross_entropy_sums, smoothing_constant
from transformer_jax.training.schedule import inverse_sqrt_schedule, make_optimizer, make_schedule


def test_schedule_is_the_paper_formula():
  fn = inverse_sqrt_schedule(512, 4000)
  for step in (1, 10, 3999, 4000, 4001, 10000, 100000):
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert float(fn(step - 1)) == pytest.approx(expected, rel=1e-5)
  assert float(fn(3999)) == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-5)  # the peak


def test_cooldown_is_off_by_default_and_ends_at_zero():
  """train.cooldown_steps: the paper's rate up to num_steps - cooldown, then a straight line from
  that rate to 0 at num_steps; 0 (the default) leaves the paper's schedule."""
  c = default_config()
  assert c.train.cooldown_steps == 0
  paper = inverse_sqrt_schedule(c.model.d_model, c.train.warmup_steps)
  steps = jnp.arange(0, 20000, 997)
  np.testing.assert_array_equal(make_schedule(c)(steps), paper(steps))
  c.train.num_steps, c.train.cooldown_steps = 10000, 2000
  fn = make_schedule(c)
  for count in (0, 3999, 7999):
    assert float(fn(count)) == pytest.approx(float(paper(count)), rel=1e-6)
  start = float(paper(8000))
  for count, left in ((8000, 1.0), (8500, 0.75), (9000, 0.5), (9900, 0.05), (10000, 0.0)):
    assert float(fn(count)) == pytest.approx(start * left, rel=1e-5, abs=1e-12)
  c.train.cooldown_steps = 10001
  with pytest.raises(ConfigError, match="train.cooldown_steps"):
    validate(c)
  c.train.cooldown_steps = -1
  with pytest.raises(ConfigError, match="train.cooldown_steps"):
    validate(c)


def test_optimizer_is_adam_with_the_paper_betas():
  """Over several steps of changing gradients, the updates are optax's Adam(0.9, 0.98, 1e-9) on
  the paper's schedule, and not Adam with other betas (the first step alone cannot tell: Adam's
  bias correction makes it independent of the betas)."""
  c = base.get_config()
  assert (c.train.adam_b1, c.train.adam_b2, c.train.adam_eps) == (0.9, 0.98, 1e-9)

  def updates(tx, steps=6):
    params = {"w": jnp.ones(3)}
    state, out = tx.init(params), []
    for t in range(steps):
      grads = {"w": jnp.array([1.0, -2.0, 0.5]) * (1.0 + t) * (-1.0) ** t}
      u, state = tx.update(grads, state, params)
      out.append(np.asarray(u["w"]))
    return np.stack(out)

  ours = updates(make_optimizer(c))
  schedule = inverse_sqrt_schedule(512, 4000)
  np.testing.assert_allclose(ours, updates(optax.adam(schedule, b1=0.9, b2=0.98, eps=1e-9)),
                             rtol=1e-5)
  other = updates(optax.adam(schedule, b1=0.5, b2=0.5, eps=1e-9))
  np.testing.assert_allclose(ours[0], other[0], rtol=1e-5)  # why one step proves nothing
  assert np.max(np.abs(ours[1:] - other[1:]) / np.abs(other[1:])) > 0.1


def test_weight_decay_shrinks_weights_but_not_biases_or_layernorm_scales():
  """train.weight_decay (AdamW, decoupled): with zero gradients an update is -rate x decay x
  the parameter for weight matrices and the embedding, and 0 for biases and LayerNorm scales;
  the sharded state is built from boxed parameters and a jitted step runs with it."""
  from configs import tiny  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import step
  c = tiny.get_config()
  c.train.weight_decay = 0.01
  c.model.num_encoder_layers = c.model.num_decoder_layers = 1  # every kind of parameter, once
  mesh = sharding.make_mesh(c.mesh)
  state = step.create_state(c, mesh)
  tx = make_optimizer(c)
  zeros = jax.tree.map(jnp.zeros_like, state.params)
  updates, _ = jax.jit(tx.update)(zeros, state.opt_state, state.params)
  rate = float(make_schedule(c)(0))
  flat = {jax.tree_util.keystr(k): (np.asarray(u), np.asarray(p)) for (k, u), p in zip(
      jax.tree_util.tree_leaves_with_path(updates), jax.tree.leaves(state.params))}
  kinds = {"bias": 0, "scale": 0, "kernel": 0, "embedding": 0}
  for name, (u, p) in flat.items():
    leaf = name.split("'")[-2]
    if leaf in ("bias", "scale"):
      np.testing.assert_array_equal(u, 0.0, err_msg=name)
    else:
      np.testing.assert_allclose(u, -rate * 0.01 * p, rtol=1e-5, atol=1e-12, err_msg=name)
    kinds[leaf] = kinds.get(leaf, 0) + 1
  assert all(kinds[k] for k in ("bias", "scale", "kernel", "embedding")), kinds
  rows = np.ones((8, 6), np.int32)
  _, metrics = step.jit_train_step(c, mesh, step.state_shardings(c, mesh)[1])(
      state, sharding.global_batch(mesh, {"inputs": rows, "targets": rows}))
  assert np.isfinite(float(metrics["loss_sum"]))


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
def test_label_smoothing_equals_the_explicit_distribution(eps):
  rng = np.random.default_rng(0)
  v = 11
  logits = jnp.asarray(rng.normal(size=(2, 5, v)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, v, size=(2, 5)))
  weights = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], jnp.float32)
  loss, nll, tokens = cross_entropy_sums(logits, targets, weights, eps)
  q = np.full((2, 5, v), eps / (v - 1))
  np.put_along_axis(q, np.asarray(targets)[..., None], 1 - eps, axis=-1)
  logp = np.asarray(jax.nn.log_softmax(logits))
  explicit = (-(q * logp).sum(-1) - smoothing_constant(v, eps)) * np.asarray(weights)
  onehot_nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
  assert float(loss) == pytest.approx(explicit.sum(), rel=1e-5)
  assert float(nll) == pytest.approx((onehot_nll * np.asarray(weights)).sum(), rel=1e-5)
  assert float(tokens) == 8.0


def test_smoothed_loss_is_zero_for_the_smoothed_target():
  v, eps = 7, 0.1
  q = np.full((1, 1, v), eps / (v - 1))
  q[0, 0, 3] = 1 - eps
  loss, _, _ = cross_entropy_sums(jnp.log(jnp.asarray(q, jnp.float32)), jnp.array([[3]]),
                                  jnp.ones((1, 1)), eps)
  assert abs(float(loss)) < 1e-5


def test_paper_configs_validate_and_carry_the_paper_values():
  for mod in (base, big):
    c = validate(mod.get_config())
    assert c.train.warmup_steps == 4000 and c.train.label_smoothing == 0.1
    assert c.decode.beam_size == 4 and c.decode.alpha == 0.6
    assert not c.model.pre_ln and c.model.tie_embeddings and c.model.pe_type == "sinusoidal"
  assert big.get_config().model.dropout_rate == 0.3


@pytest.mark.parametrize("path,value,match", [
    ("train.warmup_steps", 0, "train.warmup_steps"),
    ("data.tokens_per_batch", 10, "data.tokens_per_batch"),
    ("mesh.data", 0, "mesh.data"),
    ("train.label_smoothing", 1.0, "train.label_smoothing"),
    ("data.batch_mode", "shuffle", "data.batch_mode"),
])
def test_bad_run_config_values_name_the_key(path, value, match):
  c = default_config()
  section, key = path.split(".")
  c[section][key] = value
  with pytest.raises(ConfigError, match=match):
    validate(c)


def test_unknown_run_config_key_is_named_with_a_suggestion():
  c = default_config()
  c.train.warmup_step = 10
  with pytest.raises(ConfigError, match=r"train.warmup_step'.*warmup_steps"):
    validate(c)


def test_wrong_type_is_named():
  d = default_config().to_dict()
  d["train"]["num_steps"] = "ten"
  with pytest.raises(ConfigError, match="train.num_steps"):
    validate(ml_collections.ConfigDict(d))


@pytest.mark.parametrize("chunk,eps", [(4, 0.1), (13, 0.1), (5, 0.0)])
def test_chunked_loss_equals_the_unchunked_loss_and_gradients(chunk, eps):
  """train.loss_chunk_positions scores the target positions `chunk` at a time (T=13: padded
  for 4 and 5, one chunk for 13): the same loss sums and the same gradients for every parameter,
  to 1e-6 relative to each gradient's size."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import step  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from transformer_jax.model.transformer import Transformer  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig(vocab_size=50, d_model=32, num_heads=4, d_k=8, d_v=8, d_ff=48,
                    num_encoder_layers=1, num_decoder_layers=2, max_len=32, dropout_rate=0.0)
  rng = np.random.default_rng(3)
  src = rng.integers(3, 50, (3, 9)).astype(np.int32)
  tgt = rng.integers(3, 50, (3, 13)).astype(np.int32)
  src[1, 6:], tgt[1, 8:], tgt[2, 3:] = 0, 0, 0
  batch = {"inputs": jnp.asarray(src), "targets": jnp.asarray(tgt)}
  model = Transformer(cfg)
  variables = jax.jit(model.init)(jax.random.key(0), batch["inputs"], batch["targets"])
  params = nn.meta.unbox(variables["params"])

  def loss(p, c):
    return step._loss_and_metrics(p, model, batch, eps, True, chunk=c)  # pylint: disable=protected-access

  # Jitted: run eagerly, each of the backward pass's operations would be compiled on its own.
  grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (full, m_full), g_full = grad_fn(params, 0)
  (chunked, m_chunked), g_chunked = grad_fn(params, chunk)
  assert float(m_chunked["tokens"]) == float(m_full["tokens"]) == float((tgt != 0).sum())
  np.testing.assert_allclose(float(chunked), float(full), rtol=1e-6)
  np.testing.assert_allclose(float(m_chunked["nll_sum"]), float(m_full["nll_sum"]), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_chunked)):
    scale = float(np.abs(np.asarray(a)).max())
    assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-6 * scale


def test_a_config_saved_before_new_keys_gets_their_defaults():
  from transformer_jax.runtime.config import with_defaults  # pylint: disable=g-import-not-at-top
  saved = default_config().to_dict()
  del saved["train"]["loss_chunk_positions"], saved["model"]["scan_layers"]
  saved["train"]["num_steps"] = 123
  with pytest.raises(AttributeError):
    validate(ml_collections.ConfigDict(saved))
  config = validate(with_defaults(saved))
  assert config.train.num_steps == 123 and config.train.loss_chunk_positions == 0
  assert config.model.scan_layers is False
