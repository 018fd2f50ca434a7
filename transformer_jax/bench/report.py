"""The benchmark's Markdown report, from its JSON result."""

from __future__ import annotations

from transformer_jax.bench.train_step import GOAL_SPEEDUP


def _busy(share) -> str:
  return "n/a" if share is None else f"{share:.0%}"


def header(title: str, r: dict) -> list[str]:
  """Title, date, command, machine and its load (runner.idle_record), and a warning when it was
  not idle."""
  m = r["machine"]
  lines = [f"# {title}", "", f"Date: {r['date']}  ", f"Command: `{r['command']}`  ",
           f"Machine: {m['cpu']}, {m['cores']} cores, jax {m['jax']} on {m['backend']}; load "
           f"average {r['load_before'][0]:.2f} before, {r['load_after'][0]:.2f} after; "
           f"{_busy(r.get('others_busy_before'))} before and {_busy(r.get('others_busy_after'))} "
           "after of the CPUs used by other processes", ""]
  if not r["idle"]:
    lines += ["**Not idle: the machine was shared with other jobs during this run, so the "
              "times below are not representative (re-run when no other job runs).**", ""]
  return lines


def markdown(r: dict) -> str:
  lines = header("Benchmark: train step, decoding, input pipeline", r)
  if r["train"]:
    p = r["peak"]
    lines += ["## Train step", "",
              f"Peak (same run): {p['flops_per_s'] / 1e9:.1f} GFLOP/s, jitted {p['dtype']} "
              f"{p['n']}x{p['n']} jnp.dot, best of 5. Model FLOPs = `metrics.train_flops` "
              "(3 x forward matmul FLOPs, attention over padded lengths included). Tokens = "
              "non-pad target tokens.", "",
              "| config | batch | dropout rng | compile s | step s (median; min) | target tok/s | "
              "model GFLOP/s | MFU | XLA/model FLOPs | step buffers (args+out+temp) | peak RSS | "
              "vs issue #9's flax WMT figure |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
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
              "at equal configuration, i.e. MFU >= 65%. The last column divides by the figures "
              "issue #9 reports for the flax example (8x128: 185, 32x128: 174 tokens/s); run side "
              "by side on the same machine today the example is faster than that: "
              "`python -m experiments.bench_flax_wmt` (experiments/results/bench_flax_wmt.md). "
              "Peak RSS is the process's high-water mark after each entry (entries run in the "
              "order shown).", ""]
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
