"""Ensemble decoding (decode.ensemble_step_fn) on tiny random models: the search follows the mean
of the members' next-token probabilities, recomputed without a cache (tolerances: test_decode)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tests.test_decode import (EOS, SCORE_TOL, init_params, lp, pad_targets, teacher_forced,
                               tiny_config, trim)
from transformer_jax.decoding import decode


def ensemble_logprobs_TxV(members, inputs_1xS, seq) -> np.ndarray:
  """Teacher-forced (no cache) log of the members' mean next-token probabilities along `seq`,
  padding excluded as the search excludes it."""
  targets = jnp.asarray(pad_targets([seq], rows_multiple=1))
  probs = [np.asarray(jax.nn.softmax(teacher_forced(cfg)(params, inputs_1xS, targets)[0], axis=-1),
                      np.float64) for cfg, params in members]
  logprobs_TxV = np.log(np.mean(probs, axis=0))
  logprobs_TxV[:, 0] = -np.inf
  return logprobs_TxV


def two_models():
  """Two different random models with one vocabulary (the second has two decoder layers)."""
  a, b = tiny_config(), tiny_config(num_decoder_layers=2)
  return [(a, init_params(a, seed=5, scale=2.0)), (b, init_params(b, seed=6, scale=2.0))]


def test_a_greedy_ensemble_follows_the_mean_of_its_members_probabilities():
  """Beam 1 over an ensemble picks, at every position but the last, the arg max of the members'
  mean probabilities recomputed without a cache; it ends in EOS ranked first or second (t2t's
  beam-1 search keeps an EOS ranked second, test_beam_size_one_follows_the_greedy_path) or at the
  length limit, and its score is the path's log mean probability."""
  members = two_models()
  cfgs, params = tuple(c for c, _ in members), tuple(p for _, p in members)
  rng = np.random.RandomState(5)
  inputs_BxS = jnp.asarray(rng.randint(2, 13, (6, 5)), jnp.int32)
  max_extra_len = 6
  seqs_BxKxL, scores_BxK, _ = decode.jitted_beam_decode(cfgs, 1, 0.0, max_extra_len)(
      params, inputs_BxS)
  for b in range(inputs_BxS.shape[0]):
    seq = trim(seqs_BxKxL[b, 0])
    logprobs_TxV = ensemble_logprobs_TxV(members, inputs_BxS[b:b + 1], seq)
    for t, token in enumerate(seq[:-1]):
      assert token == np.argmax(logprobs_TxV[t]), (b, t)
    last = len(seq) - 1
    assert seq[-1] == EOS and (last + 1 == 5 + max_extra_len
                               or EOS in np.argsort(-logprobs_TxV[last])[:2])
    expected = sum(logprobs_TxV[t, token] for t, token in enumerate(seq))
    np.testing.assert_allclose(scores_BxK[b, 0], expected, **SCORE_TOL)


def test_ensemble_beams_score_their_hypotheses_and_a_model_with_itself_is_the_model():
  """Beam 3 over an ensemble (the members' caches reordered together): each returned hypothesis
  scores its log mean probability / lp. An ensemble of one model with itself (the mean of two
  equal distributions) returns the model's own beams."""
  members = two_models()
  cfgs, params = tuple(c for c, _ in members), tuple(p for _, p in members)
  batch_BxS = jnp.asarray([[5, 6, 7, 8, EOS], [11, EOS, 0, 0, 0]], jnp.int32)
  alpha, lengths = 0.6, [5, 2]
  seqs_BxKxL, scores_BxK, _ = decode.jitted_beam_decode(cfgs, 3, alpha, 6)(params, batch_BxS)
  for b in range(2):
    for k in range(3):
      seq = trim(seqs_BxKxL[b, k])
      assert len(seq) <= lengths[b] + 6
      logprobs_TxV = ensemble_logprobs_TxV(members, batch_BxS[b:b + 1], seq)
      expected = sum(logprobs_TxV[t, token] for t, token in enumerate(seq)) / lp(len(seq), alpha)
      np.testing.assert_allclose(scores_BxK[b, k], expected, **SCORE_TOL)
  cfg, p = members[0]
  alone = decode.jitted_beam_decode(cfg, 3, alpha, 6)(p, batch_BxS)
  twice = decode.jitted_beam_decode((cfg, cfg), 3, alpha, 6)((p, p), batch_BxS)
  np.testing.assert_array_equal(alone.seqs_BxKxL, twice.seqs_BxKxL)
  np.testing.assert_allclose(alone.scores_BxK, twice.scores_BxK, **SCORE_TOL)
