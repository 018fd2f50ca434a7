"""Labeled bracket precision, recall and F1 as EVALB computes them with COLLINS.prm (Table 4).

The conventions (Sekine & Collins' EVALB, parameter file COLLINS.prm, as parsing papers report):
- words whose gold POS tag is punctuation (`` '' . : ,) are deleted from both trees before
  spans are counted; a bracket left spanning no word is not counted (EVALB's "zero element").
  The gold tree's tags decide for both trees, as when EVALB scores an XX-tagged output with the
  gold tags copied in (the parser predicts no POS tags, treebank.py);
- TOP (the root) and POS-level (preterminal) brackets are not scored, nor `-NONE-`;
- labels are cut at the first '-' or '=' (`NP-SBJ` -> `NP`), and ADVP and PRT are one label;
- brackets match as multisets of (label, start, end): two identical unary brackets in the gold
  tree need two in the output;
- precision = matched / output brackets and recall = matched / gold brackets, each summed over
  the corpus before dividing (corpus level), F1 their harmonic mean; exact match = the share of
  sentences whose bracket multisets are equal. All in percent;
- `brackets_per_span` {k: [gold, output]}: how many spans carry k scored brackets in each (k > 1:
  a unary chain of k phrases, or brackets that differ only by punctuation), where an output's
  over-bracketing shows (not an EVALB number).
A sentence whose output has other words than the gold tree is an EVALB "error sentence": left
out of every count and reported as `length_mismatch` (delinearized outputs never are). As
EVALB's second summary, `le40` holds the same scores over the sentences of at most 40 words
(EVALB counts every word but `-NONE-` for length, punctuation included).

`paired_bootstrap` compares two parsers' trees on the same sentences as sacreBLEU compares two
translations (`--compare`): resampled sentences, the same p-value definition and seed.

`evaluate_parses` is how the parsing task scores decoded skeletons: it makes them trees
(repair.delinearize, counting `repaired`), scores them, and returns the tree texts.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
from sacrebleu.significance import estimate_ci

from transformer_jax.tasks.parsing import repair, treebank
from transformer_jax.tasks.parsing.treebank import nltk  # loaded at its first use

PUNCTUATION_TAGS = frozenset({"``", "''", ".", ":", ","})  # COLLINS.prm DELETE_LABEL (words)
UNSCORED_LABELS = frozenset({"TOP", "ROOT", "", "-NONE-"})  # DELETE_LABEL (brackets)
EQUIVALENT_LABELS = {"PRT": "ADVP"}                         # EQ_LABEL ADVP PRT
SHORT_SENTENCE = 40  # EVALB's second summary: sentences of at most this many words


@dataclasses.dataclass
class Counts:
  """Sums over a corpus."""
  matched: int = 0
  gold: int = 0
  test: int = 0
  exact: int = 0
  sentences: int = 0
  length_mismatch: int = 0
  gold_stacks: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  test_stacks: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  def add(self, other: "Counts") -> None:
    for f in dataclasses.fields(self):
      setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

  def scores(self) -> dict:
    p = 100.0 * self.matched / self.test if self.test else 0.0
    r = 100.0 * self.matched / self.gold if self.gold else 0.0
    return {"f1": 2 * p * r / (p + r) if p + r else 0.0, "precision": p, "recall": r,
            "exact_match": 100.0 * self.exact / self.sentences if self.sentences else 0.0,
            "matched_brackets": self.matched, "gold_brackets": self.gold,
            "test_brackets": self.test, "scored_sentences": self.sentences,
            "length_mismatch": self.length_mismatch,
            "brackets_per_span": {str(k): [self.gold_stacks[k], self.test_stacks[k]]
                                  for k in sorted(self.gold_stacks | self.test_stacks)}}


def _stacks(brackets_: collections.Counter) -> collections.Counter:
  """{k: the spans carrying k of these brackets}."""
  spans = collections.Counter()
  for (_, start, end), n in brackets_.items():
    spans[(start, end)] += n
  return collections.Counter(spans.values())


def _label(label: str) -> str:
  cut = label if label.startswith("-") else treebank.strip_label(label)
  return EQUIVALENT_LABELS.get(cut, cut)


def brackets(tree: nltk.Tree, deleted: Sequence[bool]) -> collections.Counter:
  """The multiset of scored (label, start, end) brackets; `deleted[i]`: word i is punctuation."""
  kept_before = [0]
  for d in deleted:
    kept_before.append(kept_before[-1] + (not d))
  out = collections.Counter()

  def walk(node, start: int) -> int:  # returns the end (in words) of `node`
    if isinstance(node, str):
      return start + 1
    end = start
    for kid in node:
      end = walk(kid, end)
    label = _label(node.label())
    if (node is not tree and not treebank.is_preterminal(node) and label not in UNSCORED_LABELS
        and kept_before[start] < kept_before[end]):
      out[(label, kept_before[start], kept_before[end])] += 1
    return end
  walk(tree, 0)
  return out


def sentence_counts(gold: nltk.Tree, test: nltk.Tree) -> Counts:
  """One sentence's counts (the output's words must be the gold tree's)."""
  if gold.leaves() != test.leaves():
    return Counts(length_mismatch=1)
  deleted = [tag in PUNCTUATION_TAGS for _, tag in gold.pos()]
  g, t = brackets(gold, deleted), brackets(test, deleted)
  matched = sum((g & t).values())
  return Counts(matched, sum(g.values()), sum(t.values()), int(g == t), 1,
                gold_stacks=_stacks(g), test_stacks=_stacks(t))


