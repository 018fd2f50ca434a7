"""Constrained beam search for parsing (`decode.parse_constraint`): every output is a tree.

The paper decodes a parser's linearized trees freely (§6.3); ours are repaired after decoding
(repair.py). With `decode.parse_constraint=True` (a deviation, off by default) the search itself
can only emit well-formed linearizations of the source sentence, so nothing needs repair:

- a target is whitespace-separated tokens, `(LABEL`, `)LABEL` and leaves (treebank.py); each
  token is one or more vocabulary pieces, the first beginning with '▁' (SentencePiece starts
  every whitespace-separated token so) and the rest not;
- the leaves are the source's own pieces in order (`data.parse_leaves='words'`: a word is the
  same pieces in the source and in the target, both segmented by one vocabulary), or the pieces
  of `XX` once per source word (`'xx'`);
- brackets only of the treebank's labels (treebank.PHRASE_LABELS), spelled piece by piece
  through a trie; an opening bracket only while leaves remain, at most
  `decode.parse_max_opens_in_a_row` between two leaves and at most MAX_DEPTH phrases open; a
  leaf only inside a phrase; a closing bracket only inside a phrase that has something in it
  (not right after an opening one) and not one that would end a unary chain (phrases each
  holding just the next, all over one span) longer than `decode.parse_max_unary_chain` (both
  limits: what the training trees need, :func:`search_limits`, which training checks);
  EOS only when every leaf is written and every phrase closed;
- and only while the open phrases can still all close within the chain limit with the words
  left: after the last word closing is the only way on, so a run of phrases each opened first in
  its parent needs a word written into it every `parse_max_unary_chain` phrases
  (`_words_needed`), or the limit would hold only while words remain;
- and only while the output can still be finished within its length limit (beam_search.py):
  each remaining leaf piece, each open phrase's closing bracket, and (outside any phrase) one
  more phrase must fit before the final EOS.

A piece that breaks the rule is removed without renormalizing: the allowed pieces keep the
model's own log-probabilities, so a hypothesis the model finds unlikely (one forced past the
EOS the model wanted) scores as unlikely, and the beam prefers the trees the model prefers.
The removed mass is handed to the padding id, which the search never emits (beam_search.py).
The automaton's state lives in the decoder cache under `per_beam` and follows its beam.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from transformer_jax.decoding.beam_search import NEG_INF, StepFn
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.special_ids import EOS_ID, PAD_ID
from transformer_jax.tasks.parsing import treebank

WORD_START = "▁"  # SentencePiece's whitespace marker


MAX_DEPTH = 64          # the most phrases open at once, each one's position among its parent's
                        # children tracked


@dataclasses.dataclass(frozen=True)
class TreeConstraint:
  """What the automaton needs of a vocabulary (hashable: a static argument of the jitted
  search): the pieces that begin a token (`starts`); the bracket tokens `(L` / `)L` of the
  treebank's labels as a trie over pieces (node 0 its root; `edges` (node, piece, child); each
  node's `terminal`: a whole token ends there), with `opens` / `closes` the first pieces of the
  opening / closing ones; the pieces of the leaf placeholder (`xx`, empty when leaves are the
  words); and the two limits on a tree's shape (config `decode.parse_max_*`)."""

  vocab_size: int
  starts: tuple[int, ...]
  opens: tuple[int, ...]
  closes: tuple[int, ...]
  edges: tuple[tuple[int, int, int], ...]
  terminal: tuple[bool, ...]
  to_end: tuple[int, ...]       # per node: the fewest pieces still needed to end a whole token
  shortest: tuple[int, int]     # the fewest pieces of an opening and of a closing bracket
  xx: tuple[int, ...]
  max_opens_in_a_row: int       # opening brackets between two leaves
  max_unary_chain: int          # phrases in a unary chain (over one span)

  def constrain(self, step_fn: StepFn, inputs_NxS, limit_N) -> StepFn:
    """The search's step with this constraint (decode.beam_decode calls it)."""
    return constrained_step_fn(self, step_fn, inputs_NxS, limit_N)

  def initial_cache(self, model_cache, rows: int):
    """The search's first cache: the model's and the automaton's start state of each row."""
    return initial_cache(model_cache, rows)


