"""Translation with the trained model: encode once, then beam search over the KV cache.

`beam_decode` is pure: it takes (params, inputs) and can be jitted by a caller with its own
in/out shardings; `translate_batch` is the convenience entry point that jits once per
(model config, search settings) and lets jax cache one executable per input shape (so pad
batches to a few fixed shapes). Greedy decoding is `beam_size=1`.

Output length limit (paper §6.1: "input length + 50"): sentence b may emit at most
`len_b + max_extra_len` tokens including EOS, where len_b counts its non-padding source tokens;
the buffer of a batch is S + max_extra_len (S = padded source width). Sinusoidal positions are
computed for the whole buffer, whatever `model.max_len` says; only a learned positional table
(Table 3 row E) caps the buffer at its `max_len` rows.

Ensembles (not in the paper; fairseq's and tensor2tensor's decoders have them): several models
with one vocabulary decode together, each over its own cache, and the search extends hypotheses
by the mean of the members' next-token probabilities (`ensemble_step_fn`).

A task may restrict what the search writes (a parser: trees over its source's words) with a
`Constraint` object, which wraps the search's step; the search itself stays task-agnostic.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.decoding import beam_search
from transformer_jax.model import sharding
from transformer_jax.model.transformer import Transformer, unstack_layers
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.special_ids import EOS_ID, PAD_ID

Models = ModelConfig | tuple[ModelConfig, ...]  # one model, or an ensemble's members


class SearchConstraint(Protocol):
  """What beam_decode asks of a constraint on its outputs (e.g. tasks/parsing/tree_constraint.py).
  Hashable: it is a static argument of the jitted search."""

  def constrain(self, step_fn: beam_search.StepFn, inputs_NxS, limit_N) -> beam_search.StepFn:
    """`step_fn` whose logits allow only what the constraint permits; its cache is the one
    `initial_cache` makes. `inputs_NxS`, `limit_N`: each row's source and output limit."""

  def initial_cache(self, model_cache, rows: int) -> Any:
    """The search's first cache for `rows` rows: the model's, and the constraint's state."""


Constraint = SearchConstraint | None  # None: the search is free


def buffer_length(model_cfg: ModelConfig, source_width: int, max_extra_len: int) -> int:
  """Static output buffer length for a batch of padded source width S."""
  length = max(1, source_width + max_extra_len)
  return min(length, model_cfg.max_len) if model_cfg.pe_type == "learned" else length


def output_limits(inputs_BxS, max_extra_len: int, max_len: int):
  """[B] int32: the longest output (EOS included) of each sentence: its length + max_extra_len."""
  lengths_B = jnp.sum(inputs_BxS != PAD_ID, axis=1).astype(jnp.int32)
  return jnp.clip(lengths_B + max_extra_len, 1, max_len)


def init_cache(model_cfg: ModelConfig, params, encoded_BxSxD, inputs_BxS, max_decode_len: int,
               beam_size: int = 1):
  """The decoder cache for B rows (sentences x beam_size: the self-attention buffers are laid
  out by sentence, attention.py): empty self-attention buffers, projected encoder keys/values."""
  model = Transformer(model_cfg, incremental=True, max_decode_len=max_decode_len,
                      beam_size=beam_size)
  start_Bx1 = jnp.zeros((inputs_BxS.shape[0], 1), jnp.int32)
  _, variables = model.apply({"params": params}, encoded_BxSxD, inputs_BxS, start_Bx1,
                             method=Transformer.decode, mutable=["cache"])
  return variables["cache"]


def make_step_fn(model_cfg: ModelConfig, params, encoded_NxSxD, inputs_NxS, max_decode_len: int,
                 beam_size: int = 1):
  """A `beam_search.StepFn`: one decoder position for N rows over the cache.

  `inputs_NxS` supplies the source padding mask; `encoded_NxSxD` is not read after the cache
  exists (the cross-attention keys/values are in it). Rows b*beam_size + j are the beams of
  sentence b (the self-attention caches are read by beam, attention.py).
  """
  model = Transformer(model_cfg, incremental=True, max_decode_len=max_decode_len,
                      beam_size=beam_size)

  def step_fn(ids_Nx1, position, cache):
    positions_Nx1 = jnp.full(ids_Nx1.shape, position, jnp.int32)
    logits_Nx1xV, variables = model.apply(
        {"params": params, "cache": cache}, encoded_NxSxD, inputs_NxS, ids_Nx1,
        targets_positions=positions_Nx1, method=Transformer.decode, mutable=["cache"])
    return logits_Nx1xV[:, 0, :], variables["cache"]

  return step_fn


