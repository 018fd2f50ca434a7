"""Decoding speed: beam-4 translation of newstest2014 (English side) with the base model shapes.

Run (from the repository root):
  python experiments/bench_decode.py --num_sentences=192

What it measures, on random weights (no trained model is needed for speed):
1. Throughput: sentences/s and output tokens/s of `decode.beam_decode` (beam 4, alpha 0.6,
   max length = source length + 50) on a seeded random sample of newstest2014 sentences, sorted
   by length into batches of `--batch_size`; compile time is reported separately (one
   executable per padded source width, widths rounded up to a multiple of 8).
2. Per-token cost vs position: the jitted decode step (model step, and model step + the search's
   log-softmax, top-2k and cache reordering) on batch*beam rows with the cache index at 20 and at
   200, in the same 256-long buffer.

Tokenization: no trained vocabulary is required. By default a BPE SentencePiece model
(`--spm_vocab_size`, ids pad 0 / eos 1 / unk 2) is trained in a temporary folder on the small
in-domain wmt-news training set (English and German), and its ids are used inside the model's
37000-entry vocabulary; `--tokenizer=chars` maps characters to ids instead. Random weights almost
never choose EOS, so every sentence runs to its length limit: the worst case for decoding time.
Writes `<out>.json` and `<out>.md`.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import base  # noqa: E402
from transformer_jax import beam_search, decode  # noqa: E402
from transformer_jax.config import DATA_DIR_ENV, ModelConfig  # noqa: E402
from transformer_jax.model import Transformer  # noqa: E402


def read_lines(path):
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f]


def make_tokenizer(kind, data_dir, vocab_size, workdir):
  """Returns (encode(text) -> ids without EOS, description)."""
  if kind == "chars":
    return (lambda s: [3 + (ord(c) % 36997) for c in s]), "characters (id = 3 + ord(c) mod 36997)"
  import sentencepiece as spm
  corpus = os.path.join(workdir, "spm_train.txt")
  sources = [os.path.join(data_dir, "wmt-news", f"train.{lang}.gz") for lang in ("en", "de")]
  with open(corpus, "w", encoding="utf-8") as f:
    for path in sources:
      f.writelines(line + "\n" for line in read_lines(path))
  prefix = os.path.join(workdir, "spm")
  spm.SentencePieceTrainer.train(
      input=corpus, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, input_sentence_size=200_000,
      shuffle_input_sentence=True, num_threads=2, minloglevel=2)
  sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
  return sp.encode, (f"SentencePiece BPE, {vocab_size} pieces, trained here on wmt-news/train "
                     "(en+de, 61,858 lines); ids used inside the model's 37000-entry vocabulary")


def batches_of(ids_list, batch_size, multiple=8):
  """Sorted by length, padded to a multiple of `multiple`: a list of int32 [B, S] arrays."""
  order = sorted(range(len(ids_list)), key=lambda i: len(ids_list[i]))
  out = []
  for start in range(0, len(order), batch_size):
    chunk = [ids_list[i] for i in order[start:start + batch_size]]
    width = -(-max(map(len, chunk)) // multiple) * multiple
    out.append(np.array([s + [0] * (width - len(s)) for s in chunk], np.int32))
  return out


def time_throughput(cfg, params, batches, beam_size, alpha, max_extra_len):
  fn = jax.jit(lambda p, x: decode.beam_decode(cfg, p, x, beam_size=beam_size, alpha=alpha,
                                               max_extra_len=max_extra_len))
  compiled, compile_s = {}, 0.0
  for x in batches:
    if x.shape not in compiled:
      t = time.perf_counter()
      compiled[x.shape] = fn.lower(params, x).compile()
      compile_s += time.perf_counter() - t
  sentences = tokens = steps = 0
  per_batch = []
  t = time.perf_counter()
  for i, x in enumerate(batches):
    t_batch = time.perf_counter()
    result = jax.block_until_ready(compiled[x.shape](params, x))
    seconds = time.perf_counter() - t_batch
    best = decode.strip_eos(result.seqs_BxKxL[:, 0])
    sentences += len(best)
    tokens += sum(len(s) + 1 for s in best)  # + EOS
    steps += int(result.num_steps)
    per_batch.append({"shape": list(x.shape), "buffer": decode.buffer_length(cfg, x.shape[1], max_extra_len),
                      "steps": int(result.num_steps), "seconds": seconds,
                      "seconds_per_step": seconds / int(result.num_steps)})
    print(f"  batch {i + 1}/{len(batches)} {x.shape}: {int(result.num_steps)} steps in {seconds:.1f}s",
          flush=True)
  wall = time.perf_counter() - t
  return {"per_batch": per_batch, "sentences": sentences, "output_tokens": tokens, "decoder_steps": steps,
          "decode_seconds": wall, "compile_seconds": compile_s, "executables": len(compiled),
          "sentences_per_second": sentences / wall, "output_tokens_per_second": tokens / wall,
          "seconds_per_step": wall / steps}


def time_step_at_positions(cfg, params, rows, source_width, positions, repeats, beam_size):
  """Median seconds of one jitted decode step with the cache index at each position.

  The cache is donated, so that the step updates it in place as it does inside the search's
  while loop (without donation every call would also copy the whole buffer).
  """
  buffer = cfg.max_len
  rng = np.random.RandomState(0)
  inputs_NxS = jnp.asarray(rng.randint(3, cfg.vocab_size, (rows, source_width)), jnp.int32)
  encoded_NxSxD = jax.jit(decode.encode, static_argnums=0)(cfg, params, inputs_NxS)
  cache = jax.jit(decode.init_cache, static_argnums=(0, 4))(cfg, params, encoded_NxSxD,
                                                           inputs_NxS, buffer)
  batch = rows // beam_size

  def model_step(params, encoded, inputs, ids, t, cache):
    return decode.make_step_fn(cfg, params, encoded, inputs, buffer)(ids, t, cache)

  def search_step(params, encoded, inputs, ids, t, cache):  # what one beam-search step costs
    logits_NxV, cache = model_step(params, encoded, inputs, ids, t, cache)
    logprobs = jax.nn.log_softmax(logits_NxV).reshape(batch, -1)
    _, idx_Bx2K = jax.lax.top_k(logprobs, 2 * beam_size)
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
    step = jax.jit(fn, donate_argnums=5)
    caches = {p: jax.tree_util.tree_map(jnp.copy, cache) for p in positions}

    def run(p):
      c = at_index(caches[p], p)
      t = time.perf_counter()
      _, caches[p] = jax.block_until_ready(step(params, encoded_NxSxD, inputs_NxS, ids_Nx1,
                                                jnp.int32(p), c))
      return time.perf_counter() - t

    for p in positions:  # compile + warm up
      run(p)
    samples = {p: [] for p in positions}
    for _ in range(repeats):  # interleaved, so that load from other users hits both alike
      for p in positions:
        samples[p].append(run(p))
    out[name] = {str(p): {"median_s": statistics.median(s), "min_s": min(s), "samples_s": s}
                 for p, s in samples.items()}
    lo, hi = str(positions[0]), str(positions[-1])
    out[name]["ratio_median"] = out[name][hi]["median_s"] / out[name][lo]["median_s"]
    out[name]["ratio_min"] = out[name][hi]["min_s"] / out[name][lo]["min_s"]
  out.update(rows=rows, source_width=source_width, buffer=buffer, repeats=repeats)
  return out


def machine():
  cpu = "unknown"
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(),
          "python": platform.python_version(), "jax": jax.__version__,
          "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}


def write_markdown(path, r):
  t, s = r["throughput"], r["step_vs_position"]
  m, q = s["model_step"], s["search_step"]
  lines = [
      "# Decoding speed: beam search, base model, CPU",
      "",
      f"Date: {r['date']}  ",
      f"Command: `{r['command']}`  ",
      f"Machine: {r['machine']['cpu']}, {r['machine']['cores']} cores (shared with other users; "
      f"load average {r['load_before'][0]:.2f} before, {r['load_after'][0]:.2f} after), "
      f"jax {r['machine']['jax']} on {r['machine']['backend']}",
      "",
      f"Model: configs/base.py shapes ({r['model']}), random weights, float32. Search: beam "
      f"{r['beam_size']}, alpha {r['alpha']}, output limit = source length + {r['max_extra_len']} "
      f"(EOS included), batches of {r['batch_size']} sentences x {r['beam_size']} beams.",
      "",
      f"Data: {r['num_sentences']} of {r['corpus_sentences']} newstest2014 English sentences "
      f"(seeded random sample, sorted by length), {r['tokenizer']}; "
      f"{r['mean_source_tokens']:.1f} source tokens per sentence on average (EOS included).",
      "",
      "| throughput | value |", "|---|---|",
      f"| sentences/s | {t['sentences_per_second']:.2f} |",
      f"| output tokens/s (best hypothesis, EOS included) | {t['output_tokens_per_second']:.1f} |",
      f"| seconds per decoder step (B*K rows) | {t['seconds_per_step']:.3f} |",
      f"| mean output length | {t['output_tokens'] / t['sentences']:.1f} tokens |",
      f"| decode time (compile excluded) | {t['decode_seconds']:.1f} s |",
      f"| compile time ({t['executables']} executables) | {t['compile_seconds']:.1f} s |",
      "",
      "Random weights almost never choose EOS, so each sentence runs to its length limit and "
      "early termination never fires: a worst case (a trained model stops near the length of "
      "a real translation, so it runs far fewer steps).",
      "",
      "Per batch (sorted by length; the cache buffer is the padded source width + 50):",
      "",
      "| batch shape | buffer | steps | seconds | seconds/step |", "|---|---|---|---|---|",
      *[f"| {b['shape'][0]}x{b['shape'][1]} | {b['buffer']} | {b['steps']} | {b['seconds']:.1f} | "
        f"{b['seconds_per_step']:.3f} |" for b in t["per_batch"]],
      "",
      f"Per-token time vs output position ({s['rows']} rows = {r['batch_size']} x "
      f"{r['beam_size']}, source width {s['source_width']}, cache buffer {s['buffer']}, "
      f"median of {s['repeats']}):",
      "",
      "| step | position 20 | position 200 | ratio 200/20 (median; min) |", "|---|---|---|---|",
      f"| model decode step | {m['20']['median_s'] * 1e3:.1f} ms | {m['200']['median_s'] * 1e3:.1f} ms "
      f"| {m['ratio_median']:.2f}; {m['ratio_min']:.2f} |",
      f"| + log-softmax, top-2k, cache reorder | {q['20']['median_s'] * 1e3:.1f} ms | "
      f"{q['200']['median_s'] * 1e3:.1f} ms | {q['ratio_median']:.2f}; {q['ratio_min']:.2f} |",
      "",
      "Target: ratio <= 1.5. The step attends over the whole fixed-size cache buffer with a mask "
      "and writes one slot in place (dynamic_update_slice on a donated buffer), so its cost does "
      "not depend on the position; it grows with the buffer length instead (table above): on "
      "XLA:CPU the attention dots transpose each layer's whole K and V cache "
      "([rows, L, heads, 64] -> [rows, heads, 64, L]) every step, and beam reordering gathers "
      "the whole self-attention cache every step.",
      "",
  ]
  with open(path, "w") as f:
    f.write("\n".join(lines))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num_sentences", type=int, default=192)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--alpha", type=float, default=0.6)
  parser.add_argument("--max_extra_len", type=int, default=50)
  parser.add_argument("--tokenizer", choices=["spm", "chars"], default="spm")
  parser.add_argument("--spm_vocab_size", type=int, default=16000)
  parser.add_argument("--step_repeats", type=int, default=10)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default="experiments/results/decode_speed")
  args = parser.parse_args()

  data_dir = os.environ.get(DATA_DIR_ENV, "../shared/data")
  load_before = os.getloadavg()
  cfg = ModelConfig.from_config(base.get_config().model)
  with tempfile.TemporaryDirectory() as workdir:
    t = time.perf_counter()
    encode, tokenizer = make_tokenizer(args.tokenizer, data_dir, args.spm_vocab_size, workdir)
    print(f"tokenizer ready in {time.perf_counter() - t:.1f}s: {tokenizer}", flush=True)
  lines = read_lines(os.path.join(data_dir, "wmt14", "newstest2014.en.gz"))
  rng = np.random.RandomState(args.seed)
  chosen = sorted(rng.choice(len(lines), size=min(args.num_sentences, len(lines)), replace=False))
  ids_list = [encode(lines[i])[:cfg.max_len - 1] + [decode.EOS_ID] for i in chosen]
  batches = batches_of(ids_list, args.batch_size)

  dummy = jnp.ones((1, 8), jnp.int32)
  params = nn.meta.unbox(jax.jit(Transformer(cfg).init)(jax.random.PRNGKey(args.seed), dummy,
                                                          dummy)["params"])
  print("step time vs position ...", flush=True)
  step = time_step_at_positions(cfg, params, args.batch_size * args.beam_size, 32, [20, 200],
                                args.step_repeats, args.beam_size)
  print(f"  model step ratio 200/20: {step['model_step']['ratio_median']:.2f}; "
        f"with search ops: {step['search_step']['ratio_median']:.2f}", flush=True)
  print(f"throughput on {len(ids_list)} sentences in {len(batches)} batches ...", flush=True)
  throughput = time_throughput(cfg, params, batches, args.beam_size, args.alpha, args.max_extra_len)

  result = {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "command": "python " + " ".join([sys.argv[0].replace(os.getcwd() + "/", "")] + sys.argv[1:]),
      "machine": machine(), "load_before": load_before, "load_after": os.getloadavg(),
      "model": (f"d_model {cfg.d_model}, {cfg.num_heads} heads, d_ff {cfg.d_ff}, "
                f"{cfg.num_encoder_layers}+{cfg.num_decoder_layers} layers, vocab {cfg.vocab_size}"),
      "beam_size": args.beam_size, "alpha": args.alpha, "max_extra_len": args.max_extra_len,
      "batch_size": args.batch_size, "tokenizer": tokenizer, "corpus_sentences": len(lines),
      "num_sentences": len(ids_list), "sample_seed": args.seed,
      "mean_source_tokens": float(np.mean([len(s) for s in ids_list])),
      "throughput": throughput, "step_vs_position": step,
  }
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  with open(args.out + ".json", "w") as f:
    json.dump(result, f, indent=2)
  write_markdown(args.out + ".md", result)
  print(f"{throughput['sentences_per_second']:.2f} sentences/s, "
        f"{throughput['output_tokens_per_second']:.1f} tokens/s; wrote {args.out}.json/.md")


if __name__ == "__main__":
  main()