def from_tokenizer(tokenizer, labels, placeholder: str = "", *, max_opens_in_a_row: int,
                   max_unary_chain: int) -> TreeConstraint:
  """The constraint for a parser's vocabulary (data/tokenizer.py) and phrase `labels`
  (treebank.PHRASE_LABELS): leaves are the source's words, or `placeholder` (XX) once per word; the
  limits on a tree's shape as config `decode.parse_max_opens_in_a_row` and `..._unary_chain`."""
  pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
  starts = tuple(i for i, p in enumerate(pieces) if p.startswith(WORD_START)
                 and not (p.startswith("<") and p.endswith(">")))
  is_start = set(starts)
  edges, terminal, firsts, lengths = {}, [False], {"(": set(), ")": set()}, {"(": [], ")": []}
  for bracket in "()":
    for label in labels:
      ids, node = tokenizer.encode(bracket + label), 0
      if not ids or ids[0] not in is_start or any(i in is_start for i in ids[1:]):
        raise ConfigError(f"config key 'decode.parse_constraint': the vocabulary does not spell "
                          f"{bracket + label!r} as one token ({[pieces[i] for i in ids]}); it was "
                          "not trained on linearized trees")
      firsts[bracket].add(ids[0])
      lengths[bracket].append(len(ids))
      for i in ids:
        if (node, i) not in edges:
          edges[(node, i)] = len(terminal)
          terminal.append(False)
        node = edges[(node, i)]
      terminal[node] = True
  to_end = [0 if t else len(terminal) for t in terminal]
  for (node, _), child in sorted(edges.items(), key=lambda e: -e[1]):  # children after parents
    to_end[node] = min(to_end[node], 0 if terminal[node] else 1 + to_end[child])
  shortest = (min(lengths["("]), min(lengths[")"]))
  xx = tuple(tokenizer.encode(placeholder)) if placeholder else ()
  return TreeConstraint(len(pieces), starts, tuple(sorted(firsts["("])), tuple(sorted(firsts[")"])),
                        tuple((n, i, c) for (n, i), c in sorted(edges.items())), tuple(terminal),
                        tuple(to_end), shortest, xx, max_opens_in_a_row, max_unary_chain)


class Tables(NamedTuple):
  """The constraint as arrays, built once per search (outside its loop). The pieces a bracket
  token may write are few (its trie's pieces, `cand_C`), so the rule is worked out over them
  and the one leaf piece each row may write next, not over the whole vocabulary."""

  starts_V: jnp.ndarray      # bool: the piece begins a token
  opens_V: jnp.ndarray       # bool: the first piece of an opening bracket
  closes_V: jnp.ndarray      # bool: the first piece of a closing bracket
  trie_MxV: jnp.ndarray      # int32: the node a piece leads to from each node (0: none)
  terminal_M: jnp.ndarray    # bool
  to_end_M: jnp.ndarray      # int32
  xx: jnp.ndarray            # int32 [k]: the leaf placeholder's pieces (k = 0: the words)
  cand_C: jnp.ndarray        # int32: every piece of a bracket token, and EOS
  trie_MxC: jnp.ndarray      # int32: trie_MxV's columns of cand_C
  opens_C: jnp.ndarray       # bool: opens_V of cand_C
  closes_C: jnp.ndarray      # bool: closes_V of cand_C
  first_C: jnp.ndarray       # int32: the pieces still needed after cand_C begins a bracket token
  open_len: int
  close_len: int
  max_opens_in_a_row: int
  max_unary_chain: int


def tables(c: TreeConstraint) -> Tables:
  def mask(ids):
    return jnp.zeros((c.vocab_size,), bool).at[jnp.asarray(ids, jnp.int32)].set(True)
  nodes, ids, children = (jnp.asarray(x, jnp.int32) for x in zip(*c.edges))
  trie = jnp.zeros((len(c.terminal), c.vocab_size), jnp.int32).at[nodes, ids].set(children)
  cand = jnp.asarray(sorted({i for _, i, _ in c.edges} | {EOS_ID}), jnp.int32)
  opens, closes, to_end = mask(c.opens), mask(c.closes), jnp.asarray(c.to_end, jnp.int32)
  return Tables(mask(c.starts), opens, closes, trie, jnp.asarray(c.terminal), to_end,
                jnp.asarray(c.xx, jnp.int32), cand, trie[:, cand], opens[cand], closes[cand],
                to_end[trie[0, cand]], *c.shortest, c.max_opens_in_a_row, c.max_unary_chain)


