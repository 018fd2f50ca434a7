"""NVIDIA GPU preset: the paper's base (or big) model in bfloat16 on one or more GPU nodes.

One node of 8 GPUs (one process):
  python -m transformer_jax.main --config=configs/gpu.py --workdir=/shared/run1
Several nodes under SLURM (launch/slurm.sbatch runs one task per node or per GPU):
  sbatch --nodes=2 launch/slurm.sbatch configs/gpu.py:big /shared/run-big
Check a GPU host first (compile, tokens/s, MFU, attention, memory for big):
  python -m benchmarks.accelerator --config=configs/gpu.py:base,h100
Expected: no GPU run is recorded yet; the acceptance command writes
experiments/results/accelerator.md.

Deviations from configs/base.py (or big.py), and why:
- bfloat16 matmuls and activations, float32 parameters, optimizer state, softmax, LayerNorm
  statistics and loss: the GPUs' bf16 matrix units (docs/scaling.md, "Mixed precision").
- no attention dropout: the fused kernels have none.
- default: packed rows (fewer padding tokens and one compiled shape than length buckets:
  experiments/results/bucket_vs_pack.md) with XLA's `jax.nn.dot_product_attention` and a
  segment mask, since cuDNN's kernel takes no segment mask;
  ',cudnn' (e.g. configs/gpu.py:base,h100,cudnn): bucketed rows with cuDNN's fused kernel
  (is_causal and per-row lengths instead of a mask array). Which pairing is faster depends on
  the GPU; the acceptance command times both.
- data parallelism over all GPUs: the state fits on each (docs/scaling.md).
- a checkpoint every 30 minutes: bounds the work a lost node costs.
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
