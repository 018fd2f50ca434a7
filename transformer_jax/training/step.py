"""The train state and the jit-compiled train and eval steps, with explicit shardings.

One pure function per step, compiled once per batch shape, the state's buffers donated; the
state is created directly sharded, so no device holds an unsharded copy. Dropout keys depend on
(seed, micro-step) only, so a resumed run draws the masks of an uninterrupted one. Gradient
accumulation (`train.grad_accum_steps` = A) applies one Adam update with the token-weighted mean
of A micro-batches' gradients: exactly the gradient of one batch A times larger.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh

from transformer_jax.decoding.decode import log_mean_probs
from transformer_jax.model import sharding
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime import rng
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.training.label_smoothing import chunked_cross_entropy_sums, cross_entropy_sums
from transformer_jax.training.schedule import make_optimizer, make_schedule

BATCH_KEYS = ("inputs", "targets", "inputs_segmentation", "targets_segmentation",
              "inputs_position", "targets_position")


@flax.struct.dataclass
class TrainState:
  step: jnp.ndarray          # optimizer updates applied
  micro_step: jnp.ndarray    # micro-batches seen (== step when not accumulating)
  params: Any
  opt_state: Any
  grad_sum: Any = None       # accumulated gradients (None when grad_accum_steps == 1)
  token_sum: Any = None


def _model_inputs(batch):
  return dict(inputs_BxS=batch["inputs"], targets_BxT=batch["targets"],
              inputs_positions=batch.get("inputs_position"),
              targets_positions=batch.get("targets_position"),
              inputs_segmentation=batch.get("inputs_segmentation"),
              targets_segmentation=batch.get("targets_segmentation"))


def _dummy_batch(length=8):
  ids = jnp.ones((1, length), jnp.int32)
  return {"inputs": ids, "targets": ids}


def init_state(config: ml_collections.ConfigDict, rng) -> TrainState:
  """The initial state with logical-axis boxes on parameters and optimizer moments."""
  model = Transformer(ModelConfig.from_config(config.model))
  params = model.init(rng, **_model_inputs(_dummy_batch()))["params"]
  tx = make_optimizer(config)
  accumulate = config.train.grad_accum_steps > 1
  zeros = jax.tree.map(jnp.zeros_like, params) if accumulate else None
  return TrainState(step=jnp.zeros((), jnp.int32), micro_step=jnp.zeros((), jnp.int32),
                    params=params, opt_state=tx.init(params), grad_sum=zeros,
                    token_sum=jnp.zeros((), jnp.float32) if accumulate else None)


def state_shardings(config: ml_collections.ConfigDict, mesh: Mesh):
  """(abstract unboxed state, NamedSharding tree) without allocating anything."""
  abstract_boxed = jax.eval_shape(functools.partial(init_state, config), jax.random.key(0))
  shardings = sharding.logical_shardings(mesh, abstract_boxed)
  abstract = nn.meta.unbox(abstract_boxed)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shardings)
  return abstract, shardings


def create_state(config: ml_collections.ConfigDict, mesh: Mesh, shardings=None) -> TrainState:
  """The initial state, created sharded on the mesh (parameters from config.seed); `shardings`:
  state_shardings(config, mesh)[1] where the caller has it (it traces the model's init)."""
  if shardings is None:
    _, shardings = state_shardings(config, mesh)
  init = jax.jit(lambda rng: nn.meta.unbox(init_state(config, rng)), out_shardings=shardings)
  with sharding.mesh_context(mesh):
    return init(jax.random.key(config.seed))


def _loss_and_metrics(params, model, batch, epsilon, deterministic, rngs=None, chunk=0):
  """Token sums of the smoothed loss and the NLL; `chunk` > 0 scores that many positions at a
  time (label_smoothing.chunked_cross_entropy_sums: no [B, T, V] logits in memory)."""
  targets = batch["targets"]
  weights = (targets != 0).astype(jnp.float32)
  if chunk:
    hidden_BxTxD = model.apply({"params": params}, **_model_inputs(batch),
                               deterministic=deterministic, rngs=rngs, project=False)
    project = lambda y: model.apply({"params": params}, y, method=Transformer.project)
    loss_sum, nll_sum, tokens = chunked_cross_entropy_sums(hidden_BxTxD, project, targets,
                                                           weights, epsilon, chunk)
  else:
    logits_BxTxV = model.apply({"params": params}, **_model_inputs(batch),
                               deterministic=deterministic, rngs=rngs)
    loss_sum, nll_sum, tokens = cross_entropy_sums(logits_BxTxV, targets, weights, epsilon)
  return loss_sum, {"loss_sum": loss_sum, "nll_sum": nll_sum, "tokens": tokens}


def train_step(state: TrainState, batch, *, config: ml_collections.ConfigDict) -> tuple[TrainState, dict]:
  """One micro-batch: gradients of the token-summed loss; an Adam update every A micro-batches."""
  model = Transformer(ModelConfig.from_config(config.model))
  tx = make_optimizer(config)
  base_key = jax.random.key(config.seed + 1, impl=config.train.dropout_rng_impl)
  dropout_rng = jax.random.fold_in(base_key, state.micro_step)
  grad_fn = jax.value_and_grad(_loss_and_metrics, has_aux=True)
  (_, metrics), grads = grad_fn(state.params, model, batch, config.train.label_smoothing,
                                False, {"dropout": dropout_rng}, config.train.loss_chunk_positions)
  tokens = metrics["tokens"]

  def apply(grad_sum, token_sum):
    mean_grads = jax.tree.map(lambda g: g / jnp.maximum(token_sum, 1.0), grad_sum)
    updates, opt_state = tx.update(mean_grads, state.opt_state, state.params)
    return optax.apply_updates(state.params, updates), opt_state, optax.tree.norm(mean_grads)

  lr = make_schedule(config)(state.step)
  if config.train.grad_accum_steps == 1:
    params, opt_state, grad_norm = apply(grads, tokens)
    new_state = state.replace(step=state.step + 1, micro_step=state.micro_step + 1,
                              params=params, opt_state=opt_state)
  else:
    grad_sum = jax.tree.map(jnp.add, state.grad_sum, grads)
    token_sum = state.token_sum + tokens
    last = (state.micro_step + 1) % config.train.grad_accum_steps == 0

    def do_apply(_):
      params, opt_state, norm = apply(grad_sum, token_sum)
      return (params, opt_state, jax.tree.map(jnp.zeros_like, grad_sum),
              jnp.zeros_like(token_sum), state.step + 1, norm)

    def keep(_):
      return (state.params, state.opt_state, grad_sum, token_sum, state.step,
              jnp.zeros((), jnp.float32))

    params, opt_state, grad_sum, token_sum, step, grad_norm = jax.lax.cond(last, do_apply, keep, None)
    new_state = state.replace(step=step, micro_step=state.micro_step + 1, params=params,
                              opt_state=opt_state, grad_sum=grad_sum, token_sum=token_sum)
  metrics = dict(metrics, grad_norm=grad_norm, learning_rate=lr)
  return new_state, metrics


def eval_step(params, batch, *, config: ml_collections.ConfigDict) -> dict:
  """Token sums of the smoothed loss and the NLL on one batch (dropout off)."""
  model = Transformer(ModelConfig.from_config(config.model))
  _, metrics = _loss_and_metrics(params, model, batch, config.train.label_smoothing, True,
                                 chunk=config.train.loss_chunk_positions)
  return metrics


def ensemble_eval_step(params, batch, *, model_cfgs: tuple[ModelConfig, ...],
                       epsilon: float) -> dict:
  """eval_step's sums for an ensemble (`params`: one tree per config): the distribution scored
  is the mean of the members' next-token probabilities, the one decode.ensemble_step_fn
  searches. Every member's [B, T, V] logits are in memory at once (evaluation batches only)."""
  mean_BxTxV = log_mean_probs([Transformer(cfg).apply({"params": p}, **_model_inputs(batch),
                                                      deterministic=True)
                               for cfg, p in zip(model_cfgs, params)])
  targets = batch["targets"]
  loss_sum, nll_sum, tokens = cross_entropy_sums(mean_BxTxV, targets,
                                                 (targets != 0).astype(jnp.float32), epsilon)
  return {"loss_sum": loss_sum, "nll_sum": nll_sum, "tokens": tokens}


def jit_train_step(config, mesh: Mesh, state_sharding):
  """The train step compiled with explicit in/out shardings and the state donated."""
  if config.train.unroll_threefry_on_cpu:
    rng.unroll_threefry_on_cpu()  # the same dropout bits, cheaper on the CPU (rng.py)
  batch_sh = sharding.batch_sharding(mesh)
  fn = jax.jit(functools.partial(train_step, config=config),
               in_shardings=(state_sharding, batch_sh),
               out_shardings=(state_sharding, sharding.replicated(mesh)),
               donate_argnums=(0,))
  return _with_rules(fn, mesh)


def jit_eval_step(config, mesh: Mesh, params_sharding):
  fn = jax.jit(functools.partial(eval_step, config=config),
               in_shardings=(params_sharding, sharding.batch_sharding(mesh)),
               out_shardings=sharding.replicated(mesh))
  return _with_rules(fn, mesh)


def jit_ensemble_eval_step(model_cfgs: tuple[ModelConfig, ...], epsilon: float, mesh: Mesh):
  """ensemble_eval_step compiled with every member's parameters replicated on each device."""
  fn = jax.jit(functools.partial(ensemble_eval_step, model_cfgs=model_cfgs, epsilon=epsilon),
               in_shardings=(sharding.replicated(mesh), sharding.batch_sharding(mesh)),
               out_shardings=sharding.replicated(mesh))
  return _with_rules(fn, mesh)


def _with_rules(fn, mesh):
  """Traces under the mesh and the logical rules, so activation constraints resolve."""
  @functools.wraps(fn)
  def wrapped(*args):
    with sharding.mesh_context(mesh):
      return fn(*args)
  wrapped.jitted = fn
  return wrapped
