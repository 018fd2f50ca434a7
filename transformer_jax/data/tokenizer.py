"""The shared source+target SentencePiece vocabulary (paper §5.1: one BPE vocabulary).

:func:`load_or_train_tokenizer` trains it once on a sample of the training split (both sides) and
keeps it at ``workdir/vocab/spm.model`` (written to a temp file, then renamed), reused afterwards.
Ids are fixed: pad=0, eos=1, unk=2, no bos (the decoder's start symbol is the pad id 0).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from typing import Sequence

import numpy as np
import sentencepiece as spm
from absl import logging

from transformer_jax.config import ConfigError
from transformer_jax.data import DataError

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
VOCAB_SUBDIR, MODEL_NAME = "vocab", "spm.model"
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


class Tokenizer:
  """SentencePiece wrapper with the project's fixed special ids."""

  pad_id, eos_id, unk_id = PAD_ID, EOS_ID, UNK_ID

  def __init__(self, model_proto: bytes):
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.model_proto = model_proto
    self.sha = hashlib.sha256(model_proto).hexdigest()[:16]  # keys token caches
    got = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id(), self._sp.bos_id())
    if got != (PAD_ID, EOS_ID, UNK_ID, -1):
      raise ConfigError(f"SentencePiece model has special ids (pad, eos, unk, bos)={got}; "
                        f"expected {(PAD_ID, EOS_ID, UNK_ID, -1)}")

  @classmethod
  def from_file(cls, path: str) -> "Tokenizer":
    with open(path, "rb") as f:
      return cls(f.read())

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def id_to_piece(self, token_id: int) -> str:
    return self._sp.id_to_piece(int(token_id))

  def encode(self, text: str) -> list[int]:
    """Token ids of text, without EOS."""
    return self._sp.encode(text)

  def encode_with_eos(self, text: str) -> list[int]:
    return self._sp.encode(text) + [EOS_ID]

  def encode_batch(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
    """Token ids of many texts (no EOS), encoded by SentencePiece's thread pool."""
    return self._sp.encode(list(texts), num_threads=num_threads)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Text of ids up to (not including) the first EOS or pad."""
    ids_L = np.asarray(ids, dtype=np.int64).reshape(-1)
    stop = np.flatnonzero((ids_L == EOS_ID) | (ids_L == PAD_ID))
    return self._sp.decode(ids_L[:stop[0]].tolist() if stop.size else ids_L.tolist())


def vocab_path(workdir: str) -> str:
  return os.path.join(workdir, VOCAB_SUBDIR, MODEL_NAME)


def load_or_train_tokenizer(config, workdir: str) -> Tokenizer:
  """The workdir's vocabulary, trained from the training split when not there yet."""
  path = vocab_path(workdir)
  size = config.model.vocab_size
  if os.path.isfile(path):
    tok = Tokenizer.from_file(path)
    if tok.vocab_size != size:
      raise ConfigError(f"config key 'model.vocab_size'={size} but {path} holds a vocabulary of "
                        f"{tok.vocab_size}; use that size, a new workdir, or delete the file")
    logging.info("loaded vocabulary %s (%d pieces)", path, tok.vocab_size)
    return tok
  proto = train_sentencepiece(config)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".spm-", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(proto)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)  # atomic: never a half-written model in the workdir
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  logging.info("trained %s vocabulary of %d pieces -> %s", config.data.vocab_type, size, path)
  return Tokenizer(proto)


def train_sentencepiece(config) -> bytes:
  """Trains the shared vocabulary on up to data.vocab_train_sentences training sentences."""
  from transformer_jax.data import datasets  # pylint: disable=g-import-not-at-top
  d, size = config.data, config.model.vocab_size
  sentences = list(datasets.sample_train_texts(config, d.vocab_train_sentences))
  if not sentences:
    raise DataError("the training split has no non-empty sentence to train the vocabulary on")
  logging.info("training a %s vocabulary of %d on %d sentences", d.vocab_type, size, len(sentences))
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, model_type=d.vocab_type,
        vocab_size=size, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        character_coverage=1.0, max_sentence_length=1 << 16, input_sentence_size=0,
        num_threads=os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as e:
    m = _TOO_HIGH.search(str(e))
    if m:
      raise ConfigError(f"config key 'model.vocab_size'={size} is too large for this corpus; the "
                        f"largest {d.vocab_type} vocabulary that fits is {m.group(2)}") from None
    raise DataError(f"SentencePiece training failed: {str(e).splitlines()[0]}") from None
  return model.getvalue()
