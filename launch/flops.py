"""Training FLOPs of the paper's base and big models, and projected wall time on TPU/GPU.

  python -m launch.flops                      # the tables of docs/scaling.md
  python -m launch.flops --mfu=0.3 --length=48

FLOPs come from `transformer_jax.training.metrics.train_flops` (3x the forward matmul FLOPs, padding
included) for a step of `--tokens` source and as many target tokens in rows of `--length`.
Projected step time = matmul time at `--mfu` + the data-parallel gradient all-reduce (float32,
ring: 2 (n-1)/n bytes per byte of gradient) at the stated bus bandwidth, not overlapped: a
conservative bound (XLA overlaps part of the all-reduce with the backward pass).
"""

from __future__ import annotations

import dataclasses

from absl import flags

from transformer_jax.runtime import cli, markdown
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import load_config_file
from transformer_jax.tools.params import count_params

_TOKENS = flags.DEFINE_integer("tokens", 25_000, "Tokens per side per step.", lower_bound=1)
_LENGTH = flags.DEFINE_integer("length", 32, "Padded row length.", lower_bound=1)
_MFU = flags.DEFINE_float("mfu", 0.4, "MFU of the matmuls.", lower_bound=0.0, upper_bound=1.0)

P100_SUSTAINED = 9.5e12  # the paper's assumed sustained fp32 FLOP/s of one P100 (Table 2 note)


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  config: str               # run-config file
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


RUNS = (Run("base", "configs/base.py", 100_000, 12.0, 0.4, 3.3e18),
        Run("big", "configs/big.py", 300_000, 84.0, 1.0, 2.3e19))
MACHINES = (
    # v5e: 197 TFLOP/s bf16, ICI 1600 Gbit/s per chip; ~100 GB/s effective for a 64-chip ring.
    Machine("TPU v5e-64", 64, 197e12, 100e9, "data=64 (16 hosts x 4 chips)"),
    Machine("TPU v5e-16", 16, 197e12, 100e9, "data=16 (4 hosts x 4 chips)"),
    # H100 SXM: 989 TFLOP/s dense bf16, NVLink 4 (450 GB/s per direction); NCCL ~350 GB/s.
    Machine("8x H100 SXM", 8, 989e12, 350e9, "data=8 (one host)"),
)


def model_config(spec: str) -> ModelConfig:
  return ModelConfig.from_config(load_config_file(spec).model)


def step_flops(cfg: ModelConfig, tokens: int, length: int) -> float:
  # JAX loads here: a flag mistake is reported before it.
  from transformer_jax.training.metrics import train_flops  # pylint: disable=g-import-not-at-top
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
  first, second, flops = [], [], {}
  for run in RUNS:
    cfg = model_config(run.config)
    f_step = step_flops(cfg, tokens, length)
    f_run = f_step * run.steps
    flops[run.name] = (cfg, f_step, f_run)
    paper_hw = run.paper_hours * 3600 * 8 * P100_SUSTAINED
    first.append([run.name, f"{count_params(cfg) / 1e6:.1f}M", f"{f_step:.2e}", f"{run.steps:,}",
                  f"{f_run:.2e}", f"{run.paper_flops:.1e} (= {run.paper_hours:g} h x 8 x 9.5e12 = "
                  f"{paper_hw:.2e})", f"{run.paper_flops / f_run:.1f}x", f"{f_run / paper_hw:.0%}",
                  f"{f_step / run.paper_step_s / 8 / 1e12:.1f} TFLOP/s"])
  for run in RUNS:
    cfg, f_step, _ = flops[run.name]
    grad_bytes = 4 * count_params(cfg)
    for m in MACHINES:
      t_compute = f_step / (m.chips * m.peak_bf16 * mfu)
      t_comm = 2 * (m.chips - 1) / m.chips * grad_bytes / m.allreduce_bw
      t_step = t_compute + t_comm
      effective = f_step / t_step / (m.chips * m.peak_bf16)
      second.append([run.name, m.name, m.mesh, f"{m.chips * m.peak_bf16 / 1e15:.1f} PFLOP/s",
                     f"{t_compute * 1e3:.1f} ms", f"{t_comm * 1e3:.1f} ms", f"{t_step * 1e3:.1f} ms",
                     f"{effective:.0%}", fmt_time(t_step * run.steps)])
  lines += [markdown.table(["model", "params", "FLOPs/step", "steps", "FLOPs/run (ours)",
                            "paper (Table 2)", "paper / ours", "implied P100 utilisation",
                            "paper's achieved FLOP/s per GPU"], first),
            markdown.table(["model", "machine", "mesh", "peak", "matmuls/step at MFU",
                            "grad all-reduce/step", "step (no overlap)", "effective MFU", "run"],
                           second).rstrip("\n")]
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  print(report(_TOKENS.value, _LENGTH.value, _MFU.value))


if __name__ == "__main__":
  cli.run(main, overrides=False)
