"""NVIDIA GPU preset: the paper's base (or big) model in bfloat16 with cuDNN flash attention.

One node of 8 GPUs (one process):
  python -m transformer_jax.main --config=configs/gpu.py --workdir=/shared/run1
Several nodes under SLURM (launch/slurm.sbatch runs one task per node or per GPU):
  sbatch --nodes=2 launch/slurm.sbatch configs/gpu.py:big /shared/run-big

Mixed precision: matmuls and activations in bfloat16; parameters, gradients and Adam's moments
in float32; softmax, LayerNorm statistics and the loss in float32. Attention goes through
`jax.nn.dot_product_attention`, which uses cuDNN's fused (flash) attention on Ampere/Hopper
(d_k == d_v, no attention dropout: both hold for the paper's models) and plain XLA elsewhere.
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
  c.model.attention_impl = "dot_product_attention"  # cuDNN flash attention
  c.model.attention_dropout_rate = 0.0               # the fused kernel has no attention dropout
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 1, 1
  c.train.peak_flops = PEAK_FLOPS[gpu]
  c.train.checkpoint_every_minutes = 30.0
  return c
