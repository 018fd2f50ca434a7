"""Plots of the paper's ingredients, computed from the code itself.

Run (from the repository root; a few seconds, no data, no training):
  python -m experiments.plots --out=experiments/results/paper_plots

Writes:
- positional_encoding.png: the sinusoidal table of `positional.sinusoidal_table` (positions x
  dimensions, d_model 512), a few of its dimensions as curves, and PE(p)·PE(q), which depends on
  p - q only (§3.5: relative positions are easy to attend to);
- lr_schedule.png: `schedule.make_schedule` of configs/base.py and configs/big.py (warmup 4000,
  inverse square root afterwards, §5.3), with configs/multi30k.py for comparison;
- flops_per_layer.png: forward FLOPs of one layer on a sequence of n tokens at d = 512 (Table 1):
  the self-attention sub-layer as `metrics.forward_flops` counts it (projections 8·n·d² +
  QKᵀ and AV 4·n²·d), its attention matmuls alone (the O(n²·d) of Table 1), a recurrent layer
  (O(n·d²)) and a convolution (O(k·n·d²));
- README.md: the numbers read off these plots (peak learning rates, crossover lengths).

And the plots of experiment reports: a sweep's rows against the paper's (`sweep_vs_paper`) and
its rows' dev-perplexity curves (`dev_ppl_curves`), for experiments/report.py; a training run's
dev BLEU and perplexity against wall time (`run_curves`, for experiments/report_run.py).
"""

from __future__ import annotations

import os
import sys

import jax.numpy as jnp
from absl import flags
import numpy as np

from configs import base, big, multi30k
from transformer_jax import markdown, metrics
from transformer_jax.config import ModelConfig
from transformer_jax.positional import sinusoidal_table
from transformer_jax.schedule import make_schedule


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


# --- positional encoding ------------------------------------------------------------------------

