"""Stage 2: the shared source+target SentencePiece vocabulary (paper §5.1: one BPE vocabulary).

Training (:func:`load_or_train_tokenizer`) trains it once on a sample of the training split's
cleaned sentences (both sides) and keeps it at ``WORKDIR/vocab/spm.model`` (written to a temp
file, then renamed); later runs load it. Evaluation and translation only load it
(:func:`load_tokenizer`). Special ids come from :mod:`transformer_jax.runtime.special_ids`; there is no
bos (the decoder's start symbol is the pad id).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import re
import threading
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm
from absl import logging
from sentencepiece import sentencepiece_model_pb2

from transformer_jax.data import sources
from transformer_jax.runtime import files
from transformer_jax.runtime.exceptions import ConfigError, DataError
from transformer_jax.runtime.special_ids import EOS_ID, PAD_ID, UNK_ID

VOCAB_SUBDIR, MODEL_NAME = "vocab", "spm.model"
_SAMPLING = threading.Lock()  # SentencePiece's sampling seed is one process-wide setting
# SentencePiece trainer threads. A unigram vocabulary depends on their number (its EM sums
# expected counts per thread); a BPE vocabulary does not. Pinned, not the machine's core count,
# so that every machine trains the same vocabulary from the same settings.
TRAINER_THREADS = 16
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


class Tokenizer:
  """SentencePiece wrapper with the project's fixed special ids."""

  pad_id, eos_id, unk_id = PAD_ID, EOS_ID, UNK_ID

  def __init__(self, model_proto: bytes):
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.model_proto = model_proto
    self.sha256 = hashlib.sha256(model_proto).hexdigest()  # the model file's (checkpoints)
    self.sha = self.sha256[:16]  # keys token caches
    got = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id(), self._sp.bos_id())
    if got != (PAD_ID, EOS_ID, UNK_ID, -1):
      raise DataError(f"SentencePiece model has special ids (pad, eos, unk, bos)={got}; "
                      f"expected {(PAD_ID, EOS_ID, UNK_ID, -1)}")

  @functools.cached_property
  def fingerprint(self) -> str:
    """What this vocabulary segments text into (vocab_fingerprint)."""
    return vocab_fingerprint(self.model_proto)

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def id_to_piece(self, token_id: int) -> str:
    return self._sp.id_to_piece(int(token_id))

  def word_start_ids(self) -> tuple[int, ...]:
    """The ids of the pieces that begin a whitespace-separated word: SentencePiece starts each
    such piece with '▁' (the special pieces excluded)."""
    sp = self._sp
    return tuple(i for i in range(self.vocab_size) if sp.id_to_piece(i).startswith("▁")
                 and not (sp.is_control(i) or sp.is_unknown(i)))

  def encode(self, text: str) -> list[int]:
    """Token ids of text, without EOS."""
    return self._sp.encode(text)

  def encode_with_eos(self, text: str) -> list[int]:
    return self._sp.encode(text) + [EOS_ID]

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1, *, bpe_dropout: float = 0.0,
                   seed: int = 0) -> list[list[int]]:
    """Token ids of many texts (no EOS), encoded by SentencePiece's thread pool.

    With bpe_dropout > 0 (BPE models), a sampled segmentation: each merge is skipped with that
    probability (BPE-dropout, Provilkov et al. 2020), reproducibly for a given uint32 `seed`: the
    batch runs on one fresh SentencePiece thread, whose generator starts from the seed.
    """
    if not bpe_dropout:
      return self._sp.encode(list(texts), num_threads=num_threads)
    with _SAMPLING:
      spm.set_random_generator_seed(seed)
      return self._sp.encode(list(texts), enable_sampling=True, alpha=bpe_dropout, num_threads=1)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Text of ids up to (not including) the first EOS or pad."""
    ids_L = np.asarray(ids, dtype=np.int64).reshape(-1)
    stop = np.flatnonzero((ids_L == EOS_ID) | (ids_L == PAD_ID))
    return self._sp.decode(ids_L[:stop[0]].tolist() if stop.size else ids_L.tolist())


def vocab_fingerprint(model_proto: bytes) -> str:
  """What a vocabulary segments text into, as 16 hex digits of SHA-256: the serialized model with
  two parts of its trainer's record left out, the thread count and any option spelled at its
  default value, both of which change the file's bytes (and, for the threads of a unigram
  vocabulary, its pieces, which this keeps). Files with one fingerprint turn every text into the
  same ids, so the perplexities of their runs compare, whichever machine trained them."""
  model = sentencepiece_model_pb2.ModelProto()
  model.ParseFromString(model_proto)
  spec = model.trainer_spec
  for field, value in spec.ListFields():
    if field.name == "num_threads" or value == field.default_value:
      spec.ClearField(field.name)
  return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()[:16]


def vocab_path(workdir: str) -> str:
  return files.join(workdir, VOCAB_SUBDIR, MODEL_NAME)


def load_tokenizer(workdir: str) -> Tokenizer:
  """The vocabulary that training left in WORKDIR/vocab; DataError (one line) when there is none.
  Never trains one."""
  path = vocab_path(workdir)
  if not files.exists(path) or files.isdir(path):
    raise DataError(f"{workdir} has no vocabulary ({os.path.dirname(path)}): it is written when "
                    "training starts; train first (--mode=train) with this workdir")
  proto = files.read_bytes(path)
  try:
    tok = Tokenizer(proto)
  except RuntimeError as e:  # not a SentencePiece model
    raise DataError(f"{path} is not a SentencePiece model: {str(e).splitlines()[0]}") from None
  logging.info("loaded vocabulary %s (%d pieces)", path, tok.vocab_size)
  return tok


def load_or_train_tokenizer(config, workdir: str, *, reader: sources.SplitReader | None = None,
                            split_by_script: bool = True) -> Tokenizer:
  """For training: the workdir's vocabulary, trained from the training split (read by the task's
  `reader`, sources.split_source) when not there yet, with the task's `split_by_script`
  (train_sentencepiece); model.vocab_size pieces, and a stored vocabulary of another size is a
  ConfigError."""
  path, size = vocab_path(workdir), config.model.vocab_size
  if files.exists(path):
    tok = load_tokenizer(workdir)
    if tok.vocab_size != size:
      raise ConfigError(f"config key 'model.vocab_size'={size} but {path} holds a vocabulary of "
                        f"{tok.vocab_size}; use that size, a new workdir, or delete the file")
    return tok
  d = config.data
  sentences = list(sources.sample_train_texts(config, d.vocab_train_sentences, reader))
  if not sentences:
    raise DataError("the training split has no non-empty sentence to train the vocabulary on")
  proto = train_sentencepiece(sentences, vocab_type=d.vocab_type, vocab_size=size,
                              split_by_script=split_by_script)
  files.makedirs(os.path.dirname(path))
  files.write_bytes(path, proto)  # whole: never a half-written model in the workdir
  logging.info("trained %s vocabulary of %d pieces -> %s", d.vocab_type, size, path)
  return Tokenizer(proto)


def train_sentencepiece(sentences: Iterable[str], *, vocab_type: str, vocab_size: int,
                        split_by_script: bool = True) -> bytes:
  """A serialized SentencePiece model of vocab_size pieces trained on `sentences`.
  `split_by_script=False` lets a piece mix scripts: a parser's `(NP` and `)NP` become one piece
  each (with the default they are two, `(` and `NP`, and every target longer)."""
  sentences = list(sentences)
  logging.info("training a %s vocabulary of %d on %d sentences", vocab_type, vocab_size,
               len(sentences))
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, model_type=vocab_type,
        vocab_size=vocab_size, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        character_coverage=1.0, max_sentence_length=1 << 16, input_sentence_size=0,
        num_threads=TRAINER_THREADS, minloglevel=2,
        # set only to turn it off, so that a translation vocabulary's file records no more
        # options than before it existed (vocab_fingerprint ignores a default either way)
        **({} if split_by_script else {"split_by_unicode_script": False}))
  except RuntimeError as e:
    m = _TOO_HIGH.search(str(e))
    if m:
      raise ConfigError(f"config key 'model.vocab_size'={vocab_size} is too large for this corpus; "
                        f"the largest {vocab_type} vocabulary that fits is {m.group(2)}") from None
    raise DataError(f"SentencePiece training failed: {str(e).splitlines()[0]}") from None
  return model.getvalue()
