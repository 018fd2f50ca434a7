"""Where a compiled train step's time goes (`python -m benchmarks --profile`).

`profile_step` runs steps under `jax.profiler` and splits the executor's busy time over categories
of operations, by the source each operation came from (its op_name metadata in the compiled HLO:
the einsum of the QK^T product, the FFN, dropout, the loss, ...); copies, transposes and loop
fusions that transpose count as layout work.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile

import jax

_CATEGORIES = (  # (category, predicate on the op_name metadata); the first match wins
    ("dropout RNG + mask", lambda s: any(k in s for k in ("Dropout", "bernoulli", "_uniform",
                                                          "threefry", "random_bits", "fold_in"))),
    ("vocabulary projection (matmul)", lambda s: "vocab_projection" in s),
    ("attention QK^T and AV (matmul)", lambda s: "btnk,bsnk->bnts" in s or "bnts,bsnv->btnv" in s),
    ("attention Q/K/V/output projections (matmul)",
     lambda s: "projection/" in s),
    ("FFN (matmul)", lambda s: "/ffn/" in s and ("dot_general" in s or "/transpose" in s)),
    ("attention softmax + masks", lambda s: "attention" in s and any(
        k in s for k in ("softmax", "exp", "reduce_max", "select", "where", "div", "sub"))),
    ("LayerNorm", lambda s: "norm" in s.lower()),
    ("FFN bias + ReLU", lambda s: "/ffn/" in s),
    ("embedding + positions", lambda s: "embed" in s or "positional" in s),
    ("loss (log-softmax over the vocabulary)", lambda s: "Transformer" not in s and "jvp(" in s),
    ("optimizer (Adam) + gradient norm", lambda s: "Transformer" not in s and bool(s)),
)


_MOVES = re.compile(r"\s(transpose|copy)\(")  # an HLO instruction that moves data around


def _entry_instructions(hlo_text: str) -> dict:
  """name -> (op_name metadata, whether it transposes: a copy, a transpose, or a loop fusion
  holding one) of each instruction of the entry computation."""
  bodies, entry, current = {}, None, None
  for line in hlo_text.splitlines():
    head = re.match(r"(ENTRY )?%?([\w.\-]+) .*\{$", line)
    if head:
      current = bodies.setdefault(head.group(2), [])
      entry = head.group(2) if head.group(1) else entry
    elif current is not None and line.startswith("  "):
      current.append(line)
  out = {}
  for line in bodies.get(entry, []):
    name = re.match(r"\s+(?:ROOT )?%([\w.\-]+) = ", line)
    if name:
      op_name = re.search(r'op_name="([^"]+)"', line)
      calls = re.search(r"calls=%([\w.\-]+)", line)
      fused = "kind=kLoop" in line and calls and any(
          _MOVES.search(b) for b in bodies.get(calls.group(1), []))
      out[name.group(1)] = (op_name.group(1) if op_name else "",
                            bool(_MOVES.search(line) or fused))
  return out


def category(op_name: str, transposes: bool = False) -> str:
  if transposes:
    return "transposes / layout copies"
  for name, pred in _CATEGORIES:
    if pred(op_name):
      return name
  return "other"


def profile_step(compiled, state, batch, steps: int = 1):
  """Runs `steps` steps under jax.profiler and splits the executor's busy time over categories
  of the entry computation's thunks (by their op_name metadata; thunks running at the same time
  share each instant equally). Returns (state, {category: {'share', 'forward', 'backward'}},
  seconds of busy time per step)."""
  entry = _entry_instructions(compiled.as_text())
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(steps):
        state, m = compiled(state, batch)
        jax.block_until_ready((state, m))
    (path,) = glob.glob(os.path.join(tmp, "plugins", "profile", "*", "perfetto_trace.json.gz"))
    with gzip.open(path) as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  events = [e for e in events if e.get("ph") == "X" and e.get("name") in entry]
  bounds = collections.defaultdict(list)
  for i, e in enumerate(events):
    bounds[e["ts"]].append((1, i))
    bounds[e["ts"] + e["dur"]].append((-1, i))
  share = collections.Counter()
  active, prev = set(), None
  for t in sorted(bounds):
    if prev is not None and active:
      for i in active:
        share[i] += (t - prev) / len(active)
    for sign, i in bounds[t]:
      (active.add if sign > 0 else active.discard)(i)
    prev = t
  busy = sum(share.values()) or 1.0
  cats = collections.defaultdict(lambda: {"share": 0.0, "forward": 0.0, "backward": 0.0})
  for i, e in enumerate(events):
    op_name, transposes = entry[e["name"]]
    c = cats[category(op_name, transposes)]
    c["share"] += share[i] / busy
    c["backward" if "transpose(jvp" in op_name else "forward"] += share[i] / busy
  ordered = dict(sorted(cats.items(), key=lambda kv: -kv[1]["share"]))
  return state, ordered, busy / 1e6 / steps
