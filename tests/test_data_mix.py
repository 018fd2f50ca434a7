"""Training on more than one corpus (data.extra_train_files, data.upsample_primary) on the real
files: Multi30k's training pairs followed by newstest2013's, the former upsampled.

Needs TRANSFORMER_JAX_DATA_DIR (CI: ../shared/data). One-line mistakes: tests/test_data_errors.py.
"""

from __future__ import annotations

import collections
import os
import re

import numpy as np
import pytest

from tests.common import DATA_DIR, requires_data
# config, tmp and tok are module-scoped fixtures: each module builds its own
from tests.data_fixtures import (  # noqa: F401
    config, rows_as_examples, tmp, tok, with_data)
from transformer_jax.data import batching, pipeline, sources, token_cache

# One xdist worker runs the module, so its vocabulary is trained once (conftest).
pytestmark = [requires_data, pytest.mark.xdist_group(__name__)]


def test_extra_training_files_follow_the_corpus_which_is_upsampled(config, tok, capsys):
  c = with_data(config, extra_train_files="wmt14/newstest2013", upsample_primary=2,
            tokens_per_batch=2048, batch_mode="pack")
  src, plain = sources.split_source(c, "train"), sources.split_source(config, "train")
  assert src.part_sizes == (29000, 3000) and len(src) == 32000
  assert src.dataset_id != plain.dataset_id  # own token cache
  assert len(sources.split_source(c, "validation")) == 1014
  news = sources.read_parallel_files(*(os.path.join(DATA_DIR, "wmt14", f"newstest2013.{lang}.gz")
                                       for lang in ("en", "de")))
  own = plain.texts([28999])
  got = src.texts([28999, 29000, 31999])
  assert [x[0] for x in got] == [x[0] for x in own]  # the corpus's own pairs come first
  assert [x[1:] for x in got] == [[x[0], x[-1]] for x in news]  # then the extra file's, in order

  tokd = token_cache.tokenized_split(c, tok, "train")
  keep = batching.select_for_training(tokd, 64, 64)
  it = pipeline.make_train_iterator(c, tok)
  assert re.search(r"training data: multi30k/train \d+ pairs x2 \(\d+% of target tokens\), "
                   r"wmt14/newstest2013 \d+ pairs \(\d+% of target tokens\)",
                   capsys.readouterr().out)
  counts = np.bincount(it.planner.example_ids, minlength=len(tokd))
  own_N, extra_N = keep[keep < 29000], keep[keep >= 29000]
  assert len(extra_N) > 1500  # 1924: a 1000-piece vocabulary cuts news into long sequences
  assert (counts[own_N] == 2).all() and (counts[extra_N] == 1).all()
  assert counts.sum() == 2 * len(own_N) + len(extra_N)
  # one epoch of batches holds exactly that: the corpus's pairs twice, the extra file's once
  n_rows = len(it.planner._epoch_rows(0))
  rows = []
  while len(rows) < n_rows:
    batch = next(it)
    rows += [{k: v[i:i + 1] for k, v in batch.items()} for i in range(batch["inputs"].shape[0])]
  seen = collections.Counter(ex for r in rows[:n_rows] for ex in rows_as_examples(r))
  expected = collections.Counter()
  for i, n in ((i, counts[i]) for i in np.flatnonzero(counts)):
    expected[(tuple(tokd.source(i).tolist()), tuple(tokd.target(i).tolist()))] += int(n)
  assert seen == expected
