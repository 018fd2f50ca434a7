"""Transformer base, WMT14 English->French (paper Table 2, "Transformer (base model)" EN-FR).

Run (8 accelerators; one host; the TFDS dataset prepared with file_format='array_record'):
  python -m transformer_jax.main --config=configs/base_enfr.py --workdir=/path/to/workdir
  python -m transformer_jax.main --mode=eval --workdir=/path/to/workdir --split=test --average=5

Expected (the paper's, Table 2; not run here): 38.1 BLEU on newstest2014 (TFDS
`wmt14_translate/fr-en` test split; dev: its validation split, newstest2013), last 5 checkpoints
averaged, beam 4, alpha 0.6, after 100k steps.
The paper's EN-FR choices (§5.1): the WMT14 English-French data and a shared 32000 word-piece
vocabulary; everything else as base (configs/base.py). No deviation from the paper.
"""

from configs import base


def get_config():
  c = base.get_config()
  c.data.dataset = "wmt14_translate/fr-en"
  c.data.source_lang, c.data.target_lang = "en", "fr"
  c.model.vocab_size = 32000
  return c
