"""Beam search over a KV-cached decoder (paper §6.1), one `lax.while_loop`.

The search is tensor2tensor's, as the paper used, after the flax WMT example:
- a hypothesis Y ends in EOS; its score is log P(Y) / lp(|Y|), lp(n) = ((5 + n) / 6)^alpha
  (Wu et al. 2016), |Y| counting the EOS;
- each step expands the k live hypotheses of a sentence by every token and keeps the best 2k
  candidates (so that k of them are not EOS): those ending in EOS go to the sentence's finished
  set (best k kept), the best k others live on;
- a sentence's output holds at most `limit_B` tokens including EOS (callers pass source length +
  max_extra_len); at the last position only EOS may follow;
- a sentence is done when its k finished slots are full and the worst of them beats the best
  score a live hypothesis could still reach (log-probabilities only fall, lp only grows), or
  when no live hypothesis is left (a constrained search may allow fewer than k outputs, e.g.
  only the empty one of a padding row: such a sentence would otherwise run to its limit);
- the padding id 0 is never emitted (a deviation from t2t: teacher-forced scoring could not
  represent it).

With k = 1 this is greedy search, except that an EOS ranked second at some step is kept as a
finished hypothesis (as in t2t). Rows are sentences, beams a second axis (`_BxK`), flattened to
N = B*K model rows (row b*K + j is beam j of sentence b).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from transformer_jax.runtime.special_ids import EOS_ID, PAD_ID

NEG_INF = -1.0e9  # finite, so that sums and differences of invalid scores stay finite

# step_fn(ids_Nx1, position (int32 scalar), cache) -> (logits_NxV float32, new cache)
StepFn = Callable[[jnp.ndarray, jnp.ndarray, Any], tuple[jnp.ndarray, Any]]


def length_penalty(length, alpha: float):
  """lp(n) = ((5 + n) / 6)^alpha."""
  return jnp.power((5.0 + jnp.asarray(length, jnp.float32)) / 6.0, alpha)


def _step_log_probs(logits_NxV, position, limit_N):
  """Log-softmax with padding removed and, at a row's last allowed position, only EOS left."""
  logprobs_NxV = jax.nn.log_softmax(logits_NxV.astype(jnp.float32), axis=-1)
  vocab_V = jnp.arange(logprobs_NxV.shape[-1])
  at_limit_Nx1 = (position + 1 >= limit_N)[:, None]
  banned_NxV = (vocab_V == PAD_ID)[None, :] | (at_limit_Nx1 & (vocab_V != EOS_ID)[None, :])
  return jnp.where(banned_NxV, NEG_INF, logprobs_NxV)


# ----------------------------------------------------------------------------- cache helpers


def expand_to_beams(tree, beam_size: int):
  """Repeats every batch-major leaf [B, ...] to [B*K, ...] (row b*K + j); scalars unchanged."""
  def expand(x):
    return x if jnp.ndim(x) == 0 else jnp.repeat(x, beam_size, axis=0)
  return jax.tree_util.tree_map(expand, tree)


def _needs_reorder(path) -> bool:
  # Only the self-attention layers' beam tables (`source_beams`, attention.py) follow the beams:
  # the key/value buffers stay where they were written, the cross-attention keys/values are the
  # same for every beam of a sentence, and the cache index is a scalar. A step function's own
  # per-row state (tree_constraint.py) sits under `per_beam` and follows its beam too.
  names = {getattr(p, "key", getattr(p, "name", None)) for p in path}
  return "source_beams" in names or "per_beam" in names


def reorder_cache(cache, flat_rows_N):
  """New row r continues old row flat_rows_N[r] (a row of the same sentence): the
  self-attention beam tables are gathered (int32 [rows, positions], not the key/value
  buffers, which attention reads through them)."""
  def gather(path, x):
    return jnp.take(x, flat_rows_N, axis=0) if _needs_reorder(path) else x
  return jax.tree_util.tree_map_with_path(gather, cache)


def _flat_rows(beam_BxK, beam_size):
  """Beam indices within each sentence -> row indices in the flattened [B*K] batch."""
  batch = beam_BxK.shape[0]
  return (jnp.arange(batch)[:, None] * beam_size + beam_BxK).reshape(-1)


def _take_beams(x_BxMxR, idx_BxK):
  """Picks entries along axis 1 of a [B, M, ...] array: out[b, j] = x[b, idx[b, j]]."""
  idx = idx_BxK.reshape(idx_BxK.shape + (1,) * (x_BxMxR.ndim - 2))
  return jnp.take_along_axis(x_BxMxR, idx, axis=1)


# ----------------------------------------------------------------------------- beam search


