"""The CPU scales of Table 3: its rows on Multi30k on a 2-core CPU, at the pinned protocol.

Every scale trains the protocol of experiments/table3/protocol.py (one variant each, so that a
change of configs/multi30k.py never changes them) with every row's widths x1/8 (h and N as the
paper's); the whole dev split is evaluated `dev_evaluations` times during training (the
convergence curve) and once more at the end (loss, perplexity; BLEU of beam search on the
first `bleu_sentences` sentences, 0: all).
"""

from __future__ import annotations

from typing import Any

import ml_collections

from experiments.harness.define import QUIET_RUN, scale
from transformer_jax.runtime.overrides import load_config_file

PROTOCOL = "experiments/table3/protocol.py"
# `cpu`: every row, big included, trains the same steps.
CPU = dict(dim_factor=0.125, num_steps=3000, dev_evaluations=10, bleu_sentences=500,
           seeds=(0, 1), base_seeds=(0, 1, 2))
# The post-LN pilot: base, A h=1 and C N=2 (--rows=base,A_h1,C_N2) at each rate setting, seed 0.
POSTLN_PILOTS = {
    "postln_pilot_paper_lr": "the paper's base peak rate 7.0e-4 (at step 400)",
    "postln_pilot_paper_lr_clip": "the paper's base peak rate 7.0e-4 (at step 400), gradients "
                                  "clipped to global norm 1",
    "postln_pilot_long_warmup": "the `cpu` peak 3.1e-3, reached at step 1600 (not 400)",
}
# `cpu_long`: the `cpu` protocol trained twice as long (big 3x as long, the paper's ratio), BLEU
# on the whole dev split; A h=16 and E (unchanged in the paper) one seed.
CPU_LONG = dict(num_steps=6000, dev_evaluations=12, bleu_sentences=0, paper_step_ratio=True,
                compare_with="cpu", score_two_thirds=True,
                row_seeds={"A_h16": (0,), "E_learned_pe": (0,)},
                why_pre_ln="pre-LN (a deviation: post-LN base learned slower than pre-LN at every "
                           "rate of the post-LN pilot, experiments/table3/results/"
                           "table3_postln_pilot.md), ")


def cpu_long_scale(**changes: Any) -> ml_collections.ConfigDict:
  """The `cpu_long` scale with `changes` to its settings (seeds, compare_with): for another
  sweep at the same protocol (experiments/head_width)."""
  return cpu_scale(**dict(CPU_LONG, **changes))


def cpu_scale(variant: str = "", what: str = "", **settings: Any) -> ml_collections.ConfigDict:
  """A scale at the protocol's `variant`, CPU's settings with `settings` changed."""
  p = dict(CPU, **settings)
  ratio = p.get("paper_step_ratio", False)
  spec = PROTOCOL + (f":{variant}" if variant else "")
  cfg = load_config_file(spec)
  t = cfg.train
  d_model = round(512 * p["dim_factor"])
  peak = t.learning_rate_scale * d_model ** -0.5 * t.warmup_steps ** -0.5
  every = max(1, p["num_steps"] // p["dev_evaluations"])
  # saved at two thirds of training (of big's 3x too) and kept, to score it there at the end
  two_thirds = 2 * p["num_steps"] // 3 if p.get("score_two_thirds") else 0
  return scale(
      spec, dim_factor=p["dim_factor"], num_steps=p["num_steps"],
      bleu_sentences=p["bleu_sentences"], seeds=p["seeds"], base_seeds=p["base_seeds"],
      paper_step_ratio=ratio, row_seeds=p.get("row_seeds"), compare_with=p.get("compare_with", ""),
      score_two_thirds=bool(two_thirds),
      overrides=dict(QUIET_RUN, **{"train.eval_every_steps": every, "train.max_eval_batches": 0,
                                   "train.checkpoint_every_steps": two_thirds or p["num_steps"],
                                   **({"train.keep_every_steps": two_thirds} if two_thirds else {})}),
      description=(
          f"Multi30k en-de on a 2-core CPU ({spec}): every row's widths x{p['dim_factor']:g} "
          f"(base: d_model {d_model}, d_ff {4 * d_model}, h=8, d_k=d_v={d_model // 8}, N=6), h "
          f"and N as in the paper, {p['num_steps']} steps of ~{cfg.data.tokens_per_batch} "
          + ("source + target tokens each (packed), big 3x as many as in the paper, " if ratio
             else "source + target tokens each (packed) for every row, big included, ")
          + (p.get("why_pre_ln", "pre-LN (a deviation: post-LN base does not train in this "
                                 "budget at this rate), ")
             if cfg.model.pre_ln else f"post-LN as the paper, {what}, ")
          + f"warmup {t.warmup_steps}, lrate scale {t.learning_rate_scale:g} (base peak {peak:.1e}), "
          + (f"gradient clipping at global norm {t.grad_clip_norm:g}, " if t.grad_clip_norm else "")
          + f"seeds {','.join(map(str, p['seeds']))} (base: {','.join(map(str, p['base_seeds']))}"
          + "".join(f"; {r}: {','.join(map(str, v))}" for r, v in p.get("row_seeds", {}).items())
          + f"), dev perplexity on the whole dev split every {every} steps, BLEU on "
          + (f"the first {p['bleu_sentences']} of the 1014 dev sentences" if p["bleu_sentences"]
             else "all 1014 dev sentences")))


def add_cpu_scales(scales: ml_collections.ConfigDict) -> None:
  """Adds `cpu`, `cpu_long` and the post-LN pilots' scales."""
  scales.cpu = cpu_scale()
  scales.cpu_long = cpu_long_scale()
  for name, what in POSTLN_PILOTS.items():
    scales[name] = cpu_scale(name, what, seeds=(0,), base_seeds=(0,))
