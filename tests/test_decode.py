"""KV-cache decoding and beam search on tiny random models (float32, CPU).

Tolerances: scores here are sums of float32 log-probabilities (magnitudes 1-50) computed by two
different XLA programs (the cached decoder step and the teacher-forced forward pass), whose CPU
kernels round differently on different processors (an AVX-512 Xeon differs from an AMD EPYC by
~2e-6 relative). They are compared with a relative tolerance of 1e-5 (`SCORE_TOL`); a real bug
(a wrong or missing token, an EOS term dropped, the length penalty off by one) moves a score by
more than 1e-3 relative. Logits of the cached and the full decoder get the same relative bound.
"""

from __future__ import annotations

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.decoding import beam_search, decode
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime.config import ModelConfig

EOS = decode.EOS_ID
SCORE_TOL = dict(rtol=1e-5, atol=1e-6)


def tiny_config(**changes) -> ModelConfig:
  cfg = ModelConfig(vocab_size=13, d_model=16, num_heads=2, d_k=8, d_v=8, d_ff=32,
                    num_encoder_layers=1, num_decoder_layers=1, max_len=32, dropout_rate=0.0)
  return cfg.replace(**changes)


@functools.lru_cache(maxsize=None)
def teacher_forced(cfg: ModelConfig):
  """Jitted (params, inputs, targets) -> logits [B, T, V], no cache."""
  return jax.jit(lambda params, inputs, targets: Transformer(cfg).apply({"params": params},
                                                                         inputs, targets))


@functools.lru_cache(maxsize=None)
def jitted_init(cfg: ModelConfig):
  return jax.jit(Transformer(cfg).init)  # eager Flax init is slower than compiling it


def init_params(cfg: ModelConfig, seed=0, scale=1.0):
  dummy = jnp.ones((1, 4), jnp.int32)
  params = nn.meta.unbox(jitted_init(cfg)(jax.random.PRNGKey(seed), dummy, dummy)["params"])
  # A larger scale makes the random model's next-token distributions peakier (and lets it
  # choose EOS on its own); it does not change what is being compared.
  return jax.tree_util.tree_map(lambda p: p * scale, params)


