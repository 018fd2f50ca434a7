"""The parser peer's side of benchmarks/parser_peer.py: supar's trees read into our scorer, and
both metrics agreeing on fixture trees (skipped where the 'peer' extra is not installed)."""

from __future__ import annotations

import subprocess
import sys

import nltk
import pytest

from tests.common import REPO
from transformer_jax.tasks.parsing import parseval

GOLD = [
    "(TOP (S (NP (NNP Pierre) (NNP Vinken)) (VP (MD will) (VP (VB join) (NP (DT the) "
    "(NN board)))) (. .)))",
    "(TOP (S (NP (DT The) (NN dog)) (VP (VBD barked) (PP (IN at) (NP (DT the) (NN cat)))) "
    "(. .)))",
    "(TOP (S (NP (PRP He)) (VP (VBD said) (SBAR (S (NP (PRP it)) (VP (VBD rained))))) (. .)))",
]
# One bracket moved (the PP attached to the NP), one label wrong (SBAR as S), one tree as gold.
OTHER = [
    GOLD[0],
    "(TOP (S (NP (DT The) (NN dog)) (VP (VBD barked) (NP (PP (IN at) (NP (DT the) (NN cat))))) "
    "(. .)))",
    "(TOP (S (NP (PRP He)) (VP (VBD said) (S (S (NP (PRP it)) (VP (VBD rained))))) (. .)))",
]


def _peer():
  pytest.importorskip("supar", reason="the 'peer' extra (supar, torch) is not installed")
  from benchmarks import parser_peer  # pylint: disable=g-import-not-at-top
  return parser_peer


def test_supar_reads_our_trees_and_gives_them_back_to_our_scorer(tmp_path):
  """Our preprocessed trees, written one per line, load as supar's loader reads a file (one
  nltk tree a line) with the same words and tags; a peer tree comes back as our scorer's text,
  rooted at TOP whether supar kept the root or not."""
  parser_peer = _peer()
  from supar.utils.transform import Tree  # pylint: disable=g-import-not-at-top
  path = tmp_path / "gold.pid"
  parser_peer.write_trees(str(path), GOLD)
  loaded = [nltk.Tree.fromstring(line) for line in path.read_text().splitlines()]
  assert [t.pos() for t in loaded] == [nltk.Tree.fromstring(g).pos() for g in GOLD]
  assert all(Tree.factorize(t) for t in loaded)  # spans supar can train on
  for text, tree in zip(GOLD, loaded):
    assert parser_peer.peer_tree_text(tree) == text
    assert parser_peer.peer_tree_text(tree[0]) == text  # an S without our TOP


def test_both_metrics_agree_on_fixture_trees():
  parser_peer = _peer()
  golds = [nltk.Tree.fromstring(t) for t in GOLD]
  tests = [nltk.Tree.fromstring(t) for t in OTHER]
  perfect = parser_peer.score(golds, golds)
  assert perfect["parseval"]["f1"] == pytest.approx(100.0)
  assert perfect["supar_metric"]["f1"] == pytest.approx(100.0, rel=1e-9)  # its eps of 1e-12
  both = parser_peer.score(golds, tests)
  ours, theirs = both["parseval"], both["supar_metric"]
  assert 0 < ours["f1"] < 100
  for key in ("f1", "precision", "recall", "exact_match"):
    assert ours[key] == pytest.approx(theirs[key], rel=1e-9), key
  direct = parseval.score_trees(golds, tests)
  assert ours["matched"] == direct["matched_brackets"] and ours["gold"] == direct["gold_brackets"]


def test_supar_metric_deletes_punctuation_by_the_gold_tags():
  """Our parser writes every preterminal as XX: both metrics delete punctuation by the gold
  tags, as EVALB does, so our trees score as a tagged parser's would."""
  parser_peer = _peer()
  golds = [nltk.Tree.fromstring(t) for t in GOLD]
  untagged = []
  for text in OTHER:
    tree = nltk.Tree.fromstring(text)
    for leaf in tree.treepositions("leaves"):
      tree[leaf[:-1]].set_label("XX")
    untagged.append(tree)
  tagged = parser_peer.score(golds, [nltk.Tree.fromstring(t) for t in OTHER])
  both = parser_peer.score(golds, untagged)
  for key in ("f1", "precision", "recall", "exact_match"):
    assert both["supar_metric"][key] == pytest.approx(tagged["supar_metric"][key], rel=1e-9)
    assert both["parseval"][key] == pytest.approx(both["supar_metric"][key], rel=1e-9), key
  assert untagged[1].pos()[0] == ("The", "XX")  # the trees scored are not changed


def test_without_the_extra_the_benchmark_says_which_in_one_line(tmp_path):
  """Run where supar cannot be imported (a path entry that shadows it): one line, exit 2."""
  shadow = tmp_path / "shadow"
  (shadow / "supar").mkdir(parents=True)
  (shadow / "supar" / "__init__.py").write_text("raise ImportError('no supar here')\n")
  env_path = f"{shadow}:{REPO}"
  r = subprocess.run([sys.executable, "-m", "benchmarks.parser_peer", "--out="], cwd=REPO,
                     capture_output=True, text=True, env={"PYTHONPATH": env_path, "PATH": ""},
                     timeout=120)
  assert r.returncode == 2, r.stderr
  lines = [line for line in r.stderr.splitlines() if line.strip()]
  assert lines[-1].startswith("error: benchmarks.parser_peer needs the 'peer' extra"), r.stderr
  assert "Traceback" not in r.stderr
