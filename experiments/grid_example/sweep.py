"""A free-form grid sweep: heads x d_k x dropout x positional-encoding type (16 rows + base).

  python -m experiments.harness.runner --sweep=experiments/grid_example --scale=small \
      --out=runs/grid --dry_run
  python -m experiments.harness.runner --sweep=experiments/grid_example --scale=small \
      --out=runs/grid --rows='base,h4_*'

The template of a study: copy this folder, edit sweep.py and README.md. Any keys of the run
config (transformer_jax/runtime/config.py) can be swept: each row is one combination, applied
on top of the reference (the paper's base model), so the standard scales apply (widths such as
d_k in paper units, shrunk by the scale's factor: d_k 32 and 64 run as 16 and 32 at
--scale=small). `fixed` keys go into every row of a grid, `tied` keys follow a swept one (here
d_v = d_k), and `define.add_row` adds single rows beside a grid. h*d_k differs from d_model in
most rows (the model allows it; `same_width=True` would forbid it).
"""

from experiments.harness import define


def get_config(arg: str = ""):
  del arg
  c = define.new_sweep("grid_example", "Grid over heads x d_k x P_drop x positional encoding")
  define.add_row(c, "base", label="base", group="base")  # the reference, for the Δ columns
  define.add_grid(c, {"model.num_heads": [4, 8], "model.d_k": [32, 64],
                      "model.dropout_rate": [0.1, 0.3], "model.pe_type": ["sinusoidal", "learned"]},
                  tied={"model.d_v": "model.d_k"}, group="grid")
  return c
