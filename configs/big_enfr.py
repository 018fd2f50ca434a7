"""Transformer big, WMT14 English->French (paper Table 2, "Transformer (big)" EN-FR).

Run (8 accelerators; one host; the TFDS dataset prepared with file_format='array_record'):
  python -m transformer_jax.main --config=configs/big_enfr.py --workdir=/path/to/workdir
  python -m transformer_jax.main --mode=eval --workdir=/path/to/workdir --split=test --average=20

Expected (the paper's, Table 2 and §6.1; not run here): 41.8 BLEU on newstest2014 (TFDS
`wmt14_translate/fr-en` test split), last 20 checkpoints averaged, beam 4, alpha 0.6, after 300k
steps.
The paper's EN-FR choices: dropout 0.1 instead of big's 0.3 (§6.1), a shared 32000 word-piece
vocabulary (§5.1); everything else as big (configs/big.py). No deviation from the paper.
"""

from configs import big


def get_config():
  c = big.get_config()
  c.data.dataset = "wmt14_translate/fr-en"
  c.data.source_lang, c.data.target_lang = "en", "fr"
  c.model.vocab_size = 32000
  c.model.dropout_rate = 0.1
  c.train.keep_checkpoints = 20
  return c
