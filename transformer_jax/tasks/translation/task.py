"""Translation as a task: splits are aligned parallel text, outputs are scored by sacreBLEU
BLEU, chrF and TER and the paper's tokenized BLEU (bleu.py), the search is free."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from transformer_jax.data import sources
from transformer_jax.runtime import markdown
from transformer_jax.tasks import base
from transformer_jax.tasks.translation import bleu


class Translation(base.Task):
  """Source sentences -> target sentences (data.dataset: a TFDS name or local text files)."""

  name = "translation"
  dev_metrics = (("bleu", "sacrebleu"), ("chrf", "chrf"), ("bleu_tokenized", "tokenized_bleu"))
  score_name = "sacreBLEU"

  def read_split(self, config, split: str) -> sources.SplitSource:
    return sources.parallel_text_split(config, split)

  def score(self, config, sources_, outputs, references, tokenized_references=None):
    del sources_
    return (bleu.bleu_report(outputs, references, config.data.target_lang,
                             tokenized_references=tokenized_references), list(outputs))

  def compare(self, baseline, outputs, references) -> dict:
    return bleu.paired_bootstrap(baseline, outputs, references)

  def report_line(self, report: Mapping[str, Any]) -> str:
    if "sacrebleu" not in report:
      return ""
    return (f", sacreBLEU {report['sacrebleu']:.2f} ({report['sacrebleu_signature']}), chrF "
            f"{report['chrf']:.2f}, tokenized BLEU {report['tokenized_bleu']:.2f}")

  def summary_table(self, reports: Sequence[Mapping[str, Any]]) -> str:
    header = ["set", "step", "sentences", "perplexity", "sacreBLEU", "chrF", "TER",
              "tokenized BLEU", "sent/s"]
    rows = [[r["set"], r["step"], r.get("sentences"), r["perplexity"], r.get("sacrebleu"),
             r.get("chrf"), r.get("ter"), r.get("tokenized_bleu"), r.get("sentences_per_second")]
            for r in reports]
    return markdown.table(header, rows)


TASK = Translation()