def score_trees(golds: Sequence[nltk.Tree], tests: Sequence[nltk.Tree]) -> dict:
  """Corpus-level scores of output trees against gold trees (module docstring)."""
  if len(golds) != len(tests):
    raise ValueError(f"{len(golds)} gold trees but {len(tests)} output trees")
  total, short = Counts(), Counts()
  for g, t in zip(golds, tests):
    counts = sentence_counts(g, t)
    total.add(counts)
    if len(g.leaves()) <= SHORT_SENTENCE:
      short.add(counts)
  return dict(total.scores(), le40=short.scores())


def paired_bootstrap(golds: Sequence[nltk.Tree], baseline: Sequence[nltk.Tree],
                     system: Sequence[nltk.Tree], *, samples: int = 1000, seed: int = 12345) -> dict:
  """Paired bootstrap of `system`'s corpus F1 against `baseline`'s on the same gold trees, as
  sacreBLEU's `paired_bs` test (Moses' bootstrap-hypothesis-difference-significance): `samples`
  resamplings of the sentences with replacement; p = (1 + #resamples whose centred |difference|
  exceeds the observed one) / (samples + 1). Returns {'f1': {baseline, system, delta, p_value,
  system_mean, system_ci (half-width of the 95% interval, as sacreBLEU)}}."""
  if not len(golds) == len(baseline) == len(system):
    raise ValueError(f"paired bootstrap needs one tree per gold tree ({len(golds)}); got "
                     f"{len(baseline)} baseline and {len(system)} system trees")
  stats = []
  for trees_ in (baseline, system):
    counts = [sentence_counts(g, t) for g, t in zip(golds, trees_)]
    stats.append(np.array([[c.matched, c.gold, c.test] for c in counts], dtype=np.float64))
  f1 = lambda m, g, t: np.where(g + t > 0, 200.0 * m / np.maximum(g + t, 1e-9), 0.0)  # noqa: E731
  idx = np.random.default_rng(seed).choice(len(golds), size=(samples, len(golds)), replace=True)
  base_s, sys_s = (f1(*st[idx].sum(axis=1).T) for st in stats)
  base_f1, sys_f1 = (float(f1(*st.sum(axis=0))) for st in stats)
  diffs = np.abs(sys_s - base_s)
  p = (np.sum(diffs - diffs.mean() > abs(sys_f1 - base_f1)) + 1) / (samples + 1)
  mean, ci = estimate_ci(sys_s)
  return {"f1": {"baseline": base_f1, "system": sys_f1, "delta": sys_f1 - base_f1,
                 "p_value": float(p), "system_mean": float(mean), "system_ci": float(ci)}}


def evaluate_parses(sources: Sequence[str], skeletons: Sequence[str],
                    references: Sequence[str], leaves: str = "xx") -> tuple[dict, list[str]]:
  """(report, output tree texts) for decoded linearizations of `sources` against the gold tree
  texts `references`: the scores, `repaired` (outputs that needed the repair rule) and
  `sentences`."""
  parsed = [repair.delinearize(s, w, leaves) for s, w in zip(skeletons, sources)]
  report = score_trees([nltk.Tree.fromstring(r) for r in references], [p.tree for p in parsed])
  report.update(repaired=sum(p.repaired for p in parsed), sentences=len(parsed))
  return report, [p.text for p in parsed]