def pad_targets(seqs, rows_multiple=32, width=16) -> np.ndarray:
  """Token lists -> int32 [N', 16], N' rounded up, so the scorer compiles once per config."""
  rows = -(-len(seqs) // rows_multiple) * rows_multiple
  targets_NxT = np.zeros((rows, width), np.int32)
  targets_NxT[len(seqs):, 0] = EOS
  for i, s in enumerate(seqs):
    targets_NxT[i, :len(s)] = s
  return targets_NxT


def sequence_logprobs(cfg, params, inputs_1xS, seqs):
  """Teacher-forced log P(y) of EOS-terminated token lists (no cache), for one source."""
  targets_NxT = pad_targets(seqs)
  inputs_NxS = jnp.repeat(jnp.asarray(inputs_1xS), len(targets_NxT), axis=0)
  logits_NxTxV = teacher_forced(cfg)(params, inputs_NxS, jnp.asarray(targets_NxT))
  logprobs_NxTxV = np.asarray(jax.nn.log_softmax(logits_NxTxV, axis=-1), np.float64)
  token_NxT = np.take_along_axis(logprobs_NxTxV, targets_NxT[:, :, None], axis=2)[:, :, 0]
  return np.sum(np.where(targets_NxT != 0, token_NxT, 0.0), axis=1)[:len(seqs)]


def lp(n, alpha):
  return ((5.0 + n) / 6.0) ** alpha


def trim(row) -> list[int]:
  row = list(np.asarray(row))
  return row[:row.index(EOS) + 1]


# ----------------------------------------------------------------------------- the KV cache


@pytest.mark.parametrize("impl", ["einsum", "dot_product_attention"])
def test_cached_decoding_matches_teacher_forcing(impl):
  cfg = tiny_config(attention_impl=impl, num_encoder_layers=2, num_decoder_layers=2)
  params = init_params(cfg)
  rng = np.random.RandomState(0)
  inputs_BxS = rng.randint(1, cfg.vocab_size, (3, 7)).astype(np.int32)
  inputs_BxS[0, 4:] = 0   # padding in the source
  inputs_BxS[1, 1:] = 0
  targets_BxT = jnp.asarray(rng.randint(1, cfg.vocab_size, (3, 6)), jnp.int32)
  inputs_BxS = jnp.asarray(inputs_BxS)
  full_BxTxV = teacher_forced(cfg)(params, inputs_BxS, targets_BxT)

  buffer = 9  # longer than the targets: unused cache slots must stay masked
  @jax.jit
  def encode_and_init_cache(params, inputs_BxS):
    encoded_BxSxD = decode.encode(cfg, params, inputs_BxS)
    return encoded_BxSxD, decode.init_cache(cfg, params, encoded_BxSxD, inputs_BxS, buffer)

  encoded_BxSxD, cache = encode_and_init_cache(params, inputs_BxS)
  step_fn = jax.jit(decode.make_step_fn(cfg, params, encoded_BxSxD, inputs_BxS, buffer))
  decoder_inputs_BxT = jnp.pad(targets_BxT, ((0, 0), (1, 0)))[:, :-1]
  steps = []
  for t in range(targets_BxT.shape[1]):
    logits_BxV, cache = step_fn(decoder_inputs_BxT[:, t:t + 1], jnp.int32(t), cache)
    steps.append(logits_BxV)
  np.testing.assert_allclose(np.stack(steps, axis=1), full_BxTxV, rtol=1e-5, atol=1e-5)


def test_reorder_cache_permutes_the_beam_tables_only():
  """Beams are reordered by their self-attention beam tables; the key/value buffers are never
  copied (attention reads them through the tables)."""
  table = jnp.arange(4, dtype=jnp.int32)[:, None] * 10 + jnp.arange(3)[None, :]
  cache = {"layer": {"self_attention": {"cached_key": jnp.arange(4.0)[:, None],
                                        "cached_value": jnp.arange(4.0)[:, None],
                                        "source_beams": table, "cache_index": jnp.array(3)},
                     "cross_attention": {"cross_key": jnp.arange(4.0)[:, None]}}}
  out = beam_search.reorder_cache(cache, jnp.array([1, 1, 3, 2]))["layer"]
  np.testing.assert_array_equal(out["self_attention"]["source_beams"], table[jnp.array([1, 1, 3, 2])])
  np.testing.assert_array_equal(out["self_attention"]["cached_key"][:, 0], [0, 1, 2, 3])
  np.testing.assert_array_equal(out["self_attention"]["cached_value"][:, 0], [0, 1, 2, 3])
  np.testing.assert_array_equal(out["cross_attention"]["cross_key"][:, 0], [0, 1, 2, 3])
  assert int(out["self_attention"]["cache_index"]) == 3


# model.word_positions: the decoder counts the words its inputs wrote, in the cache per beam;
# model.word_pointer: it reads the encoder's output at the next word from the cache
WORDS = dict(word_positions=True, word_pointer=True, word_starts=(4, 5, 8, 9, 10))


@pytest.mark.parametrize("changes", [{}, WORDS], ids=["plain", "word_positions_and_pointer"])
def test_decoding_through_reordered_beam_tables_matches_teacher_forcing(changes):
  """Rows that take over other rows' hypotheses mid-way (as beam search does) read their new
  history through the beam tables: each row's logits equal teacher forcing of the prefix it now
  continues, though that prefix's keys/values were written by several rows (and, with word
  positions and the word pointer, though the row counted other words before it took that prefix
  over; the pointer reads the next word from the row's own cached encoder output)."""
  cfg = tiny_config(num_encoder_layers=1, num_decoder_layers=2, **changes)
  params = init_params(cfg, seed=2)
  inputs_NxS = jnp.asarray([[5, 6, 7, EOS], [8, 9, EOS, 0], [5, 6, 7, EOS]], jnp.int32)
  history = [[3, 4, 5, 6, 7, 8], [8, 9, 10, 11, 12, 3], [9, 10, 11, 3, 4, 5]]
  buffer = 7
  encoded = decode.encode(cfg, params, inputs_NxS)
  cache = decode.init_cache(cfg, params, encoded, inputs_NxS, buffer, beam_size=3)
  step_fn = jax.jit(decode.make_step_fn(cfg, params, encoded, inputs_NxS, buffer, beam_size=3))
  # One sentence of three beams (the same source twice, another once: the decoder only sees
  # rows). At step 2, row 2 drops its own hypothesis and continues row 0's first two tokens with
  # others (two beams of one parent); at step 4 rows 0 and 2 swap. Afterwards each row's history
  # is held partly in row 0's cache slots and partly in row 2's.
  events = {2: (jnp.array([0, 1, 0]), {2: [9, 10, 11, 12]}), 4: (jnp.array([2, 1, 0]), {})}
  for t in range(6):
    if t in events:
      rows, tails = events[t]
      cache = beam_search.reorder_cache(cache, rows)
      history = [list(history[int(r)]) for r in rows]
      for row, tail in tails.items():
        history[row] = history[row][:t] + tail
    ids_Nx1 = jnp.asarray([[h[t - 1] if t else 0] for h in history], jnp.int32)
    step_logits, cache = step_fn(ids_Nx1, jnp.int32(t), cache)
    targets = jnp.asarray([h[:t] + [3] for h in history], jnp.int32)
    full = teacher_forced(cfg)(params, inputs_NxS, targets)  # position t sees the prefix h[:t]
    np.testing.assert_allclose(np.asarray(step_logits), np.asarray(full[:, t]), rtol=1e-5,
                               atol=1e-5)


# ----------------------------------------------------------------------------- the search alone

STATES = 7


def synthetic_step_fn(table_BxTxMxV, beam_size):
  """A toy decoder whose next-token logits depend on the whole prefix through a per-row state
  kept in a cache entry the search reorders (named like the attention layers' beam tables), so
  that a search that forgets to reorder the cache gets it wrong."""
  def step_fn(ids_Nx1, t, cache):
    state_N = (cache["source_beams"] * 3 + ids_Nx1[:, 0]) % STATES
    sentence_N = jnp.arange(ids_Nx1.shape[0]) // beam_size
    return table_BxTxMxV[sentence_N, t, state_N], {"source_beams": state_N}
  return step_fn


def synthetic_search(table_BxTxMxV, limit_B, beam_size, alpha, stop_early=True):
  batch, max_len = table_BxTxMxV.shape[:2]
  cache = {"source_beams": jnp.zeros((batch * beam_size,), jnp.int32)}
  return beam_search.beam_search(synthetic_step_fn(table_BxTxMxV, beam_size), cache, limit_B,
                                 beam_size=beam_size, alpha=alpha, max_len=max_len,
                                 stop_early=stop_early)


def synthetic_logprob(table_TxMxV, seq):
  logprobs_TxMxV = np.asarray(jax.nn.log_softmax(table_TxMxV, axis=-1), np.float64)
  state, prev, total = 0, 0, 0.0
  for t, token in enumerate(seq):
    state = (state * 3 + prev) % STATES
    total += logprobs_TxMxV[t, state, token]
    prev = token
  return total


def test_wide_beam_equals_exhaustive_search_on_a_synthetic_model():
  vocab, limits = 5, [5, 3]
  table_BxTxMxV = jnp.asarray(np.random.RandomState(0).randn(2, 5, STATES, vocab) * 2, jnp.float32)
  beam, alpha = 3 ** 4, 0.6  # keeps every prefix alive
  search = jax.jit(functools.partial(synthetic_search, beam_size=beam, alpha=alpha))
  result = search(table_BxTxMxV, jnp.array(limits))
  words = [2, 3, 4]
  for b, limit in enumerate(limits):
    candidates = [list(p) + [EOS] for n in range(limit) for p in itertools.product(words, repeat=n)]
    scores = np.array([synthetic_logprob(table_BxTxMxV[b], c) / lp(len(c), alpha)
                       for c in candidates])
    order = np.argsort(-scores)
    n = min(beam, len(candidates))
    assert [trim(s) for s in result.seqs_BxKxL[b, :3]] == [candidates[i] for i in order[:3]]
    np.testing.assert_allclose(result.scores_BxK[b, :n], scores[order[:n]], **SCORE_TOL)


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_early_termination_bound_never_changes_the_result(alpha):
  """Peaky toy distributions, where a long output can overtake finished short ones thanks to
  the length penalty: stopping early (one sentence per call, so that the bound alone decides
  when the loop ends) returns what running to the limit returns."""
  length = 12
  search = jax.jit(functools.partial(synthetic_search, beam_size=2, alpha=alpha))
  full = jax.jit(functools.partial(synthetic_search, beam_size=2, alpha=alpha, stop_early=False))
  stopped_early = 0
  for seed in range(100):
    table_1xTxMxV = jnp.asarray(np.random.RandomState(seed).randn(1, length, STATES, 6) * 3,
                                jnp.float32)
    a, b = search(table_1xTxMxV, jnp.array([length])), full(table_1xTxMxV, jnp.array([length]))
    np.testing.assert_array_equal(a.seqs_BxKxL, b.seqs_BxKxL)
    np.testing.assert_allclose(a.scores_BxK, b.scores_BxK, **SCORE_TOL)
    assert int(b.num_steps) == length
    stopped_early += int(a.num_steps) < length
  assert stopped_early >= 20


def test_a_sentence_with_no_live_hypothesis_left_is_done():
  """A rule that allows fewer than k outputs (a constrained search's padding row: only EOS)
  never fills the k finished slots; with no live hypothesis left the sentence is done, so the
  batch stops when its other sentences are, with the results it had when run to the limit."""
  length = 12
  search = jax.jit(functools.partial(synthetic_search, beam_size=2, alpha=0.6))
  for seed in range(100):
    table_1xTxMxV = jnp.asarray(np.random.RandomState(seed).randn(1, length, STATES, 6) * 3,
                                jnp.float32)
    alone = search(table_1xTxMxV, jnp.array([length]))
    if int(alone.num_steps) < length:
      break
  only_eos_1xTxMxV = jnp.full_like(table_1xTxMxV, beam_search.NEG_INF).at[..., EOS].set(0.0)
  both = search(jnp.concatenate([table_1xTxMxV, only_eos_1xTxMxV]), jnp.array([length, length]))
  assert int(both.num_steps) == int(alone.num_steps) < length
  np.testing.assert_array_equal(both.seqs_BxKxL[0], alone.seqs_BxKxL[0])
  assert trim(both.seqs_BxKxL[1, 0]) == [EOS]


# ----------------------------------------------------------------------------- beam search


@pytest.mark.parametrize("alpha", [0.6, 0.0])
def test_wide_beam_equals_exhaustive_search(alpha):
  cfg = tiny_config(vocab_size=6)
  params = init_params(cfg, seed=1, scale=2.0)
  inputs_BxS = jnp.array([[3, EOS], [4, 0]], jnp.int32)  # lengths 2 and 1
  max_extra_len = 2                                      # limits 4 and 3 tokens with EOS
  beam = 64                                              # = 4^3: keeps every prefix alive
  seqs_BxKxL, scores_BxK, _ = decode.jitted_beam_decode(cfg, beam, alpha, max_extra_len)(
      params, inputs_BxS)
  words = [t for t in range(cfg.vocab_size) if t not in (0, EOS)]  # padding is never emitted
  for b, limit in enumerate([4, 3]):
    candidates = [list(p) + [EOS] for n in range(limit) for p in itertools.product(words, repeat=n)]
    logp = sequence_logprobs(cfg, params, inputs_BxS[b:b + 1], candidates)
    scores = logp / np.array([lp(len(c), alpha) for c in candidates])
    order = np.argsort(-scores)
    assert trim(seqs_BxKxL[b, 0]) == candidates[order[0]]
    np.testing.assert_allclose(scores_BxK[b, 0], scores[order[0]], **SCORE_TOL)
    # Every finished slot holds the next best complete hypothesis, in order.
    n = min(beam, len(candidates))
    np.testing.assert_allclose(scores_BxK[b, :n], scores[order[:n]], **SCORE_TOL)


@pytest.mark.parametrize("changes", [{}, WORDS], ids=["plain", "word_positions_and_pointer"])
def test_narrow_beam_scores_are_its_hypotheses_scores(changes):
  cfg = tiny_config(**changes)
  params = init_params(cfg, seed=2, scale=2.0)
  inputs_BxS = jnp.array([[5, 6, 7, EOS], [8, EOS, 0, 0]], jnp.int32)
  alpha = 0.6
  seqs_BxKxL, scores_BxK, _ = decode.jitted_beam_decode(cfg, 3, alpha, 3)(params, inputs_BxS)
  for b in range(2):
    hyps = [trim(seqs_BxKxL[b, j]) for j in range(3)]
    logp = sequence_logprobs(cfg, params, inputs_BxS[b:b + 1], hyps)
    expected = logp / np.array([lp(len(h), alpha) for h in hyps])
    np.testing.assert_allclose(scores_BxK[b], expected, **SCORE_TOL)
    assert np.all(np.diff(np.asarray(scores_BxK[b])) <= 0)  # best first


def greedy_path(cfg, params, inputs_1xS, limit):
  """The arg-max path by teacher-forced recomputation (no cache, no search code): at each
  position the most likely token other than padding; EOS at the limit."""
  out = []
  while not out or out[-1] != EOS:
    if len(out) + 1 == limit:
      out.append(EOS)
      break
    targets = jnp.asarray(pad_targets([out + [EOS]], rows_multiple=1))
    logits_V = np.array(teacher_forced(cfg)(params, inputs_1xS, targets)[0, len(out)])
    logits_V[0] = -np.inf
    out.append(int(np.argmax(logits_V)))
  return out


def test_beam_size_one_follows_the_greedy_path():
  """Beam 1 follows the greedy path; as in t2t it also keeps an EOS that ranked second at some
  step, and returns it instead if its (here alpha=0: plain) log-probability is higher."""
  cfg = tiny_config()
  params = init_params(cfg, seed=3, scale=2.0)
  rng = np.random.RandomState(3)
  inputs_BxS = jnp.asarray(rng.randint(2, cfg.vocab_size, (6, 5)), jnp.int32)
  max_extra_len = 6
  beam_BxKxL, beam_scores_BxK, _ = decode.jitted_beam_decode(cfg, 1, 0.0, max_extra_len)(
      params, inputs_BxS)
  same = 0
  for b in range(inputs_BxS.shape[0]):
    g = greedy_path(cfg, params, inputs_BxS[b:b + 1], limit=5 + max_extra_len)
    logp = sequence_logprobs(cfg, params, inputs_BxS[b:b + 1], [g])[0]
    # Candidates: the greedy output, and greedy prefix + EOS wherever EOS ranked second.
    best_seq, best = g, logp
    targets = jnp.asarray(pad_targets([g], rows_multiple=1))
    logits = teacher_forced(cfg)(params, inputs_BxS[b:b + 1], targets)[0]
    logprobs_TxV = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
    prefix_logp = 0.0
    for t in range(len(g) - 1):
      ranked = [v for v in np.argsort(-logprobs_TxV[t]) if v != 0]
      if ranked[1] == EOS and prefix_logp + logprobs_TxV[t, EOS] > best:
        best_seq, best = g[:t] + [EOS], prefix_logp + logprobs_TxV[t, EOS]
      prefix_logp += logprobs_TxV[t, g[t]]
    assert trim(beam_BxKxL[b, 0]) == best_seq
    np.testing.assert_allclose(beam_scores_BxK[b, 0], best, **SCORE_TOL)
    same += best_seq == g
  assert same >= 1


def check_outputs(ids_BxL, inputs_BxS, max_extra_len):
  ids_BxL = np.asarray(ids_BxL)
  lengths = np.sum(np.asarray(inputs_BxS) != 0, axis=1)
  for row, n in zip(ids_BxL, lengths):
    eos = np.flatnonzero(row == EOS)
    assert len(eos) == 1, row                       # exactly one EOS ...
    assert eos[0] < n + max_extra_len, (row, n)      # ... within the sentence's own limit
    assert np.all(row[:eos[0]] != 0)                 # no padding inside the output
    assert np.all(row[eos[0] + 1:] == 0)             # zero padded after it


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_outputs_stop_at_eos_within_each_limit(scale):
  cfg = tiny_config()
  params = init_params(cfg, seed=4, scale=scale)
  inputs_BxS = jnp.array([[5, 6, 7, 8, 9, EOS], [5, EOS, 0, 0, 0, 0], [9, 9, EOS, 0, 0, 0]],
                         jnp.int32)
  beam_BxL, steps = decode.translate_batch(cfg, params, inputs_BxS, beam_size=3, alpha=0.6,
                                           max_extra_len=2)
  beam1_BxL, _ = decode.translate_batch(cfg, params, inputs_BxS, beam_size=1, alpha=0.6,
                                        max_extra_len=2)
  assert beam_BxL.shape == beam1_BxL.shape == (3, 6 + 2)
  check_outputs(beam_BxL, inputs_BxS, 2)
  check_outputs(beam1_BxL, inputs_BxS, 2)
  assert [len(r) for r in decode.strip_eos(beam_BxL)] == [len(trim(r)) - 1 for r in beam_BxL]
  assert max(len(trim(r)) for r in beam_BxL) <= int(steps) <= 6 + 2  # a step per token, EOS too


def test_sinusoids_let_every_input_have_its_50_extra_tokens():
  """max_len 10 but a 7-token source: the output limit is still 7 + 50 (sinusoids exist for any
  position), every score finite; a learned table caps the buffer at its 10 rows instead."""
  cfg = tiny_config(max_len=10)
  params = init_params(cfg, seed=5)
  inputs_BxS = jnp.array([[5, 6, 7, 8, 9, 10, EOS], [5, EOS, 0, 0, 0, 0, 0]], jnp.int32)
  assert decode.buffer_length(cfg, 7, 50) == 57
  np.testing.assert_array_equal(decode.output_limits(inputs_BxS, 50, 57), [57, 52])
  seqs_BxKxL, scores_BxK, _ = decode.jitted_beam_decode(cfg, 2, 0.6, 50)(params, inputs_BxS)
  assert seqs_BxKxL.shape[-1] == 57 and np.all(np.isfinite(np.asarray(scores_BxK)))
  check_outputs(seqs_BxKxL[:, 0], inputs_BxS, 50)
  # Positions past max_len are the paper's sinusoids, not a repeated or NaN row.
  from transformer_jax.model.positional import sinusoidal_table  # pylint: disable=g-import-not-at-top
  np.testing.assert_allclose(sinusoidal_table(57, 16)[:10], sinusoidal_table(10, 16))
  learned = tiny_config(max_len=10, pe_type="learned")
  assert decode.buffer_length(learned, 7, 50) == 10
  ids_BxL, _ = decode.translate_batch(learned, init_params(learned, seed=5), inputs_BxS[:1],
                                      beam_size=1, max_extra_len=50)
  assert ids_BxL.shape == (1, 10) and np.flatnonzero(np.asarray(ids_BxL[0]) == EOS)[0] <= 9


def test_forced_long_outputs_stay_finite_past_max_len():
  """A model that never wants EOS runs every sentence to its limit beyond max_len: the
  hypotheses are full length, finite, and EOS-terminated exactly at the limit."""
  cfg = tiny_config(max_len=8)
  params = init_params(cfg, seed=7)
  # The last LayerNorm outputs its bias b whatever the input (scale 0), and EOS's embedding is
  # -b: EOS always has the lowest logit, so every hypothesis runs to the forced EOS at its limit.
  params = jax.tree_util.tree_map(np.array, params)
  norm = params["decoder"][f"layer_{cfg.num_decoder_layers - 1}"]["ffn_block"]["norm"]
  b = np.random.RandomState(0).randn(cfg.d_model).astype(np.float32)
  norm["scale"][:], norm["bias"][:] = 0.0, b
  params["shared_embedding"]["embedding"][EOS] = -b
  inputs_BxS = jnp.array([[5, 6, 7, 8, 9, 10, EOS]], jnp.int32)
  seqs_BxKxL, scores_BxK, _ = decode.jitted_beam_decode(cfg, 2, 0.6, 5)(params, inputs_BxS)
  best = trim(seqs_BxKxL[0, 0])
  assert np.isfinite(float(scores_BxK[0, 0]))
  assert len(best) == 7 + 5 and best[-1] == EOS  # ran to its limit, past max_len = 8


def test_a_scan_layers_model_decodes_as_its_unrolled_twin():
  """Decoding a model.scan_layers model unstacks its layers (model.unstack_layers): the same
  beams and scores as the unrolled model with the same weights."""
  from tests.common import stack_layers  # pylint: disable=g-import-not-at-top
  cfg = tiny_config(num_encoder_layers=2, num_decoder_layers=3)
  params = init_params(cfg, seed=3, scale=2.0)
  scanned_cfg = cfg.replace(scan_layers=True)
  scanned = stack_layers(scanned_cfg, params)
  assert "layer_0" not in scanned["decoder"] and "layers" in scanned["decoder"]
  batch_BxS = jnp.asarray([[5, 6, 7, 8, EOS], [11, EOS, 0, 0, 0]], jnp.int32)
  a = decode.jitted_beam_decode(cfg, 3, 0.6, 6)(params, batch_BxS)
  b = decode.jitted_beam_decode(scanned_cfg, 3, 0.6, 6)(scanned, batch_BxS)
  np.testing.assert_array_equal(a.seqs_BxKxL, b.seqs_BxKxL)
  np.testing.assert_allclose(a.scores_BxK, b.scores_BxK, **SCORE_TOL)


def test_gathered_and_prefix_attention_read_the_history_as_the_whole_buffer_does():
  """Many beams gather each row's history; every step reads only the written prefix: both give
  the one-matmul read of the whole buffer (up to float rounding)."""
  from transformer_jax.model import attention  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  heads, sentences, beams, length, d = 2, 3, 8, 40, 16
  k = jnp.asarray(rng.normal(size=(heads, sentences, length * beams, d)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(heads, sentences, length * beams, d)), jnp.float32)
  q = jnp.asarray(rng.normal(size=(sentences * beams, heads, d)), jnp.float32)
  table = jnp.asarray(rng.integers(0, beams, (sentences * beams, length)), jnp.int32)
  for i in (0, 5, 17, length - 1):
    seen = jnp.arange(length) <= i
    whole = attention.cached_beam_attention(q, k, v, table, seen)
    np.testing.assert_allclose(attention.gathered_beam_attention(q, k, v, table, seen), whole,
                               rtol=1e-5, atol=1e-6)
    n = next(n for n in attention.prefix_lengths(length) if n > i)
    prefix = attention._prefix_attention(n, jnp.float32, q, k, v, table, i)
    np.testing.assert_allclose(prefix, whole, rtol=1e-5, atol=1e-6)
  assert attention.prefix_lengths(40) == (16, 32, 40)
