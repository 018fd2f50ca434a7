"""BLEU two ways, side by side.

1. sacreBLEU (Post 2018) on detokenized text: the comparable number, reported with its
   signature (e.g. `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`).
2. The paper-compatible "tokenized BLEU", as tensor2tensor's `utils/get_ende_bleu.sh` computed the
   numbers of the paper's Table 2:
     tokenizer.perl -l de              -> sacremoses `MosesTokenizer(lang).tokenize(escape=True)`
     perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'   -> `split_compounds` (same regex semantics)
     multi-bleu.perl reference < hypothesis
   on both the hypotheses and the references. multi-bleu.perl is corpus BLEU-4 over
   whitespace-split tokens, case-sensitive, single reference, brevity penalty exp(1 - r/c) when
   c < r, no smoothing (any zero n-gram precision gives 0). sacreBLEU with `tokenize='none'`
   (whitespace split), `smooth_method='none'` and `force=True` (it would otherwise warn about
   tokenized input) computes exactly that, so it stands in for the Perl script here.

The tokenized score is typically ~1 BLEU above sacreBLEU on WMT14 En-De (compound splitting
alone adds matches); only sacreBLEU is comparable across papers.
"""

from __future__ import annotations

import functools
import re
from typing import Sequence

import sacremoses
from sacrebleu.metrics import BLEU

_COMPOUND_RE = re.compile(r"(\S)-(\S)")
TOKENIZED_METHOD = ("sacremoses MosesTokenizer(lang, escape=True) + ##AT##-##AT## compound "
                    "splitting (t2t get_ende_bleu.sh), then BLEU-4 on whitespace tokens "
                    "(sacrebleu tokenize=none smooth=none force=True == multi-bleu.perl)")


def split_compounds(text: str) -> str:
  """t2t's `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`: 'rich-text' -> 'rich ##AT##-##AT## text'.

  Matches do not overlap (Perl's and Python's /g scan alike), so 'a-b-c' becomes
  'a ##AT##-##AT## b-c', exactly as the Perl one-liner leaves it.
  """
  return _COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", text)


@functools.lru_cache(maxsize=None)
def _moses(lang: str) -> sacremoses.MosesTokenizer:
  return sacremoses.MosesTokenizer(lang=lang)


def moses_tokenize(text: str, lang: str) -> str:
  """tokenizer.perl -l LANG (default options: HTML-escaping on, no aggressive dash splits)."""
  return _moses(lang).tokenize(text, return_str=True, escape=True)


def paper_tokenize(text: str, lang: str) -> str:
  """The text as get_ende_bleu.sh scores it: Moses-tokenized, compounds split."""
  return split_compounds(moses_tokenize(text, lang))


def _score_dict(score) -> dict:
  return {"score": score.score, "counts": list(score.counts), "totals": list(score.totals),
          "precisions": list(score.precisions), "bp": score.bp, "sys_len": score.sys_len,
          "ref_len": score.ref_len}


def sacrebleu_score(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[dict, str]:
  """sacreBLEU with its defaults on detokenized text: (score dict, signature string)."""
  metric = BLEU()
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return _score_dict(score), str(metric.get_signature())


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], target_lang: str) -> dict:
  """The paper-compatible score (t2t get_ende_bleu.sh); see the module docstring."""
  hyps = [paper_tokenize(h, target_lang) for h in hypotheses]
  refs = [paper_tokenize(r, target_lang) for r in references]
  metric = BLEU(tokenize="none", smooth_method="none", force=True)
  out = _score_dict(metric.corpus_score(hyps, [refs]))
  out["signature"] = str(metric.get_signature())
  out["method"] = TOKENIZED_METHOD
  return out


def bleu_report(hypotheses: Sequence[str], references: Sequence[str], target_lang: str) -> dict:
  """Both scores for detokenized hypotheses against detokenized references (one per line).

  Returns {'sacrebleu': float, 'sacrebleu_signature': str, 'tokenized_bleu': float,
  'num_sentences': int, 'sacrebleu_detail': {...}, 'tokenized_detail': {...}} where the details
  hold n-gram counts/totals, precisions, brevity penalty and lengths.
  """
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  sacre, signature = sacrebleu_score(hypotheses, references)
  tok = tokenized_bleu(hypotheses, references, target_lang)
  return {"sacrebleu": sacre["score"], "sacrebleu_signature": signature,
          "tokenized_bleu": tok["score"], "num_sentences": len(hypotheses),
          "sacrebleu_detail": sacre, "tokenized_detail": tok}


def format_report(report: dict) -> str:
  """One line for logs: 'sacreBLEU 27.31 (signature) | tokenized BLEU 28.02 | n=3003'."""
  return (f"sacreBLEU {report['sacrebleu']:.2f} ({report['sacrebleu_signature']}) | "
          f"tokenized BLEU {report['tokenized_bleu']:.2f} | n={report['num_sentences']}")

