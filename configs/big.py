"""Transformer big (paper Table 3 row 'big'), WMT14 English->German.

Run (8 accelerators; one host):
  python -m transformer_jax.main --config=configs/big.py --workdir=/path/to/workdir

Expected (the paper's; not run here): 26.4 BLEU on newstest2013 (dev) and 28.4 on newstest2014
(test, last 20 checkpoints averaged), after 300k steps. No deviation from the paper. Parameter
count against the paper's 213M: `python -m transformer_jax.tools.params --config=configs/big.py`.
"""

from configs import base


def get_config():
  c = base.get_config()
  c.model.d_model = 1024
  c.model.d_ff = 4096
  c.model.num_heads = 16
  c.model.d_k = c.model.d_v = 64
  c.model.dropout_rate = 0.3
  c.train.num_steps = 300_000
  c.train.keep_checkpoints = 20
  return c
