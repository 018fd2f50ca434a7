"""Head count against head width, at Table 3's `cpu_long` protocol (#53's measured reason).

  python -m experiments.run --sweep=experiments/head_width.py --scale=cpu_long \
      --out=workdirs/head_width --parallel=2          # 4 rows x seeds 0, 1: 8 runs

Row (A) of Table 3 changes the number of heads h while h x d_k stays d_model, so at widths x1/8
(base: d_model 64, eight heads 8 wide) h and the per-head width move together: one head is
64 wide. There the paper's order inverts (`table3_cpu_long.md`: A h=1 7.26 against base's 7.69).
This sweep separates the two with a 2 x 2 design: h in {1, 8} crossed with d_k = d_v in {8, 64}
at this scale (64 and 512 in the paper's units, which the rows use). If eight heads beat one at
equal width, at both widths, the inversion comes from head width, not from the count.

The protocol is `cpu_long`'s own (configs/table3_cpu.py, pre-LN, 6000 steps, dev perplexity
every 500, BLEU on all 1014 dev sentences, two-thirds checkpoints), pinned here as in
experiments/table3.py. Every row runs seeds 0 and 1, base too: base and h1_dk64 (= Table 3's A
h=1) repeat `table3_cpu_long`'s runs of the same seeds, so they double as a check that a run
regenerates. Expected (experiments/results/head_width_cpu_long.md, measured 2026-11-29 to
12-01): dev PPL 8.64 one head 8 wide, 7.66 base, 7.26 one head 64 wide, 6.86 eight heads 64 wide:
eight heads beat one at both widths, and width outweighs count. 7.9 train-hours for the 8 runs
(~4 h at `--parallel=2` on a 2-core AMD EPYC Zen 4; h8_dk64, 3.27M parameters, ~1.9 h a run).
"""

import ml_collections

from experiments import sweeps


def get_config(arg: str = ""):
  del arg
  c = sweeps.new_sweep(
      "head_width", "Head count against head width at Table 3's cpu_long protocol (dev split)",
      reference={})
  c.scales = ml_collections.ConfigDict()
  c.scales.cpu_long = sweeps.cpu_long_scale(base_seeds=(0, 1), row_seeds={}, compare_with="")
  row = lambda *a, **k: sweeps.add_row(c, *a, **k)  # noqa: E731
  row("base", label="h=8, d_k=d_v=64 (base: eight heads 8 wide at this scale)", group="base")
  row("h1_dk64", label="h=1, d_k=d_v=512 (Table 3's A h=1: one head 64 wide)", group="h=1",
      overrides={"model.num_heads": 1, "model.d_k": 512, "model.d_v": 512})
  row("h1_dk8", label="h=1, d_k=d_v=64 (one head 8 wide)", group="h=1",
      overrides={"model.num_heads": 1})
  row("h8_dk64", label="h=8, d_k=d_v=512 (eight heads 64 wide)", group="h=8",
      overrides={"model.d_k": 512, "model.d_v": 512})
  return c
