"""The machine a benchmark ran on, whether it was idle, and the Markdown report of `python -m
benchmarks` (the side-by-side writes its own tables under the same header)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import time

from experiments import results_files
from transformer_jax.markdown import table


def machine() -> dict:
  """results_files.machine() (CPU model, cores, platform) plus python, jax, the backend and the
  devices of this process."""
  import jax  # pylint: disable=g-import-not-at-top
  return dict(results_files.machine(), python=platform.python_version(), jax=jax.__version__,
              backend=jax.default_backend(), devices=[str(d) for d in jax.devices()])


def others_busy(seconds: float = 2.0) -> float | None:
  """Share of all CPUs busy over `seconds` while this process sleeps, i.e. used by other
  processes (Linux /proc/stat; None elsewhere). Unlike the load average it does not lag: a job
  that just ended does not count."""
  def sample():
    with open("/proc/stat") as f:
      v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]  # total, idle + iowait
  try:
    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
  except (OSError, ValueError, IndexError):
    return None
  return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def machine_load() -> dict:
  """The load average and the CPU share of other processes (others_busy), now."""
  return {"load": list(os.getloadavg()), "others_busy": others_busy()}


def start(command: str) -> dict:
  """The head of a result: date, command, machine, and the load just before the run."""
  before = machine_load()
  return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "command": command, "machine": machine(), "load_before": before["load"],
          "others_busy_before": before["others_busy"]}


def finish(result: dict) -> dict:
  """Adds the load just after the run and `idle`: other processes used < 10% of the CPUs just
  before and just after (the load average < 0.5 where /proc/stat is not available)."""
  after = machine_load()
  result.update(load_after=after["load"], others_busy_after=after["others_busy"])
  busy = (result["others_busy_before"], after["others_busy"])
  if None in busy:
    result["idle"] = max(result["load_before"][0], after["load"][0]) < 0.5
  else:
    result["idle"] = max(busy) < 0.10
  return result


def _share(x) -> str:
  return "n/a" if x is None else f"{x:.0%}"


def header(title: str, r: dict) -> list[str]:
  """Title, date, command, machine and its load, and a warning when it was not idle."""
  m = r["machine"]
  lines = [f"# {title}", "", f"Date: {r['date']}  ", f"Command: `{r['command']}`  ",
           f"Machine: {m['cpu']}, {m['cores']} cores, jax {m['jax']} on {m['backend']}; load "
           f"average {r['load_before'][0]:.2f} before, {r['load_after'][0]:.2f} after; "
           f"{_share(r['others_busy_before'])} before and {_share(r['others_busy_after'])} after "
           "of the CPUs used by other processes", ""]
  if not r["idle"]:
    lines += ["**Not idle: the machine was shared with other jobs during this run, so the "
              "times below are not representative (re-run when no other job runs).**", ""]
  return lines


def write(result: dict, text: str, out: str) -> None:
  """OUT.json and OUT.md (nothing when `out` is '')."""
  if out:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".json", "w") as f:
      json.dump(result, f, indent=2)
    with open(out + ".md", "w") as f:
      f.write(text)


def _train(r: dict) -> list[str]:
  from benchmarks.train_step import step_bytes  # pylint: disable=g-import-not-at-top
  p = r["peak"]
  rows, notes = [], []
  for e in r["train"]:
    mem = e["memory"]
    buffers = step_bytes(mem)
    xla = e["xla_flops_per_step"] / e["model_flops_per_step"] if e["xla_flops_per_step"] else "n/a"
    rows.append([f"{e['name']} ({e['config']})",
                 e["batch"]["shape"] + (" packed" if e["batch"]["packed"] else ""),
                 e["dropout_rng_impl"], f"{e['compile_s']:.1f}",
                 f"{e['step_s']['median']:.3f}; {e['step_s']['min']:.3f}",
                 round(e["target_tokens_per_s"]), f"{e['model_flops_per_s'] / 1e9:.1f}",
                 f"{e['mfu']:.1%}", xla, f"{buffers / 2**30:.2f} GiB",
                 f"{mem['process_peak_rss_bytes'] / 2**30:.2f} GiB"])
    h = e["hlo"]
    notes.append(f"- {e['name']} {e['batch']['shape']}: compiled step has "
                 f"{h['library_dot_fusions']} YNNPACK dot fusions, {h['eigen_dots']} Eigen dots, "
                 f"{h['transposing_fusions']} transposing loop fusions writing "
                 f"{h['transposed_bytes'] / 2**20:.0f} MiB, {h['while_loops']} while loops, "
                 f"{h['copies']} copies ({h['copied_bytes'] / 2**20:.0f} MiB); "
                 + "; ".join(e.get("attention") or ["attention: not recorded"]))
  overrides = {k: v for e in r["train"] for k, v in e["overrides"].items()}
  lines = ["## Train step", "",
           f"Peak (same run): {p['flops_per_s'] / 1e9:.1f} GFLOP/s, jitted {p['dtype']} "
           f"{p['n']}x{p['n']} jnp.dot, best of 5. Model FLOPs = `metrics.train_flops` (3 x "
           "forward matmul FLOPs, attention over padded lengths included). Tokens = non-pad "
           "target tokens. Peak RSS is the process's high-water mark after each entry (entries "
           "run in the order shown)."
           + (f" Overrides: `{', '.join(f'{k}={v}' for k, v in overrides.items())}`."
              if overrides else ""), "",
           table(["config", "batch", "dropout rng", "compile s", "step s (median; min)",
                  "target tok/s", "model GFLOP/s", "MFU", "XLA/model FLOPs",
                  "step buffers (args+out+temp)", "peak RSS"], rows), *notes, "",
           "The flax WMT example's step on the same machine: `python -m benchmarks.flax_wmt` "
           "(its results: experiments/results/bench_flax_wmt_*.md).", ""]
  profiled = [e for e in r["train"] if e.get("profile")]
  if profiled:
    cats = list(dict.fromkeys(c for e in profiled for c in e["profile"]["categories"]))
    def share(e, c):
      v = e["profile"]["categories"].get(c)
      return f"{v['share']:.1%} ({v['forward']:.1%}; {v['backward']:.1%})" if v else ""
    rows = [[c, *(share(e, c) for e in profiled)] for c in cats]
    rows.append(["busy seconds per step", *(e["profile"]["busy_s_per_step"] for e in profiled)])
    lines += ["## Where the train step's time goes", "",
              "Profiled steps per entry (jax.profiler): the executor's busy time split over the "
              "compiled step's operations by their source (op_name metadata); operations running "
              "at the same time share each instant. Share of the step (forward; backward).", "",
              table(["category", *(f"{e['name']} {e['batch']['shape']}" for e in profiled)], rows)]
  return lines


def _decode(d: dict) -> list[str]:
  t, s = d["throughput"], d["step_vs_position"]
  positions = [p for p in s["model_step"] if p.isdigit()]
  def ms(step, p):
    return f"{s[step][p]['median_s'] * 1e3:.1f} ms"
  first, last = positions[0], positions[-1]
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
              f"{b['seconds_per_step']:.3f}"] for b in t["per_batch"]]),
      f"One decoder step vs the cache position ({s['rows']} rows = batch x beam, source width "
      f"{s['source_width']}, cache buffer {s['buffer']}, median of {s['repeats']}):", "",
      table(["step", *(f"position {p}" for p in positions),
             f"ratio {last}/{first} (median; min)"],
            [[name, *(ms(step, p) for p in positions),
              f"{s[step]['ratio_median']:.2f}; {s[step]['ratio_min']:.2f}"]
             for step, name in (("model_step", "model decode step"),
                                ("search_step", "+ log-softmax, top-2k, cache reorder"))])]


def _data(d: dict) -> list[str]:
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


def markdown(r: dict) -> str:
  """The report of `python -m benchmarks`, from its JSON result."""
  lines = header("Benchmark: train step, decoding, input pipeline", r)
  if r["train"]:
    lines += _train(r)
  if r["decode"]:
    lines += _decode(r["decode"])
  if r["data"]:
    lines += _data(r["data"])
  return "\n".join(lines).rstrip("\n") + "\n"
