"""Table 3 of the paper: its rows, each the base model with the row's changes, as a sweep.

  python -m experiments.harness.runner --sweep=experiments/table3 --scale=cpu --out=W --parallel=2
  python -m experiments.harness.runner --sweep=experiments/table3 --scale=cpu_long --out=W \
      --parallel=2
  python -m experiments.harness.runner --sweep=experiments/table3 --scale=postln_pilot_paper_lr \
      --rows=base,A_h1,C_N2 --out=W --parallel=2
  python -m experiments.harness.runner --sweep=experiments/table3 --scale=paper --out=/shared/t3 \
      --dry_run --launcher=slurm            # the per-run sbatch commands, nothing run

Widths are in the paper's units; a scale shrinks d_model, d_k, d_v and d_ff by one factor
(experiments/table3/scales.py). `paper` holds what the paper prints for the row, None where
its table leaves the cell blank ("identical to the base model"): N, d_model, d_ff, h, d_k, d_v,
P_drop, eps_ls, train steps, perplexity and BLEU on newstest2013 (dev, beam search, no
checkpoint averaging) and parameters (millions). The verdicts read the paper's direction for
each row off these values (experiments/harness/verdicts.py). What was measured, and where:
experiments/table3/README.md.
"""

from experiments.harness import define
from experiments.table3 import scales

# Paths that results committed before this study had its folder recorded in their commands.
FORMER_PATHS = {"experiments/table3.py": "experiments/table3",
                "configs/table3_cpu.py": "experiments/table3/protocol.py"}


def _paper(ppl, bleu, params_m=None, **cells):
  return dict(cells, ppl=ppl, bleu=bleu, params_m=params_m)


def _n(n):
  return {"model.num_encoder_layers": n, "model.num_decoder_layers": n}


def get_config():
  c = define.new_sweep(
      "table3", "Vaswani et al. (2017), Table 3: variations on the Transformer architecture, "
      "English-to-German, dev set newstest2013",
      report_sections=("experiments/head_width/report.py",))
  scales.add_cpu_scales(c.scales)
  row = lambda *a, **k: define.add_row(c, *a, **k)  # noqa: E731

  row("base", label="base", group="base", same_width=True,
      paper=_paper(4.92, 25.8, 65, N=6, d_model=512, d_ff=2048, h=8, d_k=64, d_v=64,
                   P_drop=0.1, eps_ls=0.1, train_steps=100_000))

  # (A) number of heads and attention key/value sizes, computation kept constant.
  for h, dk, ppl, bleu in ((1, 512, 5.29, 24.9), (4, 128, 5.00, 25.5), (16, 32, 4.91, 25.8),
                           (32, 16, 5.01, 25.4)):
    row(f"A_h{h}", label=f"(A) h={h}, d_k=d_v={dk}", group="A", same_width=True,
        overrides={"model.num_heads": h, "model.d_k": dk, "model.d_v": dk},
        paper=_paper(ppl, bleu, h=h, d_k=dk, d_v=dk))

  # (B) smaller attention key size (d_v stays 64).
  for dk, ppl, bleu, params in ((16, 5.16, 25.1, 58), (32, 5.01, 25.4, 60)):
    row(f"B_dk{dk}", label=f"(B) d_k={dk}", group="B", overrides={"model.d_k": dk},
        paper=_paper(ppl, bleu, params, d_k=dk))

  # (C) model size: depth, width, feed-forward size.
  for n, ppl, bleu, params in ((2, 6.11, 23.7, 36), (4, 5.19, 25.3, 50), (8, 4.88, 25.5, 80)):
    row(f"C_N{n}", label=f"(C) N={n}", group="C", overrides=_n(n),
        paper=_paper(ppl, bleu, params, N=n))
  for d, dk, ppl, bleu, params in ((256, 32, 5.75, 24.5, 28), (1024, 128, 4.66, 26.0, 168)):
    row(f"C_dmodel{d}", label=f"(C) d_model={d}, d_k=d_v={dk}", group="C", same_width=True,
        overrides={"model.d_model": d, "model.d_k": dk, "model.d_v": dk},
        paper=_paper(ppl, bleu, params, d_model=d, d_k=dk, d_v=dk))
  for ff, ppl, bleu, params in ((1024, 5.12, 25.4, 53), (4096, 4.75, 26.2, 90)):
    row(f"C_dff{ff}", label=f"(C) d_ff={ff}", group="C", overrides={"model.d_ff": ff},
        paper=_paper(ppl, bleu, params, d_ff=ff))

  # (D) regularization: residual dropout and label smoothing.
  for p, tag, ppl, bleu in ((0.0, "0", 5.77, 24.6), (0.2, "02", 4.95, 25.5)):
    row(f"D_pdrop{tag}", label=f"(D) P_drop={p}", group="D",
        overrides={"model.dropout_rate": p}, paper=_paper(ppl, bleu, P_drop=p))
  for e, tag, ppl, bleu in ((0.0, "0", 4.67, 25.3), (0.2, "02", 5.47, 25.7)):
    row(f"D_ls{tag}", label=f"(D) eps_ls={e}", group="D",
        overrides={"train.label_smoothing": e}, paper=_paper(ppl, bleu, eps_ls=e))

  # (E) learned positional embedding instead of sinusoids.
  row("E_learned_pe", label="(E) positional embedding instead of sinusoids", group="E",
      overrides={"model.pe_type": "learned"}, paper=_paper(4.92, 25.7))

  # big: d_k = d_v = 64 as base (1024 / 16), dropout 0.3, 300k steps at the paper's scale.
  row("big", label="big", group="big", same_width=True,
      overrides={"model.d_model": 1024, "model.d_ff": 4096, "model.num_heads": 16,
                 "model.dropout_rate": 0.3, "train.num_steps": 300_000},
      paper=_paper(4.33, 26.4, 213, N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3,
                   train_steps=300_000))
  return c
