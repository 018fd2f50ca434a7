"""Subtree substitution: more training trees made from the treebank's own (`data.parse_substitute`).

A copy of a training tree has one of its phrases replaced by a phrase of the same label from
another training tree (Shi, Livescu and Gimpel 2021's substructure substitution): the words and
the brackets of the result are both the treebank's, recombined where the grammar allows it, so a
small treebank offers a parser more trees without any data from elsewhere. A deviation, off by
default: the paper trains on the treebank's trees only.

Only phrases below a sentence's top phrase are swapped (a whole-sentence swap would repeat a
tree), a result is kept only if no longer than the longest training sentence and no deeper in
the constrained search's two measures of shape (tree_constraint.search_limits) than the deepest
training tree, and the copies are a function of the trees and the seed alone.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from transformer_jax.tasks.parsing import tree_constraint, treebank

TRIES = 20  # draws per copy before a tree is left without it (a tree of one phrase has none)


def _phrases(tree) -> list[tuple[int, ...]]:
  """Positions of the phrases below the sentence's top phrase (TOP's child): a phrase is a node
  that is not a part-of-speech tag over its word."""
  return [p for p in tree.treepositions() if len(p) >= 2 and not isinstance(tree[p], str)
          and not treebank.is_preterminal(tree[p])]


def substitute(examples: list[treebank.Example], copies: int, seed: int
               ) -> list[treebank.Example]:
  """`copies` new trees for each of `examples` (fewer where no draw passes the checks), each
  with one phrase swapped for a phrase of the same label from another example; the new
  examples keep their host's file and line."""
  if copies <= 0 or len(examples) < 2:
    return []
  nltk = treebank.nltk
  trees = [nltk.Tree.fromstring(e.tree) for e in examples]
  phrases = [_phrases(t) for t in trees]
  donors = collections.defaultdict(list)  # label -> [(tree index, position)]
  for i, (tree, positions) in enumerate(zip(trees, phrases)):
    for p in positions:
      donors[tree[p].label()].append((i, p))
  max_words = max(len(t.leaves()) for t in trees)
  shapes = [tree_constraint.search_limits(e.linearized) for e in examples]
  max_opens, max_unary = (max(s[k] for s in shapes) for k in range(2))
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(copies):
    for i, (host, positions) in enumerate(zip(trees, phrases)):
      for _ in range(TRIES if positions else 0):
        p = positions[rng.integers(len(positions))]
        j, q = (pool := donors[host[p].label()])[rng.integers(len(pool))]
        if j == i:
          continue
        new = host.copy(deep=True)
        new[p] = trees[j][q].copy(deep=True)
        if len(new.leaves()) > max_words:
          continue
        linearized = treebank.linearize(new)
        opens, unary = tree_constraint.search_limits(linearized)
        if opens > max_opens or unary > max_unary:
          continue
        out.append(dataclasses.replace(
            examples[i], words=" ".join(new.leaves()), linearized=linearized,
            linearized_words=treebank.linearize(new, "words"), tree=treebank.tree_text(new)))
        break
  return out
