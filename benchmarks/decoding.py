"""The decoding benchmark: beam-search throughput and the cost of one decoder step vs position.

Random weights (no trained model is needed for speed): they almost never choose EOS, so every
sentence runs to its length limit, the worst case for decoding time.
1. Throughput: sentences/s and output tokens/s of `decode.beam_decode` on newstest2014 English
   sentences (a seeded sample; or random ids), sorted by length into batches whose width is
   rounded up to a multiple of 8; compile time is reported separately (one executable per width).
2. Step vs position: the jitted decode step (the model step, and the model step plus the
   search's log-softmax, top-2k and cache reordering) on batch x beam rows with the cache index at
   each position, in one `max_len`-long buffer.
Tokenization of newstest: the wmt-news corpus' 16000-piece BPE vocabulary, trained here
(`input_pipeline.corpus_config`), its ids used inside the model's vocabulary; or characters.
"""

from __future__ import annotations

import gzip
import os
import statistics
import tempfile
import time
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import beam_search, decode
from transformer_jax.config import DATA_DIR_ENV, ConfigError, ModelConfig
from transformer_jax.model import Transformer
from transformer_jax.special_ids import EOS_ID, PAD_ID

from benchmarks import input_pipeline, train_step

ALPHA, MAX_EXTRA_LEN, SOURCE_WIDTH = 0.6, 50, 32


def newstest_path() -> str:
  return os.path.join(input_pipeline.data_dir(), "wmt14", "newstest2014.en.gz")


def check(config: str, data: str, tokenizer: str, positions: Sequence[str]) -> None:
  """A ConfigError for settings that cannot run, before anything is timed."""
  model = train_step.preset(config)[0].model
  max_len, spm_size = model.max_len, input_pipeline.CORPORA["wmt-news"][3]
  if not positions or not all(p.isdigit() and int(p) < max_len for p in positions):
    raise ConfigError(f"--decode_positions={','.join(positions)}: expected integers in "
                      f"[0, {max_len}) (model.max_len of configs/{config}.py)")
  if data == "newstest" and tokenizer == "spm" and model.vocab_size < spm_size:
    raise ConfigError(f"--decode_tokenizer=spm gives ids up to {spm_size}, more than the "
                      f"{model.vocab_size} of configs/{config}.py; use --decode_tokenizer=chars")
  if data == "newstest" and not os.path.isfile(newstest_path()):
    raise ConfigError(f"--decode_data=newstest needs {newstest_path()}: set {DATA_DIR_ENV} to the "
                      "data folder, or use --decode_data=random")


def source_ids(cfg: ModelConfig, data: str, tokenizer: str, count: int, seed: int):
  """(`count` sentences of ids ending in EOS, a description) for `data` 'newstest' or 'random'."""
  rng = np.random.RandomState(seed)
  if data == "random":
    lengths = np.clip(rng.normal(30, 12, count), 4, cfg.max_len - 1).astype(int)
    ids = [rng.randint(3, cfg.vocab_size, n - 1).tolist() + [EOS_ID] for n in lengths]
    return ids, f"{count} random-id sentences, lengths ~ N(30, 12) clipped to [4, max_len)"
  if tokenizer == "chars":
    encode = lambda s: [3 + ord(c) % (cfg.vocab_size - 3) for c in s]  # noqa: E731
    how = f"characters (id = 3 + ord(c) mod {cfg.vocab_size - 3})"
  else:
    from transformer_jax.data import tokenizer as tokenizers  # pylint: disable=g-import-not-at-top
    with tempfile.TemporaryDirectory() as tmp:
      config = input_pipeline.corpus_config("wmt-news", tmp)
      encode = tokenizers.load_or_train_tokenizer(config, os.path.join(tmp, "work")).encode
    how = (f"SentencePiece BPE, {config.model.vocab_size} pieces, trained here on wmt-news/train; "
           f"ids used inside the model's {cfg.vocab_size}-entry vocabulary")
  with gzip.open(newstest_path(), "rt", encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f]
  chosen = sorted(rng.choice(len(lines), size=min(count, len(lines)), replace=False))
  ids = [encode(lines[i])[:cfg.max_len - 1] + [EOS_ID] for i in chosen]
  return ids, f"{len(ids)} of {len(lines)} newstest2014 English sentences (seeded sample); {how}"


