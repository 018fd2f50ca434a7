"""The paper's Table 3 ("Variations on the Transformer architecture"), as a sweep.

  python -m experiments.run --sweep=experiments/table3.py --scale=cpu --out=workdirs/table3_cpu \
      --parallel=2                          # 2 cores: two one-core runs at a time (1.48x)
  python -m experiments.run --sweep=experiments/table3.py --scale=paper --out=/shared/t3 \
      --dry_run --launcher=slurm            # the per-run sbatch commands, nothing run

Results: one file per (row, seed) in experiments/results/table3_<scale>/, the report beside it
(experiments/report.py; experiments/verdicts.py reads the paper's direction for each row off the
`paper` values here).

Scale `cpu` (pinned in configs/table3_cpu.py) is 41 runs of 3000 steps at widths x1/8 on
Multi30k, pre-LN. Expected on a 2-core CPU: base dev perplexity ~8.8 (sacreBLEU ~35 on 500 dev
sentences), still falling ~13% over the last quarter; 10 of the paper's 11 clear rows agree on
dev perplexity (experiments/results/table3_cpu.md); ~10.3 hours with `--parallel=2` (16-69
minutes a run on one core: A h=16 and h=32 take 2-4x base's step time). Pre-LN because post-LN
base stalls at this rate (experiments/results/archive/table3_cpu_postln.md); the scales
`postln_pilot_*` are the paper's post-LN at other rates (#53's pilot).

Scale `cpu_long` (#53) is the same pinned protocol trained twice as long, 6000 steps, big 3x as
long (18000, the paper's ratio), dev perplexity every 500 steps, BLEU on all 1014 dev sentences,
39 runs (A h=16 and E, unchanged in the paper, one seed):
  python -m experiments.run --sweep=experiments/table3.py --scale=cpu_long \
      --out=workdirs/table3_cpu_long --parallel=2
Expected (measured, experiments/results/table3_cpu_long.md): 73.5 train-hours, ~37 hours with
`--parallel=2` on 2-core AMD EPYCs (big: 5.4 h a seed on a Zen 4, 12.3 h on a Zen 3); base dev
perplexity 7.69, still falling 4.5% over the last quarter (its fit, log PPL = a + b t^-c, puts
< 3% at ~9000 steps); PPL 8 of 11 clear rows agree, BLEU 6 of 15; so the bar is that no
verdict changes between two thirds of training and the end (the report shows both: PPL from
the dev curve, BLEU from each run's checkpoint at two thirds, kept and evaluated at the end).
Still pre-LN: post-LN base learned slower than pre-LN at every rate of the pilot
(experiments/results/table3_postln_pilot.md).

Each row is the paper's base model with the row's changes (model widths in the paper's units;
a scale shrinks d_model, d_k, d_v and d_ff by one factor, see experiments/sweeps.py). `paper`
holds what the paper prints for the row, None where its table leaves the cell blank ("identical
to the base model"): N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, train steps, perplexity and
BLEU on newstest2013 (dev, beam search, no checkpoint averaging) and parameters (millions).
"""

from experiments import sweeps


def _paper(ppl, bleu, params_m=None, **cells):
  return dict(cells, ppl=ppl, bleu=bleu, params_m=params_m)


def _n(n):
  return {"model.num_encoder_layers": n, "model.num_decoder_layers": n}


def get_config():
  c = sweeps.new_sweep(
      "table3", "Vaswani et al. (2017), Table 3: variations on the Transformer architecture, "
      "English-to-German, dev set newstest2013")
  row = lambda *a, **k: sweeps.add_row(c, *a, **k)  # noqa: E731

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
