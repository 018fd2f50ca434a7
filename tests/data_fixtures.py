"""The real-data fixtures of the input-side tests (tests/test_data.py, tests/test_data_mix.py): a
tiny config on the Multi30k files, its TFDS build in a module-scoped temp folder, and a
1000-piece BPE vocabulary trained once per module that uses them.
"""

from __future__ import annotations

import pytest

from tests.common import DATA_DIR
from transformer_jax.data import tokenizer


def data_config(tfds_dir, **data):
  from configs.tiny import get_config
  c = get_config()
  c.data.data_dir = DATA_DIR
  c.data.tfds_data_dir = str(tfds_dir)
  c.data.max_source_len = c.data.max_target_len = 64
  c.model.vocab_size = 1000
  return with_data(c, **data)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
  return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def config(tmp):
  return data_config(tmp / "tfds")


@pytest.fixture(scope="module")
def tok(config, tmp):
  return tokenizer.load_or_train_tokenizer(config, str(tmp / "workdir"))


def with_data(config, **data):
  c = config.copy_and_resolve_references()
  for k, v in data.items():
    c.data[k] = v
  return c


def rows_as_examples(batch):
  """(source ids, target ids) tuples of every example in a batch, split at segments."""
  out = []
  for b in range(batch["inputs"].shape[0]):
    for seg in range(1, int(batch["inputs_segmentation"][b].max(initial=0)) + 1):
      s = batch["inputs"][b][batch["inputs_segmentation"][b] == seg]
      t = batch["targets"][b][batch["targets_segmentation"][b] == seg]
      out.append((tuple(s.tolist()), tuple(t.tolist())))
  return out
