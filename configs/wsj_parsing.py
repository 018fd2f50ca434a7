"""English constituency parsing, WSJ only (paper §6.3, Table 4): words in, linearized trees out.

Run on the full Penn Treebank (LDC99T42; data_dir holds `treebank_3/parsed/mrg/wsj/00..24/`):
  python -m transformer_jax.main --config=configs/wsj_parsing.py --workdir=workdirs/wsj
  python -m transformer_jax.main --mode=eval --workdir=workdirs/wsj --split=validation,test
Expected (paper, Table 4): 91.3 F1 on section 23, WSJ only (40K training sentences); not run
here (no treebank license, no accelerator).

Run on the treebank sample (60 minutes of training on every core; `data_dir/ptb-sample/combined`):
  TRANSFORMER_JAX_DATA_DIR=../shared/data python -m transformer_jax.main \
      --config=configs/wsj_parsing.py:sample --workdir=workdirs/wsj_sample
  TRANSFORMER_JAX_DATA_DIR=../shared/data python -m transformer_jax.main --mode=eval \
      --workdir=workdirs/wsj_sample --split=validation
Expected (sample, experiments/results/wsj_sample.md): dev F1 77.4 (P 77.6, R 77.1; <= 40 words
78.3; none repaired; the last checkpoint alone 77.0) after ~6600 steps on both cores of an idle
AMD EPYC (AVX-512; how many steps fit the hour varies from machine to machine of one type), then
~2 minutes of constrained beam-21 dev decoding. The sample has no test split: its dev split
(files wsj_0160-wsj_0179, 273 trees) is fixed here, and training uses wsj_0001-wsj_0159 (3396
trees). Leaves and sizes were chosen on dev (experiments/wsj_parsing/sweep.py), the deviations
from word positions on across three folds of the training files (experiments/parser_levers). The
published parser beside it (benchmarks.parser_peer, supar's CRF parser, the same trees, minutes
and cores on the same machine type): dev F1 85.94 (experiments/results/parser_peer_2core.md).

The paper's choices: 4 encoder and 4 decoder layers, d_model 1024, a 16K vocabulary, beam 21,
alpha 0.3, output limit input length + 300, and "all other parameters unchanged from the base
model": 8 heads (so d_k = d_v = 1024 / 8 = 128, as §3.2.2 sets them), d_ff 2048, dropout 0.1,
the base schedule; the number of steps is not given (100k here, as base). Sections 02-21 train,
22 is dev, 23 is test. Deviations of both variants:
- one piece may mix scripts in the shared vocabulary (data/tokenizer.py), so that `(NP` is one
  token: otherwise every bracket is two tokens and targets are 1.6x as long.
- POS tags are not predicted and brackets are closed with their label, as Vinyals et al. 2015
  (the paper does not say; tasks/parsing/treebank.py has why); the full treebank writes each
  word as XX as they did, the sample the word itself (below).
Deviations of the sample variant only, for 3396 training trees and 2 shared CPU cores:
- each word written as itself, not XX (data.parse_leaves='words'): after the same 50 minutes,
  dev F1 51.2 against 13.6; with XX the small model rarely emits the right number of leaves.
- 3 + 3 layers, d_model 256, 4 heads of 64, d_ff 1024, pre-LN: a first run with 4 + 4 post-LN
  layers and dropout 0.3 made 647 steps in 30 minutes under load and still decoded one skeleton
  for every sentence (dev F1 10.1 on 16 sentences); the project's CPU ablations found post-LN
  slow to start too (README, Table 3).
- 4000 BPE pieces (paper 16K): the sample has ~11K word types.
- weight decay 0.1 (paper none): 3.4K trees overfit quickly.
- ~2048 target tokens a batch, warmup 300, learning-rate scale 0.7 (scale 1.0: dev PPL 2.56 vs
  2.17 at 900 steps, experiments/results/wsj_parsing_pilot.md).
- stops after 60 minutes of training (`train.max_train_minutes`), the README's budget for the
  sample; one run on every core makes more steps than one run per core and beats their ensemble
  (benchmarks/core_budget), and on the folds more steps were worth most (F1 +13 to +18 from
  1200 to 2400 steps).
- word positions (model.word_positions; the paper has none): one learned embedding of each
  token's word index in both stacks, so the decoder knows which word it writes next, where
  long outputs otherwise lose their place among repeated words. Better on all three folds of the
  lever sweep at 2400 steps (experiments/parser_levers): F1 +18.0, +17.3 and +19.7 (p 0.001).
- dropout 0.2 (paper 0.1): with word positions the dev perplexity stops falling a third of the
  way into the hour while the training one falls on, and dropout 0.2 was better on all three
  folds at 2400 steps (experiments/parser_levers): F1 +0.5, +3.0 and +1.6 (p 0.004). Attention
  and ReLU dropout 0.1 on top of it were not (better on one fold, worse on two).
- two subtree-substituted copies of each training tree (data.parse_substitute=2; the paper trains
  on the treebank's own trees only, tasks/parsing/substitution.py): the hour overfits 3.4K trees,
  and the copies were better on all three folds at 3900 steps (experiments/parser_levers): F1
  +2.4, +1.8 and +2.8 (p 0.001), precision and recall both higher on every fold.
- the constrained search (decode.parse_constraint; the paper decodes freely and repairs): every
  output is a tree over the words, F1 +17 on the same checkpoint (archived wsj_sample_2289steps).
- the last 2 checkpoints averaged for decoding (decode.average_checkpoints; the paper averages
  the last 5 or 20 for translation and does not say for parsing): with the copies, better on
  all three folds at 3900 steps (experiments/parser_levers): F1 +0.8, +1.6 and +0.2 (p 0.039).
  The last 3 were too, but not better than the last 2 on every fold. The sample keeps a
  checkpoint every 5 minutes, so its last two lie about as far apart, in shares of the run, as
  the folds' two.
- at most 6 brackets opened in a row and unary chains of at most 3 (decode.parse_max_*; the
  training trees need 8 and 4): each better on all three folds of the lever sweep
  (experiments/parser_levers). One training tree needs a chain of 4: training warns about it.
"""

