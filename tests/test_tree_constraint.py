"""Constrained beam search for parsers (tree_constraint.py): every gold linearization of the
sample treebank is allowed, and a random model's constrained outputs are trees over the source
words (its free outputs are not)."""

from __future__ import annotations

import functools
import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.common import DATA_DIR
from tests.test_decode import init_params
from transformer_jax.data import tokenizer as tok_lib
from transformer_jax.decoding import beam_search, decode
from transformer_jax.runtime.config import default_config, ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.tasks import registry
from transformer_jax.tasks.parsing import repair, tree_constraint as tc, treebank

SAMPLE = os.path.join(DATA_DIR, "ptb-sample", "combined") if DATA_DIR else ""
needs_sample = pytest.mark.skipif(not SAMPLE or not os.path.isdir(SAMPLE),
                                  reason="needs the Penn Treebank sample (TRANSFORMER_JAX_DATA_DIR)")


@functools.lru_cache(maxsize=None)
def sample():
  """A parser's vocabulary (400 pieces, brackets one piece or several) and 40 dev trees."""
  train = treebank.read_examples(
      tuple(sorted(glob.glob(os.path.join(SAMPLE, "wsj_00[0-2]*.mrg")))))
  texts = [e.words for e in train] + [e.linearized_words for e in train] + [e.linearized for e in train]
  tok = tok_lib.Tokenizer(tok_lib.train_sentencepiece(texts, vocab_type="bpe", vocab_size=400,
                                                      split_by_script=False))
  dev = treebank.read_examples(
      tuple(sorted(glob.glob(os.path.join(SAMPLE, "wsj_016*.mrg")))))[:40]
  return tok, dev


LIMITS = default_config().decode  # parse_max_opens_in_a_row, parse_max_unary_chain


def _constraint(tok, placeholder: str = "", opens: int = LIMITS.parse_max_opens_in_a_row,
                unary: int = LIMITS.parse_max_unary_chain):
  return tc.from_tokenizer(tok, treebank.PHRASE_LABELS, placeholder, max_opens_in_a_row=opens,
                           max_unary_chain=unary)


@functools.lru_cache(maxsize=None)
def _walker(c):
  """A jitted walk through `c`'s automaton: (inputs [N, S], target pieces [N, T], length limits
  [N]) -> [T, N] whether each piece was allowed where it came, the rows stepping together
  (PAD, fed after a row's end, changes nothing)."""
  tables = tc.tables(c)

  @jax.jit
  def run(inputs_NxS, pieces_NxT, limit_N):
    leaves, count = tc.leaf_pieces(tables, inputs_NxS)
    words = tc.words_after(tables, leaves, count)
    rows_N = jnp.arange(inputs_NxS.shape[0])

    def step(state, position_and_pieces):
      position, pieces_N = position_and_pieces
      ok_N = tc.allowed(tables, state, leaves, count, position, limit_N, words)[rows_N, pieces_N]
      return tc.advance(tables, state, pieces_N, leaves, count), ok_N
    positions = jnp.arange(pieces_NxT.shape[1])
    return jax.lax.scan(step, tc.init_state(inputs_NxS.shape[0]), (positions, pieces_NxT.T))[1]
  return run


