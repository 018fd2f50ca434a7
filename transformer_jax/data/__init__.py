"""The input side: corpora through TFDS (ArrayRecord), SentencePiece, grain batches.

Modules, by role:

- ``local_files``: locating and checking aligned local text files (and fetching known ones);
- ``datasets``: TFDS sources (``wmt14_translate/*`` and a builder for any pair of aligned local
  text files), text cleanup, :func:`datasets.load_split_texts`;
- ``tokenizer``: the shared SentencePiece vocabulary and the :class:`tokenizer.Tokenizer`;
- ``token_cache``: the corpus tokenized once, kept as ragged ``.npy`` arrays;
- ``batching``: per-epoch batch plans (token-budget length buckets or packed rows) and the
  assembly of a plan entry into padded numpy arrays;
- ``pipeline``: the checkpointable grain train iterator and the padded eval batches.

Every user mistake or bad input raises :class:`DataError` (a :class:`ConfigError`) with one line.
"""

from transformer_jax.config import ConfigError


class DataError(ConfigError):
  """Bad input data (missing or misaligned files, bad bytes, nothing left to train on)."""


__all__ = ["DataError"]
