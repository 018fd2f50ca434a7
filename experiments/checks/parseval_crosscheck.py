"""Cross-checks transformer_jax/tasks/parsing/parseval.py against PYEVALB (PyPI `PYEVALB` 0.1.3, a Python EVALB).

  pip install PYEVALB==0.1.3
  TRANSFORMER_JAX_DATA_DIR=../shared/data python -m experiments.checks.parseval_crosscheck

Test trees: each sample tree's linearization with 15% of its bracket tokens deleted (seeded),
delinearized (repaired) with its words. PYEVALB implements fewer of COLLINS.prm's conventions: no
punctuation deletion, no ADVP = PRT, brackets matched as a set (and the root scored). So both
scorers see the trees with those conventions applied beforehand: punctuation words removed
(gold tags), PRT relabeled ADVP, TOP removed; identical unary brackets (NP over NP after
-NONE- removal) are then the only difference left, and are counted. Prints both corpus F1s.
"""

from __future__ import annotations

import os
import random

import nltk

from transformer_jax.runtime import cli
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.tasks.parsing import parseval, repair, treebank as trees


def _conventions_applied(tree: nltk.Tree, deleted: list[bool]) -> nltk.Tree | None:
  """The tree without punctuation words (deleted[i]) and with PRT as ADVP."""
  position = iter(range(len(deleted)))

  def walk(node):
    if trees.is_preterminal(node):
      return None if deleted[next(position)] else node.copy(deep=True)
    kids = [k for k in (walk(c) for c in node) if k is not None]
    return nltk.Tree(parseval.EQUIVALENT_LABELS.get(node.label(), node.label()), kids) if kids else None
  return walk(tree)


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    from PYEVALB import scorer as pyevalb_scorer  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError("PYEVALB is not installed: pip install PYEVALB==0.1.3") from None
  folder = os.path.join(os.environ.get("TRANSFORMER_JAX_DATA_DIR", "../shared/data"),
                        "ptb-sample", "combined")
  examples = trees.read_examples(tuple(trees.select_files(folder, "wsj_0001-wsj_0179", "sample")))
  rng = random.Random(0)
  golds, tests = [], []
  for ex in examples:
    tokens = [t for t in ex.linearized.split() if not (t[0] in "()" and rng.random() < 0.15)]
    golds.append(nltk.Tree.fromstring(ex.tree))
    tests.append(repair.delinearize(" ".join(tokens), ex.words).tree)
  ours = parseval.score_trees(golds, tests)
  print(f"parseval.py (COLLINS.prm) on {len(golds)} trees: F1 {ours['f1']:.4f} P "
        f"{ours['precision']:.4f} R {ours['recall']:.4f} exact {ours['exact_match']:.2f}")
  g2, t2, duplicates = [], [], 0
  for g, t in zip(golds, tests):
    deleted = [tag in parseval.PUNCTUATION_TAGS for _, tag in g.pos()]
    if all(deleted):
      continue
    g, t = _conventions_applied(g, deleted), _conventions_applied(t, deleted)
    if (len(g) != 1 or len(t) != 1 or trees.is_preterminal(g[0])
        or trees.is_preterminal(t[0])):  # PYEVALB scores the root: single-rooted trees only
      continue
    g2.append(g[0])
    t2.append(t[0])
    no_deletion = [False] * len(g.leaves())
    duplicates += sum(c - 1 for c in parseval.brackets(g, no_deletion).values() if c > 1)
  ours2 = parseval.score_trees([nltk.Tree("TOP", [g]) for g in g2], [nltk.Tree("TOP", [t]) for t in t2])
  results = pyevalb_scorer.Scorer().score_corpus(
      [g.pformat(margin=10**9) for g in g2], [t.pformat(margin=10**9) for t in t2])
  matched = sum(r.matched_brackets for r in results)
  gold = sum(r.gold_brackets for r in results)
  test = sum(r.test_brackets for r in results)
  p, r = 100 * matched / test, 100 * matched / gold
  differ = [i for i, res in enumerate(results) if res.matched_brackets != parseval.sentence_counts(
      nltk.Tree("TOP", [g2[i]]), nltk.Tree("TOP", [t2[i]])).matched]
  explained = sum(1 for i in differ if max(parseval.brackets(
      nltk.Tree("TOP", [g2[i]]), [False] * len(g2[i].leaves())).values()) > 1)
  print(f"conventions applied beforehand, {len(g2)} single-rooted trees: parseval.py F1 "
        f"{ours2['f1']:.4f} ({ours2['matched_brackets']}/{ours2['gold_brackets']}/"
        f"{ours2['test_brackets']} matched/gold/test), PYEVALB F1 {2 * p * r / (p + r):.4f} "
        f"({matched}/{gold}/{test}); identical unary gold brackets (a multiset counts them, "
        f"PYEVALB's set once): {duplicates}; sentences whose matched count differs: "
        f"{len(differ)}, of which {explained} hold such a duplicate")


if __name__ == "__main__":
  cli.run(main, overrides=False)