def _walks(c, tok, pairs, limit_extra: int = 300):
  """Feeds each (source, target)'s target pieces (then EOS) through the automaton, all pairs as
  one batch: per pair the first (position, piece) it forbids, or None when every one (EOS
  included) was allowed. Lengths are padded to multiples of 64, so that most walks through one
  automaton share one compilation."""
  sources = [tok.encode_with_eos(s) for s, _ in pairs]
  targets = [tok.encode(t) + [decode.EOS_ID] for _, t in pairs]

  def pad(rows):
    width = -(-max(map(len, rows)) // 64) * 64
    return jnp.asarray([r + [decode.PAD_ID] * (width - len(r)) for r in rows], jnp.int32)
  limit_N = jnp.asarray([len(s) + limit_extra for s in sources])  # each source's own limit
  ok_TxN = np.asarray(_walker(c)(pad(sources), pad(targets), limit_N))
  firsts = []
  for n, target in enumerate(targets):
    forbidden = np.flatnonzero(~ok_TxN[:len(target), n])
    firsts.append((int(forbidden[0]), tok.id_to_piece(target[forbidden[0]])) if forbidden.size
                  else None)
  return firsts


def _walk(c, tok, source: str, target: str, limit_extra: int = 300):
  """_walks for one pair."""
  return _walks(c, tok, [(source, target)], limit_extra)[0]


@needs_sample
@pytest.mark.parametrize("leaves", ["words", "xx"])
def test_every_gold_tree_is_allowed(leaves):
  tok, dev = sample()
  c = _constraint(tok, treebank.POS_PLACEHOLDER if leaves == "xx" else "")
  assert len(c.opens) > 1 and len(c.closes) > 1
  several = [t for t in {x for e in dev for x in e.linearized.split() if x[0] in "()"}
             if len(tok.encode(t)) > 1]
  assert several  # labels of more than one piece are exercised too
  targets = [e.linearized_words if leaves == "words" else e.linearized for e in dev]
  firsts = _walks(c, tok, [(e.words, t) for e, t in zip(dev, targets)])
  assert firsts == [None] * len(dev), [(t, f) for t, f in zip(targets, firsts) if f]


@needs_sample
def test_what_the_automaton_forbids():
  tok, _ = sample()
  c = _constraint(tok)
  src = "the cat sat ."
  assert _walk(c, tok, src, "(S (NP the cat )NP (VP sat )VP . )S") is None
  assert _walk(c, tok, src, "(S (NP the cat )NP (VP sat )VP )S")[1] == "</s>"     # a word left out
  assert _walk(c, tok, src, "(S (NP the dog )NP") is not None                      # not the source's
  assert _walk(c, tok, src, "the (S cat") is not None                                # a leaf outside a phrase
  assert _walk(c, tok, src, "(S (NP )NP the cat sat . )S") is not None              # an empty phrase
  assert _walk(c, tok, src, "(S the cat sat . )S )S") is not None                   # nothing to close
  assert _walk(c, tok, src, "(S (FOO the cat )FOO sat . )S") is not None            # not a label
  assert _walk(c, tok, src, "(S (NPX the cat )NP sat . )S") is not None             # half a label
  deep = " ".join(["(NP"] * LIMITS.parse_max_opens_in_a_row)  # (a chain: allowed as one here)
  unchained = _constraint(tok, unary=LIMITS.parse_max_opens_in_a_row + 1)
  assert _walk(unchained, tok, "the", f"{deep} the {')NP ' * LIMITS.parse_max_opens_in_a_row}") is None
  assert _walk(unchained, tok, src, f"(S {deep} the") is not None                   # too many opens
  assert _walk(c, tok, src, "(S the cat sat . ") is not None                        # EOS inside a phrase
  # Unary chains (phrases each holding just the next) of at most parse_max_unary_chain; a phrase
  # with two children ends no chain. After the last word closing is the only way on, so the
  # chain a run of first-child phrases will make there is refused when the run is opened.
  k = LIMITS.parse_max_unary_chain
  chain = lambda n, leaf: f"{'(NP ' * n}{leaf} {')NP ' * n}"
  assert _walk(c, tok, src, f"(S {chain(k, 'the')} cat sat . )S") is None
  assert _walk(c, tok, src, f"(S {chain(k + 1, 'the')} cat sat . )S") is not None
  assert _walk(c, tok, src, f"(S {'(NP ' * (k + 1)}the {')NP ' * k}(NP cat )NP )NP sat . )S") is None
  assert _walk(c, tok, src, f"(S (NP {chain(k, 'the')} cat )NP sat . )S") is None
  assert _walk(c, tok, src, f"(S (NP the {chain(k, 'cat')} )NP sat . )S") is None
  assert _walk(c, tok, src, f"(S the cat sat {chain(k, '.')} )S") is None
  assert _walk(c, tok, src, f"(S the cat sat {chain(k + 1, '.')} )S") == (
      len(tok.encode(f"(S the cat sat {'(NP ' * k}")), tok.id_to_piece(tok.encode("(NP")[0]))
  # A run of k + 1 first children holding two words can still close: the last word breaks it.
  assert _walk(c, tok, src, f"(S the cat {'(NP ' * (k + 1)}sat )NP . {')NP ' * k})S") is None
  assert _walk(c, tok, src, f"(S the cat {'(NP ' * (k + 1)}sat . {')NP ' * (k + 1)})S") is not None
  # The length limit (source pieces + EOS + limit_extra): the flat tree fits exactly, one more
  # phrase does not.
  extra = len(tok.encode("(S )S"))
  assert _walk(c, tok, src, "(S the cat sat . )S", limit_extra=extra) is None
  assert _walk(c, tok, src, "(S (NP the cat )NP sat . )S", limit_extra=extra) is not None


@needs_sample
def test_the_limits_a_tree_needs_are_the_ones_the_search_counts():
  """tc.search_limits (what training checks against the config) agrees with the automaton:
  each dev tree walks through with its own limits, and not with one less of either."""
  tok, dev = sample()
  needed = {tc.search_limits(e.linearized) for e in dev}
  assert {o for o, _ in needed} >= {2, 3, 4} and {u for _, u in needed} >= {1, 2, 3}
  cases = {}  # the automaton's (opens, unary) limits -> [(tree, whether it may pass)]
  for opens, unary in sorted(needed):
    e = next(e for e in dev if tc.search_limits(e.linearized) == (opens, unary))
    cases.setdefault((opens, unary), []).append((e, True))
    cases.setdefault((opens - 1, unary), []).append((e, False))
    cases.setdefault((opens, unary - 1), []).append((e, False))
  for (opens, unary), trees_ in cases.items():
    firsts = _walks(_constraint(tok, opens=opens, unary=unary), tok,
                    [(e.words, e.linearized_words) for e, _ in trees_])
    assert [f is None for f in firsts] == [ok for _, ok in trees_], ((opens, unary), firsts)
  assert tc.search_limits("(S (NP (NP the )NP )NP (VP sat )VP )S") == (3, 2)
  assert tc.search_limits("(S (VP (NP the )NP )VP )S") == (3, 3)  # closes after the last leaf


@needs_sample
@pytest.mark.parametrize("unary", [1, 2])
def test_random_walks_through_the_automaton_never_end_in_a_dead_end(unary):
  """Whatever allowed piece is chosen, some piece is allowed next, until EOS: the chain
  look-ahead never leaves a hypothesis without a legal token (random choices favour opening
  brackets, which make the long runs of first children it must foresee)."""
  tok, dev = sample()
  c = _constraint(tok, unary=unary)
  tables = tc.tables(c)
  rng = np.random.default_rng(unary)
  sentences = dev[:12]
  encoded = [tok.encode_with_eos(e.words) for e in sentences]
  inputs = jnp.asarray([x + [0] * (max(map(len, encoded)) - len(x)) for x in encoded], jnp.int32)
  leaves_all, count_all = tc.leaf_pieces(tables, inputs)  # padded alike: one compilation each
  words_all = tc.words_after(tables, leaves_all, count_all)
  advance = jax.jit(lambda s, p, leaves, count: tc.advance(tables, s, p, leaves, count))
  allowed = jax.jit(lambda s, t, leaves, count, limit, words: tc.allowed(
      tables, s, leaves, count, t, limit, words))
  for i, e in enumerate(sentences):
    leaves, count, words = (a[i:i + 1] for a in (leaves_all, count_all, words_all))
    limit = jnp.asarray([len(encoded[i]) + 300])
    state, out = tc.init_state(1), []
    for t in range(len(encoded[i]) + 300):
      ok = np.flatnonzero(np.asarray(allowed(state, t, leaves, count, limit, words)[0]))
      assert ok.size, (e.words, tok.decode(out))
      opens = [o for o in ok if o in c.opens]
      piece = int(rng.choice(opens if opens and rng.random() < 0.6 else ok))
      if piece == decode.EOS_ID:
        break
      out.append(piece)
      state = advance(state, jnp.asarray([piece]), leaves, count)
    assert piece == decode.EOS_ID
    parsed = repair.delinearize(tok.decode(out), e.words, "words")
    assert not parsed.repaired
    assert max(tc.search_limits(tok.decode(out))[1], 1) <= unary, tok.decode(out)


def _tiny_parser(tok):
  """(model config, parameters) of a fixed random parser over the sample's vocabulary."""
  cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=16, num_heads=2, d_k=8, d_v=8, d_ff=32,
                    num_encoder_layers=1, num_decoder_layers=1, max_len=256, dropout_rate=0.0)
  return cfg, init_params(cfg, seed=3, scale=3.0)