def batches_of(ids_list, batch_size: int, multiple: int = 8) -> list[np.ndarray]:
  """Sorted by length, padded to a multiple of `multiple`: a list of int32 [B, S] arrays."""
  ordered = sorted(ids_list, key=len)
  out = []
  for start in range(0, len(ordered), batch_size):
    chunk = ordered[start:start + batch_size]
    width = -(-max(map(len, chunk)) // multiple) * multiple
    out.append(np.array([s + [PAD_ID] * (width - len(s)) for s in chunk], np.int32))
  return out


def time_throughput(cfg: ModelConfig, params, batches, beam_size: int) -> dict:
  """Compiles one executable per batch shape, then decodes every batch once, timed."""
  fn = jax.jit(lambda p, x: decode.beam_decode(cfg, p, x, beam_size=beam_size, alpha=ALPHA,
                                               max_extra_len=MAX_EXTRA_LEN))
  compiled, compile_s = {}, 0.0
  for x in batches:
    if x.shape not in compiled:
      t = time.perf_counter()
      compiled[x.shape] = fn.lower(params, x).compile()
      compile_s += time.perf_counter() - t
  sentences = tokens = steps = 0
  per_batch = []
  start = time.perf_counter()
  for x in batches:
    t = time.perf_counter()
    result = jax.block_until_ready(compiled[x.shape](params, x))
    seconds, n = time.perf_counter() - t, int(result.num_steps)
    best = decode.strip_eos(result.seqs_BxKxL[:, 0])
    sentences += len(best)
    tokens += sum(len(s) + 1 for s in best)  # + EOS
    steps += n
    per_batch.append({"shape": list(x.shape), "steps": n, "seconds": seconds,
                      "buffer": decode.buffer_length(cfg, x.shape[1], MAX_EXTRA_LEN),
                      "seconds_per_step": seconds / n})
    print(f"  batch {len(per_batch)}/{len(batches)} {x.shape}: {n} steps in {seconds:.1f} s",
          flush=True)
  wall = time.perf_counter() - start
  return {"per_batch": per_batch, "sentences": sentences, "output_tokens": tokens,
          "decoder_steps": steps, "decode_seconds": wall, "compile_seconds": compile_s,
          "executables": len(compiled), "sentences_per_second": sentences / wall,
          "output_tokens_per_second": tokens / wall, "seconds_per_step": wall / steps}


def time_step_at_positions(cfg: ModelConfig, params, rows: int, positions: Sequence[int],
                           repeats: int, beam_size: int) -> dict:
  """Median and min seconds of one jitted decode step with the cache index at each position.

  The cache is donated, so that the step updates it in place as it does inside the search's
  while loop (without donation every call would also copy the whole buffer). The positions are
  timed in turn, so that load from other processes hits them alike.
  """
  buffer, batch = cfg.max_len, rows // beam_size
  inputs_NxS = jnp.asarray(np.random.RandomState(0).randint(3, cfg.vocab_size, (rows, SOURCE_WIDTH)),
                           jnp.int32)
  encoded_NxSxD = jax.jit(decode.encode, static_argnums=0)(cfg, params, inputs_NxS)
  cache = jax.jit(decode.init_cache, static_argnums=(0, 4, 5))(cfg, params, encoded_NxSxD,
                                                              inputs_NxS, buffer, beam_size)

  def model_step(params, encoded, inputs, ids, t, cache):
    return decode.make_step_fn(cfg, params, encoded, inputs, buffer, beam_size)(ids, t, cache)

  def search_step(params, encoded, inputs, ids, t, cache):  # what one beam-search step costs
    logits_NxV, cache = model_step(params, encoded, inputs, ids, t, cache)
    logprobs_BxKV = jax.nn.log_softmax(logits_NxV).reshape(batch, -1)
    _, idx_Bx2K = jax.lax.top_k(logprobs_BxKV, 2 * beam_size)
    parent_BxK = idx_Bx2K[:, :beam_size] // cfg.vocab_size
    rows_N = (jnp.arange(batch)[:, None] * beam_size + parent_BxK).reshape(-1)
    return idx_Bx2K, beam_search.reorder_cache(cache, rows_N)

  def at_index(cache, p):
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.full_like(x, p) if "cache_index" in jax.tree_util.keystr(path) else x,
        cache)

  ids_Nx1 = jnp.full((rows, 1), 5, jnp.int32)
  out = {}
  for name, fn in (("model_step", model_step), ("search_step", search_step)):
    jitted = jax.jit(fn, donate_argnums=5)
    caches = {p: jax.tree_util.tree_map(jnp.copy, cache) for p in positions}

    def run(p):
      c = at_index(caches[p], p)
      t = time.perf_counter()
      _, caches[p] = jax.block_until_ready(jitted(params, encoded_NxSxD, inputs_NxS, ids_Nx1,
                                                  jnp.int32(p), c))
      return time.perf_counter() - t

    for p in positions:  # compile and warm up
      run(p)
    samples = {p: [] for p in positions}
    for _ in range(repeats):
      for p in positions:
        samples[p].append(run(p))
    out[name] = {str(p): {"median_s": statistics.median(s), "min_s": min(s), "samples_s": s}
                 for p, s in samples.items()}
    lo, hi = out[name][str(positions[0])], out[name][str(positions[-1])]
    out[name]["ratio_median"] = hi["median_s"] / lo["median_s"]
    out[name]["ratio_min"] = hi["min_s"] / lo["min_s"]
  out.update(rows=rows, source_width=SOURCE_WIDTH, buffer=buffer, repeats=repeats)
  return out


def measure(config: str, data: str, tokenizer: str, sentences: int, batch_size: int,
            positions: Sequence[int], repeats: int, beam_size: int, seed: int) -> dict:
  """Step vs position, then throughput, for the preset `config` (base and big with their own
  vocabulary) on random weights."""
  run_config, description = train_step.preset(config)
  description += f", vocab {run_config.model.vocab_size}"
  cfg = ModelConfig.from_config(run_config.model)
  ids_list, data_description = source_ids(cfg, data, tokenizer, sentences, seed)
  dummy = jnp.ones((1, 8), jnp.int32)
  params = nn.meta.unbox(jax.jit(Transformer(cfg).init)(jax.random.PRNGKey(seed), dummy,
                                                          dummy)["params"])
  print("  decoder step vs position ...", flush=True)
  steps = time_step_at_positions(cfg, params, batch_size * beam_size, positions, repeats,
                                 beam_size)
  batches = batches_of(ids_list, batch_size)
  print(f"  throughput: {len(ids_list)} sentences in {len(batches)} batches ...", flush=True)
  return {"config": description, "beam_size": beam_size, "alpha": ALPHA,
          "max_extra_len": MAX_EXTRA_LEN, "batch_size": batch_size, "data": data_description,
          "sample_seed": seed, "mean_source_tokens": float(np.mean([len(s) for s in ids_list])),
          "throughput": time_throughput(cfg, params, batches, beam_size),
          "step_vs_position": steps}