def leaf_pieces(t: Tables, inputs_NxS):
  """The pieces the leaves must spell, in order [N, S'], and their number [N]: the source's
  pieces (EOS and padding dropped), or `XX`'s pieces once per source word."""
  valid_NxS = (inputs_NxS != PAD_ID) & (inputs_NxS != EOS_ID)
  if not t.xx.size:
    return jnp.where(valid_NxS, inputs_NxS, PAD_ID), valid_NxS.sum(axis=1)
  words_N = (valid_NxS & t.starts_V[inputs_NxS]).sum(axis=1)
  k = t.xx.size
  tiled = jnp.tile(t.xx, inputs_NxS.shape[1])[None, :]
  return jnp.broadcast_to(tiled, (inputs_NxS.shape[0], tiled.shape[1])), words_N * k


def init_state(n: int) -> dict:
  """Per row: leaf pieces written, open phrases, whether the last token opened a phrase, the
  trie node of the bracket token being written (0: none), opening brackets since the last leaf;
  per open phrase (by depth) whether it is its parent's first child; and the unary chain the
  innermost open phrase would end if it closed now (0: it holds something besides one phrase
  just closed)."""
  zeros = jnp.zeros((n,), jnp.int32)
  return {"written": zeros, "depth": zeros, "just_opened": jnp.zeros((n,), bool), "node": zeros,
          "opens_in_a_row": zeros, "first_child": jnp.zeros((n, MAX_DEPTH), bool),
          "unary_below": zeros}


def words_after(t: Tables, leaves_NxS, num_leaves_N):
  """[N, S'+1] int32: the words that begin at or after each leaf position (word-start pieces)."""
  pos_S = jnp.arange(leaves_NxS.shape[1])
  starts_NxS = t.starts_V[leaves_NxS] & (pos_S[None, :] < num_leaves_N[:, None])
  after_NxS = jnp.flip(jnp.cumsum(jnp.flip(starts_NxS.astype(jnp.int32), 1), axis=1), 1)
  return jnp.pad(after_NxS, ((0, 0), (0, 1)))


def _words_needed(first_child_NxD, depth_N, chain_N, empty_N, limit: int):
  """The fewest words still to write so that every open phrase can close with no unary chain
  longer than `limit`: closing from the innermost phrase outward, the chain grows by one with
  each phrase that was its parent's first child (and restarts at 0 with one that was not), a
  phrase may close only while the chain of its last child is below the limit, and a word written
  into it first restarts that chain. Words go in as late as possible (optimal: the chain only
  grows); an empty innermost phrase needs one. `chain_N`: the chain of the innermost phrase's
  last child (the state's `unary_below`)."""
  def close_one(i, carry):
    chain, need = carry
    k = MAX_DEPTH - 1 - i
    open_ = k < depth_N
    word = open_ & (chain >= limit)
    chain = jnp.where(word, 0, chain)
    chain = jnp.where(open_, jnp.where(first_child_NxD[:, k], chain + 1, 0), chain)
    return chain, need + word
  start = (jnp.where(empty_N, 0, chain_N), empty_N.astype(jnp.int32))
  return jax.lax.fori_loop(0, MAX_DEPTH, close_one, start)[1]


def _next_leaf(leaves_NxS, written_N):
  return jnp.take_along_axis(leaves_NxS, jnp.minimum(written_N, leaves_NxS.shape[1] - 1)[:, None],
                             axis=1)[:, 0]