def _decode(tok, c, sources, *, beam_size, drop_finished=False, segments=False):
  """The decoded texts (with `segments`: dropping_decode's segments instead)."""
  cfg, params = _tiny_parser(tok)
  ids = [tok.encode_with_eos(s) for s in sources]
  inputs = np.zeros((len(ids), max(map(len, ids))), np.int32)
  for i, x in enumerate(ids):
    inputs[i, :len(x)] = x
  if segments:
    return decode.dropping_decode(cfg, params, inputs, beam_size=beam_size, alpha=0.3,
                                  max_extra_len=60, constraint=c)[2]
  out, _ = decode.translate_batch(cfg, params, inputs, beam_size=beam_size, alpha=0.3,
                                  max_extra_len=60, constraint=c, drop_finished=drop_finished)
  return [tok.decode(x) for x in decode.strip_eos(out)]


@needs_sample
@pytest.mark.parametrize("leaves, beam_size", [("words", 4), ("xx", 1)])
def test_a_random_models_constrained_outputs_are_trees_over_the_words(leaves, beam_size):
  tok, dev = sample()
  c = _constraint(tok, treebank.POS_PLACEHOLDER if leaves == "xx" else "")
  sources = [e.words for e in dev[:6]]
  free = [repair.delinearize(o, s, leaves) for s, o in
          zip(sources, _decode(tok, None, sources, beam_size=beam_size))]
  assert any(p.repaired for p in free)  # unconstrained, random weights write no trees
  for s, o in zip(sources, _decode(tok, c, sources, beam_size=beam_size)):
    parsed = repair.delinearize(o, s, leaves)
    assert not parsed.repaired, o
    if leaves == "words":  # the leaves the search wrote are the sentence
      assert [t for t in o.split() if t[0] not in "()"] == s.split()


