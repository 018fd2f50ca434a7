"""NVIDIA GPU preset: the paper's base (or big) model in bfloat16 on one or more GPU nodes.

One node of 8 GPUs (one process):
  python -m transformer_jax.main --config=configs/gpu.py --workdir=/shared/run1
Several nodes under SLURM (launch/slurm.sbatch runs one task per node or per GPU):
  sbatch --nodes=2 launch/slurm.sbatch configs/gpu.py:big /shared/run-big

Mixed precision: matmuls and activations in bfloat16; parameters, gradients and Adam's moments
in float32; softmax, LayerNorm statistics and the loss in float32. Attention goes through
`jax.nn.dot_product_attention` (d_k == d_v, no attention dropout: both hold for the paper's
models); with packed rows it gets a segment mask, so XLA's implementation runs, not cuDNN's
fused kernel.
Mesh: data parallelism over all GPUs (NVLink inside a node, InfiniBand across nodes).
"""

from configs import base, big

PEAK_FLOPS = {  # dense bf16 FLOP/s per GPU, NVIDIA data sheets (SXM parts)
    "a100": 312e12,
    "h100": 989e12,
    "h200": 989e12,
}


def get_config(arg: str = "base"):
  """arg: 'base' or 'big', optionally ',<gpu>' (default h100), e.g. 'big,a100'."""
  model, _, gpu = (arg or "base").partition(",")
  if model not in ("base", "big"):
    raise ValueError(f"configs/gpu.py:{arg}: the model is 'base' or 'big'")
  gpu = gpu or "h100"
  if gpu not in PEAK_FLOPS:
    raise ValueError(f"configs/gpu.py:{arg}: GPU is one of {', '.join(PEAK_FLOPS)}")
  c = (big if model == "big" else base).get_config()
  c.model.dtype = "bfloat16"
  c.model.attention_impl = "dot_product_attention"
  c.model.attention_dropout_rate = 0.0               # the fused kernel has no attention dropout
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 1, 1
  # Packed rows: ~95% real tokens and one compiled step shape, against ~73% and 8 shapes for
  # 8 length buckets at 25000 tokens (experiments/results/bucket_vs_pack.md).
  c.data.batch_mode = "pack"
  c.train.peak_flops = PEAK_FLOPS[gpu]
  c.train.checkpoint_every_minutes = 30.0
  return c
