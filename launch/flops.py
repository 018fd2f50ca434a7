"""Training FLOPs of the paper's base and big models, and projected wall time on TPU/GPU.

  python launch/flops.py                      # the tables of docs/scaling.md
  python launch/flops.py --mfu 0.3 --length 48

FLOPs come from `transformer_jax.metrics.train_flops` (3x the forward matmul FLOPs, padding
included) for a step of `--tokens` source and as many target tokens in rows of `--length`.
Projected step time = matmul time at `--mfu` + the data-parallel gradient all-reduce (float32,
ring: 2 (n-1)/n bytes per byte of gradient) at the stated bus bandwidth, not overlapped: a
conservative bound (XLA overlaps part of the all-reduce with the backward pass).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transformer_jax.config import ModelConfig  # noqa: E402
from transformer_jax.metrics import train_flops  # noqa: E402
from transformer_jax.params import count_params  # noqa: E402

P100_SUSTAINED = 9.5e12  # the paper's assumed sustained fp32 FLOP/s of one P100 (Table 2 note)


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  config_module: str
  steps: int
  paper_hours: float        # 8 P100s (paper §5.2)
  paper_step_s: float
  paper_flops: float        # Table 2, "Training Cost (FLOPs)"


@dataclasses.dataclass(frozen=True)
class Machine:
  name: str
  chips: int
  peak_bf16: float          # dense FLOP/s per chip
  allreduce_bw: float       # effective all-reduce bus bandwidth per chip, bytes/s
  mesh: str


RUNS = (Run("base", "configs.base", 100_000, 12.0, 0.4, 3.3e18),
        Run("big", "configs.big", 300_000, 84.0, 1.0, 2.3e19))
MACHINES = (
    # v5e: 197 TFLOP/s bf16, ICI 1600 Gbit/s per chip; ~100 GB/s effective for a 64-chip ring.
    Machine("TPU v5e-64", 64, 197e12, 100e9, "data=64 (16 hosts x 4 chips)"),
    Machine("TPU v5e-16", 16, 197e12, 100e9, "data=16 (4 hosts x 4 chips)"),
    # H100 SXM: 989 TFLOP/s dense bf16, NVLink 4 (450 GB/s per direction); NCCL ~350 GB/s.
    Machine("8x H100 SXM", 8, 989e12, 350e9, "data=8 (one host)"),
)


def model_config(module: str) -> ModelConfig:
  import importlib  # pylint: disable=g-import-not-at-top
  return ModelConfig.from_config(importlib.import_module(module).get_config().model)


def step_flops(cfg: ModelConfig, tokens: int, length: int) -> float:
  rows = tokens / length
  return train_flops(cfg, rows, length, length)


def fmt_time(seconds: float) -> str:
  if seconds >= 86400 * 2:
    return f"{seconds / 86400:.1f} d"
  if seconds >= 3600:
    return f"{seconds / 3600:.1f} h"
  return f"{seconds / 60:.0f} min"


def report(tokens: int, length: int, mfu: float) -> str:
  lines = [f"Step: {tokens} source + {tokens} target tokens in rows of {length} "
           f"({tokens / length:.0f} rows); compute MFU {mfu:.0%}.", ""]
  lines += ["| model | params | FLOPs/step | steps | FLOPs/run (ours) | paper (Table 2) | "
            "paper / ours | implied P100 utilisation | paper's achieved FLOP/s per GPU |",
            "|---|---|---|---|---|---|---|---|---|"]
  flops = {}
  for run in RUNS:
    cfg = model_config(run.config_module)
    f_step = step_flops(cfg, tokens, length)
    f_run = f_step * run.steps
    flops[run.name] = (cfg, f_step, f_run)
    paper_hw = run.paper_hours * 3600 * 8 * P100_SUSTAINED
    lines.append(f"| {run.name} | {count_params(cfg) / 1e6:.1f}M | {f_step:.2e} | {run.steps:,} | "
                 f"{f_run:.2e} | {run.paper_flops:.1e} (= {run.paper_hours:g} h x 8 x 9.5e12 = "
                 f"{paper_hw:.2e}) | {run.paper_flops / f_run:.1f}x | {f_run / paper_hw:.0%} | "
                 f"{f_step / run.paper_step_s / 8 / 1e12:.1f} TFLOP/s |")
  lines += ["", "| model | machine | mesh | peak | matmuls/step at MFU | grad all-reduce/step | "
            "step (no overlap) | effective MFU | run |", "|---|---|---|---|---|---|---|---|---|"]
  for run in RUNS:
    cfg, f_step, _ = flops[run.name]
    grad_bytes = 4 * count_params(cfg)
    for m in MACHINES:
      t_compute = f_step / (m.chips * m.peak_bf16 * mfu)
      t_comm = 2 * (m.chips - 1) / m.chips * grad_bytes / m.allreduce_bw
      t_step = t_compute + t_comm
      effective = f_step / t_step / (m.chips * m.peak_bf16)
      lines.append(f"| {run.name} | {m.name} | {m.mesh} | {m.chips * m.peak_bf16 / 1e15:.1f} "
                   f"PFLOP/s | {t_compute * 1e3:.1f} ms | {t_comm * 1e3:.1f} ms | "
                   f"{t_step * 1e3:.1f} ms | {effective:.0%} | {fmt_time(t_step * run.steps)} |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tokens", type=int, default=25_000, help="tokens per side per step")
  parser.add_argument("--length", type=int, default=32, help="padded row length")
  parser.add_argument("--mfu", type=float, default=0.4, help="MFU of the matmuls")
  args = parser.parse_args()
  print(report(args.tokens, args.length, args.mfu))


if __name__ == "__main__":
  main()
