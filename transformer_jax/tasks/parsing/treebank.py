"""The treebank side of parsing (paper §6.3): `.mrg` files in, linearized trees out.

Reading: Penn Treebank `.mrg` files (the "combined" format: every word under its POS tag), one
or more bracketed trees per file. A scan finds where each tree starts before NLTK reads it, so
bad input is a one-line DataError naming the file and line.

Preprocessing (:func:`preprocess`), the standard one for parser evaluation: `-NONE-` empty
elements are dropped (and constituents left without words); phrase labels lose function tags
and indices as EVALB's `modify_label` does (`NP-SBJ-1` -> `NP`, `PRT|ADVP` -> `PRT`); POS tags
stay whole (`-LRB-`); the unlabeled root becomes `TOP`.

Linearization (:func:`linearize`, Vinyals et al. 2015): the source is the words, the target the
bracketing depth first, `(S (NP XX XX )NP (VP XX )VP XX )S`, every POS tag written as the
placeholder `XX` (EVALB does not score POS brackets, so predicting them would only lengthen the
targets). With `data.parse_leaves='words'` each XX is the word itself, so the decoder copies the
word it is at instead of counting placeholders. Either way the source words go back into the
decoded skeleton's leaves (repair.py), so a parser cannot change its sentence.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import importlib.util
import os
import sys

from transformer_jax.runtime.exceptions import ConfigError, DataError


class _Missing:
  """Stands in for a package that is not installed: its first use is a one-line ConfigError."""

  def __init__(self, name: str):
    self._name = name

  def __getattr__(self, attr):
    raise ConfigError(f"the {self._name} package is not installed (pip install {self._name}); "
                      "parsing reads and writes trees with it")


def _lazy_import(name: str):
  """The module `name`, executed at the first access to one of its attributes (the standard
  library's importlib.util.LazyLoader recipe); the module itself if already imported."""
  if name in sys.modules:
    return sys.modules[name]
  spec = importlib.util.find_spec(name)
  if spec is None:  # not installed: a translation run never notices; a parser's first use says so
    return _Missing(name)
  spec.loader = importlib.util.LazyLoader(spec.loader)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


# NLTK's package __init__ imports the whole toolkit (scipy.stats included), which a CLI start
# that never reads a tree should not pay for: it loads at the first use of nltk.Tree, and the
# other parsing modules take this one from here.
nltk = _lazy_import("nltk")

VERSION = 1             # of the preprocessing and linearization: part of the token caches' key
POS_PLACEHOLDER = "XX"
# The Penn Treebank's phrase labels once function tags are stripped (Bies et al. 1995): what a
# constrained parser may write (tree_constraint.py).
PHRASE_LABELS = ("ADJP", "ADVP", "CONJP", "FRAG", "INTJ", "LST", "NAC", "NP", "NX", "PP", "PRN",
                 "PRT", "QP", "RRC", "S", "SBAR", "SBARQ", "SINV", "SQ", "UCP", "VP", "WHADJP",
                 "WHADVP", "WHNP", "WHPP", "X")
LEAVES = ("xx", "words")  # what a linearization writes for a word (config data.parse_leaves)
ROOT = "TOP"
ROOT_LABELS = ("", "ROOT", "TOP")  # the treebank's unlabeled outer bracket, or an explicit root
EMPTY_ELEMENT = "-NONE-"
ESCAPES = {"(": "-LRB-", ")": "-RRB-"}


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
    text = raw.decode("utf-8-sig")  # a byte-order mark (files saved on Windows) is not a tree
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


# ----------------------------------------------------------------------------- linearization


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
  return "".join(ESCAPES.get(ch, ch) for ch in word) if word[:1] in "()" else word


def read_tree_texts(texts, what: str) -> list[nltk.Tree]:
  """Bracketed tree texts (one tree each: outputs of a parser) -> trees; one that does not read
  is a one-line ConfigError naming `what` and its line."""
  out = []
  for i, text in enumerate(texts):
    try:
      out.append(nltk.Tree.fromstring(text))
    except ValueError as e:
      reason = str(e).strip().splitlines()[0]
      raise ConfigError(f"{what}: line {i + 1} is not a bracketed tree ({reason}): {text[:60]!r}"
                        ) from None
  return out
