"""The input-pipeline benchmark: real target tokens/s of the train iterator per corpus and mode
(`experiments/bench_data.py`'s `throughput`; needs TRANSFORMER_JAX_DATA_DIR)."""

from __future__ import annotations

import os
import tempfile

from transformer_jax.config import DATA_DIR_ENV

def measure(opts) -> dict:
  """Per `opts.data` entry CORPUS:MODE@TOKENS: batches/s and real target tokens/s."""
  from experiments import bench_data as bdata  # pylint: disable=g-import-not-at-top
  from transformer_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
  data_dir = os.environ.get(DATA_DIR_ENV, "../shared/data")
  out = {"entries": []}
  with tempfile.TemporaryDirectory() as tmp:
    for item in opts.data.split(","):
      corpus, _, rest = item.partition(":")
      mode, _, budget = rest.partition("@")
      if not os.path.isdir(os.path.join(data_dir, bdata.CORPORA[corpus][0])):
        out["entries"].append({"corpus": corpus, "skipped": f"no {corpus} under {data_dir}: set "
                                                            f"{DATA_DIR_ENV}"})
        continue
      c = bdata.corpus_config(corpus, tmp)
      c.data.data_dir = data_dir
      tok = tokenizer.load_or_train_tokenizer(c, os.path.join(tmp, "work-" + corpus))
      r = bdata.throughput(c, tok, mode, int(budget), opts.data_seconds)
      out["entries"].append({"corpus": corpus, "mode": mode, "tokens_per_batch": int(budget), **r})
  return out
