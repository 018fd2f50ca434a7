"""Decoded linearizations back into trees: every output becomes a tree over its source's words.

A model may write a skeleton that is not a tree (brackets that do not close, too many or too
few leaves). :func:`delinearize` turns any output into one by a deterministic rule, and
`Parsed.repaired` says whether any step of it was needed:
1. tokens are read left to right: `(L` opens a phrase L (a bare `(` opens `X`), `)...` closes the
   innermost open phrase (its label is ignored; a `)` with none open is dropped), `XX` is a leaf
   slot (with leaves='words': any other token is), anything else is dropped;
2. phrases still open at the end are closed; phrases without a leaf slot are dropped;
3. too many leaf slots: the last ones are dropped (and phrases left empty by that); too few: the
   missing words are added as XX leaves at the end of the top phrase (of TOP itself when the
   output has several top-level phrases, none, or only a leaf);
4. leaf i gets source word i (`(` and `)` in a word are written `-LRB-` / `-RRB-`).
"""

from __future__ import annotations

import dataclasses

from transformer_jax.tasks.parsing.treebank import (ESCAPES, POS_PLACEHOLDER, ROOT,
                                                     is_preterminal, nltk, tree_text)


@dataclasses.dataclass(frozen=True)
class Parsed:
  tree: nltk.Tree
  repaired: bool

  @property
  def text(self) -> str:
    return tree_text(self.tree)


def _prune(node: nltk.Tree) -> bool:
  """Drops phrases without leaf slots below `node`; True when something was dropped."""
  dropped = False
  for i in reversed(range(len(node))):
    kid = node[i]
    if is_preterminal(kid):
      continue
    dropped |= _prune(kid)
    if len(kid) == 0:
      del node[i]
      dropped = True
  return dropped


def _slots(node: nltk.Tree) -> list[tuple[nltk.Tree, int]]:
  """(parent, index) of each leaf slot, left to right."""
  out = []
  for i, kid in enumerate(node):
    if is_preterminal(kid):
      out.append((node, i))
    else:
      out.extend(_slots(kid))
  return out


def delinearize(skeleton: str, words: list[str] | str, leaves: str = "xx") -> Parsed:
  """The tree of a decoded linearization with source word i at leaf i, repaired when needed
  (the rule in the module docstring); `leaves`: what the linearization writes for a word."""
  if isinstance(words, str):
    words = words.split()
  root, repaired = nltk.Tree(ROOT, []), False
  stack = [root]
  for tok in skeleton.split():
    if tok.startswith("("):
      label = tok[1:].replace("(", "").replace(")", "")
      repaired |= label != tok[1:] or not label
      node = nltk.Tree(label or "X", [])
      stack[-1].append(node)
      stack.append(node)
    elif tok.startswith(")"):
      if len(stack) > 1:
        stack.pop()
      else:
        repaired = True
    elif tok == POS_PLACEHOLDER or leaves == "words":
      stack[-1].append(nltk.Tree(POS_PLACEHOLDER, [""]))
    else:
      repaired = True
  repaired |= len(stack) > 1
  repaired |= _prune(root)
  slots = _slots(root)
  if len(slots) > len(words):
    repaired = True
    for parent, i in reversed(slots[len(words):]):
      del parent[i]
    _prune(root)
  elif len(slots) < len(words):
    repaired = True
    target = root[0] if len(root) == 1 and not is_preterminal(root[0]) else root
    for _ in range(len(words) - len(slots)):
      target.append(nltk.Tree(POS_PLACEHOLDER, [""]))
  for (parent, i), word in zip(_slots(root), words):
    parent[i][0] = "".join(ESCAPES.get(ch, ch) for ch in word)
  return Parsed(root, repaired)
