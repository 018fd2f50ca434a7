"""The input side, one stage per module, in the order data flows through them:

1. ``sources``: raw parallel text (TFDS ``wmt14_translate/*``, or aligned local text files made
   into a TFDS ArrayRecord dataset, or any two files) -> checked, cleaned sentence pairs;
   :func:`sources.load_split_texts`, :func:`sources.read_parallel_files` (``downloads`` fetches
   missing files of corpora with a public home);
2. ``tokenizer``: the shared SentencePiece vocabulary (trained once per workdir) and the
   :class:`tokenizer.Tokenizer`;
3. ``token_cache``: cleaned pairs -> token ids, a split tokenized once and cached as ragged
   ``.npy`` arrays;
4. ``batching``: per-epoch batch plans (token-budget length buckets or packed rows) and the
   assembly of a plan entry into padded numpy arrays;
5. ``pipeline``: the checkpointable grain train iterator and the padded eval batches.

Every user mistake or bad input raises :class:`DataError` (a :class:`ConfigError`) with one line.
"""

from transformer_jax.runtime.exceptions import DataError  # defined there, with the other error types

__all__ = ["DataError"]
