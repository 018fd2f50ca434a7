"""Benchmark: train-step throughput and MFU, beam-search decoding speed, input-pipeline speed.

Run (from the repository root; the full run takes ~10 minutes on 2 CPU cores):
  TRANSFORMER_JAX_DATA_DIR=../shared/data python -m transformer_jax.bench
Quick runs:
  python -m transformer_jax.bench --only=train --train=base:8x128 --steps=2
  python -m transformer_jax.bench --only=decode --decode_sentences=8 --decode_data=random

Writes `<out>.json` and `<out>.md` (default experiments/results/bench) and prints the table.
Modules: __main__.py (flags), runner.py (runs the parts), train_step.py, hlo_profile.py (where the
step's time goes, `--profile`), decoding.py, input_pipeline.py, report.py (the Markdown).

What is measured (one process, the default jax device, float32 unless the config says otherwise):
- train (train_step.py): the compiled train step (`step.jit_train_step`: forward, backward, Adam update, dropout
  on, state donated) of each `--train` entry `CONFIG:ROWSxLENGTH` on synthetic batches of random
  ids with source and target length LENGTH (pack-mode configs get packed rows with segment ids).
  'base' is configs/base.py with a 32000-piece vocabulary (the flax WMT example's), 'big'
  likewise; 'multi30k' and 'tiny' are those configs as they are. Per entry: compile time, step
  time (median and min of `--steps` steps after `--warmup`), target tokens/s (non-pad target
  tokens per step / median step time), model FLOP/s and MFU.
  Model FLOPs are counted the standard way: `metrics.train_flops` = 3 x the forward pass's matmul
  FLOPs (2 per multiply-add: Q/K/V/output projections, QK^T and AV over the padded lengths, the
  FFNs, the pre-softmax projection; embedding lookups, softmax, LayerNorm, the loss and Adam are
  not counted), so MFU does not credit recomputation or overhead. XLA's own count of the
  compiled step (`cost_analysis()['flops']`) is recorded next to it.
  MFU is against the peak measured in the same run: `metrics.measure_peak_flops` (a jitted
  2048x2048 jnp.dot, best of 5) in the compute dtype of the first train entry.
  Memory: the compiled step's buffers (XLA memory analysis: arguments, outputs, temporaries)
  and the process's peak resident set size after the entry (a high-water mark over the run, so
  entries run from small to large as given).
- decode (decoding.py): `experiments/bench_decode.py`'s functions, imported: beam-4 throughput (sentences/s,
  output tokens/s) on a batch of newstest2014 sentences (or random ids with `--decode_data=random`)
  and the median time of one decoder step with the cache index at each `--decode_positions`.
  Random weights: every sentence runs to its length limit (a worst case).
- data (input_pipeline.py): `experiments/bench_data.py`'s `throughput` for each `--data` entry `CORPUS:MODE@TOKENS`:
  real target tokens/s of the train iterator (needs TRANSFORMER_JAX_DATA_DIR).

Timing on a shared machine is only meaningful when it is idle: the load average before and
after is recorded, and the report says so when it was above 0.5.
"""
