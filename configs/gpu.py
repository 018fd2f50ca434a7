"""NVIDIA GPU preset: the paper's base (or big) model in bfloat16 on one or more GPU nodes.

One node of 8 GPUs (one process):
  python -m transformer_jax.main --config=configs/gpu.py --workdir=/shared/run1
Several nodes under SLURM (launch/slurm.sbatch runs one task per node or per GPU):
  sbatch --nodes=2 launch/slurm.sbatch configs/gpu.py:big /shared/run-big
Check a GPU host first (~5 minutes; compiles, tokens/s, MFU, attention, memory for big):
  python -m benchmarks.accelerator --config=configs/gpu.py:base,h100

Mixed precision: matmuls and activations in bfloat16; parameters, gradients and Adam's moments
in float32; softmax, LayerNorm statistics and the loss in float32.
Attention and batch layout, two pairings:
- default: packed rows (~95% real tokens and one compiled shape, against ~73% and 8 shapes for
  8 length buckets at 25000 tokens: experiments/results/bucket_vs_pack.md) with XLA's
  `jax.nn.dot_product_attention` and a segment mask (cuDNN's kernel takes no segment mask);
- ',cudnn' (e.g. configs/gpu.py:base,h100,cudnn): bucketed rows with cuDNN's fused kernel
  (`attention_impl='cudnn'`: is_causal and per-row lengths instead of a mask array).
At the paper's sizes attention is a small share of the FLOPs, so the 22 points of padding are
expected to outweigh the fused kernel; the acceptance command times both on your GPU.
Mesh: data parallelism over all GPUs (NVLink inside a node, InfiniBand across nodes).
"""

from configs import base, big

PEAK_FLOPS = {  # dense bf16 FLOP/s per GPU, NVIDIA data sheets (SXM parts)
    "a100": 312e12,
    "h100": 989e12,
    "h200": 989e12,
}


def get_config(arg: str = "base"):
  """arg: 'base' or 'big', optionally ',<gpu>' (default h100) and ',cudnn', e.g. 'big,a100'."""
  parts = (arg or "base").split(",")
  model, gpu, extra = (parts + ["", ""])[:3]
  if model not in ("base", "big") or extra not in ("", "cudnn") or len(parts) > 3:
    raise ValueError(f"configs/gpu.py:{arg}: the model is 'base' or 'big', optionally followed "
                     "by ',<gpu>' and ',cudnn'")
  cudnn = extra == "cudnn"
  gpu = gpu or "h100"
  if gpu not in PEAK_FLOPS:
    raise ValueError(f"configs/gpu.py:{arg}: GPU is one of {', '.join(PEAK_FLOPS)}")
  c = (big if model == "big" else base).get_config()
  c.model.dtype = "bfloat16"
  c.model.attention_impl = "cudnn" if cudnn else "dot_product_attention"
  c.model.attention_dropout_rate = 0.0               # the fused kernels have no attention dropout
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = -1, 1, 1
  c.data.batch_mode = "bucket" if cudnn else "pack"
  c.train.peak_flops = PEAK_FLOPS[gpu]
  c.train.checkpoint_every_minutes = 30.0
  return c