class BeamState(NamedTuple):
  """The loop carry. `step` = number of tokens decoded so far (= position of the next one)."""

  step: jnp.ndarray                # int32 scalar
  live_seqs_BxKxL: jnp.ndarray     # int32 output tokens (no start symbol), 0 after `step`
  live_logprobs_BxK: jnp.ndarray   # float32 log P(prefix); NEG_INF for no hypothesis
  last_ids_BxK: jnp.ndarray        # int32 the token each live hypothesis ends with (0 at start)
  finished_seqs_BxKxL: jnp.ndarray
  finished_scores_BxK: jnp.ndarray  # float32 length-penalised; NEG_INF for an empty slot
  finished_flags_BxK: jnp.ndarray   # bool
  cache: Any                        # decoder cache with B*K rows


class BeamResult(NamedTuple):
  seqs_BxKxL: jnp.ndarray   # int32 finished hypotheses, best first, EOS-terminated, zero padded
  scores_BxK: jnp.ndarray   # float32 log P(Y) / lp(|Y|)
  num_steps: jnp.ndarray    # int32 scalar: decoder steps run (< L when it stopped early)


def _sentence_done(state: BeamState, limit_B, alpha, stop_early=True):
  """[B] bool: the sentence reached its length limit, or no live hypothesis can still win (or
  none is left)."""
  best_live_B = state.live_logprobs_BxK[:, 0]  # live hypotheses are kept sorted, best first
  none_live_B = best_live_B <= 0.5 * NEG_INF
  if not stop_early:
    return (state.step >= limit_B) | none_live_B
  best_reachable_B = best_live_B / length_penalty(limit_B, alpha)
  all_full_B = jnp.all(state.finished_flags_BxK, axis=1)
  worst_finished_B = jnp.where(all_full_B, jnp.min(state.finished_scores_BxK, axis=1), NEG_INF)
  return (state.step >= limit_B) | none_live_B | (worst_finished_B > best_reachable_B)


def initial_state(cache, batch: int, beam_size: int, max_len: int) -> BeamState:
  """The search's start for `batch` sentences: one live empty hypothesis each, nothing finished."""
  k = beam_size
  first_beam_only_BxK = jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF)[None, :]
  return BeamState(
      step=jnp.array(0, jnp.int32),
      live_seqs_BxKxL=jnp.zeros((batch, k, max_len), jnp.int32),
      live_logprobs_BxK=jnp.broadcast_to(first_beam_only_BxK, (batch, k)).astype(jnp.float32),
      last_ids_BxK=jnp.zeros((batch, k), jnp.int32),
      finished_seqs_BxKxL=jnp.zeros((batch, k, max_len), jnp.int32),
      finished_scores_BxK=jnp.full((batch, k), NEG_INF, jnp.float32),
      finished_flags_BxK=jnp.zeros((batch, k), bool),
      cache=cache)


def beam_search(step_fn: StepFn, cache, limit_B, *, beam_size: int, alpha: float,
                max_len: int, stop_early: bool = True) -> BeamResult:
  """Beam search for a batch of sentences.

  Args:
    step_fn: (ids [B*K, 1], position, cache) -> (logits [B*K, V], cache).
    cache: the decoder cache for the B*K rows (row b*K + j: beam j of sentence b).
    limit_B: int32 [B], the longest output of each sentence in tokens, EOS included
      (clipped to [1, max_len]).
    beam_size: k.
    alpha: the length penalty exponent (>= 0 for the termination bound to hold).
    max_len: static buffer length L (>= max(limit_B)).
    stop_early: stop a sentence when no live hypothesis can beat its finished ones (False:
      run every sentence to its limit; the result is the same, only slower).

  Returns:
    BeamResult: the k finished hypotheses of each sentence, best first ([B, K, L] int32,
    EOS-terminated, zero padded), their scores log P(Y) / lp(|Y|) [B, K], the steps run.
  """
  state = initial_state(cache, jnp.shape(limit_B)[0], beam_size, max_len)
  final = search(step_fn, state, limit_B, beam_size=beam_size, alpha=alpha, max_len=max_len,
                 stop_early=stop_early)
  # Every sentence is forced to finish at its limit (<= max_len), so finished slot 0 is filled.
  return BeamResult(final.finished_seqs_BxKxL, final.finished_scores_BxK, final.step)


def sentences_done(state: BeamState, limit_B, *, alpha: float, max_len: int,
                   stop_early: bool = True):
  """[B] bool: the sentences whose finished hypotheses are final (`search`'s rule)."""
  limit_B = jnp.clip(jnp.asarray(limit_B, jnp.int32), 1, max_len)
  return _sentence_done(state, limit_B, alpha, stop_early) | (state.step >= max_len)


