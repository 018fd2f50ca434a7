"""What a parser's training split reads: the leaves setting chooses the targets, and subtree
substitution (tasks/parsing/substitution.py, data.parse_substitute) adds copies, each a training
tree with one phrase swapped for a training phrase of the same label, deterministic, never on
dev, bad settings one line."""

import nltk
import pytest

from tests.test_parsing import _fixture_trees, _mrg
from transformer_jax.data import sources
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import load
from transformer_jax.tasks import registry
from transformer_jax.tasks.parsing import treebank as trees

T = nltk.Tree.fromstring


def _fixture_config(tmp_path, trees_in_file: int):
  """The sample config reading one file of `trees_in_file` fixture trees as train and dev."""
  _mrg(tmp_path, "f_01.mrg", _fixture_trees(trees_in_file, 0))
  return load("configs/wsj_parsing.py:sample", [
      f"--config.data.data_dir={tmp_path}", "--config.data.local_corpus=tb",
      "--config.data.train_files=f_01", "--config.data.eval_files=f_01"])


def test_the_leaves_setting_chooses_the_training_targets(tmp_path):
  c = _fixture_config(tmp_path, 3)
  c.data.parse_leaves = "xx"
  reader = registry.get(c).read_split
  xx = sources.split_source(c, "train", reader)
  c.data.parse_leaves = "words"
  words = sources.split_source(c, "train", reader)
  (src,), (target,) = words.texts([0])
  (_,), (target_xx,) = xx.texts([0])
  assert target.split()[1:1 + 2] == ["(NP", src.split()[0]] and "XX" not in target
  assert "XX" in target_xx and words.dataset_id != xx.dataset_id


def test_substituted_copies_recombine_the_training_trees_phrases(tmp_path):
  c = _fixture_config(tmp_path, 12)
  reader = registry.get(c).read_split
  c.data.parse_substitute = 0  # the treebank's own trees only (the sample config adds copies)
  plain = sources.split_source(c, "train", reader)
  c.data.parse_substitute = 2
  more = sources.split_source(c, "train", reader)
  assert len(plain) == 12 and 12 < len(more) <= 36 and more.dataset_id != plain.dataset_id
  assert more.records.examples[:12] == plain.records.examples
  originals = [T(e.tree) for e in plain.records.examples]
  phrases = {str(t[p]) for t in originals for p in t.treepositions() if len(p) >= 2
             and isinstance(t[p], nltk.Tree)}
  new = more.records.examples[12:]
  assert {e.tree for e in new} - {e.tree for e in plain.records.examples}  # not only copies
  hosts = {(e.path, e.line): T(e.tree) for e in plain.records.examples}

  def one_swap(host, tree):  # some phrase of host's swapped for a training phrase, label kept
    for p in host.treepositions():
      if len(p) < 2 or not isinstance(host[p], nltk.Tree) or trees.is_preterminal(host[p]):
        continue
      swapped, part = host.copy(deep=True), tree[p] if p in tree.treepositions() else None
      if isinstance(part, nltk.Tree) and part.label() == host[p].label():
        swapped[p] = part
        if swapped == tree and str(part) in phrases:
          return True
    return False
  for e in new:
    tree = T(e.tree)
    assert e.words == " ".join(tree.leaves()) and e.linearized == trees.linearize(tree)
    assert e.linearized_words == trees.linearize(tree, "words")
    assert one_swap(hosts[e.path, e.line], tree), e.tree
  assert sources.split_source(c, "train", reader).records.examples == more.records.examples
  assert len(sources.split_source(c, "validation", reader)) == 12  # dev is never substituted
  c.data.parse_substitute = -1
  with pytest.raises(ConfigError, match="data.parse_substitute"):
    registry.get(c)
  c.data.parse_substitute, c.data.task, c.decode.parse_constraint = 1, "translation", False
  with pytest.raises(ConfigError, match="data.parse_substitute"):
    registry.get(c)
