"""The input-pipeline benchmark: real-token share of training batches and the train iterator's rate.

Per corpus, prepared from scratch in a temporary folder (so the one-time costs are measured too):
TFDS prepare, vocabulary training, tokenization (cold, then from the token cache). Per entry
CORPUS:MODE@TOKENS (MODE: bucket, pack, or pack-balanced: pack rows whose source length is sized
to the corpus' mean source/target length ratio):
- real share: non-pad tokens / all tokens of the batches as fed to the model (padding and empty
  rows included), over one epoch of the train iterator;
- throughput: batches/s, padded tokens/s and real target tokens/s of the train iterator over
  `seconds`, with this process pinned to one CPU core.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Sequence

from transformer_jax.data import batching, pipeline, sources, token_cache, tokenizer
from transformer_jax.runtime.config import DATA_DIR_ENV, default_config
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.markdown import table
from transformer_jax.runtime.special_ids import PAD_ID

CORPORA = {
    # name: (local_corpus, files (train, dev, test), eval_data_dir, vocab, max_len)
    "multi30k": ("multi30k", ("train", "val", "test_2016_flickr"), "", 8000, 100),
    "wmt-news": ("wmt-news", ("train", "newstest2013", "newstest2014"), "wmt14", 16000, 256),
}
MODES = ("bucket", "pack", "pack-balanced")


def data_dir() -> str:
  """The data folder, as training reads it (TRANSFORMER_JAX_DATA_DIR, else the default)."""
  return default_config().data.data_dir


def corpus_config(name: str, tmp: str):
  """The run config reading corpus `name` from the data folder, prepared under `tmp`."""
  corpus, (train, dev, test), eval_dir, vocab, max_len = CORPORA[name]
  c = default_config()
  d = c.data
  d.dataset, d.local_corpus, d.eval_data_dir = "local", corpus, eval_dir
  d.train_files, d.eval_files, d.test_files = train, dev, test
  d.html_unescape = True
  d.tfds_data_dir = os.path.join(tmp, "tfds")
  d.max_source_len = d.max_target_len = max_len
  c.model.vocab_size = vocab
  c.model.max_len = max(256, max_len)
  return c


def parse_entry(text: str) -> tuple[str, str, int]:
  """'multi30k:pack@4096' -> ('multi30k', 'pack', 4096)."""
  corpus, _, rest = text.partition(":")
  mode, _, budget = rest.partition("@")
  if corpus not in CORPORA or mode not in MODES or not budget.isdigit() or int(budget) < 1:
    raise ConfigError(f"--data entry {text!r}: expected CORPUS:MODE@TOKENS with CORPUS one of "
                      f"{', '.join(CORPORA)} and MODE one of {', '.join(MODES)}")
  return corpus, mode, int(budget)


@contextlib.contextmanager
def _one_core():
  """This thread (and the threads it starts) on its first allowed CPU core, for the block."""
  if not hasattr(os, "sched_setaffinity"):
    yield "all cores (not pinned)"
    return
  cores = os.sched_getaffinity(0)
  os.sched_setaffinity(0, {min(cores)})
  try:
    yield "one core"
  finally:
    os.sched_setaffinity(0, cores)


def _timed(fn):
  start = time.perf_counter()
  out = fn()
  return out, round(time.perf_counter() - start, 2)


def prepare(name: str, tmp: str) -> tuple[object, object, dict]:
  """(config, tokenizer, record of one-time costs and corpus statistics) of corpus `name`."""
  c = corpus_config(name, tmp)
  r = {"vocab_size": c.model.vocab_size, "max_len": c.data.max_source_len}
  _, r["tfds_prepare_s"] = _timed(lambda: [sources.split_source(c, s) for s in sources.SPLITS])
  tok, r["vocab_train_s"] = _timed(
      lambda: tokenizer.load_or_train_tokenizer(c, os.path.join(tmp, "work-" + name)))
  tokd, r["tokenize_cold_s"] = _timed(lambda: token_cache.tokenized_split(c, tok, "train"))
  _, r["token_cache_load_s"] = _timed(lambda: token_cache.tokenized_split(c, tok, "train"))
  keep = batching.select_for_training(tokd, c.data.max_source_len, c.data.max_target_len)
  r["pairs"], r["pairs_kept"] = len(tokd), int(len(keep))
  r["mean_source_len"] = round(float(tokd.source_lengths[keep].mean()), 2)
  r["mean_target_len"] = round(float(tokd.target_lengths[keep].mean()), 2)
  r["balanced_source_len"] = batching.round_up(
      int(c.data.max_target_len * r["mean_source_len"] / r["mean_target_len"]))
  return c, tok, r


def _variant(config, mode: str, budget: int, balanced_source_len: int):
  c = config.copy_and_resolve_references()
  c.data.batch_mode, c.data.tokens_per_batch = mode.partition("-")[0], budget
  if mode == "pack-balanced":
    c.data.max_source_len = balanced_source_len
  return c


def epoch_share(config, tok, budget: int) -> dict:
  """Real-token shares, batch count and distinct shapes over one epoch of the train iterator."""
  it = pipeline.make_train_iterator(config, tok)
  n = len(it.planner.epoch_batches(0)[0])
  real, total = {"inputs": 0, "targets": 0}, {"inputs": 0, "targets": 0}
  shapes, over = set(), 0
  for _ in range(n):
    batch = next(it)
    shapes.add((batch["inputs"].shape, batch["targets"].shape))
    for k in real:
      real[k] += int((batch[k] != PAD_ID).sum())
      total[k] += batch[k].size
      over += batch[k].size > budget
  return {"batches_per_epoch": n, "distinct_shapes": len(shapes), "over_budget_batches": over,
          "source_real_share": round(real["inputs"] / total["inputs"], 4),
          "target_real_share": round(real["targets"] / total["targets"], 4),
          "real_share": round(sum(real.values()) / sum(total.values()), 4),
          "mean_source_tokens_per_batch": round(total["inputs"] / n, 1),
          "mean_target_tokens_per_batch": round(total["targets"] / n, 1),
          "pairs_in_plan": len(it.planner.example_ids)}


def throughput(config, tok, seconds: float) -> dict:
  """Batches/s, padded tokens/s and real target tokens/s of the train iterator over `seconds`."""
  it = pipeline.make_train_iterator(config, tok)
  next(it)
  padded = real_target = batches = 0
  start = time.perf_counter()
  while time.perf_counter() - start < seconds:
    batch = next(it)
    padded += batch["inputs"].size + batch["targets"].size
    real_target += int((batch["targets"] != PAD_ID).sum())
    batches += 1
  dt = time.perf_counter() - start
  return {"batches_per_s": round(batches / dt, 1), "padded_tokens_per_s": round(padded / dt),
          "real_target_tokens_per_s": round(real_target / dt)}


def measure(entries: Sequence[str], seconds: float, tmp: str) -> dict:
  """Each corpus of `entries` prepared once under `tmp`, then each of its entries measured."""
  parsed = [parse_entry(e) for e in entries]
  out = {"seconds": seconds, "corpora": {}}
  with _one_core() as cores:
    out["cores"] = cores
    for corpus in dict.fromkeys(name for name, _, _ in parsed):
      if not os.path.isdir(os.path.join(data_dir(), CORPORA[corpus][0])):
        out["corpora"][corpus] = {"skipped": f"no {corpus} under {data_dir()}: set {DATA_DIR_ENV}"}
        continue
      c, tok, record = prepare(corpus, tmp)
      record["entries"] = []
      for mode, budget in [(m, b) for name, m, b in parsed if name == corpus]:
        variant = _variant(c, mode, budget, record["balanced_source_len"])
        key = f"{variant.data.batch_mode}@{budget}" + (
            f" (rows {variant.data.max_source_len}+{variant.data.max_target_len})"
            if mode == "pack-balanced" else "")
        entry = {"key": key, "mode": mode, "tokens_per_batch": budget,
                 **epoch_share(variant, tok, budget), **throughput(variant, tok, seconds)}
        print(f"  {corpus} {key}: real share {entry['real_share']:.1%}, "
              f"{entry['real_target_tokens_per_s']:,} real target tok/s", flush=True)
        record["entries"].append(entry)
      out["corpora"][corpus] = record
  return out


def markdown(d: dict) -> list[str]:
  """The report section of `measure`'s result."""
  lines = ["## Input pipeline", "",
           "Real share = non-pad tokens / all tokens of the batches (padding and empty rows "
           "included), over one epoch of the train iterator. Throughput: the train iterator for "
           f"{d['seconds']} s on {d['cores']} (padded source+target tokens/s; real target "
           "tokens/s). One-time costs are measured from scratch in a temporary folder.", ""]
  for name, c in d["corpora"].items():
    if "skipped" in c:
      lines += [f"### {name}", "", f"Skipped: {c['skipped']}", ""]
      continue
    lines += [f"### {name}", "",
              f"{c['pairs_kept']} of {c['pairs']} pairs kept (max length {c['max_len']} tokens), "
              f"vocabulary {c['vocab_size']} BPE, mean length {c['mean_source_len']} source / "
              f"{c['mean_target_len']} target tokens (incl. EOS). One-time costs: TFDS prepare "
              f"{c['tfds_prepare_s']} s, vocabulary {c['vocab_train_s']} s, tokenize "
              f"{c['tokenize_cold_s']} s (cached afterwards: {c['token_cache_load_s']} s).", "",
              table(["mode @ tokens/batch", "real share", "source", "target", "batches/epoch",
                     "shapes", "padded tok/s", "real target tok/s"],
                    [[e["key"], f"{e['real_share']:.1%}", f"{e['source_real_share']:.1%}",
                      f"{e['target_real_share']:.1%}", e["batches_per_epoch"],
                      e["distinct_shapes"], f"{e['padded_tokens_per_s']:,}",
                      f"{e['real_target_tokens_per_s']:,}"] for e in c["entries"]])]
  return lines
