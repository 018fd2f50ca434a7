"""The decoding benchmark: beam-search throughput and the per-token decoder step vs position.

Uses `experiments/bench_decode.py`'s timing functions on random weights (every sentence runs to
its length limit: a worst case) with base-model shapes by default.
"""

from __future__ import annotations

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.bench.train_step import train_config
from transformer_jax.config import DATA_DIR_ENV, ModelConfig

def measure(opts) -> dict:
  """Beam-search throughput and per-position step times for `opts` (a runner.Options)."""
  from experiments import bench_decode as bd  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import Transformer  # pylint: disable=g-import-not-at-top
  config, description = train_config(opts.decode_config)
  if opts.decode_config in ("base", "big"):  # decoding as experiments/bench_decode.py: 37000
    config.model.vocab_size = 37000
    description = description.replace("vocab 32000", "vocab 37000")
  cfg = ModelConfig.from_config(config.model)
  rng = np.random.default_rng(opts.seed)
  if opts.decode_data == "random":
    lengths = np.clip(rng.normal(30, 12, opts.decode_sentences), 4, cfg.max_len - 1).astype(int)
    ids_list = [list(rng.integers(3, cfg.vocab_size, n - 1)) + [1] for n in lengths]
    data = f"{len(ids_list)} random-id sentences, lengths ~ N(30, 12) clipped to [4, max_len)"
  else:
    data_dir = os.environ.get(DATA_DIR_ENV, "../shared/data")
    with tempfile.TemporaryDirectory() as workdir:
      encode, tok_desc = bd.make_tokenizer(opts.decode_tokenizer, data_dir, 16000, workdir)
    lines = bd.read_lines(os.path.join(data_dir, "wmt14", "newstest2014.en.gz"))
    chosen = sorted(np.random.RandomState(opts.seed).choice(
        len(lines), size=min(opts.decode_sentences, len(lines)), replace=False))
    ids_list = [encode(lines[i])[:cfg.max_len - 1] + [1] for i in chosen]
    data = f"{len(ids_list)} newstest2014 English sentences (seeded sample); {tok_desc}"
  batches = bd.batches_of([list(map(int, s)) for s in ids_list], opts.decode_batch)
  dummy = jnp.ones((1, 8), jnp.int32)
  params = nn.meta.unbox(jax.jit(Transformer(cfg).init)(jax.random.PRNGKey(opts.seed), dummy,
                                                          dummy)["params"])
  positions = [int(p) for p in opts.decode_positions.split(",")]
  step_times = bd.time_step_at_positions(cfg, params, opts.decode_batch * opts.beam_size, 32,
                                         positions, opts.decode_repeats, opts.beam_size)
  throughput = bd.time_throughput(cfg, params, batches, opts.beam_size, 0.6, 50)
  return {"config": description, "beam_size": opts.beam_size, "alpha": 0.6, "max_extra_len": 50,
          "batch_size": opts.decode_batch, "data": data,
          "mean_source_tokens": float(np.mean([len(s) for s in ids_list])),
          "throughput": throughput, "step_vs_position": step_times,
          "per_token_s": {str(p): step_times["model_step"][str(p)]["median_s"] for p in positions},
          "per_token_with_search_s": {str(p): step_times["search_step"][str(p)]["median_s"]
                                      for p in positions}}
