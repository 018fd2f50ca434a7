"""The pinned protocols of Table 3's CPU scales (experiments/table3/scales.py), one a variant.

  python -m transformer_jax.main --config=experiments/table3/protocol.py --workdir=W
  python -m transformer_jax.main --config=experiments/table3/protocol.py:postln_pilot_paper_lr ...

Every setting a result depends on is written out, none read from configs/multi30k.py or the
schema's defaults, so a later change of the Multi30k recipe or of a default cannot change what
these protocols train (tests/test_provenance.py). Never edit a variant that has results: a new
protocol is a new variant. Each variant trains Table 3's base row at widths x1/8; the sweep
scales every row's widths from the paper's by the same factor.

Deviations from the paper, and why:
- Multi30k en-de (29k pairs, 8000 shared BPE pieces) instead of WMT14: what 2 cores can train.
- widths x1/8 (d_model 64, d_ff 256, d_k = d_v = 8, h and N as the paper's): x1/8 learned more
  per minute than x1/4 on this machine (experiments/results/archive/, table3_pilot).
- ~2048 + 2048 tokens a batch, packed rows, 3000 steps, warmup 400, lrate scale 0.5 (peak
  3.1e-3): the most updates that fit the `cpu` sweep into a night of a 2-core machine.
- pre-LN (model.pre_ln), because post-LN base stalls in this budget at this rate; the
  `postln_pilot_*` variants are the paper's post-LN with other rates: `paper_lr` the paper's
  base peak (7.0e-4, reached at step 400), `paper_lr_clip` the same with the global gradient
  norm clipped to 1, `long_warmup` the `cpu` peak 3.1e-3 reached at step 1600.
"""

from transformer_jax.runtime.config import default_config
from transformer_jax.runtime.overrides import apply_overrides

# The `cpu` scale's base row, every key that can change a result (as its results record it).
CPU = {
    "data.dataset": "local", "data.local_corpus": "multi30k", "data.source_lang": "en",
    "data.target_lang": "de", "data.train_files": "train", "data.eval_files": "val",
    "data.test_files": "test_2016_flickr", "data.html_unescape": True,
    "data.skip_bad_utf8": False, "data.max_source_len": 100, "data.max_target_len": 100,
    "data.tokens_per_batch": 2048, "data.batch_mode": "pack", "data.num_buckets": 8,
    "data.eval_batch_size": 64, "data.vocab_type": "bpe", "data.vocab_train_sentences": 2_000_000,
    "data.bpe_dropout": 0.0, "data.bpe_dropout_target": True, "data.extra_train_files": "",
    "data.upsample_primary": 1,
    "model.vocab_size": 8000, "model.d_model": 64, "model.num_heads": 8, "model.d_k": 8,
    "model.d_v": 8, "model.d_ff": 256, "model.num_encoder_layers": 6,
    "model.num_decoder_layers": 6, "model.dropout_rate": 0.1,
    "model.attention_dropout_rate": 0.0, "model.relu_dropout_rate": 0.0, "model.pre_ln": True,
    "model.tie_embeddings": True, "model.pe_type": "sinusoidal", "model.max_len": 160,
    "model.layer_norm_epsilon": 1e-6, "model.dtype": "float32", "model.attention_impl": "einsum",
    "model.remat": "none", "model.scan_layers": False,
    "train.num_steps": 3000, "train.warmup_steps": 400, "train.learning_rate_scale": 0.5,
    "train.adam_b1": 0.9, "train.adam_b2": 0.98, "train.adam_eps": 1e-9,
    "train.label_smoothing": 0.1, "train.weight_decay": 0.0, "train.grad_clip_norm": 0.0,
    "train.cooldown_steps": 0, "train.grad_accum_steps": 1, "train.loss_chunk_positions": 0,
    "train.dropout_rng_impl": "threefry2x32", "train.unroll_threefry_on_cpu": True,
    "train.divergence_warn_factor": 4.0, "train.profile_steps": 0,
    "train.profile_after_steps": 10,
    "decode.beam_size": 4, "decode.alpha": 0.6, "decode.max_extra_len": 50,
    "decode.batch_size": 64, "decode.average_checkpoints": 0,
    "mesh.data": -1, "mesh.fsdp": 1, "mesh.tensor": 1,
}
# The post-LN pilot: the paper's architecture at three learning-rate settings.
# Peak = learning_rate_scale * d_model^-0.5 * warmup^-0.5 (d_model 64).
VARIANTS = {
    "": {},
    "postln_pilot_paper_lr": {"model.pre_ln": False, "train.learning_rate_scale": 0.1118},
    "postln_pilot_paper_lr_clip": {"model.pre_ln": False, "train.learning_rate_scale": 0.1118,
                                   "train.grad_clip_norm": 1.0},
    "postln_pilot_long_warmup": {"model.pre_ln": False, "train.warmup_steps": 1600,
                                 "train.learning_rate_scale": 1.0},
}


def get_config(variant: str = ""):
  if variant not in VARIANTS:
    raise ValueError(f"experiments/table3/protocol.py: unknown variant {variant!r}; use one of "
                     f"{', '.join(repr(v) for v in VARIANTS if v)} or nothing")
  c = default_config()
  apply_overrides(c, {**CPU, **VARIANTS[variant]})
  c.train.max_train_minutes = 0.0     # step-based: every row trains train.num_steps
  return c
