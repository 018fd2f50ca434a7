"""How a SentencePiece vocabulary is trained and named: the model file records only the options
set, the trainer's thread count is pinned (not the machine's core count), and the fingerprint
keys what a vocabulary segments into, not how its trainer ran. No data folder needed."""

from __future__ import annotations

import os

from sentencepiece import sentencepiece_model_pb2

from transformer_jax.data import tokenizer


def test_a_translation_vocabulary_leaves_split_by_unicode_script_unset():
  """The model file records the options set: the default is not set, so a translation
  vocabulary's bytes (its sha256 in result files) do not depend on the option existing."""
  text = [f"(S (NP ein kleiner satz )NP nummer {i} )S" for i in range(200)]
  for split, recorded in ((True, False), (False, True)):
    m = sentencepiece_model_pb2.ModelProto()
    m.ParseFromString(tokenizer.train_sentencepiece(text, vocab_type="bpe", vocab_size=40,
                                                    split_by_script=split))
    assert m.trainer_spec.HasField("split_by_unicode_script") == recorded
    assert m.trainer_spec.split_by_unicode_script == split


def test_a_vocabulary_is_the_same_on_any_machine(monkeypatch):
  """The trainer's thread count is pinned, not the core count: a unigram vocabulary's pieces
  depend on it (a BPE one's do not), and the model file records it."""
  text = [f"ein kleiner satz nummer {i} über {i % 7} häuser" for i in range(300)]
  trained = []
  for cores in (1, 64):
    monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
    trained.append(tokenizer.train_sentencepiece(text, vocab_type="unigram", vocab_size=60))
  assert trained[0] == trained[1]


def test_the_fingerprint_is_what_segments_not_how_the_trainer_ran():
  text = [f"(S (NP ein kleiner satz )NP nummer {i} )S" for i in range(200)]
  proto = tokenizer.train_sentencepiece(text, vocab_type="bpe", vocab_size=40)
  fingerprint = tokenizer.vocab_fingerprint(proto)

  def changed(edit) -> str:
    m = sentencepiece_model_pb2.ModelProto()
    m.ParseFromString(proto)
    edit(m)
    assert m.SerializeToString() != proto
    return tokenizer.vocab_fingerprint(m.SerializeToString())
  # Another machine's thread count, an option spelled at its default: the same vocabulary.
  assert changed(lambda m: setattr(m.trainer_spec, "num_threads", 3)) == fingerprint
  assert changed(lambda m: setattr(m.trainer_spec, "split_by_unicode_script", True)) == fingerprint
  # Another piece, score, normalization or algorithm: another one.
  for edit in (lambda m: setattr(m.pieces[10], "piece", m.pieces[10].piece + "x"),
               lambda m: setattr(m.pieces[10], "score", m.pieces[10].score - 1),
               lambda m: setattr(m.normalizer_spec, "name", "identity"),
               lambda m: setattr(m.trainer_spec, "model_type", m.trainer_spec.UNIGRAM)):
    assert changed(edit) != fingerprint