def ensemble_step_fn(step_fns) -> beam_search.StepFn:
  """One `beam_search.StepFn` for several models, each stepping over its own cache (the cache is
  the tuple of theirs): log of the mean of their next-token probabilities, as fairseq's
  EnsembleModel (a mean of probabilities, not of log-probabilities, so that one member's
  confident choice is not vetoed by another's near-zero)."""
  def step_fn(ids_Nx1, position, caches):
    outs = [fn(ids_Nx1, position, cache) for fn, cache in zip(step_fns, caches)]
    return log_mean_probs([logits for logits, _ in outs]), tuple(cache for _, cache in outs)
  return step_fn


def log_mean_probs(logits):
  """log of the mean of softmax(l) over the members' logits [..., V] (float32): the ensemble's
  distribution, for the search (ensemble_step_fn) and for perplexity (step.ensemble_eval_step)."""
  logprobs = [jax.nn.log_softmax(l.astype(jnp.float32), axis=-1) for l in logits]
  return jax.nn.logsumexp(jnp.stack(logprobs), axis=0) - np.log(len(logprobs))


def encode(model_cfg: ModelConfig, params, inputs_BxS):
  return Transformer(model_cfg).apply({"params": params}, inputs_BxS, method=Transformer.encode)


def _search_parts(model_cfg: Models, params, inputs_BxS, *, beam_size: int, max_extra_len: int,
                  constraint: Constraint, new_cache: bool = True):
  """(step_fn, the first cache or None, limit_B, max_len) of a search over `inputs_BxS`: one
  model's or an ensemble's (equally long tuples of configs and parameters). Without
  `new_cache`, the step of a search that continues over a cache it already has."""
  ensemble = isinstance(model_cfg, tuple)
  members = [unstack_layers(c, p) for c, p in (zip(model_cfg, params) if ensemble
                                                else [(model_cfg, params)])]
  max_len = min(buffer_length(c, inputs_BxS.shape[1], max_extra_len) for c, _ in members)
  caches, step_fns = [], []
  for cfg, p in members:
    encoded_BxSxD = encode(cfg, p, inputs_BxS)  # not computed when only the step reads it
    encoded_NxSxD, inputs_NxS = beam_search.expand_to_beams((encoded_BxSxD, inputs_BxS), beam_size)
    # The cache is made for the B*K rows directly (the head-major self-attention buffers have
    # their rows on axis 1; the cross-attention keys/values are projected for each beam's row).
    if new_cache:
      caches.append(init_cache(cfg, p, encoded_NxSxD, inputs_NxS, max_len, beam_size))
    step_fns.append(make_step_fn(cfg, p, encoded_NxSxD, inputs_NxS, max_len, beam_size))
  cache = (tuple(caches) if ensemble else caches[0]) if new_cache else None
  step_fn = ensemble_step_fn(step_fns) if ensemble else step_fns[0]
  limit_B = output_limits(inputs_BxS, max_extra_len, max_len)
  if constraint is not None:
    inputs_NxS, limit_N = beam_search.expand_to_beams((inputs_BxS, limit_B), beam_size)
    step_fn = constraint.constrain(step_fn, inputs_NxS, limit_N)
    if new_cache:
      cache = constraint.initial_cache(cache, inputs_NxS.shape[0])
  return step_fn, cache, limit_B, max_len


def beam_decode(model_cfg: Models, params, inputs_BxS, *, beam_size: int = 4, alpha: float = 0.6,
                max_extra_len: int = 50, stop_early: bool = True,
                constraint: Constraint = None) -> beam_search.BeamResult:
  """Pure (jit-able) beam search: BeamResult(seqs [B, K, L], scores [B, K], steps), best first.
  A scan_layers model decodes as its unrolled equivalent (one cache layout for beam search).
  `model_cfg` and `params` may be equally long tuples: an ensemble (ensemble_step_fn) whose
  members share the vocabulary; its output buffer is the shortest any member allows.
  `constraint`: what the outputs must obey (a SearchConstraint), None for a free search."""
  step_fn, cache, limit_B, max_len = _search_parts(
      model_cfg, params, inputs_BxS, beam_size=beam_size, max_extra_len=max_extra_len,
      constraint=constraint)
  return beam_search.beam_search(step_fn, cache, limit_B, beam_size=beam_size, alpha=alpha,
                                 max_len=max_len, stop_early=stop_early)


# ----------------------------------------------------------------------------- finished sentences leave

# A batch is halved while it stays at least this many sentences per data-parallel device: below
# that a step costs about the same whatever the rows, and each size is one more compilation.
MIN_ROWS_PER_DEVICE = 4


def next_rows(rows: int, devices: int = 1) -> int:
  """The batch a search of `rows` sentences shrinks to once no more than that many are still
  searching: half, while a multiple of `devices` and not under MIN_ROWS_PER_DEVICE each; 0: it
  runs to the end at `rows`."""
  half = rows // 2
  return half if rows % 2 == 0 and half % devices == 0 and half >= MIN_ROWS_PER_DEVICE * devices else 0


