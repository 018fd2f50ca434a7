"""The report section of rows that change only the attention heads, ordered by head width.

Named in `report_sections` by this study's sweep and by Table 3's (rows A and B): it shows
whether dev perplexity follows the number of heads h or the width d_k of each.
"""

from __future__ import annotations

from experiments.harness.report import ours
from transformer_jax.runtime import markdown
from transformer_jax.runtime.dotted import flatten

HEAD_KEYS = ("model.num_heads", "model.d_k", "model.d_v")


def by_head_width(sweep, rows: list[dict]) -> list[dict]:
  """The rows that change only h, d_k and d_v, and base, ordered by the d_k they ran at (then
  h); empty unless they ran at two d_k or more (rows without results left out)."""
  picked = [r for r in rows if r["hparams"] and r["ppl"]["n"]
            and set(flatten(sweep.rows[r["row"]].overrides)) <= set(HEAD_KEYS)]
  if len({r["hparams"]["d_k"] for r in picked}) < 2:
    return []
  return sorted(picked, key=lambda r: (r["hparams"]["d_k"], r["hparams"]["h"]))


def sections(sweep, rows: list[dict], scale_name: str) -> tuple[list[str], dict]:
  """(Markdown lines, JSON entries) of the report: the head rows by their per-head width."""
  del scale_name  # every scale's report shows its own rows the same way
  widths = by_head_width(sweep, rows)
  record = {"by_head_width": [{"d_k": r["hparams"]["d_k"], "row": r["row"]} for r in widths]}
  if not widths:
    return [], record
  return ["", "## By per-head width", "",
          "The rows that change only the attention heads (h, d_k, d_v) and base, ordered by the "
          "per-head key width d_k they ran at (at this scale): whether dev PPL follows the number "
          "of heads or the width of each.", "",
          markdown.table(["d_k", "row", "h", "d_v", "PPL ours", "BLEU ours"],
                         [[r["hparams"]["d_k"], r["label"], r["hparams"]["h"], r["hparams"]["d_v"],
                           ours(r, "ppl", 2), ours(r, "bleu", 1)] for r in widths])], record
