"""The paper's learning-rate schedule (§5.3) and optimizer, as Optax objects.

lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), evaluated at Optax's count
+ 1 (the paper's step 1 is the first update).

`train.cooldown_steps` > 0 (a named deviation, off by default) ends the run with a linear decay
from the scheduled rate to 0 over its last steps, as warmup-stable-decay schedules do (Hagele et
al. 2024): an alternative to checkpoint averaging for the paper's schedule.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax


def inverse_sqrt_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)
  return schedule


def make_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  t = config.train
  schedule = inverse_sqrt_schedule(config.model.d_model, t.warmup_steps, t.learning_rate_scale)
  cooldown = t.cooldown_steps
  if not cooldown:
    return schedule
  start = t.num_steps - cooldown
  return optax.join_schedules(
      [schedule, optax.linear_schedule(schedule(start), 0.0, cooldown)], [start])


NOT_DECAYED = ("bias", "scale")  # parameter names AdamW leaves alone: biases, LayerNorm gains


def decay_mask(params):
  """True for the parameters `train.weight_decay` decays (weight matrices and embedding tables),
  False for biases and LayerNorm scales (as BERT's AdamW and most since). Works on boxed
  (logically partitioned) parameters too: a leaf is named by the last dict key on its path."""
  def decayed(path, _):
    names = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
    return not names or names[-1] not in NOT_DECAYED
  return jax.tree_util.tree_map_with_path(decayed, params)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adam(beta1=0.9, beta2=0.98, eps=1e-9) on the schedule; optional clipping, and decoupled
  weight decay (AdamW, Loshchilov & Hutter 2019; not in the paper) of the decay_mask parameters,
  scaled by the schedule's rate."""
  t = config.train
  schedule = make_schedule(config)
  if t.weight_decay:
    adam = optax.adamw(schedule, b1=t.adam_b1, b2=t.adam_b2, eps=t.adam_eps,
                       weight_decay=t.weight_decay, mask=decay_mask)
  else:
    adam = optax.adam(schedule, b1=t.adam_b1, b2=t.adam_b2, eps=t.adam_eps)
  if t.grad_clip_norm:
    return optax.chain(optax.clip_by_global_norm(t.grad_clip_norm), adam)
  return adam
