"""Translation metrics: sacreBLEU BLEU, chrF and TER; the paper's tokenized BLEU; significance.

1. sacreBLEU (Post 2018) on detokenized text: BLEU, chrF (character 6-grams, beta 2) and TER,
   each reported with its signature (e.g. `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|
   version:2.6.0`). These are the numbers comparable across papers.
2. The paper-compatible "tokenized BLEU", as tensor2tensor's `utils/get_ende_bleu.sh` computed
   the paper's Table 2 numbers. That script does, for the hypotheses:
     replace-unicode-punctuation.perl   -> sacremoses `MosesPunctNormalizer.replace_unicode_punct`
     tokenizer.perl -l de               -> sacremoses `MosesTokenizer(lang).tokenize(escape=True)`
     perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'   -> `split_compounds` (same regex semantics)
   and for the reference, an already tokenized file (t2t's `newstest2013.tok.de`), only the
   compound splitting; then `multi-bleu.perl reference < hypothesis`. `tokenized_bleu` does
   exactly that when given `tokenized_references`; given detokenized references (the usual case
   here) it runs them through the same three steps as the hypotheses. multi-bleu.perl is corpus
   BLEU-4 over whitespace tokens, case-sensitive, one reference, brevity penalty exp(1 - r/c) when
   c < r, no smoothing (a zero n-gram precision gives 0); sacreBLEU with `tokenize='none'`,
   `smooth_method='none'` and `force=True` computes exactly that, so it stands in for the script.
   Only sacreBLEU is comparable across papers; the tokenized score is usually higher (compound
   splitting adds matches).
3. Paired bootstrap resampling (Koehn 2004) between two systems on the same references, with
   sacreBLEU's own implementation (`sacrebleu.significance.PairedTest`, 1000 resamples): the
   p-value that the second system is not better than the first, for BLEU and chrF.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Sequence

from sacrebleu.metrics import BLEU, CHRF, TER

if TYPE_CHECKING:  # imported where used: half a second every training process does not need
  import sacremoses

_COMPOUND_RE = re.compile(r"(\S)-(\S)")
TOKENIZED_METHOD = ("t2t get_ende_bleu.sh: replace-unicode-punctuation + Moses tokenizer (sacremoses, "
                    "escape=True) + ##AT##-##AT## compound splitting, then BLEU-4 on whitespace "
                    "tokens (sacrebleu tokenize=none smooth=none force=True == multi-bleu.perl)")
BOOTSTRAP_SAMPLES = 1000


def split_compounds(text: str) -> str:
  """t2t's `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`: 'rich-text' -> 'rich ##AT##-##AT## text'.

  Matches do not overlap (Perl's and Python's /g scan alike), so 'a-b-c' becomes
  'a ##AT##-##AT## b-c', exactly as the Perl one-liner leaves it.
  """
  return _COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", text)


@functools.lru_cache(maxsize=None)
def _moses(lang: str) -> sacremoses.MosesTokenizer:
  import sacremoses  # pylint: disable=g-import-not-at-top,redefined-outer-name
  return sacremoses.MosesTokenizer(lang=lang)


def moses_tokenize(text: str, lang: str) -> str:
  """tokenizer.perl -l LANG (default options: HTML-escaping on, no aggressive dash splits)."""
  return _moses(lang).tokenize(text, return_str=True, escape=True)


@functools.lru_cache(maxsize=None)
def _punct() -> sacremoses.MosesPunctNormalizer:
  import sacremoses  # pylint: disable=g-import-not-at-top,redefined-outer-name
  return sacremoses.MosesPunctNormalizer()


def replace_unicode_punctuation(text: str) -> str:
  """replace-unicode-punctuation.perl: full-width and CJK punctuation, curly quotes, '…' -> ASCII."""
  return _punct().replace_unicode_punct(text)


def paper_tokenize(text: str, lang: str) -> str:
  """A hypothesis as get_ende_bleu.sh scores it: punctuation replaced, Moses-tokenized,
  compounds split."""
  return split_compounds(moses_tokenize(replace_unicode_punctuation(text), lang))


def _score_dict(score) -> dict:
  return {"score": score.score, "counts": list(score.counts), "totals": list(score.totals),
          "precisions": list(score.precisions), "bp": score.bp, "sys_len": score.sys_len,
          "ref_len": score.ref_len}


def sacrebleu_score(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[dict, str]:
  """sacreBLEU with its defaults on detokenized text: (score dict, signature string)."""
  metric = BLEU()
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return _score_dict(score), str(metric.get_signature())


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], target_lang: str, *,
                   tokenized_references: Sequence[str] | None = None) -> dict:
  """The paper-compatible score (t2t get_ende_bleu.sh); see the module docstring. With
  `tokenized_references` (an already tokenized reference file, as the script takes), those are
  only compound-split and `references` are not used."""
  hyps = [paper_tokenize(h, target_lang) for h in hypotheses]
  if tokenized_references is not None:
    refs = [split_compounds(r) for r in tokenized_references]
  else:
    refs = [paper_tokenize(r, target_lang) for r in references]
  if len(refs) != len(hyps):
    raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} tokenized references")
  metric = BLEU(tokenize="none", smooth_method="none", force=True)
  out = _score_dict(metric.corpus_score(hyps, [refs]))
  out["signature"] = str(metric.get_signature())
  out["method"] = TOKENIZED_METHOD
  return out


def bleu_report(hypotheses: Sequence[str], references: Sequence[str], target_lang: str, *,
                tokenized_references: Sequence[str] | None = None) -> dict:
  """Every metric for detokenized hypotheses against detokenized references (one per line).

  Returns {'sacrebleu', 'sacrebleu_signature', 'chrf', 'chrf_signature', 'ter',
  'ter_signature', 'tokenized_bleu', 'num_sentences', 'sacrebleu_detail', 'tokenized_detail'}
  where the details hold n-gram counts/totals, precisions, brevity penalty and lengths.
  """
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
  hyps, refs = list(hypotheses), [list(references)]
  sacre, signature = sacrebleu_score(hypotheses, references)
  chrf, ter = CHRF(), TER()
  tok = tokenized_bleu(hypotheses, references, target_lang,
                       tokenized_references=tokenized_references)
  return {"sacrebleu": sacre["score"], "sacrebleu_signature": signature,
          "chrf": chrf.corpus_score(hyps, refs).score, "chrf_signature": str(chrf.get_signature()),
          "ter": ter.corpus_score(hyps, refs).score, "ter_signature": str(ter.get_signature()),
          "tokenized_bleu": tok["score"], "num_sentences": len(hypotheses),
          "sacrebleu_detail": sacre, "tokenized_detail": tok}


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str], references: Sequence[str], *,
                     samples: int = BOOTSTRAP_SAMPLES) -> dict:
  """sacreBLEU's paired bootstrap test of `system` against `baseline` (same references).

  Returns {'bleu': {...}, 'chrf': {...}} with, per metric: 'baseline' and 'system' scores,
  'delta' (system - baseline), 'p_value' (the probability, under resampling, that the
  difference is due to chance; sacreBLEU's definition), the bootstrap 'system_mean' and
  'system_ci' (95%), and 'signature'. Resampling is seeded as sacreBLEU seeds it
  (SACREBLEU_SEED, default 12345), so a rerun gives the same p-values.
  """
  from sacrebleu.significance import PairedTest  # pylint: disable=g-import-not-at-top
  n = len(references)
  if len(baseline) != n or len(system) != n:
    raise ValueError(f"paired bootstrap needs one line per reference ({n}); got "
                     f"{len(baseline)} baseline and {len(system)} system lines")
  test = PairedTest([("baseline", list(baseline)), ("system", list(system))],
                    {"bleu": BLEU(), "chrf": CHRF()}, [list(references)],
                    test_type="bs", n_samples=samples)
  signatures, results = test()
  out = {}
  for name, key in (("BLEU", "bleu"), ("chrF2", "chrf")):
    base, sys_ = results[name]
    out[key] = {"baseline": float(base.score), "system": float(sys_.score),
                "delta": float(sys_.score - base.score), "p_value": float(sys_.p_value),
                "system_mean": float(sys_.mean), "system_ci": float(sys_.ci),
                "signature": str(signatures[name])}
  return out