def search(step_fn: StepFn, state: BeamState, limit_B, *, beam_size: int, alpha: float,
           max_len: int, stop_early: bool = True, until_live_at_most: int = 0) -> BeamState:
  """Runs the search from `state` (beam_search's arguments) until every sentence is done, or,
  with `until_live_at_most` n > 0, until at most n sentences are not done: a caller then drops
  the done ones from the batch (decode.py), so that finished sentences stop costing. A done
  sentence's finished hypotheses never change again."""
  k = beam_size
  limit_B = jnp.clip(jnp.asarray(limit_B, jnp.int32), 1, max_len)
  batch = limit_B.shape[0]
  limit_N = jnp.repeat(limit_B, k)

  def cond_fn(state: BeamState):
    not_done = jnp.sum(~_sentence_done(state, limit_B, alpha, stop_early))
    return (state.step < max_len) & (not_done > until_live_at_most)

  def body_fn(state: BeamState):
    t = state.step
    logits_NxV, cache = step_fn(state.last_ids_BxK.reshape(batch * k, 1), t, state.cache)
    vocab = logits_NxV.shape[-1]
    logprobs_BxKxV = _step_log_probs(logits_NxV, t, limit_N).reshape(batch, k, vocab)
    candidates_BxKxV = state.live_logprobs_BxK[:, :, None] + logprobs_BxKxV

    # The best 2k extensions: at most k end in EOS, so k of them go on living.
    cand_logprobs_Bx2K, flat_idx_Bx2K = lax.top_k(candidates_BxKxV.reshape(batch, k * vocab), 2 * k)
    cand_valid_Bx2K = cand_logprobs_Bx2K > 0.5 * NEG_INF
    cand_logprobs_Bx2K = jnp.where(cand_valid_Bx2K, cand_logprobs_Bx2K, NEG_INF)
    cand_beam_Bx2K = flat_idx_Bx2K // vocab
    cand_ids_Bx2K = (flat_idx_Bx2K % vocab).astype(jnp.int32)
    cand_seqs_Bx2KxL = _take_beams(state.live_seqs_BxKxL, cand_beam_Bx2K)
    cand_seqs_Bx2KxL = lax.dynamic_update_slice(cand_seqs_Bx2KxL, cand_ids_Bx2K[:, :, None], (0, 0, t))
    cand_eos_Bx2K = cand_ids_Bx2K == EOS_ID

    # Live: the best k candidates not ending in EOS; the cache follows their parent beams.
    alive_Bx2K = jnp.where(cand_eos_Bx2K, NEG_INF, cand_logprobs_Bx2K)
    live_logprobs_BxK, pick_BxK = lax.top_k(alive_Bx2K, k)
    live_parent_BxK = _take_beams(cand_beam_Bx2K, pick_BxK)
    cache = reorder_cache(cache, _flat_rows(live_parent_BxK, k))

    # Finished: merge the new EOS candidates into the k best so far.
    new_flags_Bx2K = cand_eos_Bx2K & cand_valid_Bx2K
    new_scores_Bx2K = jnp.where(new_flags_Bx2K, cand_logprobs_Bx2K / length_penalty(t + 1, alpha),
                                NEG_INF)
    all_scores_Bx3K = jnp.concatenate([state.finished_scores_BxK, new_scores_Bx2K], axis=1)
    all_flags_Bx3K = jnp.concatenate([state.finished_flags_BxK, new_flags_Bx2K], axis=1)
    all_seqs_Bx3KxL = jnp.concatenate([state.finished_seqs_BxKxL, cand_seqs_Bx2KxL], axis=1)
    finished_scores_BxK, keep_BxK = lax.top_k(all_scores_Bx3K, k)

    return BeamState(
        step=t + 1,
        live_seqs_BxKxL=_take_beams(cand_seqs_Bx2KxL, pick_BxK),
        live_logprobs_BxK=live_logprobs_BxK,
        last_ids_BxK=_take_beams(cand_ids_Bx2K, pick_BxK),
        finished_seqs_BxKxL=_take_beams(all_seqs_Bx3KxL, keep_BxK),
        finished_scores_BxK=finished_scores_BxK,
        finished_flags_BxK=_take_beams(all_flags_Bx3K, keep_BxK),
        cache=cache)

  return lax.while_loop(cond_fn, body_fn, state)


def take_sentences(state: BeamState, keep_M, beam_size: int) -> BeamState:
  """The search of sentences `keep_M` only (int32 [M] indices into the batch): a smaller batch
  that continues exactly where these sentences were. Each self-attention buffer
  ([heads, sentences, ...]) keeps their sentences, every other per-row cache entry (B*K rows
  first: the beam tables, cross-attention keys/values, a constraint's state) their rows."""
  rows_N = (keep_M[:, None] * beam_size + jnp.arange(beam_size)[None, :]).reshape(-1)

  def take(path, x):
    if jnp.ndim(x) == 0:
      return x
    names = {getattr(p, "key", getattr(p, "name", None)) for p in path}
    if names & {"cached_key", "cached_value"}:
      return jnp.take(x, keep_M, axis=1)
    return jnp.take(x, rows_N, axis=0)

  per_sentence = {f: jnp.take(getattr(state, f), keep_M, axis=0) for f in state._fields
                  if f not in ("step", "cache")}
  return state._replace(cache=jax.tree_util.tree_map_with_path(take, state.cache), **per_sentence)
