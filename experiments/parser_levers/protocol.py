"""The pinned base of the parser lever sweep (experiments/parser_levers): the treebank-sample
parser of configs/wsj_parsing.py:sample, every setting written out, trained a fixed number of
steps and decoded with the constrained search.

  python -m experiments.harness.runner --sweep=experiments/parser_levers --scale=cv0 --out=W

Every setting is written out (none read from configs/wsj_parsing.py), so improving the sample
config never changes what the sweep's rows train. The file ranges are the fold's (sweep.py).

Deviations from the paper's parser (configs/wsj_parsing.py gives why): 3 + 3 pre-LN layers of
d_model 256, 4000 BPE pieces, each word written as itself (data.parse_leaves='words'), ~2048
target tokens a batch, warmup 300, lrate scale 0.7, weight decay 0.1; a step budget instead of
the sample's 50 minutes (rows compare at equal steps, whatever the machine's load); the
constrained search (decode.parse_constraint), the sample's best decoding on dev.
"""

from transformer_jax.runtime.config import default_config
from transformer_jax.runtime.overrides import apply_overrides

SETTINGS = {
    "data.task": "parsing", "data.dataset": "local", "data.local_corpus": "ptb-sample/combined",
    "data.train_files": "wsj_0001-wsj_0159", "data.eval_files": "wsj_0160-wsj_0179",
    "data.test_files": "", "data.max_source_len": 128, "data.max_target_len": 384,
    "data.tokens_per_batch": 2048, "data.eval_batch_size": 64, "data.parse_leaves": "words",
    "data.vocab_type": "bpe",
    "model.vocab_size": 4000, "model.num_encoder_layers": 3, "model.num_decoder_layers": 3,
    "model.d_model": 256, "model.num_heads": 4, "model.d_k": 64, "model.d_v": 64,
    "model.d_ff": 1024, "model.pre_ln": True, "model.max_len": 384, "model.dropout_rate": 0.1,
    "model.attention_dropout_rate": 0.0, "model.relu_dropout_rate": 0.0,
    "model.tie_embeddings": True, "model.pe_type": "sinusoidal", "model.dtype": "float32",
    "train.num_steps": 1200, "train.max_train_minutes": 0.0, "train.warmup_steps": 300,
    "train.learning_rate_scale": 0.7, "train.adam_b1": 0.9, "train.adam_b2": 0.98,
    "train.adam_eps": 1e-9, "train.label_smoothing": 0.1, "train.weight_decay": 0.1,
    "train.log_every_steps": 50, "train.eval_every_steps": 100_000,
    "train.eval_bleu_sentences": 0, "train.checkpoint_every_steps": 300,
    "train.checkpoint_every_minutes": 0.0, "train.keep_checkpoints": 10,
    "train.progress_bar": False,
    "decode.beam_size": 21, "decode.alpha": 0.3, "decode.max_extra_len": 300,
    "decode.batch_size": 32, "decode.parse_constraint": True,
}


def get_config():
  return apply_overrides(default_config(), SETTINGS)
