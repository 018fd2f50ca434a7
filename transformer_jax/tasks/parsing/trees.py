"""Constituency trees as a translation task (paper §6.3): `.mrg` files in, linearized trees out.

Reading: Penn Treebank `.mrg` files (the "combined" format: every word under its POS tag), one
or more bracketed trees per file, each read with NLTK (`nltk.Tree.fromstring`) after a scan that
finds where each tree starts, so that bad input is a one-line DataError naming the file and line
(brackets that do not balance, text outside a tree, a word without a POS tag, an empty file).

Preprocessing (:func:`preprocess`), the standard one for parser evaluation:
- `-NONE-` empty elements (traces, null complementizers) are dropped, and so is every
  constituent left without words by that;
- phrase labels lose function tags and indices as EVALB's `modify_label` does (`NP-SBJ-1` ->
  `NP`, `S-TPC=2` -> `S`, `PRT|ADVP` -> `PRT`); POS tags are kept as they are, so `-LRB-` and
  `-RRB-` (they start with '-') stay whole;
- the treebank's unlabeled root becomes `TOP`; the words are kept.

Linearization (:func:`linearize`, Vinyals et al. 2015, "Grammar as a Foreign Language"): the
source is the words, the target the bracketing depth first, each phrase as `(LABEL ... )LABEL`,
and every POS tag replaced by the placeholder `XX`:
`(S (NP XX XX )NP (VP XX (NP XX XX )NP )VP XX )S`. POS tags are not kept because EVALB
(COLLINS.prm) does not score POS brackets, so predicting them would lengthen every target by a
third for no score; Vinyals et al. normalized them to XX for the same reason. With
`data.parse_leaves='words'` (`leaves='words'` here) each XX is the word itself instead,
`(S (NP The cat )NP (VP sat )VP . )S`: longer targets, but the decoder copies the word it is at
from the source rather than counting placeholders, which a small model on little data learns
sooner (experiments/wsj_parsing.py measures it). Either way leaf i of a decoded skeleton gets
source word i (:func:`delinearize`), so the parser cannot change the sentence. Scoring (parseval.py) takes the gold tree's POS tags for the
punctuation rule, as EVALB does with gold tags copied into an XX tree.

Repair (:func:`delinearize`): every decoded output becomes a tree by one deterministic rule;
`Parsed.repaired` says whether any step was needed:
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
import fnmatch
import functools
import hashlib
import importlib.util
import os
import sys

from transformer_jax.runtime.exceptions import DataError


def _lazy_import(name: str):
  """The module `name`, executed at the first access to one of its attributes (the standard
  library's importlib.util.LazyLoader recipe); the module itself if already imported."""
  if name in sys.modules:
    return sys.modules[name]
  spec = importlib.util.find_spec(name)
  spec.loader = importlib.util.LazyLoader(spec.loader)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


# NLTK's package __init__ imports the whole toolkit, scipy.stats included: ~1.7 s at every start
# of the CLI, which needs NLTK only for trees. So it loads at the first use of nltk.Tree, and
# parseval and evaluate take this one from here.
nltk = _lazy_import("nltk")

VERSION = 1             # of the preprocessing and linearization: part of the token caches' key
POS_PLACEHOLDER = "XX"
# The Penn Treebank's phrase labels once function tags are stripped (Bies et al. 1995; the
# sample's trees use all 26): what a constrained parser may write (tree_constraint.py).
PHRASE_LABELS = ("ADJP", "ADVP", "CONJP", "FRAG", "INTJ", "LST", "NAC", "NP", "NX", "PP", "PRN",
                 "PRT", "QP", "RRC", "S", "SBAR", "SBARQ", "SINV", "SQ", "UCP", "VP", "WHADJP",
                 "WHADVP", "WHNP", "WHPP", "X")
LEAVES = ("xx", "words")  # what a linearization writes for a word (config data.parse_leaves)
ROOT = "TOP"
ROOT_LABELS = ("", "ROOT", "TOP")  # the treebank's unlabeled outer bracket, or an explicit root
EMPTY_ELEMENT = "-NONE-"
_ESCAPES = {"(": "-LRB-", ")": "-RRB-"}


@dataclasses.dataclass(frozen=True)
class Example:
  """One preprocessed tree: the source words, the target linearizations (XX leaves, or the
  words), the gold tree's text."""
  words: str
  linearized: str
  linearized_words: str
  tree: str
  path: str
  line: int


@dataclasses.dataclass(frozen=True)
class Parsed:
  tree: nltk.Tree
  repaired: bool

  @property
  def text(self) -> str:
    return tree_text(self.tree)


def tree_text(tree: nltk.Tree) -> str:
  """The tree on one line, `(TOP (S (NP (XX John)) ...))`; '' for a tree without words."""
  return tree.pformat(margin=sys.maxsize) if tree.leaves() else ""


# ----------------------------------------------------------------------------- reading


def select_files(folder: str, spec: str, what: str) -> list[str]:
  """The `.mrg` files under `folder` (searched recursively) whose names match `spec`: comma
  separated entries, each a range of file stems `wsj_0200-wsj_2199` (inclusive, compared as
  strings), one stem, or a glob (`wsj_22*`). DataError naming the folder when it is missing or
  nothing matches."""
  if not os.path.isdir(folder):
    raise DataError(f"data folder not found: {folder} ({what})")
  if not spec.strip():
    raise DataError(f"no files configured for the {what} (the config's file range is empty)")
  stems = {}
  for root, _, names in os.walk(folder):
    for name in names:
      if name.endswith(".mrg"):
        stems[name[:-len(".mrg")]] = os.path.join(root, name)
  chosen = set()
  for entry in (e.strip() for e in spec.split(",") if e.strip()):
    first, sep, last = entry.partition("-")
    if sep and first and last and not any(ch in entry for ch in "*?["):
      chosen.update(s for s in stems if first <= s <= last)
    else:
      chosen.update(fnmatch.filter(stems, entry))
  if not chosen:
    raise DataError(f"no .mrg file in {folder} matches {spec!r} ({what})")
  return [stems[s] for s in sorted(chosen)]


def _tree_strings(path: str) -> list[tuple[int, str]]:
  """(1-based line where it starts, text) of each top-level bracketed tree of a file."""
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise DataError(f"cannot read {path}: {e.strerror or e}") from None
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    bad_line = raw[:e.start].count(b"\n") + 1
    raise DataError(f"{path} line {bad_line} is not valid UTF-8") from None
  out, depth, start, start_line, line = [], 0, 0, 0, 1
  for i, ch in enumerate(text):
    if ch == "\n":
      line += 1
    elif ch == "(":
      if depth == 0:
        start, start_line = i, line
      depth += 1
    elif ch == ")":
      if depth == 0:
        raise DataError(f"{path} line {line}: unbalanced brackets (a ')' closes nothing)")
      depth -= 1
      if depth == 0:
        out.append((start_line, text[start:i + 1]))
    elif depth == 0 and not ch.isspace():
      snippet = text[i:].split("\n", 1)[0][:40]
      raise DataError(f"{path} line {line}: not a bracketed tree: {snippet!r}")
  if depth:
    raise DataError(f"{path} line {start_line}: unbalanced brackets (the tree starting here is "
                    "not closed by the end of the file)")
  if not out:
    raise DataError(f"{path}: no trees (the file is empty)")
  return out


def read_trees(path: str) -> list[tuple[int, nltk.Tree]]:
  """(line, raw tree) of each tree of an `.mrg` file; DataError naming the file and line."""
  trees = []
  for line, text in _tree_strings(path):
    try:
      tree = nltk.Tree.fromstring(text)
    except ValueError as e:
      raise DataError(f"{path} line {line}: not a tree ({str(e).splitlines()[0][:80]})") from None
    _check_pos(tree, path, line)
    trees.append((line, tree))
  return trees


def _check_pos(tree: nltk.Tree, path: str, line: int) -> None:
  for node in tree.subtrees():
    words = [k for k in node if isinstance(k, str)]
    if words and (len(node) > 1 or node is tree):
      raise DataError(f"{path} line {line}: word {words[0]!r} has no POS tag (expected the "
                      "treebank's combined .mrg format, '(NN word)')")


def read_examples(paths: tuple[str, ...]) -> list[Example]:
  """The preprocessed, linearized trees of the files, in order; trees without a word left
  after preprocessing are skipped."""
  return list(_read_examples(tuple((p, os.path.getsize(p), os.stat(p).st_mtime_ns)
                                   for p in paths)))


@functools.lru_cache(maxsize=8)
def _read_examples(keyed_paths) -> tuple[Example, ...]:
  out = []
  for path, _, _ in keyed_paths:
    for line, raw in read_trees(path):
      tree = preprocess(raw)
      if tree.leaves():
        out.append(Example(" ".join(tree.leaves()), linearize(tree), linearize(tree, "words"),
                           tree_text(tree), path, line))
  return tuple(out)


class Records:
  """A split's examples in memory, read like a tfds data source (sources.SplitSource);
  `key` names the files' versions and this module's (keys token caches)."""

  def __init__(self, examples: list[Example], key: str):
    self.examples, self.key = examples, key

  def __len__(self) -> int:
    return len(self.examples)

  def __getitems__(self, ids) -> list[dict]:
    return [dataclasses.asdict(self.examples[i]) for i in ids]


def split_records(folder: str, spec: str, what: str) -> Records:
  """The examples of the `.mrg` files of `spec` (select_files) under `folder`."""
  paths = tuple(select_files(folder, spec, what))
  examples = read_examples(paths)
  if not examples:
    raise DataError(f"the {what} ({spec!r} in {folder}) holds no tree with words")
  key = hashlib.sha256(repr((VERSION, [(p, os.path.getsize(p), os.stat(p).st_mtime_ns)
                                       for p in paths])).encode()).hexdigest()[:12]
  return Records(examples, key)


def search_limits(linearized: str) -> tuple[int, int]:
  """What the constrained search (tree_constraint.py) must allow to write this linearization:
  (the most opening brackets between two leaves, the longest unary chain: phrases each holding
  just the next, the last holding anything else). Counted as the search counts them, token by
  token."""
  tokens = linearized.split()
  opens = most_opens = longest = unary_below = 0
  first_child, just_opened = [], False  # per open phrase: its parent's first child
  for t in tokens:
    if t.startswith("("):
      first_child.append(just_opened)
      opens, unary_below = opens + 1, 0
      most_opens = max(most_opens, opens)
    elif t.startswith(")"):
      longest = max(longest, unary_below + 1)
      unary_below = unary_below + 1 if first_child.pop() else 0
    else:
      opens, unary_below = 0, 0
    just_opened = t.startswith("(")
  return most_opens, longest


def search_limit_warnings(examples: list[Example], decode) -> list[str]:
  """Training trees against the constrained search's limits on a tree's shape (config
  `decode.parse_max_*`, tree_constraint.py): a line for each limit that some trees exceed (with
  `decode.parse_constraint` the search could not write them), naming the value they need."""
  needed = [search_limits(e.linearized) for e in examples]
  out = []
  for i, key in enumerate(("parse_max_opens_in_a_row", "parse_max_unary_chain")):
    over = [(n[i], e) for n, e in zip(needed, examples) if n[i] > decode[key]]
    if over:
      most, e = max(over, key=lambda x: x[0])
      out.append(f"{len(over)} of {len(examples)} training trees exceed decode.{key}="
                 f"{decode[key]} (the constrained search could not write them; the most, {most}, "
                 f"at {e.path} line {e.line}): decode with --config.decode.{key}={most}")
  return out


# ----------------------------------------------------------------------------- preprocessing


def strip_label(label: str) -> str:
  """`NP-SBJ-1` -> `NP`, `S=2` -> `S`, `PRT|ADVP` -> `PRT`; a label starting with '-' (`-LRB-`,
  `-NONE-`) is kept whole."""
  if label.startswith("-"):
    return label
  label = label.split("|")[0]
  for sep in "-=":
    label = label.split(sep)[0]
  return label


def is_preterminal(node) -> bool:
  return isinstance(node, nltk.Tree) and len(node) == 1 and isinstance(node[0], str)


def _clean(node: nltk.Tree):
  if is_preterminal(node):
    return None if node.label() == EMPTY_ELEMENT else nltk.Tree(node.label(), [node[0]])
  kids = [k for k in (_clean(c) for c in node) if k is not None]
  return nltk.Tree(strip_label(node.label()), kids) if kids else None


def preprocess(raw: nltk.Tree) -> nltk.Tree:
  """The tree as parsers are scored on it: TOP over the phrases, no empty elements, no
  function tags or indices (module docstring)."""
  tops = list(raw) if raw.label() in ROOT_LABELS and not is_preterminal(raw) else [raw]
  return nltk.Tree(ROOT, [k for k in (_clean(t) for t in tops) if k is not None])


# ----------------------------------------------------------------------------- (de)linearization


def linearize(tree: nltk.Tree, leaves: str = "xx") -> str:
  """`(S (NP XX XX )NP ... )S` of a preprocessed tree (TOP itself not written); with
  leaves='words', `(S (NP The cat )NP ... )S`."""
  tokens = []

  def walk(node):
    if is_preterminal(node):
      tokens.append(_word_token(node[0]) if leaves == "words" else POS_PLACEHOLDER)
      return
    tokens.append("(" + node.label())
    for kid in node:
      walk(kid)
    tokens.append(")" + node.label())
  for top in tree:
    walk(top)
  return " ".join(tokens)


def _word_token(word: str) -> str:
  """A word as a target token: never read as a bracket (PTB words are escaped already)."""
  return "".join(_ESCAPES.get(ch, ch) for ch in word) if word[:1] in "()" else word


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
    parent[i][0] = "".join(_ESCAPES.get(ch, ch) for ch in word)
  return Parsed(root, repaired)
