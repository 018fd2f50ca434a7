"""BLEU: sacreBLEU on detokenized text and the paper-compatible tokenized BLEU."""

from __future__ import annotations

import collections
import math
import random

import pytest

from transformer_jax import bleu


def multi_bleu_perl(hypotheses, references):
  """multi-bleu.perl's arithmetic (single reference, case-sensitive) on whitespace tokens."""
  correct, total = [0] * 4, [0] * 4
  hyp_len = ref_len = 0
  for hyp, ref in zip(hypotheses, references):
    h, r = hyp.split(), ref.split()
    hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
    for n in range(1, 5):
      h_ngrams = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
      r_ngrams = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
      correct[n - 1] += sum(min(c, r_ngrams[g]) for g, c in h_ngrams.items())
      total[n - 1] += max(len(h) - n + 1, 0)
  if min(correct) == 0:
    return 0.0
  log_precision = sum(math.log(c / t) for c, t in zip(correct, total)) / 4
  bp = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
  return 100 * bp * math.exp(log_precision)


def test_identical_text_scores_100():
  refs = ["Das ist ein kleiner Test.", "Die E-Mail-Adresse ist \"falsch\" & alt."]
  report = bleu.bleu_report(refs, refs, "de")
  assert report["sacrebleu"] == pytest.approx(100.0)
  assert report["tokenized_bleu"] == pytest.approx(100.0)
  assert report["num_sentences"] == 2


def test_known_values():
  # All n-grams match, hypothesis 4 tokens against 5: BLEU = exp(1 - 5/4).
  report = bleu.bleu_report(["a b c d"], ["a b c d e"], "en")
  assert report["sacrebleu"] == pytest.approx(100 * math.exp(-0.25), abs=1e-6)
  assert report["tokenized_bleu"] == pytest.approx(77.880078, abs=1e-5)
  # No 4-gram match: multi-bleu.perl gives 0; sacreBLEU's default exp smoothing does not.
  report = bleu.bleu_report(["a b c e"], ["a b c d"], "en")
  assert report["tokenized_bleu"] == 0.0
  assert report["sacrebleu"] > 0.0
  assert report["tokenized_detail"]["counts"] == [3, 2, 1, 0]
  assert report["tokenized_detail"]["totals"] == [4, 3, 2, 1]


def test_compound_splitting():
  assert bleu.split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
  assert (bleu.split_compounds("Rich-Text-Datei") ==
          "Rich ##AT##-##AT## Text ##AT##-##AT## Datei")
  assert bleu.split_compounds("a - b -c d-") == "a - b -c d-"  # no word character on a side
  assert bleu.split_compounds("a-b-c") == "a ##AT##-##AT## b-c"  # as Perl's /g: no overlap
  assert (bleu.paper_tokenize("Die E-Mail kam, sagte \"Müller\" & Co.", "de") ==
          "Die E ##AT##-##AT## Mail kam , sagte &quot; Müller &quot; &amp; Co.")


def test_signatures_present():
  report = bleu.bleu_report(["Hello world ."], ["Hello there world ."], "en")
  sig = report["sacrebleu_signature"]
  assert "tok:13a" in sig and "smooth:exp" in sig and "version:" in sig and "nrefs:1" in sig
  assert "tok:none" in report["tokenized_detail"]["signature"]
  assert "smooth:none" in report["tokenized_detail"]["signature"]
  assert "sacreBLEU" in bleu.format_report(report)


def test_tokenized_bleu_equals_multi_bleu_arithmetic():
  rng = random.Random(0)
  words = "der die das Haus-Tür , . \" & Katze E-Mail sagte ja nein 3,5 Prozent".split()
  refs = [" ".join(rng.choices(words, k=rng.randint(3, 15))) for _ in range(40)]
  hyps = [" ".join(w for w in r.split() if rng.random() > 0.2) + " ja" for r in refs]
  tok_hyps = [bleu.paper_tokenize(h, "de") for h in hyps]
  tok_refs = [bleu.paper_tokenize(r, "de") for r in refs]
  expected = multi_bleu_perl(tok_hyps, tok_refs)
  assert 0 < expected < 100
  assert bleu.tokenized_bleu(hyps, refs, "de")["score"] == pytest.approx(expected, abs=1e-9)


def test_length_mismatch_raises():
  with pytest.raises(ValueError):
    bleu.bleu_report(["a"], ["a", "b"], "en")
