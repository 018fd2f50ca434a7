"""Where a compiled train step's time goes: HLO statistics and a categorised profile.

`hlo_statistics` counts what XLA made of the step (library dot fusions, Eigen dots, loop fusions
that transpose and the bytes they write, while loops, copies). `profile_step` runs steps under
`jax.profiler` and splits the executor's busy time over categories of operations, by the source
each operation came from (its op_name metadata: the einsum of the QK^T product, the FFN, dropout,
the loss, ...).
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
import numpy as np

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


def _entry_instructions(hlo_text: str) -> dict:
  """name -> (opcode[:fusion kind], shape, op_name, called computation) of the entry computation."""
  out, in_entry = {}, False
  for line in hlo_text.splitlines():
    if line.startswith("ENTRY"):
      in_entry = True
      continue
    if in_entry and line.startswith("}"):
      break
    m = re.match(r"\s+(?:ROOT )?%([\w.\-]+) = ", line) if in_entry else None
    if m:
      name, rest = m.group(1), line[m.end():]
      if rest.startswith("("):  # a tuple shape: up to its matching parenthesis
        depth = 0
        for i, ch in enumerate(rest):
          depth += {"(": 1, ")": -1}.get(ch, 0)
          if depth == 0:
            break
        shape, rest = rest[:i + 1], rest[i + 1:].lstrip()
      else:
        shape, _, rest = rest.partition(" ")
      op = re.match(r"([\w\-]+)\(", rest)
      if not op:
        continue
      opcode = op.group(1)
      kind = re.search(r"kind=(k\w+)", line)
      op_name = re.search(r'op_name="([^"]+)"', line)
      calls = re.search(r"calls=%([\w.\-]+)", line)
      out[name] = (opcode + (":" + kind.group(1) if kind else ""), shape,
                   op_name.group(1) if op_name else "", calls.group(1) if calls else None)
  return out


def _computations(hlo_text: str) -> dict:
  comps, cur = {}, None
  for line in hlo_text.splitlines():
    m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if m and not line.startswith(" "):
      cur = comps.setdefault(m.group(1), [])
    elif cur is not None and line.startswith("  "):
      cur.append(line)
  return comps


def _array_bytes(shape: str) -> int:
  m = re.match(r"(\w+)\[([\d,]*)\]", shape)
  if not m:
    return 0
  size = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "f64": 8, "s64": 8}.get(m.group(1), 4)
  return size * int(np.prod([int(d) for d in m.group(2).split(",") if d] or [1]))


def hlo_statistics(hlo_text: str) -> dict:
  """Counts in the compiled step: library (YNNPACK) dot fusions, Eigen dots, loop fusions that
  transpose (and the bytes they write), while loops (threefry's rolled rounds on CPU), copies."""
  comps, entry = _computations(hlo_text), _entry_instructions(hlo_text)
  stats = {"library_dot_fusions": 0, "library_other_fusions": 0, "eigen_dots": 0,
           "loop_fusions": 0, "transposing_fusions": 0, "transposed_bytes": 0, "while_loops": 0,
           "copies": 0, "copied_bytes": 0}
  for opcode, shape, _, calls in entry.values():
    body = comps.get(calls, []) if calls else []
    if opcode == "fusion:kCustom":
      key = "library_dot_fusions" if any(" dot(" in b for b in body) else "library_other_fusions"
      stats[key] += 1
    elif opcode.startswith("fusion"):
      stats["loop_fusions"] += 1
      if any(re.search(r"\s(transpose|copy)\(", b) for b in body):
        stats["transposing_fusions"] += 1
        stats["transposed_bytes"] += _array_bytes(shape)
    elif opcode == "dot":
      stats["eigen_dots"] += 1
    elif opcode == "while":
      stats["while_loops"] += 1
    elif opcode == "copy":
      stats["copies"] += 1
      stats["copied_bytes"] += _array_bytes(shape)
  return stats


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
  text = compiled.as_text()
  entry, comps = _entry_instructions(text), _computations(text)

  def transposes(name):
    opcode, _, _, calls = entry[name]
    if opcode == "copy" or opcode == "transpose":
      return True
    return opcode == "fusion:kLoop" and any(re.search(r"\s(transpose|copy)\(", b)
                                            for b in comps.get(calls, []))

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
    op_name = entry[e["name"]][2]
    c = cats[category(op_name, transposes(e["name"]))]
    c["share"] += share[i] / busy
    c["backward" if "transpose(jvp" in op_name else "forward"] += share[i] / busy
  ordered = dict(sorted(cats.items(), key=lambda kv: -kv[1]["share"]))
  return state, ordered, busy / 1e6 / steps