def advance(t: Tables, state: dict, ids_N, leaves_NxS, num_leaves_N):
  """The state after each row emitted ids_N (PAD, the search's start, and EOS change nothing)."""
  n = state["written"]
  child_N = t.trie_MxV[state["node"], ids_N]
  is_cont = (state["node"] > 0) & (child_N > 0)  # the bracket token goes on
  is_leaf = ~is_cont & (ids_N == _next_leaf(leaves_NxS, n)) & (n < num_leaves_N)
  is_open = ~is_cont & ~is_leaf & t.opens_V[ids_N]
  is_close = ~is_cont & ~is_leaf & t.closes_V[ids_N]
  token_start = is_open | is_close | (is_leaf & t.starts_V[ids_N])
  depth_N, rows_N = state["depth"], jnp.arange(ids_N.shape[0])
  # an opened phrase is its parent's first child if the parent was empty; a closed phrase ends a
  # unary chain one longer than the one below it, which its parent extends if it was the first
  opened = jnp.minimum(depth_N, MAX_DEPTH - 1)
  first_child = state["first_child"].at[rows_N, opened].set(
      jnp.where(is_open, state["just_opened"], state["first_child"][rows_N, opened]))
  closed_first_N = state["first_child"][rows_N, jnp.clip(depth_N - 1, 0, MAX_DEPTH - 1)]
  chain_N = jnp.where(closed_first_N, state["unary_below"] + 1, 0)
  return {"written": n + is_leaf,
          "depth": state["depth"] + is_open - is_close,
          "just_opened": jnp.where(token_start, is_open, state["just_opened"]),
          "node": jnp.where(is_cont, child_N, jnp.where(is_open | is_close, t.trie_MxV[0, ids_N], 0)),
          "opens_in_a_row": jnp.where(is_leaf, 0, state["opens_in_a_row"] + is_open),
          "first_child": first_child,
          "unary_below": jnp.where(is_close, chain_N,
                                   jnp.where(is_leaf | is_open, 0, state["unary_below"]))}


def _chain_room(t: Tables, state: dict, words_left_N):
  """Per row, whether the phrases can still all close within the chain limit (`_words_needed`)
  after a leaf that begins a word, after an opening bracket and after a closing one."""
  n_rows = state["depth"].shape[0]
  rows_N, depth_N, fc_NxD = jnp.arange(n_rows), state["depth"], state["first_child"]
  opened_fc = fc_NxD.at[rows_N, jnp.minimum(depth_N, MAX_DEPTH - 1)].set(state["just_opened"])
  closing_first_N = fc_NxD[rows_N, jnp.clip(depth_N - 1, 0, MAX_DEPTH - 1)]
  zeros_N, false_N = jnp.zeros_like(depth_N), jnp.zeros((n_rows,), bool)
  need = _words_needed(  # the three successors stacked: [3N]
      jnp.concatenate([fc_NxD, opened_fc, fc_NxD]),
      jnp.concatenate([depth_N, depth_N + 1, depth_N - 1]),
      jnp.concatenate([zeros_N, zeros_N, jnp.where(closing_first_N, state["unary_below"] + 1, 0)]),
      jnp.concatenate([false_N, ~false_N, false_N]), t.max_unary_chain).reshape(3, n_rows)
  return need[0] <= words_left_N - 1, need[1] <= words_left_N, need[2] <= words_left_N


def allowed(t: Tables, state: dict, leaves_NxS, num_leaves_N, position, limit_N, words_after_NxS):
  """[N, V] bool: the pieces each row may emit at `position` (see the module docstring);
  `words_after_NxS`: words_after's table. `allowed_pieces` laid out over the vocabulary."""
  ok_NxC, leaf_N, nxt_N = allowed_pieces(t, state, leaves_NxS, num_leaves_N, position, limit_N,
                                         words_after_NxS)
  rows_N = jnp.arange(ok_NxC.shape[0])
  ok_NxV = jnp.zeros((ok_NxC.shape[0], t.starts_V.shape[0]), bool).at[:, t.cand_C].set(ok_NxC)
  return ok_NxV.at[rows_N, nxt_N].set(ok_NxV[rows_N, nxt_N] | leaf_N)


