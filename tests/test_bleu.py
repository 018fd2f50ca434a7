"""BLEU: sacreBLEU on detokenized text and the paper-compatible tokenized BLEU."""

from __future__ import annotations

import collections
import math
import os
import random

import pytest

from tests.common import DATA_DIR, requires_data
from transformer_jax.tasks.translation import bleu


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
  assert "nc:6" in report["chrf_signature"] and "tok:tercom" in report["ter_signature"]
  assert 0 < report["chrf"] < 100 and report["ter"] > 0


def test_paired_bootstrap_finds_the_known_winner():
  rng = random.Random(1)
  words = "ein mann eine frau zwei hunde spielen im schnee park fährt rad liest buch".split()
  refs = [" ".join(rng.choices(words, k=rng.randint(5, 12))) for _ in range(200)]
  good = [" ".join(w if rng.random() > 0.1 else "x" for w in r.split()) for r in refs]
  bad = [" ".join(w if rng.random() > 0.5 else "x" for w in r.split()) for r in refs]
  better = bleu.paired_bootstrap(bad, good, refs)
  assert better["bleu"]["delta"] > 10 and better["bleu"]["p_value"] < 0.01
  assert better["chrf"]["delta"] > 5 and better["chrf"]["p_value"] < 0.01
  assert "bs:1000" in better["bleu"]["signature"]
  # Two systems of the same quality (independent noise at the same rate): not significant.
  twin = [" ".join(w if rng.random() > 0.1 else "x" for w in r.split()) for r in refs]
  same = bleu.paired_bootstrap(good, twin, refs)
  assert abs(same["bleu"]["delta"]) < 3 and same["bleu"]["p_value"] > 0.05
  # Seeded as sacreBLEU seeds it: the same inputs give the same p-values.
  assert bleu.paired_bootstrap(bad, good, refs) == better
  with pytest.raises(ValueError):
    bleu.paired_bootstrap(bad[:-1], good, refs)


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


def _newstest_pairs(n=40):
  """The first n references of newstest2013 (de) and 'hypotheses' made from them: every fifth
  word dropped, ASCII quotes and apostrophes curled, '...' as '…', a full-width comma in every
  seventh line, so that each step of get_ende_bleu.sh has work to do."""
  import gzip  # pylint: disable=g-import-not-at-top
  with gzip.open(os.path.join(DATA_DIR, "wmt14", "newstest2013.de.gz"), "rt", encoding="utf-8") as f:
    refs = [next(f).rstrip("\n") for _ in range(n)]

  def hyp(i, r):
    words = [w for j, w in enumerate(r.split()) if (j + i) % 5 != 3]
    s = " ".join(words).replace('"', "\u201d").replace("...", "\u2026").replace("'", "\u2019")
    return s.replace(",", "\uff0c", 1) if i % 7 == 0 else s
  return [hyp(i, r) for i, r in enumerate(refs)], refs


@requires_data
def test_tokenized_bleu_equals_the_t2t_perl_pipeline_on_newstest():
  """Known output of tensor2tensor's get_ende_bleu.sh, run with the Moses scripts (mosesdecoder
  at 34452895f) on _newstest_pairs():
    replace-unicode-punctuation.perl < hyps | tokenizer.perl -l de -q | perl -ple ATAT > h
    tokenizer.perl -l de -q < refs | perl -ple ATAT > r      (the tokenized reference file)
    multi-bleu.perl r < h  ->  BLEU = 49.30, 100.0/79.8/58.0/35.7 (BP=0.773, ratio=0.796)
  and sha256 of the files h and r as below."""
  import hashlib  # pylint: disable=g-import-not-at-top
  hyps, refs = _newstest_pairs()
  digest = lambda lines: hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest()  # noqa: E731
  assert digest([bleu.paper_tokenize(h, "de") for h in hyps]) == (
      "2364d27adc8635de13f0990fca852c94dbca13bd8738a40e26b3f27e77c53721")
  assert digest([bleu.paper_tokenize(r, "de") for r in refs]) == (
      "5d00d6ef3ab03e5914472b768303a430b5e18f8e5661e469daba42ec49b84b8e")
  score = bleu.tokenized_bleu(hyps, refs, "de")
  assert round(score["score"], 2) == 49.30 and round(score["bp"], 3) == 0.773
  assert [round(p, 1) for p in score["precisions"]] == [100.0, 79.8, 58.0, 35.7]
  # The script's own mode: an already tokenized reference file, only compound-split here.
  tokenized_refs = [bleu.moses_tokenize(r, "de") for r in refs]
  assert bleu.tokenized_bleu(hyps, None, "de", tokenized_references=tokenized_refs)["score"] == (
      pytest.approx(score["score"], abs=1e-9))
