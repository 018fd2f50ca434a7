"""The decoding benchmark: beam-search throughput on random weights.

Random weights (no trained model is needed for speed): they almost never choose EOS, so every
sentence runs to its length limit, source length + MAX_EXTRA_LEN, the worst case for decoding
time; the sentences' content does not matter, only their lengths. Sentences/s and output tokens/s
of `decode.beam_decode` on a seeded sample of random-id sentences whose lengths are ~ N(30, 12),
near those of news sentences in a 16000-piece BPE (the input-pipeline benchmark reports a
corpus' mean lengths), sorted by length into batches whose width is rounded up to a multiple of
8; compile time is reported separately (one executable per width), and each batch's steps and
seconds per step.
"""

from __future__ import annotations

import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.decoding import decode
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.markdown import table
from transformer_jax.runtime.special_ids import EOS_ID, PAD_ID

from benchmarks import train_step

ALPHA, MAX_EXTRA_LEN = 0.6, 50


def source_ids(cfg: ModelConfig, count: int, seed: int):
  """(`count` sentences of random ids ending in EOS, a description)."""
  rng = np.random.RandomState(seed)
  lengths = np.clip(rng.normal(30, 12, count), 4, cfg.max_len - 1).astype(int)
  ids = [rng.randint(3, cfg.vocab_size, n - 1).tolist() + [EOS_ID] for n in lengths]
  return ids, f"{count} random-id sentences, lengths ~ N(30, 12) clipped to [4, max_len)"


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


def random_params(cfg: ModelConfig, seed: int):
  """Our model's own initializer's (unboxed) weights."""
  dummy = jnp.ones((1, 8), jnp.int32)
  return nn.meta.unbox(jax.jit(Transformer(cfg).init)(jax.random.key(seed), dummy, dummy)["params"])


def measure(config: str, sentences: int, batch_size: int, beam_size: int, seed: int) -> dict:
  """Throughput of the preset `config` (base and big with their own vocabulary) on random
  weights."""
  run_config, description = train_step.preset(config)
  cfg = ModelConfig.from_config(run_config.model)
  ids_list, data_description = source_ids(cfg, sentences, seed)
  batches = batches_of(ids_list, batch_size)
  print(f"  throughput: {len(ids_list)} sentences in {len(batches)} batches ...", flush=True)
  return {"config": f"{description}, vocab {cfg.vocab_size}", "beam_size": beam_size,
          "alpha": ALPHA, "max_extra_len": MAX_EXTRA_LEN, "batch_size": batch_size,
          "data": data_description, "sample_seed": seed,
          "mean_source_tokens": float(np.mean([len(s) for s in ids_list])),
          "throughput": time_throughput(cfg, random_params(cfg, seed), batches, beam_size)}


def markdown(d: dict) -> list[str]:
  """The report section of `measure`'s result."""
  t = d["throughput"]
  return [
      "## Decoding (beam search)", "",
      f"{d['config']}, random weights, beam {d['beam_size']}, alpha {d['alpha']}, output limit "
      f"source length + {d['max_extra_len']} (EOS included); {d['data']}, "
      f"{d['mean_source_tokens']:.1f} source tokens per sentence on average (EOS included); "
      f"sorted by length into batches of {d['batch_size']}. Random weights almost never choose "
      "EOS, so each sentence runs to its length limit: a worst case.", "",
      table(["sentences/s", "output tokens/s (best hypothesis, EOS included)",
             "s per decoder step (batch x beam rows)", "mean output length", "decode s",
             f"compile s ({t['executables']} executables)"],
            [[t["sentences_per_second"], f"{t['output_tokens_per_second']:.1f}",
              f"{t['seconds_per_step']:.3f}", f"{t['output_tokens'] / t['sentences']:.1f}",
              f"{t['decode_seconds']:.1f}", f"{t['compile_seconds']:.1f}"]]),
      "Per batch (the cache buffer is the padded source width + the output limit):", "",
      table(["batch shape", "buffer", "steps", "seconds", "seconds/step"],
            [[f"{b['shape'][0]}x{b['shape'][1]}", b["buffer"], b["steps"], f"{b['seconds']:.1f}",
              f"{b['seconds_per_step']:.3f}"] for b in t["per_batch"]])]