@needs_sample
def test_sentences_that_leave_the_batch_get_the_trees_they_got_in_it():
  """decode.dropping_decode on a fixed random parser: 16 sentences (8, then 4 left searching)
  give the very trees of the search that keeps every sentence to the end."""
  tok, dev = sample()
  c = _constraint(tok)
  sources = [e.words for e in dev[:16]]
  assert decode.next_rows(16) == 8 and decode.next_rows(8) == 4 and decode.next_rows(4) == 0
  assert _decode(tok, c, sources, beam_size=4, drop_finished=True) == _decode(
      tok, c, sources, beam_size=4)
  assert len(_decode(tok, c, sources, beam_size=4, segments=True)) > 1


@needs_sample
def test_padding_rows_end_the_constrained_search_at_once():
  """A padding row (an empty source) allows one output, the empty tree, so it is done after one
  step: a batch's padding rows (an evaluation's last batch, a single sentence) never run the
  search on to their length limit."""
  tok, dev = sample()
  cfg, params = _tiny_parser(tok)
  search = functools.partial(decode.translate_batch, cfg, params, beam_size=4, alpha=0.3,
                             constraint=_constraint(tok))
  ids = tok.encode_with_eos(dev[0].words)
  inputs = np.zeros((4, len(ids)), np.int32)
  inputs[0] = ids
  out, steps = search(inputs[1:], max_extra_len=150)
  assert int(steps) == 1 and decode.strip_eos(out) == [[], [], []]
  with_sentence, _ = search(inputs, max_extra_len=40)
  assert decode.strip_eos(with_sentence)[1:] == [[], [], []]
  assert decode.strip_eos(with_sentence)[0] == decode.strip_eos(
      search(inputs[:1], max_extra_len=40)[0])[0]


def test_the_constraint_is_for_parsers():
  config = default_config()
  config.decode.parse_constraint = True
  with pytest.raises(ConfigError, match="decode.parse_constraint"):
    registry.get(config)