from transformer_jax.runtime.config import default_config

VARIANTS = ("", "sample", "pilot")


def get_config(variant: str = ""):
  if variant not in VARIANTS:
    raise ValueError(f"configs/wsj_parsing.py: unknown variant {variant!r}; use 'sample', 'pilot' or nothing")
  c = default_config()
  d = c.data
  d.task = "parsing"
  d.dataset = "local"
  d.local_corpus = "treebank_3/parsed/mrg/wsj"
  d.train_files = "wsj_0200-wsj_2199"    # sections 02-21
  d.eval_files = "wsj_2200-wsj_2299"     # section 22
  d.test_files = "wsj_2300-wsj_2399"     # section 23
  d.max_source_len = 256
  d.max_target_len = 768                 # linearized trees are ~2.6x the words
  m = c.model
  m.vocab_size = 16000
  m.num_encoder_layers = m.num_decoder_layers = 4
  m.d_model, m.num_heads, m.d_k, m.d_v, m.d_ff = 1024, 8, 128, 128, 2048
  m.max_len = 768
  t = c.train
  t.num_steps = 100_000
  t.checkpoint_every_steps = 2000
  dc = c.decode
  dc.beam_size = 21
  dc.alpha = 0.3
  dc.max_extra_len = 300
  if variant == "pilot":                 # experiments/wsj_parsing/sweep.py's protocol, pinned here
    d.local_corpus = "ptb-sample/combined"
    d.train_files, d.eval_files, d.test_files = "wsj_0001-wsj_0159", "wsj_0160-wsj_0179", ""
    d.max_source_len, d.max_target_len = 128, 384
    d.tokens_per_batch = 2048
    d.eval_batch_size = 64
    m.vocab_size = 4000
    m.num_encoder_layers = m.num_decoder_layers = 3
    m.d_model, m.num_heads, m.d_k, m.d_v, m.d_ff = 256, 4, 64, 64, 1024
    d.parse_leaves = "xx"
    m.pre_ln = True
    m.dropout_rate = 0.1
    m.max_len = 384
    t.num_steps = 900
    t.max_train_minutes = 0.0
    t.warmup_steps = 300
    t.learning_rate_scale = 0.7
    t.weight_decay = 0.1
    t.label_smoothing = 0.1
    t.log_every_steps = 50
    t.eval_every_steps = 300
    t.eval_bleu_sentences = 0
    t.checkpoint_every_steps = 900
    t.checkpoint_every_minutes = 10.0
    t.progress_bar = False
    dc.batch_size = 32
  if variant == "sample":
    d.local_corpus = "ptb-sample/combined"
    d.train_files = "wsj_0001-wsj_0159"
    d.eval_files = "wsj_0160-wsj_0179"
    d.test_files = ""                    # the sample has no test split
    d.max_source_len, d.max_target_len = 128, 384
    d.tokens_per_batch = 2048
    d.eval_batch_size = 64
    d.parse_leaves = "words"             # dev F1 51.2 against XX's 13.6 (same 50 minutes)
    d.parse_substitute = 2               # better on all three folds (experiments/parser_levers)
    m.vocab_size = 4000
    m.num_encoder_layers = m.num_decoder_layers = 3
    m.d_model, m.num_heads, m.d_k, m.d_v, m.d_ff = 256, 4, 64, 64, 1024
    m.pre_ln = True                      # post-LN 4 + 4 ignored the source after 647 steps
    m.word_positions = True              # better on all three folds (experiments/parser_levers)
    m.dropout_rate = 0.2                 # better on all three folds with word positions (the same)
    m.max_len = 384
    t.num_steps = 100_000                # the wall-time limit below ends the run
    t.max_train_minutes = 60.0           # the README's budget, spent by one run on every core
    t.warmup_steps = 300
    t.learning_rate_scale = 0.7
    t.weight_decay = 0.1
    t.log_every_steps = 50
    t.eval_every_steps = 500
    t.eval_bleu_sentences = 8            # decoded dev trees (and TensorBoard samples) each eval
    t.checkpoint_every_steps = 100_000
    t.checkpoint_every_minutes = 5.0
    t.keep_checkpoints = 10
    dc.batch_size = 32
    dc.average_checkpoints = 2           # better on all three folds (experiments/parser_levers)
    dc.parse_constraint = True           # the search writes only trees (below)
    dc.parse_max_opens_in_a_row = 6      # adopted across three folds (experiments/parser_levers)
    dc.parse_max_unary_chain = 3
  return c
