"""Constrained beam search for parsing (`decode.parse_constraint`): every output is a tree.

The paper decodes a parser's linearized trees freely (§6.3) and says nothing of outputs that
are not trees; ours are repaired after decoding (data/trees.py, `Parsed.repaired`). With
`decode.parse_constraint=True` (a deviation, off by default) the search itself can only emit
well-formed linearizations of the source sentence, so nothing needs repair:

- a target is whitespace-separated tokens, `(LABEL`, `)LABEL` and leaves (data/trees.py); each
  token is one or more vocabulary pieces, the first beginning with '▁' (SentencePiece starts
  every whitespace-separated token so) and the rest not;
- the leaves are the source's own pieces in order (`data.parse_leaves='words'`: a word is the
  same pieces in the source and in the target, both segmented by one vocabulary), or the pieces
  of `XX` once per source word (`'xx'`);
- an opening bracket only while leaves remain, a leaf only inside a phrase, a closing bracket
  only inside a phrase that has something in it (not right after an opening one), EOS only when
  every leaf is written and every phrase closed; a label's pieces after its bracket's first are
  the model's choice;
- and only while the output can still be finished within its length limit (beam_search.py):
  each remaining leaf piece, each open phrase's closing bracket, and (outside any phrase) one
  more phrase must fit before the final EOS.

A piece that breaks the rule is removed without renormalizing: the allowed pieces keep the
model's own log-probabilities, so a hypothesis the model finds unlikely (one forced past the
EOS the model wanted) scores as unlikely, and the beam prefers the trees the model prefers.
(Renormalized, a forced hypothesis continues for free, and the search filled the length limit
with empty phrases and label fragments: experiments/results/wsj_parsing_pilot_reading.md.) The
removed mass is handed to the padding id, which the search never emits (beam_search.py). The
automaton's state lives in the decoder cache under `per_beam` and follows its beam.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from transformer_jax.beam_search import NEG_INF, StepFn
from transformer_jax.exceptions import ConfigError
from transformer_jax.special_ids import EOS_ID, PAD_ID

WORD_START = "▁"  # SentencePiece's whitespace marker


@dataclasses.dataclass(frozen=True)
class TreeConstraint:
  """What the automaton needs of a vocabulary (hashable: a static argument of the jitted
  search). Ids of the pieces that begin a token (`starts`), that begin an opening / a closing
  bracket, and the pieces of the leaf placeholder (`xx`, empty when the leaves are the words)."""

  vocab_size: int
  starts: tuple[int, ...]
  continues: tuple[int, ...]
  opens: tuple[int, ...]
  closes: tuple[int, ...]
  xx: tuple[int, ...] = ()


def from_tokenizer(tokenizer, placeholder: str = "") -> TreeConstraint:
  """The constraint for a parser's vocabulary (data/tokenizer.py): leaves are the source's
  words, or `placeholder` (data/trees.py's XX) once per word."""
  pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  special = {i for i, p in enumerate(pieces) if p.startswith("<") and p.endswith(">")}
  starts = tuple(i for i, p in enumerate(pieces) if p.startswith(WORD_START) and i not in special)
  opens = tuple(i for i in starts if pieces[i].startswith(WORD_START + "("))
  closes = tuple(i for i in starts if pieces[i].startswith(WORD_START + ")"))
  if not opens or not closes:
    raise ConfigError("config key 'decode.parse_constraint': the vocabulary has no piece that "
                      "begins a bracket ('▁(' or '▁)'); it was not trained on linearized trees")
  continues = tuple(i for i in range(len(pieces)) if i not in special and i not in set(starts))
  xx = tuple(tokenizer.encode(placeholder)) if placeholder else ()
  return TreeConstraint(len(pieces), starts, continues, opens, closes, xx)


def _mask(ids: tuple[int, ...], size: int):
  return jnp.zeros((size,), bool).at[jnp.asarray(ids, jnp.int32)].set(True)


def leaf_pieces(c: TreeConstraint, inputs_NxS):
  """The pieces the leaves must spell, in order [N, S'], and their number [N]: the source's
  pieces (EOS and padding dropped), or `XX`'s pieces once per source word."""
  valid_NxS = (inputs_NxS != PAD_ID) & (inputs_NxS != EOS_ID)
  if not c.xx:
    return jnp.where(valid_NxS, inputs_NxS, PAD_ID), valid_NxS.sum(axis=1)
  words_N = (valid_NxS & _mask(c.starts, c.vocab_size)[inputs_NxS]).sum(axis=1)
  k = len(c.xx)
  tiled = jnp.tile(jnp.asarray(c.xx, jnp.int32), inputs_NxS.shape[1])[None, :]
  return jnp.broadcast_to(tiled, (inputs_NxS.shape[0], tiled.shape[1])), words_N * k


def init_state(n: int) -> dict:
  """Per row: leaf pieces written, open phrases, whether the last token opened a phrase, and
  whether the last piece was a bracket's (so that a label's further pieces may follow)."""
  zeros, no = jnp.zeros((n,), jnp.int32), jnp.zeros((n,), bool)
  return {"written": zeros, "depth": zeros, "just_opened": no, "in_label": no}


def _next_leaf(leaves_NxS, written_N):
  return jnp.take_along_axis(leaves_NxS, jnp.minimum(written_N, leaves_NxS.shape[1] - 1)[:, None],
                             axis=1)[:, 0]


def advance(c: TreeConstraint, state: dict, ids_N, leaves_NxS, num_leaves_N):
  """The state after each row emitted ids_N (PAD, the search's start, and EOS change nothing)."""
  n = state["written"]
  is_leaf = (ids_N == _next_leaf(leaves_NxS, n)) & (n < num_leaves_N)
  is_open = _mask(c.opens, c.vocab_size)[ids_N] & ~is_leaf
  is_close = _mask(c.closes, c.vocab_size)[ids_N] & ~is_leaf
  token_start = is_open | is_close | (is_leaf & _mask(c.starts, c.vocab_size)[ids_N])
  return {"written": n + is_leaf,
          "depth": state["depth"] + is_open - is_close,
          "just_opened": jnp.where(token_start, is_open, state["just_opened"]),
          "in_label": is_open | is_close | (state["in_label"] & ~is_leaf
                                            & _mask(c.continues, c.vocab_size)[ids_N])}


def allowed(c: TreeConstraint, state: dict, leaves_NxS, num_leaves_N, position, limit_N):
  """[N, V] bool: the pieces each row may emit at `position` (see the module docstring)."""
  v = c.vocab_size
  n, depth, just_opened = state["written"], state["depth"], state["just_opened"]
  left_N = num_leaves_N - n
  nxt_N = _next_leaf(leaves_NxS, n)
  starts_V = _mask(c.starts, v)
  mid_word_N = (left_N > 0) & ~starts_V[nxt_N]  # inside a leaf token: only its next piece
  # Tokens that may still follow a piece at `position`, the last being EOS at limit - 1.
  room_N = limit_N - 2 - position

  def need(left, depth):  # pieces still to write, EOS aside
    return left + depth + 2 * ((depth == 0) & (left > 0))
  vocab_V = jnp.arange(v)
  leaf_NxV = (vocab_V[None, :] == nxt_N[:, None]) & (left_N > 0)[:, None] & (
      (depth > 0) | mid_word_N)[:, None] & (need(left_N - 1, depth) <= room_N)[:, None]
  open_NxV = _mask(c.opens, v)[None, :] & ((left_N > 0) & ~mid_word_N
                                           & (need(left_N, depth + 1) <= room_N))[:, None]
  close_NxV = _mask(c.closes, v)[None, :] & ((depth > 0) & ~just_opened & ~mid_word_N
                                             & (need(left_N, depth - 1) <= room_N))[:, None]
  # A label's further pieces, after its bracket's first.
  label_NxV = _mask(c.continues, v)[None, :] & (state["in_label"]
                                                & (need(left_N, depth) <= room_N))[:, None]
  eos_NxV = (vocab_V == EOS_ID)[None, :] & ((left_N == 0) & (depth == 0))[:, None]
  return leaf_NxV | open_NxV | close_NxV | label_NxV | eos_NxV


def constrained_step_fn(c: TreeConstraint, step_fn: StepFn, inputs_NxS, limit_N) -> StepFn:
  """`step_fn` with the constraint: its cache becomes (the model's cache, {'per_beam': state});
  start the search with `initial_cache`."""
  leaves_NxS, num_leaves_N = leaf_pieces(c, inputs_NxS)

  def wrapped(ids_Nx1, position, cache):
    model_cache, state = cache
    state = advance(c, state["per_beam"], ids_Nx1[:, 0], leaves_NxS, num_leaves_N)
    logits_NxV, model_cache = step_fn(ids_Nx1, position, model_cache)
    ok_NxV = allowed(c, state, leaves_NxS, num_leaves_N, position, limit_N)
    return _without(logits_NxV, ok_NxV), (model_cache, {"per_beam": state})
  return wrapped


def _without(logits_NxV, ok_NxV):
  """Logits whose softmax is the model's over the allowed pieces, unrenormalized: the forbidden
  pieces' mass moves to the padding id, which the search bans after its softmax."""
  logprobs_NxV = jax.nn.log_softmax(logits_NxV.astype(jnp.float32), axis=-1)
  sink_NxV = ~ok_NxV | (jnp.arange(ok_NxV.shape[-1]) == PAD_ID)[None, :]  # PAD's own mass too
  forbidden_N = jax.nn.logsumexp(jnp.where(sink_NxV, logprobs_NxV, -jnp.inf), axis=-1)
  out_NxV = jnp.where(ok_NxV, logprobs_NxV, NEG_INF)
  return out_NxV.at[:, PAD_ID].set(jnp.maximum(forbidden_N, NEG_INF))


def initial_cache(model_cache, rows: int):
  return model_cache, {"per_beam": init_state(rows)}