def _best(state: beam_search.BeamState):
  return state.finished_seqs_BxKxL[:, 0, :]


def first_segment(model_cfg: Models, params, inputs_BxS, *, beam_size: int, alpha: float,
                  max_extra_len: int, constraint: Constraint, until_live_at_most: int):
  """Pure: the search of a new batch until at most `until_live_at_most` sentences are still
  searching (0: to the end). Returns (state, done_B, best_BxL)."""
  step_fn, cache, limit_B, max_len = _search_parts(
      model_cfg, params, inputs_BxS, beam_size=beam_size, max_extra_len=max_extra_len,
      constraint=constraint)
  state = beam_search.initial_state(cache, inputs_BxS.shape[0], beam_size, max_len)
  state = beam_search.search(step_fn, state, limit_B, beam_size=beam_size, alpha=alpha,
                             max_len=max_len, until_live_at_most=until_live_at_most)
  done_B = beam_search.sentences_done(state, limit_B, alpha=alpha, max_len=max_len)
  return state, done_B, _best(state)


def next_segment(model_cfg: Models, params, inputs_BxS, state, keep_M, *, beam_size: int,
                 alpha: float, max_extra_len: int, constraint: Constraint,
                 until_live_at_most: int):
  """Pure: the search of sentences `keep_M` of a batch, continued from `state` as a batch of M
  (beam_search.take_sentences). Returns (inputs_MxS, state, done_M, best_MxL)."""
  inputs_MxS = jnp.take(inputs_BxS, keep_M, axis=0)
  state = beam_search.take_sentences(state, keep_M, beam_size)
  step_fn, _, limit_M, max_len = _search_parts(
      model_cfg, params, inputs_MxS, beam_size=beam_size, max_extra_len=max_extra_len,
      constraint=constraint, new_cache=False)
  state = beam_search.search(step_fn, state, limit_M, beam_size=beam_size, alpha=alpha,
                             max_len=max_len, until_live_at_most=until_live_at_most)
  done_M = beam_search.sentences_done(state, limit_M, alpha=alpha, max_len=max_len)
  return inputs_MxS, state, done_M, _best(state)


@functools.lru_cache(maxsize=None)
def _segments(model_cfg: Models, beam_size: int, alpha: float, max_extra_len: int, mesh,
              constraint: Constraint, until_live_at_most: int):
  """first_segment and next_segment jitted for these settings; with a mesh, what the host reads
  (done flags, best outputs) comes out replicated, the search state as the partitioner lays it."""
  settings = dict(beam_size=beam_size, alpha=alpha, max_extra_len=max_extra_len,
                  constraint=constraint, until_live_at_most=until_live_at_most)
  replicate = ((lambda x: jax.lax.with_sharding_constraint(x, sharding.replicated(mesh)))
               if mesh is not None else (lambda x: x))

  def first(params, inputs_BxS):
    state, done_B, best_BxL = first_segment(model_cfg, params, inputs_BxS, **settings)
    return state, replicate(done_B), replicate(best_BxL)

  def then(params, inputs_BxS, state, keep_M):
    inputs_MxS, state, done_M, best_MxL = next_segment(model_cfg, params, inputs_BxS, state,
                                                       keep_M, **settings)
    return inputs_MxS, state, replicate(done_M), replicate(best_MxL)
  return jax.jit(first), jax.jit(then)


def _global(mesh, array, logical_axes):
  """A host array as the mesh's (the same on every process), laid out by `logical_axes`."""
  if mesh is None:
    return jnp.asarray(array)
  sh = (sharding.logical_sharding(mesh, logical_axes, sharding.INFERENCE_RULES) if logical_axes
        else sharding.replicated(mesh))
  return jax.make_array_from_callback(array.shape, sh, lambda i: array[i])


