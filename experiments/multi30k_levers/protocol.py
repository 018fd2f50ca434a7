"""The pinned base of the Multi30k lever sweep (experiments/multi30k_levers): the recipe of
configs/multi30k.py as its levers were measured, trained to 2700 steps.

  python -m experiments.harness.runner --sweep=experiments/multi30k_levers --scale=at2700 \
      --out=W --rows=base,ls02 --parallel=2

Every setting is written out (none read from configs/multi30k.py), so improving the recipe never
changes what the sweep's rows train. What base scored, seed by seed: the study's README.md.

Deviations from the paper, and why (configs/multi30k.py gives the measurements):
- 3 + 3 layers, d_model 256, 4 heads of 64, d_ff 1024, 8000 BPE pieces: 29k pairs on 2 cores.
- ~2048 + 2048 tokens a batch, packed: more updates an hour.
- warmup 400, lrate scale 0.7 (peak 2.2e-3), 2700 steps: the hour of a slow 2-core CPU, counted
  in steps so that a row compares whatever the machine's load.
- dropout 0.2, AdamW weight decay 0.1: 29k pairs overfit within the hour.
- a checkpoint every 90 steps (40 kept): the number averaged is chosen on dev.
- decode alpha 0.6 (the paper's): the levers were scored with it.
"""

from transformer_jax.runtime.config import default_config
from transformer_jax.runtime.overrides import apply_overrides

SETTINGS = {
    "data.dataset": "local", "data.local_corpus": "multi30k", "data.source_lang": "en",
    "data.target_lang": "de", "data.train_files": "train", "data.eval_files": "val",
    "data.test_files": "test_2016_flickr", "data.html_unescape": True,
    "data.max_source_len": 100, "data.max_target_len": 100, "data.tokens_per_batch": 2048,
    "data.batch_mode": "pack", "data.eval_batch_size": 64, "data.vocab_type": "bpe",
    "data.extra_train_files": "", "data.upsample_primary": 1, "data.bpe_dropout": 0.0,
    "model.vocab_size": 8000, "model.d_model": 256, "model.num_heads": 4, "model.d_k": 64,
    "model.d_v": 64, "model.d_ff": 1024, "model.num_encoder_layers": 3,
    "model.num_decoder_layers": 3, "model.dropout_rate": 0.2,
    "model.attention_dropout_rate": 0.0, "model.relu_dropout_rate": 0.0, "model.pre_ln": False,
    "model.tie_embeddings": True, "model.pe_type": "sinusoidal", "model.max_len": 160,
    "model.dtype": "float32",
    "train.num_steps": 2700, "train.max_train_minutes": 0.0, "train.warmup_steps": 400,
    "train.learning_rate_scale": 0.7, "train.adam_b1": 0.9, "train.adam_b2": 0.98,
    "train.adam_eps": 1e-9, "train.label_smoothing": 0.1, "train.weight_decay": 0.1,
    "train.grad_clip_norm": 0.0, "train.cooldown_steps": 0, "train.grad_accum_steps": 1,
    "train.dropout_rng_impl": "threefry2x32", "train.log_every_steps": 50,
    "train.eval_every_steps": 500, "train.checkpoint_every_steps": 90,
    "train.checkpoint_every_minutes": 0.0, "train.keep_checkpoints": 40,
    "decode.beam_size": 4, "decode.alpha": 0.6, "decode.max_extra_len": 50,
    "decode.batch_size": 64,
}


def get_config():
  return apply_overrides(default_config(), SETTINGS)