def plot_positional_encoding(path: str, max_len: int = 256, d_model: int = 512) -> dict:
  plt = pyplot()
  pe = sinusoidal_table(max_len, d_model)
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), layout="constrained",
                           gridspec_kw={"width_ratios": [1.4, 1.0, 1.0]})
  im = axes[0].imshow(pe, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
  axes[0].set(xlabel="dimension i (even: sin, odd: cos)", ylabel="position",
              title=f"sinusoidal positional encoding, d_model={d_model}")
  fig.colorbar(im, ax=axes[0], shrink=0.8)
  for dim in (20, 120, 200, 201, 320):
    wavelength = 2 * np.pi * 10000 ** ((dim // 2 * 2) / d_model)
    axes[1].plot(pe[:, dim], label=f"dim {dim} (wavelength {wavelength:,.0f})", lw=1)
  axes[1].set(xlabel="position", ylabel="PE", title="a few dimensions: geometric wavelengths "
              "2π ... 10000·2π")
  axes[1].legend(fontsize=7, loc="lower left")
  gram = pe.astype(np.float64) @ pe.astype(np.float64).T
  im = axes[2].imshow(gram, cmap="viridis", aspect="auto", interpolation="nearest")
  axes[2].set(xlabel="position q", ylabel="position p",
              title="PE(p)·PE(q): a function of p − q only")
  fig.colorbar(im, ax=axes[2], shrink=0.8)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  # the dot product depends on the offset only: every diagonal is constant
  spread = max(float(np.ptp(np.diagonal(gram, k))) for k in range(0, max_len // 2))
  return {"max_len": max_len, "d_model": d_model, "max_spread_along_diagonals": spread}


# --- learning-rate schedule ---------------------------------------------------------------------

def _rates(config, steps: int) -> np.ndarray:
  return np.asarray(make_schedule(config)(jnp.arange(steps)))  # optax count 0 = paper step 1


def plot_lr_schedule(path: str) -> dict:
  plt = pyplot()
  # (name, config, steps drawn, colour): multi30k stops on wall time after ~1500 steps
  runs = [("base", base.get_config(), base.get_config().train.num_steps, "C0"),
          ("big", big.get_config(), big.get_config().train.num_steps, "C3"),
          ("multi30k (CPU config)", multi30k.get_config(), 3000, "C2")]
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), layout="constrained")
  info = {}
  for name, c, steps, color in runs:
    rates = _rates(c, steps)
    x = np.arange(1, steps + 1)
    style = "--" if name.startswith("multi30k") else "-"
    label = (f"{name}: d_model {c.model.d_model}, warmup {c.train.warmup_steps}, "
             f"scale {c.train.learning_rate_scale}")
    axes[0].plot(x, rates, style, color=color, label=label)
    zoom = min(steps, 20_000)
    axes[1].plot(x[:zoom], rates[:zoom], style, color=color, label=name)
    peak = int(np.argmax(rates))
    info[name] = {"d_model": c.model.d_model, "warmup_steps": c.train.warmup_steps,
                  "scale": c.train.learning_rate_scale, "steps": steps,
                  "peak_step": peak + 1, "peak_rate": float(rates[peak]), "final_rate": float(rates[-1])}
    axes[1].annotate(f"peak {rates[peak]:.2e}\n@ step {peak + 1}", (peak + 1, rates[peak]),
                     textcoords="offset points", xytext=(8, -2), fontsize=7, color=color)
  axes[0].set(xscale="log", xlabel="training step (log)", ylabel="learning rate",
              title="lrate = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)")
  axes[0].legend(fontsize=7)
  axes[1].set(xlabel="training step", ylabel="learning rate", title="first 20k steps")
  axes[1].axvline(4000, color="gray", lw=0.8, ls=":")
  axes[1].legend(fontsize=7)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return info


# --- FLOPs per layer (Table 1) ------------------------------------------------------------------

def _cfg(d, heads, d_ff, enc_layers):
  return ModelConfig(vocab_size=1, d_model=d, num_heads=heads, d_k=d // heads, d_v=d // heads,
                     d_ff=d_ff, num_encoder_layers=enc_layers, num_decoder_layers=1, max_len=8)


def encoder_layer_flops(n: int, d: int = 512, heads: int = 8, d_ff: int = 2048) -> float:
  """One encoder layer's forward FLOPs on n tokens, by metrics.forward_flops (layer 2 - layer 1)."""
  return (metrics.forward_flops(_cfg(d, heads, d_ff, 2), 1, n, 1)
          - metrics.forward_flops(_cfg(d, heads, d_ff, 1), 1, n, 1))


def self_attention_sublayer_flops(n: int, d: int = 512, heads: int = 8) -> float:
  """The self-attention sub-layer alone: the layer's FLOPs are affine in d_ff, so the FFN is
  removed by extrapolating to d_ff = 0 (2·layer(d_ff) − layer(2·d_ff))."""
  return 2 * encoder_layer_flops(n, d, heads, 1024) - encoder_layer_flops(n, d, heads, 2048)


def attention_matmul_flops(n: int, d: int = 512, heads: int = 8) -> float:
  """QKᵀ and the weighted sum AV alone, as forward_flops counts them: 2·h·n²·(d_k + d_v)."""
  return 2.0 * heads * n * n * (d // heads + d // heads)


def recurrent_flops(n: int, d: int = 512, gates: int = 1) -> float:
  """h_t = f(W x_t + U h_{t-1}): two d x d matmuls per position and gate (LSTM: 4 gates)."""
  return 2.0 * 2 * d * d * n * gates


def convolution_flops(n: int, d: int = 512, k: int = 3) -> float:
  """A width-k convolution d -> d channels: k d x d matmuls per position."""
  return 2.0 * k * d * d * n


def _crossing(ns, a, b):
  """Smallest n where a(n) >= b(n), or None."""
  above = np.flatnonzero(np.asarray(a) >= np.asarray(b))
  return int(ns[above[0]]) if above.size else None


def plot_flops(path: str, d: int = 512, heads: int = 8) -> dict:
  plt = pyplot()
  ns = np.arange(1, 4097)
  sub = np.array([self_attention_sublayer_flops(int(n), d, heads) for n in ns])
  core = np.array([attention_matmul_flops(int(n), d, heads) for n in ns])
  # the model's accounting = projections 8·n·d² + attention 4·n²·d (checked, not assumed)
  np.testing.assert_allclose(sub - core, 8.0 * ns * d * d, rtol=1e-12)
  np.testing.assert_allclose(core, 4.0 * ns.astype(float) ** 2 * d, rtol=1e-12)
  rnn, lstm, conv = recurrent_flops(ns, d), recurrent_flops(ns, d, 4), convolution_flops(ns, d)
  curves = [
      ("self-attention sub-layer (metrics.forward_flops: 8nd² + 4n²d)", sub, "C0", "-"),
      ("  its QKᵀ and AV matmuls alone (4n²d): Table 1's O(n²·d)", core, "C0", ":"),
      ("recurrent layer, tanh RNN (4nd²): O(n·d²)", rnn, "C3", "-"),
      ("recurrent layer, LSTM (16nd²)", lstm, "C3", "--"),
      ("convolution, k=3 (6nd²): O(k·n·d²)", conv, "C2", "-"),
  ]
  fig, axes = plt.subplots(1, 2, figsize=(14, 5), layout="constrained")
  for label, y, color, style in curves:
    axes[0].plot(ns, y, style, color=color, label=label)
    axes[1].plot(ns, y / ns, style, color=color, label=label)
  for ax in axes:
    ax.axvline(d, color="gray", lw=0.8, ls=":")
    ax.axvspan(15, 34, color="gold", alpha=0.25, lw=0)
  axes[0].text(d * 1.05, 1e6 * 2, "n = d = 512", fontsize=8, color="gray")
  axes[0].text(15.5, 1e6 * 2, "mean sentence\nlength (BPE)\nMulti30k 15,\nWMT news 31-34",
               fontsize=7)
  axes[0].set(xscale="log", yscale="log", xlabel="sequence length n (tokens)",
              ylabel="forward FLOPs of one layer", title=f"FLOPs per layer, d = {d}, h = {heads}")
  axes[0].legend(fontsize=7, loc="upper left")
  axes[1].set(xscale="log", yscale="log", xlabel="sequence length n (tokens)",
              ylabel="forward FLOPs per token", title="per token: self-attention grows with n, "
              "recurrence and convolution do not")
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return {"d_model": d, "heads": heads,
          "attention_matmuls_exceed_rnn_at_n": _crossing(ns, core, rnn),
          "attention_sublayer_exceeds_lstm_at_n": _crossing(ns, sub, lstm),
          "attention_sublayer_exceeds_conv3_at_n": _crossing(ns, sub, conv),
          "attention_share_of_sublayer_at_n_32": attention_matmul_flops(32, d, heads)
                                                 / self_attention_sublayer_flops(32, d, heads),
          "attention_share_of_sublayer_at_n_512": attention_matmul_flops(512, d, heads)
                                                  / self_attention_sublayer_flops(512, d, heads)}


def write_readme(path: str, pe: dict, lr: dict, fl: dict) -> None:
  lines = ["# The paper's ingredients, plotted from the code", "",
           "Command: `python -m experiments.plots --out=experiments/results/paper_plots`", "",
           "## positional_encoding.png", "",
           f"`positional.sinusoidal_table({pe['max_len']}, {pe['d_model']})`. PE(p)·PE(q) is constant "
           f"along every diagonal (largest spread {pe['max_spread_along_diagonals']:.1e}): it depends "
           "on the offset p − q only.", "",
           "## lr_schedule.png", "",
           markdown.table(["config", "d_model", "warmup", "scale", "peak rate (step)",
                           "rate at last step"],
                          [[name, r["d_model"], r["warmup_steps"], r["scale"],
                            f"{r['peak_rate']:.2e} ({r['peak_step']})",
                            f"{r['final_rate']:.2e} (step {r['steps']:,})"] for name, r in lr.items()])]
  lines += ["## flops_per_layer.png", "",
            f"d = {fl['d_model']}, h = {fl['heads']}. The self-attention sub-layer is counted by "
            "`metrics.forward_flops` (the FLOPs the MFU numbers use), isolated by differencing "
            "(one encoder layer = forward_flops with 2 layers − with 1; FFN removed by "
            "extrapolating d_ff to 0); the script asserts that this equals 8·n·d² (Q, K, V, output "
            "projections) + 4·n²·d (QKᵀ and AV).", "",
            f"- QKᵀ and AV alone (Table 1's O(n²·d)) cost at least a tanh RNN's 4·n·d² from "
            f"n = {fl['attention_matmuls_exceed_rnn_at_n']} on (n = d): the paper's \"self-attention "
            "layers are faster than recurrent layers when n < d\".",
            f"- With its Q/K/V/output projections the whole sub-layer costs at least an LSTM layer "
            f"(16·n·d²) from n = {fl['attention_sublayer_exceeds_lstm_at_n']} on (n = 2d), "
            + ("more than a width-3 convolution (6·n·d²) at every n"
               if fl['attention_sublayer_exceeds_conv3_at_n'] == 1 else
               f"more than a width-3 convolution from n = {fl['attention_sublayer_exceeds_conv3_at_n']}")
            + ", and more than a plain RNN at every n: in FLOPs alone the projections (8·n·d², "
            "the analogue of the RNN's W·x_t) dominate short sentences; what self-attention buys "
            "is O(1) sequential operations and path length instead of O(n).",
            f"- At n = 32 (a WMT sentence) the attention matmuls are "
            f"{fl['attention_share_of_sublayer_at_n_32']:.0%} of the sub-layer; at n = 512, "
            f"{fl['attention_share_of_sublayer_at_n_512']:.0%}.", ""]
  with open(path, "w") as f:
    f.write("\n".join(lines))


# --- experiment reports ---------------------------------------------------------------------------

def sweep_vs_paper(rows: list[dict], path: str, title: str) -> bool:
  """A sweep's dev PPL and BLEU against the paper's (experiments/report.py's rows: ours as the
  mean over seeds with a min–max bar), base's values as cross-hairs, a row green for ✓, red for
  ✗, grey within the noise; False (nothing written) when no row has both values."""
  panels = (("PPL (dev)", "paper_ppl", "ppl", "ppl_verdict"),
            ("BLEU (dev, tokenized)", "paper_bleu", "bleu", "bleu_verdict"))
  if not any(r[p] is not None and r[o]["n"] for _, p, o, _ in panels for r in rows):
    return False
  plt = pyplot()
  base = next((r for r in rows if r["row"] == "base"), None)
  fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
  for ax, (name, pk, ok, vk) in zip(axes, panels):
    for r in rows:
      if r[pk] is None or not r[ok]["n"]:
        continue
      color = "black" if r is base else {"✓": "tab:green", "✗": "tab:red", "= ✓": "tab:green"}.get(
          r[vk], "tab:gray")
      mean = r[ok]["mean"]
      ax.errorbar(r[pk], mean, yerr=[[mean - r[ok]["min"]], [r[ok]["max"] - mean]], fmt="o",
                  color=color, ms=5, capsize=2, zorder=3)
      ax.annotate(r["row"], (r[pk], mean), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if base and base[pk] is not None and base[ok]["n"]:
      ax.axvline(base[pk], color="gray", lw=0.8, ls="--")
      ax.axhspan(base[ok]["min"], base[ok]["max"], color="gray", alpha=0.15, lw=0)
      ax.axhline(base[ok]["mean"], color="gray", lw=0.8, ls="--")
    ax.set(xlabel=f"paper {name}", ylabel=f"ours {name} (mean, min–max over seeds)")
    ax.set_title(f"{name}: green ✓, red ✗, grey = within the seed spread or pending", fontsize=9)
    ax.grid(alpha=0.3)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def dev_ppl_curves(curves: dict[str, list[list[list[float]]]], path: str, title: str,
                   xlabel: str = "training step",
                   ylabel: str = "dev perplexity (mean over seeds, log)") -> bool:
  """Every row's dev perplexity (or another y: `ylabel`) against the training step (or another x:
  `xlabel`), the mean over its seeds at the x values all of them evaluated (`curves`: label ->
  one [[x, y], ...] per seed), log scale; False (nothing written) when no row has a curve."""
  means = {}
  for label, per_seed in curves.items():
    per_seed = [dict((float(s), p) for s, p in c) for c in per_seed if c]
    steps = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
    if steps:
      means[label] = (steps, [float(np.mean([c[s] for c in per_seed])) for s in steps],
                      len(per_seed))
  if not means:
    return False
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(11, 6.5))
  cmap = plt.get_cmap("tab20")
  for i, (label, (steps, ppl, n)) in enumerate(means.items()):
    ax.plot(steps, ppl, "o-" if len(steps) < 30 else "-", ms=3, lw=2.2 if label == "base" else 1.2,
            color="black" if label == "base" else cmap(i % 20), label=f"{label} (n={n})")
  ax.set(yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=7, ncol=2, loc="upper right")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


def run_curves(curve: list[dict], train_rows: list[dict], dev_rows: list[dict], path: str,
               name: str) -> None:
  """A training run: dev BLEU of its checkpoints against wall time (`curve`: wall_minutes,
  dev_bleu, dev_bleu_tokenized, and test_bleu where scored), and train/dev perplexity (metrics.jsonl rows with `minutes`)."""
  plt = pyplot()
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  minutes = [c["wall_minutes"] for c in curve]
  ax1.plot(minutes, [c["dev_bleu"] for c in curve], "o-", label="sacreBLEU")
  ax1.plot(minutes, [c["dev_bleu_tokenized"] for c in curve], "s--", label="tokenized BLEU")
  with_test = [c for c in curve if "test_bleu" in c]
  if with_test:
    ax1.plot([c["wall_minutes"] for c in with_test], [c["test_bleu"] for c in with_test], "^:",
             label="test sacreBLEU (reported only)")
  ax1.set(xlabel="training wall time (minutes)", ylabel="BLEU (beam search)",
          title=f"{name}: dev BLEU vs wall time")
  ax2.plot([r["minutes"] for r in train_rows], [r["perplexity"] for r in train_rows], label="train")
  ax2.plot([r["minutes"] for r in dev_rows], [r["perplexity"] for r in dev_rows], "o-", label="dev")
  ax2.set(yscale="log", xlabel="training wall time (minutes)",
          ylabel="perplexity per target wordpiece")
  for ax in (ax1, ax2):
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# Its own flag set: report.py and report_run.py import this module beside entry points whose
# global flags (--out) would clash.
FLAGS = flags.FlagValues()
flags.DEFINE_string("out", "experiments/results/paper_plots", "Output folder.", flag_values=FLAGS)


def main(argv=None) -> int:
  FLAGS.unparse_flags()  # each call parses its own arguments only
  try:
    rest = FLAGS(argv or sys.argv)
  except flags.Error as e:
    raise SystemExit(f"error: {str(e).splitlines()[0]}") from None
  if len(rest) > 1:
    raise SystemExit(f"error: unexpected arguments: {' '.join(rest[1:])}")
  out = FLAGS.out
  os.makedirs(out, exist_ok=True)
  pe = plot_positional_encoding(os.path.join(out, "positional_encoding.png"))
  lr = plot_lr_schedule(os.path.join(out, "lr_schedule.png"))
  fl = plot_flops(os.path.join(out, "flops_per_layer.png"))
  write_readme(os.path.join(out, "README.md"), pe, lr, fl)
  print(open(os.path.join(out, "README.md")).read())
  return 0


if __name__ == "__main__":
  sys.exit(main())
