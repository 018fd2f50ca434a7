"""Cloud TPU preset: the paper's base (or big) model in bfloat16 compute on a TPU slice.

Run on every worker of the slice (launch/tpu_vm.sh does that):
  python -m transformer_jax.main --config=configs/tpu.py --workdir=/mnt/shared/run1
  python -m transformer_jax.main --config=configs/tpu.py:big --workdir=...   # the big model

Expected: no TPU run is recorded yet; projected step times: docs/scaling.md.

Deviations from configs/base.py (or big.py), and why:
- bfloat16 matmuls and activations (the MXU's native input type); parameters, gradients and
  Adam's moments, attention logits/softmax, LayerNorm statistics and the loss in float32.
- packed rows: fewer padding tokens and one compiled step shape
  (experiments/results/bucket_vs_pack.md).
- pure data parallelism over all chips: the base model's state fits on any chip; for big on
  small-HBM chips, `--config.mesh.fsdp=-1 --config.mesh.data=1` shards the state instead.
- a checkpoint every 30 minutes (preemptible slices) and no progress bar (many workers' logs).
"""

from configs import base, big

PEAK_FLOPS = {  # dense bf16 FLOP/s per chip, from Google's TPU pages
    "v4": 275e12,
    "v5e": 197e12,
    "v5p": 459e12,
    "v6e": 918e12,
}


def get_config(arg: str = "base"):
  """arg: 'base' or 'big', optionally ',<tpu generation>' (default v5e), e.g. 'big,v5p'."""
  model, _, generation = (arg or "base").partition(",")
  if model not in ("base", "big"):
    raise ValueError(f"configs/tpu.py:{arg}: the model is 'base' or 'big'")
  generation = generation or "v5e"
  if generation not in PEAK_FLOPS:
    raise ValueError(f"configs/tpu.py:{arg}: TPU generation is one of {', '.join(PEAK_FLOPS)}")
  c = (big if model == "big" else base).get_config()
  c.model.dtype = "bfloat16"
  c.model.attention_impl = "einsum"       # XLA fuses it well on TPU
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 1, 1
  c.data.batch_mode = "pack"              # one compiled step shape, little padding
  c.train.peak_flops = PEAK_FLOPS[generation]  # for MFU (measuring it would use one chip)
  c.train.checkpoint_every_minutes = 30.0  # bound lost work on preemptible/spot slices
  c.train.progress_bar = False             # logs from many workers are streamed
  return c