def allowed_pieces(t: Tables, state: dict, leaves_NxS, num_leaves_N, position, limit_N,
                   words_after_NxS):
  """The rule of `allowed` over the pieces it can allow: ([N, C] bool for t.cand_C, [N] bool
  whether the row's next leaf piece is allowed, [N] int32 that piece)."""
  n, depth, just_opened, node = (state[k] for k in ("written", "depth", "just_opened", "node"))
  words_left_N = jnp.take_along_axis(words_after_NxS, n[:, None], axis=1)[:, 0]
  leaf_room_N, open_room_N, close_room_N = _chain_room(t, state, words_left_N)
  left_N = num_leaves_N - n
  nxt_N = _next_leaf(leaves_NxS, n)
  mid_word_N = (left_N > 0) & ~t.starts_V[nxt_N]  # inside a leaf: only its next piece
  # A token may begin once the bracket token being written is whole (or none is).
  boundary_N = ~mid_word_N & ((node == 0) | t.terminal_M[node])
  room_N = limit_N - 2 - position  # pieces that may still follow, the last being EOS
  to_end, open_len, close_len = t.to_end_M, t.open_len, t.close_len

  def fits(left, depth, extra=0):  # what is still to write after this piece fits the limit
    need = left + depth * close_len + (open_len + close_len) * ((depth == 0) & (left > 0))
    return need[..., None] + extra <= room_N[:, None] if jnp.ndim(extra) else need <= room_N
  leaf_N = (left_N > 0) & fits(left_N - 1, depth) & (
      mid_word_N | boundary_N & (depth > 0) & leaf_room_N)
  child_NxC = t.trie_MxC[node]  # a bracket token's next piece, to the end of a treebank label
  label_NxC = (child_NxC > 0) & (node > 0)[:, None] & fits(left_N, depth, to_end[child_NxC])
  first_C = t.first_C[None, :]  # a bracket token's first piece, and what it commits to
  open_NxC = t.opens_C[None, :] & fits(left_N, depth + 1, first_C) & (
      boundary_N & (left_N > 0) & (state["opens_in_a_row"] < t.max_opens_in_a_row)
      & (depth < MAX_DEPTH) & open_room_N)[:, None]
  too_long_N = state["unary_below"] >= t.max_unary_chain  # no unary chain past the limit
  close_NxC = t.closes_C[None, :] & fits(left_N, depth - 1, first_C) & (
      boundary_N & (depth > 0) & ~just_opened & ~too_long_N & close_room_N)[:, None]
  eos_NxC = (t.cand_C == EOS_ID)[None, :] & (boundary_N & (left_N == 0) & (depth == 0))[:, None]
  return label_NxC | open_NxC | close_NxC | eos_NxC, leaf_N, nxt_N


def constrained_step_fn(c: TreeConstraint, step_fn: StepFn, inputs_NxS, limit_N) -> StepFn:
  """`step_fn` with the constraint: its cache becomes (the model's cache, {'per_beam': state});
  start the search with `initial_cache`."""
  t = tables(c)
  leaves_NxS, num_leaves_N = leaf_pieces(t, inputs_NxS)
  words_after_NxS = words_after(t, leaves_NxS, num_leaves_N)

  def wrapped(ids_Nx1, position, cache):
    model_cache, state = cache
    state = advance(t, state["per_beam"], ids_Nx1[:, 0], leaves_NxS, num_leaves_N)
    logits_NxV, model_cache = step_fn(ids_Nx1, position, model_cache)
    ok_NxV = allowed(t, state, leaves_NxS, num_leaves_N, position, limit_N, words_after_NxS)
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


# ----------------------------------------------------------------------------- the limits trees need


def search_limits(linearized: str) -> tuple[int, int]:
  """What the constrained search must allow to write this linearization:
  (the most opening brackets between two leaves, the longest unary chain: phrases each holding
  just the next, the last holding anything else). Counted as the search counts them, token by
  token."""
  tokens = linearized.split()
  opens = most_opens = longest = unary_below = 0
  first_child, just_opened = [], False  # per open phrase: its parent's first child
  for t in tokens:
    if t.startswith("("):
      first_child.append(just_opened)
      opens, unary_below = opens + 1, 0
      most_opens = max(most_opens, opens)
    elif t.startswith(")"):
      longest = max(longest, unary_below + 1)
      unary_below = unary_below + 1 if first_child.pop() else 0
    else:
      opens, unary_below = 0, 0
    just_opened = t.startswith("(")
  return most_opens, longest


def search_limit_warnings(examples: list[treebank.Example], decode) -> list[str]:
  """Training trees against the constrained search's limits on a tree's shape (config
  `decode.parse_max_*`): a line for each limit that some trees exceed (with
  `decode.parse_constraint` the search could not write them), naming the value they need."""
  needed = [search_limits(e.linearized) for e in examples]
  out = []
  for i, key in enumerate(("parse_max_opens_in_a_row", "parse_max_unary_chain")):
    over = [(n[i], e) for n, e in zip(needed, examples) if n[i] > decode[key]]
    if over:
      most, e = max(over, key=lambda x: x[0])
      out.append(f"{len(over)} of {len(examples)} training trees exceed decode.{key}="
                 f"{decode[key]} (the constrained search could not write them; the most, {most}, "
                 f"at {e.path} line {e.line}): decode with --config.decode.{key}={most}")
  return out
