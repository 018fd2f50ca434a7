"""The paper's evaluation path on real WMT text, at CPU scale: English->German news.

Train on the 31k WMT news-test pairs of 2008-2012 and 2015-2020 (`wmt-news/train`), validate on
newstest2013 (the paper's dev set), test on all 3003 lines of newstest2014 (the paper's test
set), with the paper's decoding (beam 4, alpha 0.6, last checkpoints averaged) and both BLEU
scores.

Run (~30 minutes of training on 2 CPU cores):
  TRANSFORMER_JAX_DATA_DIR=../shared/data python -m transformer_jax.main \
      --config=configs/wmt_news.py --workdir=workdirs/wmt_news
  python -m transformer_jax.main --mode=eval --workdir=workdirs/wmt_news --average=5

Expected: a low BLEU (31k training pairs is 1/150th of WMT14, and 30 CPU minutes is ~1/20000th
of the paper's compute); the point is that the exact evaluation of Table 2 runs end to end.
Measured: experiments/results/wmt_news.md.

Differs from the paper's base model as configs/multi30k.py does (small model, short schedule,
packed 4096-token batches), with a 16000-piece vocabulary for the news domain and sentences
up to 128 tokens (the 2020 segments hold several sentences).
"""

from configs import multi30k


def get_config():
  c = multi30k.get_config()
  d = c.data
  d.local_corpus = "wmt-news"
  d.eval_data_dir = "wmt14"           # dev and test come from the WMT14 folder
  d.train_files, d.eval_files, d.test_files = "train", "newstest2013", "newstest2014"
  d.html_unescape = False
  d.max_source_len = d.max_target_len = 128
  c.model.vocab_size = 16000
  c.model.max_len = 192               # 128 + beam search's 50-token margin, rounded up
  c.train.max_train_minutes = 30.0
  c.train.checkpoint_every_minutes = 3.0
  return c
