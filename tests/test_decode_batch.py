"""The decode batch: its sentences are independent of each other, and sentences that finish
leave it (decode.dropping_decode) without changing any output. Tiny random models, float32 on
the CPU; tolerances as tests/test_decode.py gives them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from tests.test_decode import EOS, SCORE_TOL, WORDS, init_params, tiny_config, trim
from transformer_jax.decoding import decode


def test_batch_entries_are_independent():
  cfg = tiny_config()
  params = init_params(cfg, seed=6, scale=2.0)
  sentences = [[5, 6, 7, 8, 9, 10, EOS], [11, EOS], [4, 12, 3, EOS]]
  width = max(map(len, sentences))
  batch_BxS = jnp.asarray([s + [0] * (width - len(s)) for s in sentences], jnp.int32)
  beam = decode.jitted_beam_decode(cfg, 3, 0.6, 4)
  seqs_BxKxL, scores_BxK, _ = beam(params, batch_BxS)
  for b in (0, 1):  # the longest and the shortest, decoded alone
    alone_1xS = jnp.asarray([sentences[b]], jnp.int32)  # own width: another buffer length too
    seqs_1xKxL, scores_1xK, _ = beam(params, alone_1xS)
    for j in range(3):
      assert trim(seqs_1xKxL[0, j]) == trim(seqs_BxKxL[b, j])
    np.testing.assert_allclose(scores_1xK[0], scores_BxK[b], **SCORE_TOL)


@pytest.mark.parametrize("beam_size, members, changes",
                         [(1, 1, {}), (4, 1, {}), (3, 2, {}), (4, 1, WORDS)])
def test_done_sentences_leave_the_batch_without_changing_any_output(beam_size, members, changes):
  """decode.dropping_decode: a batch of 32 (pad rows included) halved as its sentences finish
  gives beam_decode's outputs, for greedy, beam and ensemble searches (and with word positions
  and the word pointer, whose per-row caches the smaller batch keeps)."""
  cfg = tiny_config(max_len=64, **changes)
  models = tuple([cfg] * members) if members > 1 else cfg
  params = tuple(init_params(cfg, seed=4 + i, scale=3.0) for i in range(members))
  params = params if members > 1 else params[0]
  rng = np.random.default_rng(0)
  inputs_BxS = np.zeros((32, 10), np.int32)
  for row in inputs_BxS[:28]:
    n = rng.integers(1, 10)
    row[:n - 1], row[n - 1] = rng.integers(3, 13, n - 1), EOS
  kept, steps = decode.translate_batch(models, params, inputs_BxS, beam_size=beam_size,
                                       alpha=0.6, max_extra_len=20)
  dropped, dropped_steps = decode.translate_batch(models, params, inputs_BxS,
                                                  beam_size=beam_size, alpha=0.6,
                                                  max_extra_len=20, drop_finished=True)
  np.testing.assert_array_equal(np.asarray(kept), dropped)
  assert dropped_steps == int(steps)
  _, _, segments = decode.dropping_decode(models, params, inputs_BxS, beam_size=beam_size,
                                          alpha=0.6, max_extra_len=20)
  assert [rows for rows, _ in segments][:2] == [32, 16] and sum(s for _, s in segments) == steps
  # fewer model rows were run than by the search that keeps every sentence
  assert sum(rows * s for rows, s in segments) < 32 * int(steps)
  assert [decode.next_rows(r) for r in (32, 16, 8, 4, 6)] == [16, 8, 4, 0, 0]
  assert decode.next_rows(16, devices=4) == 0 and decode.next_rows(32, devices=4) == 16
