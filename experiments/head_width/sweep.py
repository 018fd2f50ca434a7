"""Head count against head width, at Table 3's `cpu_long` protocol: a 2 x 2 design.

  python -m experiments.harness.runner --sweep=experiments/head_width --scale=cpu_long --out=W \
      --parallel=2                                 # 4 rows x seeds 0, 1: 8 runs

Row (A) of Table 3 changes the number of heads h while h x d_k stays d_model, so at widths x1/8
(base: d_model 64, eight heads 8 wide) h and the per-head width move together: one head is 64
wide. This sweep separates the two: h in {1, 8} crossed with d_k = d_v in {8, 64} at this scale
(64 and 512 in the paper's units, which the rows use). If eight heads beat one at equal width,
at both widths, an inversion of row A comes from head width, not from the count.

The protocol is `cpu_long`'s own (experiments/table3/scales.py). Every row runs seeds 0 and 1,
base too: base and h1_dk64 (= Table 3's A h=1) repeat Table 3's `cpu_long` runs of the same
seeds, so they double as a check that a run regenerates. What was measured:
experiments/head_width/README.md.
"""

import ml_collections

from experiments.harness import define
from experiments.table3 import scales

# Paths that results committed before this study had its folder recorded in their commands.
FORMER_PATHS = {"experiments/head_width.py": "experiments/head_width"}


def get_config(arg: str = ""):
  del arg
  c = define.new_sweep(
      "head_width", "Head count against head width at Table 3's cpu_long protocol (dev split)",
      reference={}, report_sections=("experiments/head_width/report.py",))
  c.scales = ml_collections.ConfigDict()
  c.scales.cpu_long = scales.cpu_long_scale(base_seeds=(0, 1), row_seeds={}, compare_with="")
  row = lambda *a, **k: define.add_row(c, *a, **k)  # noqa: E731
  row("base", label="h=8, d_k=d_v=64 (base: eight heads 8 wide at this scale)", group="base")
  row("h1_dk64", label="h=1, d_k=d_v=512 (Table 3's A h=1: one head 64 wide)", group="h=1",
      overrides={"model.num_heads": 1, "model.d_k": 512, "model.d_v": 512})
  row("h1_dk8", label="h=1, d_k=d_v=64 (one head 8 wide)", group="h=1",
      overrides={"model.num_heads": 1})
  row("h8_dk64", label="h=8, d_k=d_v=512 (eight heads 64 wide)", group="h=8",
      overrides={"model.d_k": 512, "model.d_v": 512})
  return c
