"""Benchmarks of transformer_jax (the library does not import this package).

  TRANSFORMER_JAX_DATA_DIR=../shared/data python -m benchmarks [--profile] [--only=train,data]

`python -m benchmarks` writes OUT.json and OUT.md (default experiments/results/bench) and prints
the report. What it measures, in one process on the default jax device:
- train (train_step.py): the compiled train step (`step.jit_train_step`: forward, backward, Adam,
  dropout on, state donated) of each `--train` entry CONFIG:ROWSxLENGTH on a synthetic batch of
  random ids (pack-mode configs get packed rows with segment ids). Model FLOPs are
  `metrics.train_flops` (3 x the forward pass's matmul FLOPs, attention over the padded lengths;
  embeddings, softmax, LayerNorm, the loss and Adam not counted), so MFU credits no
  recomputation or overhead; MFU is against `metrics.measure_peak_flops` measured in the same
  run in the first entry's compute dtype. `--profile`: where the step's time goes
  (hlo_profile.py).
- decode (decoding.py): beam-search throughput on random weights and random-id sentences.
- data (input_pipeline.py): real-token share and throughput of the train iterator.
`python -m benchmarks.ctranslate2_decode` is the decoding anchor: CTranslate2's beam search
(float32 and int8, one and two threads) beside ours on the same trained weights and sentences,
exported by `transformer_jax.tools.export`; `python -m benchmarks.export_agreement` checks that
the exported models translate what ours translates. `python -m benchmarks.flax_wmt`
(flax_wmt.py) and `python -m benchmarks.flax_wmt_decode` time the flax WMT example's train step
and beam-search decoding beside ours (their code: flax_example.py);
`python -m benchmarks.accelerator` checks a GPU/TPU host; `python -m benchmarks.parallel_runs`
times sweep runs side by side.

Every result records its command and the settings it resolved to (settings.py:
`settings.resolve(command)` recomputes them at HEAD without running anything, which is how
`experiments` checks that a committed result still regenerates) and is written whole through
`transformer_jax.runtime.results` (report.py). Timing on a shared machine means something only
when it is idle: the other processes' CPU share before and after is recorded (report.py), and
the report says when it was not idle.
"""