def dropping_decode(model_cfg: Models, params, inputs_BxS, *, beam_size: int, alpha: float,
                    max_extra_len: int, mesh=None, constraint: Constraint = None):
  """(best output of each sentence [B, L] int32 numpy, decoder steps, [(rows, steps)] of each
  segment the search ran): the beam search of beam_decode, where the sentences that are done
  leave the batch. The batch runs until at most
  half of it is still searching, then those continue as a batch of half the size (padded with
  done sentences, which stay done), down to next_rows' floor, where it runs to the end: a done
  sentence's hypotheses never change, so the outputs are beam_decode's."""
  inputs_BxS = np.asarray(inputs_BxS, np.int32)
  devices = sharding.batch_parallelism(mesh) if mesh is not None else 1
  rows = inputs_BxS.shape[0]
  until = next_rows(rows, devices)
  first, _ = _segments(model_cfg, beam_size, float(alpha), max_extra_len, mesh, constraint, until)
  context = (sharding.mesh_context(mesh, sharding.INFERENCE_RULES) if mesh is not None
             else contextlib.nullcontext())
  with context:
    inputs = _global(mesh, inputs_BxS, ("batch", "length"))
    state, done, best = first(params, inputs)
    out_BxL, index_R, segments, before = None, np.arange(rows), [], 0
    while True:
      done_R, best_RxL = np.asarray(jax.device_get(done)), np.asarray(jax.device_get(best))
      step = int(jax.device_get(state.step))
      segments.append((len(index_R), step - before))
      before = step
      if out_BxL is None:
        out_BxL = np.zeros((rows, best_RxL.shape[1]), np.int32)
      out_BxL[index_R[done_R]] = best_RxL[done_R]
      alive = np.flatnonzero(~done_R)
      if until == 0 or not alive.size:
        out_BxL[index_R[alive]] = best_RxL[alive]  # at the end every sentence is done
        break
      keep_M = np.concatenate([alive, np.flatnonzero(done_R)[:until - alive.size]]).astype(np.int32)
      index_R = index_R[keep_M]
      until = next_rows(until, devices)
      _, then = _segments(model_cfg, beam_size, float(alpha), max_extra_len, mesh, constraint,
                          until)
      inputs, state, done, best = then(params, inputs, state, _global(mesh, keep_M, None))
  return out_BxL, before, segments


@functools.lru_cache(maxsize=None)
def jitted_beam_decode(model_cfg: Models, beam_size: int, alpha: float, max_extra_len: int,
                       stop_early: bool = True, constraint: Constraint = None):
  """`beam_decode` jitted for these settings (jax keeps one executable per input shape)."""
  return jax.jit(functools.partial(beam_decode, model_cfg, beam_size=beam_size, alpha=alpha,
                                   max_extra_len=max_extra_len, stop_early=stop_early,
                                   constraint=constraint))


@functools.lru_cache(maxsize=None)
def sharded_beam_decode(model_cfg: Models, beam_size: int, alpha: float, max_extra_len: int,
                        mesh, constraint: Constraint = None):
  """`beam_decode` for batches split over the mesh's data-parallel axes: each device searches its
  own sentences (parameters as placed, weights gathered per sharding.INFERENCE_RULES); the
  result is replicated, so every process reads all of it."""
  fn = jax.jit(functools.partial(beam_decode, model_cfg, beam_size=beam_size, alpha=alpha,
                                 max_extra_len=max_extra_len, constraint=constraint),
               out_shardings=sharding.replicated(mesh))

  def run(params, inputs_BxS):
    inputs_BxS = np.asarray(inputs_BxS, np.int32)
    inputs_sh = sharding.logical_sharding(mesh, ("batch", "length"), sharding.INFERENCE_RULES)
    global_BxS = jax.make_array_from_callback(inputs_BxS.shape, inputs_sh, lambda i: inputs_BxS[i])
    with sharding.mesh_context(mesh, sharding.INFERENCE_RULES):
      return fn(params, global_BxS)
  return run


def translate_batch(model_cfg: Models, params, inputs_BxS, *, beam_size: int = 4,
                    alpha: float = 0.6, max_extra_len: int = 50, mesh=None,
                    constraint: Constraint = None, drop_finished: bool = False):
  """(The best beam-search hypothesis per sentence: int32 [B, L], EOS-terminated, zero padded;
  the decoder steps the search ran). Tuples of configs and parameters: an ensemble, as
  beam_decode. With a mesh, the B rows (a multiple of its data-parallel size,
  the same on every process) are decoded split over it. `drop_finished`: done sentences leave
  the batch (dropping_decode; the same outputs)."""
  if drop_finished:
    out_BxL, steps, _ = dropping_decode(model_cfg, params, inputs_BxS, beam_size=beam_size,
                                        alpha=alpha, max_extra_len=max_extra_len, mesh=mesh,
                                        constraint=constraint)
    return out_BxL, steps
  if mesh is None:
    fn = jitted_beam_decode(model_cfg, beam_size, float(alpha), max_extra_len,
                            constraint=constraint)
    inputs_BxS = jnp.asarray(inputs_BxS, jnp.int32)
  else:
    fn = sharded_beam_decode(model_cfg, beam_size, float(alpha), max_extra_len, mesh, constraint)
  result = fn(params, inputs_BxS)
  best_BxL = result.seqs_BxKxL[:, 0, :]
  return best_BxL, result.num_steps


def strip_eos(ids_BxL) -> list[list[int]]:
  """Token ids of each output up to (not including) its first EOS, padding removed."""
  out = []
  for row in np.asarray(ids_BxL).tolist():
    row = row[:row.index(EOS_ID)] if EOS_ID in row else row
    out.append([i for i in row if i != PAD_ID])
  return out