def test_the_automatons_state_follows_its_beam():
  """The search reorders what sits under `per_beam` with the beams, and not the model's cache
  (whose key/value buffers attention reads through its own `source_beams` tables)."""
  cache = tc.initial_cache({"cached_key": jnp.arange(4.0)}, 4)
  cache[1]["per_beam"]["depth"] = jnp.asarray([5, 6, 7, 8])
  cache[1]["per_beam"]["first_child"] = cache[1]["per_beam"]["first_child"].at[1, 3].set(True)
  model, state = beam_search.reorder_cache(cache, jnp.asarray([1, 1, 0, 3]))
  assert state["per_beam"]["depth"].tolist() == [6, 6, 5, 8]
  assert state["per_beam"]["first_child"][:, 3].tolist() == [True, True, False, False]
  assert model["cached_key"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_forbidden_pieces_are_removed_without_renormalizing():
  """The allowed pieces keep the model's log-probabilities after the search's softmax (a forced
  hypothesis stays as unlikely as the model finds it); the forbidden ones cannot be chosen."""
  logits = jnp.asarray([[0.5, 1.0, 2.0, -1.0, 0.3]])
  model = jax.nn.log_softmax(logits)
  for ok in ([False, True, False, True, True], [True] * 5, [False, False, True, False, False]):
    ok = jnp.asarray([ok])
    got = beam_search._step_log_probs(tc._without(logits, ok), 0, jnp.asarray([10]))
    allowed = ok[0].at[decode.PAD_ID].set(False)
    np.testing.assert_allclose(got[0][allowed], model[0][allowed], rtol=1e-6)
    assert (got[0][~allowed] < 0.5 * beam_search.NEG_INF).all()


def _dense_allowed(t, state, leaves_NxS, num_leaves_N, position, limit_N, words_after_NxS):
  """The rule written over the whole vocabulary, as the search first ran it: the reference that
  tc.allowed (worked out over the bracket pieces and each row's next leaf) must equal."""
  v = t.starts_V.shape[0]
  n, depth, just_opened, node = (state[k] for k in ("written", "depth", "just_opened", "node"))
  words_left_N = jnp.take_along_axis(words_after_NxS, n[:, None], axis=1)[:, 0]
  leaf_room_N, open_room_N, close_room_N = tc._chain_room(t, state, words_left_N)
  left_N = num_leaves_N - n
  nxt_N = tc._next_leaf(leaves_NxS, n)
  mid_word_N = (left_N > 0) & ~t.starts_V[nxt_N]
  boundary_N = ~mid_word_N & ((node == 0) | t.terminal_M[node])
  room_N = limit_N - 2 - position

  def fits(left, depth, extra=0):
    need = left + depth * t.close_len + (t.open_len + t.close_len) * ((depth == 0) & (left > 0))
    return need[..., None] + extra <= room_N[:, None] if jnp.ndim(extra) else need <= room_N
  vocab_V = jnp.arange(v)
  leaf = (vocab_V[None, :] == nxt_N[:, None]) & ((left_N > 0) & fits(left_N - 1, depth) & (
      mid_word_N | boundary_N & (depth > 0) & leaf_room_N))[:, None]
  child = t.trie_MxV[node]
  label = (child > 0) & (node > 0)[:, None] & fits(left_N, depth, t.to_end_M[child])
  first = t.to_end_M[t.trie_MxV[0]][None, :]
  opens = t.opens_V[None, :] & fits(left_N, depth + 1, first) & (
      boundary_N & (left_N > 0) & (state["opens_in_a_row"] < t.max_opens_in_a_row)
      & (depth < tc.MAX_DEPTH) & open_room_N)[:, None]
  closes = t.closes_V[None, :] & fits(left_N, depth - 1, first) & (
      boundary_N & (depth > 0) & ~just_opened & ~(state["unary_below"] >= t.max_unary_chain)
      & close_room_N)[:, None]
  eos = (vocab_V == decode.EOS_ID)[None, :] & (boundary_N & (left_N == 0) & (depth == 0))[:, None]
  return leaf | label | opens | closes | eos


@needs_sample
@pytest.mark.parametrize("leaves", ["words", "xx"])
def test_the_rule_over_bracket_pieces_is_the_rule_over_the_vocabulary(leaves, monkeypatch):
  """The search's masks equal the whole-vocabulary reference in every state a gold walk and a
  beam search reach (tight length limits included), so it writes the same trees."""
  tok, dev = sample()
  c = _constraint(tok, treebank.POS_PLACEHOLDER if leaves == "xx" else "")
  t = tc.tables(c)
  assert t.cand_C.shape[0] < tok.vocab_size // 4  # the point: few pieces, not the vocabulary
  examples = dev[:8]
  encoded = [tok.encode_with_eos(e.words) for e in examples]
  inputs = jnp.asarray([x + [0] * (max(map(len, encoded)) - len(x)) for x in encoded], jnp.int32)
  targets = [tok.encode(e.linearized_words if leaves == "words" else e.linearized)
             for e in examples]
  leaves_NxS, count_N = tc.leaf_pieces(t, inputs)
  words_NxS = tc.words_after(t, leaves_NxS, count_N)
  for extra in (300, 3):  # a roomy limit, and one that makes the length look-ahead bite
    limit_N = jnp.asarray([len(y) + 1 + extra for y in targets])  # EOS, then `extra`

    @jax.jit
    def both(state, position, limit_N=limit_N):
      return (tc.allowed(t, state, leaves_NxS, count_N, position, limit_N, words_NxS),
              _dense_allowed(t, state, leaves_NxS, count_N, position, limit_N, words_NxS))
    state = tc.init_state(len(examples))
    for position in range(max(map(len, targets)) + 1):
      fast, dense = both(state, position)
      np.testing.assert_array_equal(np.asarray(fast), np.asarray(dense))
      pieces = jnp.asarray([y[position] if position < len(y) else decode.PAD_ID for y in targets])
      state = jax.jit(lambda s, p: tc.advance(t, s, p, leaves_NxS, count_N))(state, pieces)
  sources = [e.words for e in examples[:4]]
  fast = _decode(tok, c, sources, beam_size=4)
  monkeypatch.setattr(tc, "allowed", _dense_allowed)
  decode.jitted_beam_decode.cache_clear()  # compiled with the rule as it was
  try:
    assert _decode(tok, c, sources, beam_size=4) == fast
  finally:
    decode.jitted_beam_decode.cache_clear()
