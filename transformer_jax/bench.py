"""Benchmark: train-step throughput and MFU, beam-search decoding speed, input-pipeline speed.

Run (from the repository root; the full run takes ~10 minutes on 2 CPU cores):
  TRANSFORMER_JAX_DATA_DIR=../shared/data python -m transformer_jax.bench
Quick runs:
  python -m transformer_jax.bench --only=train --train=base:8x128 --steps=2
  python -m transformer_jax.bench --only=decode --decode_sentences=8 --decode_data=random

Writes `<out>.json` and `<out>.md` (default experiments/results/bench) and prints the table.

What is measured (one process, the default jax device, float32 unless the config says otherwise):
- train: the compiled train step (`step.jit_train_step`: forward, backward, Adam update, dropout
  on, state donated) of each `--train` entry `CONFIG:ROWSxLENGTH` on synthetic batches of random
  ids with source and target length LENGTH (pack-mode configs get packed rows with segment ids).
  'base' is configs/base.py with a 32000-piece vocabulary (the flax WMT example's), 'big'
  likewise; 'multi30k' and 'tiny' are those configs as they are. Per entry: compile time, step
  time (median and min of `--steps` steps after `--warmup`), target tokens/s (non-pad target
  tokens per step / median step time), model FLOP/s and MFU.
  Model FLOPs are counted the standard way: `metrics.train_flops` = 3 x the forward pass's matmul
  FLOPs (2 per multiply-add: Q/K/V/output projections, QK^T and AV over the padded lengths, the
  FFNs, the pre-softmax projection; embedding lookups, softmax, LayerNorm, the loss and Adam are
  not counted), so MFU does not credit recomputation or overhead. XLA's own count of the
  compiled step (`cost_analysis()['flops']`) is recorded next to it.
  MFU is against the peak measured in the same run: `metrics.measure_peak_flops` (a jitted
  2048x2048 jnp.dot, best of 5) in the compute dtype of the first train entry.
  Memory: the compiled step's buffers (XLA memory analysis: arguments, outputs, temporaries)
  and the process's peak resident set size after the entry (a high-water mark over the run, so
  entries run from small to large as given).
- decode: `experiments/bench_decode.py`'s functions, imported: beam-4 throughput (sentences/s,
  output tokens/s) on a batch of newstest2014 sentences (or random ids with `--decode_data=random`)
  and the median time of one decoder step with the cache index at each `--decode_positions`.
  Random weights: every sentence runs to its length limit (a worst case).
- data: `experiments/bench_data.py`'s `throughput` for each `--data` entry `CORPUS:MODE@TOKENS`:
  real target tokens/s of the train iterator (needs TRANSFORMER_JAX_DATA_DIR).

Timing on a shared machine is only meaningful when it is idle: the load average before and
after is recorded, and the report says so when it was above 0.5.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer_jax import metrics, sharding, step
from transformer_jax.config import DATA_DIR_ENV, ModelConfig

SCHEMA_VERSION = 1
PARTS = ("train", "decode", "data")
DEFAULT_TRAIN = "multi30k:40x100,base:8x128,base:32x128"
DEFAULT_DATA = "multi30k:pack@4096,wmt-news:bucket@25000"
# The flax WMT example (examples/wmt, fp32, vocab 32000) on this machine, as reported in issue #9.
FLAX_WMT_REFERENCE = {
    "8x128": {"seconds_per_step": 5.5, "target_tokens_per_s": 185.0},
    "32x128": {"seconds_per_step": 23.5, "target_tokens_per_s": 174.0},
    "note": "flax examples/wmt train step, fp32, measured on this machine (issue #9); about 50% "
            "of a ~140 GFLOP/s jnp.dot peak",
}
GOAL_SPEEDUP = 1.3


def train_config(name: str) -> tuple[ml_collections.ConfigDict, str]:
  """(run config, description) of a named train preset."""
  from configs import base, big, multi30k, tiny  # pylint: disable=g-import-not-at-top
  if name == "base":
    c = base.get_config()
    c.model.vocab_size = 32000
    return c, "configs/base.py, vocab 32000"
  if name == "big":
    c = big.get_config()
    c.model.vocab_size = 32000
    return c, "configs/big.py, vocab 32000"
  if name == "multi30k":
    return multi30k.get_config(), "configs/multi30k.py"
  if name == "tiny":
    return tiny.get_config(), "configs/tiny.py"
  raise ValueError(f"unknown config {name!r}; use base, big, multi30k or tiny")


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> dict:
  """`section.key=value` strings, parsed as the type of the current value."""
  done = {}
  for item in overrides:
    key, _, raw = item.partition("=")
    if not _:
      raise ValueError(f"--override {item!r}: expected key=value")
    *path, leaf = key.split(".")
    node = config
    for part in path:
      node = node[part]
    old = node[leaf]
    if isinstance(old, bool):
      value = raw.lower() in ("1", "true", "yes")
    elif old is None:
      value = raw
    else:
      value = type(old)(raw)
    node[leaf] = value
    done[key] = value
  return done


def parse_shape(text: str) -> tuple[int, int]:
  rows, _, length = text.lower().partition("x")
  return int(rows), int(length)


def synthetic_batch(config, rows: int, length: int, seed: int = 0) -> dict:
  """Random ids in [3, vocab) filling every position; pack-mode configs get packed rows of
  segments of 8-24 tokens (each ending in EOS) with segment ids and positions."""
  rng = np.random.default_rng(seed)
  vocab = config.model.vocab_size
  batch = {}
  packed = config.data.batch_mode == "pack"
  for side in ("inputs", "targets"):
    ids = rng.integers(3, vocab, (rows, length)).astype(np.int32)
    if not packed:
      ids[:, -1] = 1
      batch[side] = ids
      continue
    seg = np.zeros((rows, length), np.int32)
    pos = np.zeros((rows, length), np.int32)
    for r in range(rows):
      start, k = 0, 1
      while start < length:
        n = min(int(rng.integers(8, 25)), length - start)
        seg[r, start:start + n] = k
        pos[r, start:start + n] = np.arange(n)
        ids[r, start + n - 1] = 1
        start, k = start + n, k + 1
    batch[side], batch[f"{side}_segmentation"], batch[f"{side}_position"] = ids, seg, pos
  return batch


def _rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


def _memory(compiled) -> dict:
  try:
    m = compiled.memory_analysis()
  except Exception:  # noqa: BLE001 - not every backend reports it
    return {}
  if m is None:
    return {}
  keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "generated_code_size_in_bytes")
  return {k.replace("_size_in_bytes", "_bytes"): int(getattr(m, k)) for k in keys if hasattr(m, k)}


def _xla_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # noqa: BLE001
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return float(cost["flops"]) if cost and "flops" in cost else None


# --- where the time goes: HLO statistics and a categorised profile of one step ------------------

_CATEGORIES = (  # (category, predicate on the op_name metadata); the first match wins
    ("dropout RNG + mask", lambda s: any(k in s for k in ("Dropout", "bernoulli", "_uniform",
                                                          "threefry", "random_bits", "fold_in"))),
    ("vocabulary projection (matmul)", lambda s: "bld,vd->blv" in s),
    ("attention QK^T and AV (matmul)", lambda s: "btnk,bsnk->bnts" in s or "bnts,bsnv->btnv" in s),
    ("attention Q/K/V/output projections (matmul)",
     lambda s: "bld,dnk->blnk" in s or "btnv,nvd->btd" in s),
    ("FFN (matmul)", lambda s: "/ffn/" in s and ("dot_general" in s or "/transpose" in s)),
    ("attention softmax + masks", lambda s: "attention" in s and any(
        k in s for k in ("softmax", "exp", "reduce_max", "select", "where", "div", "sub"))),
    ("LayerNorm", lambda s: "norm" in s.lower()),
    ("FFN bias + ReLU", lambda s: "/ffn/" in s),
    ("embedding + positions", lambda s: "embed" in s or "positional" in s),
    ("loss (log-softmax over the vocabulary)", lambda s: "Transformer" not in s and "jvp(" in s),
    ("optimizer (Adam) + gradient norm", lambda s: "Transformer" not in s and bool(s)),
)


def _entry_instructions(hlo_text: str) -> dict:
  """name -> (opcode[:fusion kind], shape, op_name, called computation) of the entry computation."""
  out, in_entry = {}, False
  for line in hlo_text.splitlines():
    if line.startswith("ENTRY"):
      in_entry = True
      continue
    if in_entry and line.startswith("}"):
      break
    m = re.match(r"\s+(?:ROOT )?%([\w.\-]+) = ", line) if in_entry else None
    if m:
      name, rest = m.group(1), line[m.end():]
      if rest.startswith("("):  # a tuple shape: up to its matching parenthesis
        depth = 0
        for i, ch in enumerate(rest):
          depth += {"(": 1, ")": -1}.get(ch, 0)
          if depth == 0:
            break
        shape, rest = rest[:i + 1], rest[i + 1:].lstrip()
      else:
        shape, _, rest = rest.partition(" ")
      op = re.match(r"([\w\-]+)\(", rest)
      if not op:
        continue
      opcode = op.group(1)
      kind = re.search(r"kind=(k\w+)", line)
      op_name = re.search(r'op_name="([^"]+)"', line)
      calls = re.search(r"calls=%([\w.\-]+)", line)
      out[name] = (opcode + (":" + kind.group(1) if kind else ""), shape,
                   op_name.group(1) if op_name else "", calls.group(1) if calls else None)
  return out


def _computations(hlo_text: str) -> dict:
  comps, cur = {}, None
  for line in hlo_text.splitlines():
    m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if m and not line.startswith(" "):
      cur = comps.setdefault(m.group(1), [])
    elif cur is not None and line.startswith("  "):
      cur.append(line)
  return comps


def _array_bytes(shape: str) -> int:
  m = re.match(r"(\w+)\[([\d,]*)\]", shape)
  if not m:
    return 0
  size = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "f64": 8, "s64": 8}.get(m.group(1), 4)
  return size * int(np.prod([int(d) for d in m.group(2).split(",") if d] or [1]))


def hlo_statistics(hlo_text: str) -> dict:
  """Counts in the compiled step: library (YNNPACK) dot fusions, Eigen dots, loop fusions that
  transpose (and the bytes they write), while loops (threefry's rolled rounds on CPU), copies."""
  comps, entry = _computations(hlo_text), _entry_instructions(hlo_text)
  stats = {"library_dot_fusions": 0, "library_other_fusions": 0, "eigen_dots": 0,
           "loop_fusions": 0, "transposing_fusions": 0, "transposed_bytes": 0, "while_loops": 0,
           "copies": 0, "copied_bytes": 0}
  for opcode, shape, _, calls in entry.values():
    body = comps.get(calls, []) if calls else []
    if opcode == "fusion:kCustom":
      key = "library_dot_fusions" if any(" dot(" in b for b in body) else "library_other_fusions"
      stats[key] += 1
    elif opcode.startswith("fusion"):
      stats["loop_fusions"] += 1
      if any(re.search(r"\s(transpose|copy)\(", b) for b in body):
        stats["transposing_fusions"] += 1
        stats["transposed_bytes"] += _array_bytes(shape)
    elif opcode == "dot":
      stats["eigen_dots"] += 1
    elif opcode == "while":
      stats["while_loops"] += 1
    elif opcode == "copy":
      stats["copies"] += 1
      stats["copied_bytes"] += _array_bytes(shape)
  return stats


def _category(op_name: str, transposes: bool = False) -> str:
  if transposes:
    return "transposes / layout copies"
  for name, pred in _CATEGORIES:
    if pred(op_name):
      return name
  return "other"


def profile_step(compiled, state, batch, steps: int = 1):
  """Runs `steps` steps under jax.profiler and splits the executor's busy time over categories
  of the entry computation's thunks (by their op_name metadata; thunks running at the same time
  share each instant equally). Returns (state, {category: {'share', 'forward', 'backward'}},
  seconds of busy time per step)."""
  import glob  # pylint: disable=g-import-not-at-top
  import gzip  # pylint: disable=g-import-not-at-top
  text = compiled.as_text()
  entry, comps = _entry_instructions(text), _computations(text)

  def transposes(name):
    opcode, _, _, calls = entry[name]
    if opcode == "copy" or opcode == "transpose":
      return True
    return opcode == "fusion:kLoop" and any(re.search(r"\s(transpose|copy)\(", b)
                                            for b in comps.get(calls, []))

  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(steps):
        state, m = compiled(state, batch)
        jax.block_until_ready((state, m))
    (path,) = glob.glob(os.path.join(tmp, "plugins", "profile", "*", "perfetto_trace.json.gz"))
    with gzip.open(path) as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  events = [e for e in events if e.get("ph") == "X" and e.get("name") in entry]
  bounds = collections.defaultdict(list)
  for i, e in enumerate(events):
    bounds[e["ts"]].append((1, i))
    bounds[e["ts"] + e["dur"]].append((-1, i))
  share = collections.Counter()
  active, prev = set(), None
  for t in sorted(bounds):
    if prev is not None and active:
      for i in active:
        share[i] += (t - prev) / len(active)
    for sign, i in bounds[t]:
      (active.add if sign > 0 else active.discard)(i)
    prev = t
  busy = sum(share.values()) or 1.0
  cats = collections.defaultdict(lambda: {"share": 0.0, "forward": 0.0, "backward": 0.0})
  for i, e in enumerate(events):
    op_name = entry[e["name"]][2]
    c = cats[_category(op_name, transposes(e["name"]))]
    c["share"] += share[i] / busy
    c["backward" if "transpose(jvp" in op_name else "forward"] += share[i] / busy
  ordered = dict(sorted(cats.items(), key=lambda kv: -kv[1]["share"]))
  return state, ordered, busy / 1e6 / steps


def bench_train_entry(name: str, shape: str, steps: int, warmup: int, overrides: Sequence[str],
                      peak: float | None, profile: bool = False) -> dict:
  config, description = train_config(name)
  applied = apply_overrides(config, overrides)
  rows, length = parse_shape(shape)
  model_cfg = ModelConfig.from_config(config.model)
  mesh = sharding.make_mesh(config.mesh)
  _, state_sh = step.state_shardings(config, mesh)
  state = step.create_state(config, mesh)
  batch = synthetic_batch(config, rows, length)
  batch = jax.device_put(batch, sharding.batch_sharding(mesh))
  fn = step.jit_train_step(config, mesh, state_sh)
  t = time.perf_counter()
  with sharding.mesh_context(mesh):
    compiled = fn.jitted.lower(state, batch).compile()
  compile_s = time.perf_counter() - t
  samples, losses = [], []
  for i in range(warmup + steps):
    t = time.perf_counter()
    state, m = compiled(state, batch)
    jax.block_until_ready((state, m))
    if i >= warmup:
      samples.append(time.perf_counter() - t)
    losses.append(float(m["loss_sum"]) / max(float(m["tokens"]), 1.0))
  tokens = int((np.asarray(batch["targets"]) != 0).sum())
  flops = metrics.train_flops(model_cfg, rows, length, length)
  median = statistics.median(samples)
  entry = {
      "name": name, "config": description, "overrides": applied,
      "model": {"d_model": model_cfg.d_model, "heads": model_cfg.num_heads, "d_ff": model_cfg.d_ff,
                "layers": [model_cfg.num_encoder_layers, model_cfg.num_decoder_layers],
                "vocab": model_cfg.vocab_size, "dtype": model_cfg.dtype,
                "dropout": model_cfg.dropout_rate},
      "dropout_rng_impl": config.train.dropout_rng_impl,
      "batch": {"shape": shape, "rows": rows, "source_len": length, "target_len": length,
                "packed": config.data.batch_mode == "pack"},
      "compile_s": compile_s, "warmup_steps": warmup,
      "step_s": {"median": median, "min": min(samples), "samples": samples},
      "target_tokens_per_step": tokens, "target_tokens_per_s": tokens / median,
      "model_flops_per_step": flops, "model_flops_per_s": flops / median,
      "mfu": flops / median / peak if peak else None,
      "xla_flops_per_step": _xla_flops(compiled),
      "memory": dict(_memory(compiled), process_peak_rss_bytes=_rss_bytes()),
      "loss_first_last": [losses[0], losses[-1]],
      "finite": bool(np.all(np.isfinite(losses))),
  }
  entry["hlo"] = hlo_statistics(compiled.as_text())
  if profile:
    state, cats, busy = profile_step(compiled, state, batch, steps=2)
    entry["profile"] = {"busy_s_per_step": busy, "categories": cats}
  ref = FLAX_WMT_REFERENCE.get(shape) if name == "base" else None
  if ref:
    entry["flax_wmt_reference"] = ref
    entry["speedup_vs_flax_wmt"] = entry["target_tokens_per_s"] / ref["target_tokens_per_s"]
  del state, compiled
  return entry


def bench_decode(args) -> dict:
  from experiments import bench_decode as bd  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import Transformer  # pylint: disable=g-import-not-at-top
  config, description = train_config(args.decode_config)
  if args.decode_config in ("base", "big"):  # decoding as experiments/bench_decode.py: 37000
    config.model.vocab_size = 37000
    description = description.replace("vocab 32000", "vocab 37000")
  cfg = ModelConfig.from_config(config.model)
  rng = np.random.default_rng(args.seed)
  if args.decode_data == "random":
    lengths = np.clip(rng.normal(30, 12, args.decode_sentences), 4, cfg.max_len - 1).astype(int)
    ids_list = [list(rng.integers(3, cfg.vocab_size, n - 1)) + [1] for n in lengths]
    data = f"{len(ids_list)} random-id sentences, lengths ~ N(30, 12) clipped to [4, max_len)"
  else:
    data_dir = os.environ.get(DATA_DIR_ENV, "../shared/data")
    with tempfile.TemporaryDirectory() as workdir:
      encode, tok_desc = bd.make_tokenizer(args.decode_tokenizer, data_dir, 16000, workdir)
    lines = bd.read_lines(os.path.join(data_dir, "wmt14", "newstest2014.en.gz"))
    chosen = sorted(np.random.RandomState(args.seed).choice(
        len(lines), size=min(args.decode_sentences, len(lines)), replace=False))
    ids_list = [encode(lines[i])[:cfg.max_len - 1] + [1] for i in chosen]
    data = f"{len(ids_list)} newstest2014 English sentences (seeded sample); {tok_desc}"
  batches = bd.batches_of([list(map(int, s)) for s in ids_list], args.decode_batch)
  dummy = jnp.ones((1, 8), jnp.int32)
  params = nn.meta.unbox(jax.jit(Transformer(cfg).init)(jax.random.PRNGKey(args.seed), dummy,
                                                          dummy)["params"])
  positions = [int(p) for p in args.decode_positions.split(",")]
  step_times = bd.time_step_at_positions(cfg, params, args.decode_batch * args.beam_size, 32,
                                         positions, args.decode_repeats, args.beam_size)
  throughput = bd.time_throughput(cfg, params, batches, args.beam_size, 0.6, 50)
  return {"config": description, "beam_size": args.beam_size, "alpha": 0.6, "max_extra_len": 50,
          "batch_size": args.decode_batch, "data": data,
          "mean_source_tokens": float(np.mean([len(s) for s in ids_list])),
          "throughput": throughput, "step_vs_position": step_times,
          "per_token_s": {str(p): step_times["model_step"][str(p)]["median_s"] for p in positions},
          "per_token_with_search_s": {str(p): step_times["search_step"][str(p)]["median_s"]
                                      for p in positions}}


def bench_data(args) -> dict:
  from experiments import bench_data as bdata  # pylint: disable=g-import-not-at-top
  from transformer_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
  data_dir = os.environ.get(DATA_DIR_ENV, "../shared/data")
  out = {"entries": []}
  with tempfile.TemporaryDirectory() as tmp:
    for item in args.data.split(","):
      corpus, _, rest = item.partition(":")
      mode, _, budget = rest.partition("@")
      if not os.path.isdir(os.path.join(data_dir, bdata.CORPORA[corpus][0])):
        out["entries"].append({"corpus": corpus, "skipped": f"no {corpus} under {data_dir}: set "
                                                            f"{DATA_DIR_ENV}"})
        continue
      c = bdata.corpus_config(corpus, tmp)
      c.data.data_dir = data_dir
      tok = tokenizer.load_or_train_tokenizer(c, os.path.join(tmp, "work-" + corpus))
      r = bdata.throughput(c, tok, mode, int(budget), args.data_seconds)
      out["entries"].append({"corpus": corpus, "mode": mode, "tokens_per_batch": int(budget), **r})
  return out


def machine() -> dict:
  from experiments import bench_decode as bd  # pylint: disable=g-import-not-at-top
  return bd.machine()


def run(args) -> dict:
  parts = [p for p in args.only.split(",") if p] if args.only else list(PARTS)
  for p in parts:
    if p not in PARTS:
      raise ValueError(f"--only: unknown part {p!r}; use {','.join(PARTS)}")
  load_before = os.getloadavg()
  result = {"schema_version": SCHEMA_VERSION,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m transformer_jax.bench " + " ".join(args.argv),
            "machine": machine(), "parts": parts, "load_before": list(load_before),
            "train": None, "decode": None, "data": None, "peak": None}
  if "train" in parts:
    entries = [e.partition(":")[::2] for e in args.train.split(",") if e]
    dtype = np.dtype(ModelConfig.from_config(train_config(entries[0][0])[0].model).dtype)
    t = time.perf_counter()
    peak = metrics.measure_peak_flops(dtype, n=args.peak_n)
    result["peak"] = {"dtype": str(dtype), "n": args.peak_n, "flops_per_s": peak,
                      "measure_s": time.perf_counter() - t}
    print(f"peak ({dtype} {args.peak_n}^2 jnp.dot): {peak / 1e9:.1f} GFLOP/s", flush=True)
    result["train"] = []
    for name, shape in entries:
      print(f"train {name} {shape} ...", flush=True)
      e = bench_train_entry(name, shape, args.steps, args.warmup, args.override or [], peak,
                            args.profile)
      print(f"  {e['step_s']['median']:.3f} s/step, {e['target_tokens_per_s']:.0f} target tok/s, "
            f"{e['model_flops_per_s'] / 1e9:.1f} GFLOP/s, MFU {e['mfu']:.1%}, compile "
            f"{e['compile_s']:.1f} s", flush=True)
      result["train"].append(e)
  if "decode" in parts:
    print("decode ...", flush=True)
    result["decode"] = bench_decode(args)
  if "data" in parts:
    print("data ...", flush=True)
    result["data"] = bench_data(args)
  result["load_after"] = list(os.getloadavg())
  result["idle"] = max(load_before[0], result["load_after"][0]) < 0.5
  return result


def markdown(r: dict) -> str:
  m = r["machine"]
  lines = ["# Benchmark: train step, decoding, input pipeline", "",
           f"Date: {r['date']}  ", f"Command: `{r['command']}`  ",
           f"Machine: {m['cpu']}, {m['cores']} cores, jax {m['jax']} on {m['backend']}; load "
           f"average {r['load_before'][0]:.2f} before, {r['load_after'][0]:.2f} after", ""]
  if not r["idle"]:
    lines += ["**Not idle: the machine was shared with other jobs during this run, so the "
              "times below are not representative (re-run when `uptime` shows a load < 0.5).**", ""]
  if r["train"]:
    p = r["peak"]
    lines += ["## Train step", "",
              f"Peak (same run): {p['flops_per_s'] / 1e9:.1f} GFLOP/s, jitted {p['dtype']} "
              f"{p['n']}x{p['n']} jnp.dot, best of 5. Model FLOPs = `metrics.train_flops` "
              "(3 x forward matmul FLOPs, attention over padded lengths included). Tokens = "
              "non-pad target tokens.", "",
              "| config | batch | dropout rng | compile s | step s (median; min) | target tok/s | "
              "model GFLOP/s | MFU | XLA/model FLOPs | step buffers (args+out+temp) | peak RSS | "
              "vs flax WMT |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in r["train"]:
      mem = e["memory"]
      buffers = sum(mem.get(k, 0) for k in ("argument_bytes", "output_bytes", "temp_bytes"))
      buffers -= mem.get("alias_bytes", 0)
      xla = (f"{e['xla_flops_per_step'] / e['model_flops_per_step']:.2f}"
             if e.get("xla_flops_per_step") else "n/a")
      vs = (f"{e['speedup_vs_flax_wmt']:.2f}x ({e['flax_wmt_reference']['target_tokens_per_s']:.0f})"
            if "speedup_vs_flax_wmt" in e else "")
      lines.append(
          f"| {e['name']} ({e['config']}) | {e['batch']['shape']}{' packed' if e['batch']['packed'] else ''} "
          f"| {e['dropout_rng_impl']} | {e['compile_s']:.1f} | {e['step_s']['median']:.3f}; "
          f"{e['step_s']['min']:.3f} | {e['target_tokens_per_s']:.0f} | "
          f"{e['model_flops_per_s'] / 1e9:.1f} | {e['mfu']:.1%} | {xla} | {buffers / 2**30:.2f} GiB | "
          f"{mem['process_peak_rss_bytes'] / 2**30:.2f} GiB | {vs} |")
    for e in r["train"]:
      h = e.get("hlo", {})
      if h:
        lines.append(f"- {e['name']} {e['batch']['shape']}: compiled step has {h['library_dot_fusions']} "
                     f"YNNPACK dot fusions, {h['eigen_dots']} Eigen dots, {h['transposing_fusions']} "
                     f"transposing loop fusions writing {h['transposed_bytes'] / 2**20:.0f} MiB, "
                     f"{h['while_loops']} while loops, {h['copies']} copies "
                     f"({h['copied_bytes'] / 2**20:.0f} MiB)")
    lines += ["", f"Goal (issue #9): base >= {GOAL_SPEEDUP}x the flax WMT example's target tokens/s "
              "(8x128: 185, 32x128: 174 tokens/s measured here), i.e. MFU >= 65%. Peak RSS is the "
              "process's high-water mark after each entry (entries run in the order shown).", ""]
  profiled = [e for e in (r["train"] or []) if e.get("profile")]
  if profiled:
    lines += ["## Where the train step's time goes", "",
              "One profiled step per entry (jax.profiler): the executor's busy time split over the "
              "compiled step's operations by their source (op_name metadata); operations running "
              "at the same time share each instant. Share of the step (forward; backward).", ""]
    names = [f"{e['name']} {e['batch']['shape']}" for e in profiled]
    lines += ["| category | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    cats = []
    for e in profiled:
      cats += [c for c in e["profile"]["categories"] if c not in cats]
    for c in cats:
      cells = []
      for e in profiled:
        v = e["profile"]["categories"].get(c)
        cells.append(f"{v['share']:.1%} ({v['forward']:.1%}; {v['backward']:.1%})" if v else "")
      lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines.append("| busy seconds per step | " + " | ".join(
        f"{e['profile']['busy_s_per_step']:.2f}" for e in profiled) + " |")
    lines.append("")
  if r["decode"]:
    d = r["decode"]
    t = d["throughput"]
    lines += ["## Decoding (beam search)", "",
              f"{d['config']}, random weights, beam {d['beam_size']}, alpha {d['alpha']}, output "
              f"limit source + {d['max_extra_len']}; {d['data']}; batches of {d['batch_size']}.", "",
              "| sentences/s | output tokens/s | s per decoder step | compile s |", "|---|---|---|---|",
              f"| {t['sentences_per_second']:.2f} | {t['output_tokens_per_second']:.1f} | "
              f"{t['seconds_per_step']:.3f} | {t['compile_seconds']:.1f} |", "",
              f"Per-token decode time ({d['step_vs_position']['rows']} rows = batch x beam, cache "
              f"buffer {d['step_vs_position']['buffer']}, median of {d['step_vs_position']['repeats']}):",
              "", "| position | model step | + log-softmax, top-2k, cache reorder |", "|---|---|---|"]
    for p, s in d["per_token_s"].items():
      lines.append(f"| {p} | {s * 1e3:.1f} ms | {d['per_token_with_search_s'][p] * 1e3:.1f} ms |")
    lines.append("")
  if r["data"]:
    lines += ["## Input pipeline", "", "| corpus | mode @ tokens/batch | batches/s | "
              "real target tok/s |", "|---|---|---|---|"]
    for e in r["data"]["entries"]:
      if "skipped" in e:
        lines.append(f"| {e['corpus']} | skipped: {e['skipped']} | | |")
      else:
        lines.append(f"| {e['corpus']} | {e['mode']}@{e['tokens_per_batch']} | "
                     f"{e['batches_per_s']} | {e['real_target_tokens_per_s']:,} |")
    lines.append("")
  return "\n".join(lines)


def parse_args(argv: Sequence[str] | None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--only", default="", help=f"comma list of parts: {','.join(PARTS)}")
  parser.add_argument("--train", default=DEFAULT_TRAIN,
                      help="comma list of CONFIG:ROWSxLENGTH (CONFIG: base, big, multi30k, tiny)")
  parser.add_argument("--steps", type=int, default=5, help="timed train steps per entry")
  parser.add_argument("--warmup", type=int, default=1, help="untimed steps after compiling")
  parser.add_argument("--override", action="append", default=None,
                      help="config override for the train entries, e.g. train.dropout_rng_impl=rbg")
  parser.add_argument("--profile", action="store_true",
                      help="profile one more train step per entry and split its time by category")
  parser.add_argument("--peak_n", type=int, default=2048, help="size of the peak-FLOP/s jnp.dot")
  parser.add_argument("--decode_config", default="base")
  parser.add_argument("--decode_data", choices=["newstest", "random"], default="newstest")
  parser.add_argument("--decode_tokenizer", choices=["spm", "chars"], default="spm")
  parser.add_argument("--decode_sentences", type=int, default=32)
  parser.add_argument("--decode_batch", type=int, default=32)
  parser.add_argument("--decode_positions", default="20,200")
  parser.add_argument("--decode_repeats", type=int, default=5)
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--data", default=DEFAULT_DATA, help="comma list of CORPUS:MODE@TOKENS")
  parser.add_argument("--data_seconds", type=float, default=3.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default="experiments/results/bench",
                      help="writes OUT.json and OUT.md ('' to write nothing)")
  args = parser.parse_args(argv)
  args.argv = list(sys.argv[1:] if argv is None else argv)
  return args


def main(argv: Sequence[str] | None = None) -> dict:
  args = parse_args(argv)
  result = run(args)
  text = markdown(result)
  if args.out:
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
      json.dump(result, f, indent=2)
    with open(args.out + ".md", "w") as f:
      f.write(text + "\n")
  print(text)
  return result


if __name__ == "__main__":
  main()
