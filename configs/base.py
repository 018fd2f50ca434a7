"""Transformer base (paper Table 3 row 'base'), WMT14 English->German.

Run (8 accelerators; one host):
  python -m transformer_jax.main --config=configs/base.py --workdir=/path/to/workdir

Expected (the paper's; not run here): 25.8 BLEU on newstest2013 (dev, Table 3, no averaging)
and 27.3 on newstest2014 (test, Table 2, last 5 checkpoints averaged, beam 4, alpha 0.6), after
100k steps of ~25000 source + ~25000 target tokens. No deviation from the paper: the schema's
defaults are its base model. Parameter count against the paper's 65M:
`python -m transformer_jax.tools.params --config=configs/base.py` (docs/results.md).
"""

from transformer_jax.runtime.config import default_config


def get_config():
  c = default_config()  # the schema's defaults are the paper's base model
  c.data.dataset = "wmt14_translate/de-en"
  c.data.source_lang, c.data.target_lang = "en", "de"
  c.model.vocab_size = 37000
  c.data.tokens_per_batch = 25000
  c.train.num_steps = 100_000
  c.train.checkpoint_every_steps = 2000  # roughly the paper's 10-minute interval
  c.train.keep_checkpoints = 5
  return c
