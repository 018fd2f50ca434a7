"""A tiny model for tests and smoke runs on one CPU core.

Run:
  python -m transformer_jax.main --config=configs/tiny.py --workdir=/tmp/tiny
Expected: the run finishes in seconds; it learns Multi30k only a little (2 layers of width 64,
200 steps), since it exists to exercise every code path fast. To train a real model on a CPU:
configs/multi30k.py.
"""

from transformer_jax.runtime.config import default_config


def get_config():
  c = default_config()
  c.data.dataset = "local"
  c.data.local_corpus = "multi30k"
  c.data.train_files, c.data.eval_files, c.data.test_files = "train", "val", "test_2016_flickr"
  c.data.html_unescape = True
  c.data.max_source_len = c.data.max_target_len = 64
  c.data.tokens_per_batch = 1024
  c.data.eval_batch_size = 32
  m = c.model
  m.vocab_size = 1000
  m.d_model, m.num_heads, m.d_k, m.d_v, m.d_ff = 64, 4, 16, 16, 128
  m.num_encoder_layers = m.num_decoder_layers = 2
  m.max_len = 64
  t = c.train
  t.num_steps = 200
  t.warmup_steps = 100
  t.learning_rate_scale = 2.0
  t.log_every_steps = 20
  t.eval_every_steps = 100
  t.checkpoint_every_steps = 100
  t.max_eval_batches = 4
  t.keep_checkpoints = 3
  c.decode.beam_size = 2
  return c
