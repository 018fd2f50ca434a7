"""Parsing as a task: splits are `.mrg` files read as (words, linearized tree, gold tree),
outputs are repaired into trees and scored by bracket F1, the search may be constrained to
trees, and the vocabulary keeps `(NP` / `)NP` one piece each."""

from __future__ import annotations

import functools
import os
from typing import Any, Mapping, Sequence

from transformer_jax.data import sources
from transformer_jax.runtime import markdown
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.tasks import base
from transformer_jax.tasks.parsing import (parseval, repair, substitution, tree_constraint,
                                          treebank)


class Parsing(base.Task):
  """Words -> linearized trees (treebank.py), read from data.data_dir/data.local_corpus."""

  name = "parsing"
  dev_metrics = (("f1", "f1"), ("precision", "precision"), ("recall", "recall"),
                 ("exact_match", "exact_match"), ("repaired", "repaired"))
  score_name = "bracket F1"
  # Brackets and labels mix scripts ('(' and 'NP'): split, every target would be longer.
  split_by_script = False
  switches = {"decode.parse_constraint": "constrains a parser's trees",
              "data.parse_substitute": "adds subtree-substituted copies of training trees"}
  export_refusal = ("a parser's outputs are trees, repaired after a search that may be "
                    "constrained to trees (decode.parse_constraint); another toolkit's decoder "
                    "does neither")

  def validate(self, config) -> None:
    d = config.data
    if d.parse_leaves not in treebank.LEAVES:
      raise ConfigError(f"config key 'data.parse_leaves' is {d.parse_leaves!r}; expected one of "
                        f"{', '.join(treebank.LEAVES)}")
    if not isinstance(d.parse_substitute, int) or d.parse_substitute < 0:
      raise ConfigError(f"config key 'data.parse_substitute' is {d.parse_substitute!r}; expected "
                        "a whole number of substituted copies per training tree, 0 for none")
    if d.dataset != "local" or d.extra_train_files or d.eval_data_dir:
      raise ConfigError("config key 'data.task'='parsing' reads .mrg files from "
                        "data.local_corpus: it needs data.dataset='local' and no "
                        "data.extra_train_files or data.eval_data_dir")

  def read_split(self, config, split: str) -> sources.SplitSource:
    """The .mrg files of the split's file range, preprocessed and linearized in memory; for
    training, with data.parse_substitute's copies after the treebank's own trees."""
    d = config.data
    folder, stem = _files(config, split)
    records = (_with_copies(folder, stem, d.parse_substitute, config.seed)
               if split == "train" and d.parse_substitute
               else treebank.split_records(folder, stem, f"{split} split"))
    words = d.parse_leaves == "words"
    return sources.SplitSource(records, "words", "linearized_words" if words else "linearized",
                               f"trees_{split}{'_words' if words else ''}_{records.key}", False,
                               (len(records),), reference_key="tree")

  def training_warnings(self, config) -> list[str]:
    """Training trees the constrained search could not write under the decode.parse_max_*
    limits (tree_constraint.search_limit_warnings)."""
    records = treebank.split_records(*_files(config, "train"), "train split")  # no copies
    return tree_constraint.search_limit_warnings(records.examples, config.decode)

  def word_starts(self, tokenizer) -> tuple[int, ...]:
    """The pieces that begin a leaf: a target's brackets are tokens too, but not words (no word
    begins with a bracket: treebank.ESCAPES), so the target's count is of the leaves written."""
    brackets = {tokenizer.encode(b + label)[0] for b in "()" for label in treebank.PHRASE_LABELS}
    return tuple(i for i in tokenizer.word_start_ids() if i not in brackets)

  def decode_constraint(self, config, tokenizer) -> tree_constraint.TreeConstraint | None:
    if not config.decode.parse_constraint:
      return None
    return tree_constraint.from_tokenizer(
        tokenizer, treebank.PHRASE_LABELS,
        treebank.POS_PLACEHOLDER if config.data.parse_leaves == "xx" else "",
        max_opens_in_a_row=config.decode.parse_max_opens_in_a_row,
        max_unary_chain=config.decode.parse_max_unary_chain)

  def postprocess(self, config, sources_, outputs) -> list[str]:
    """Trees, one line each, with the words of the (tokenized) sources at the leaves."""
    leaves = config.data.parse_leaves
    return [repair.delinearize(o, s, leaves).text for s, o in zip(sources_, outputs)]

  def score(self, config, sources_, outputs, references, tokenized_references=None):
    del tokenized_references
    return parseval.evaluate_parses(sources_, outputs, references, config.data.parse_leaves)

  def read_baseline(self, lines, what: str, sources=None):
    """Trees, each over the words of its sentence here: a file of trees over other words
    would be scored against F1 0 (parseval counts their sentences as mismatched)."""
    trees = treebank.read_tree_texts(lines, what)
    for i, (tree, words) in enumerate(zip(trees, sources or ())):
      leaves = tree.leaves()
      if leaves != words.split():
        raise ConfigError(f"{what}: the tree on line {i + 1} is over other words than sentence "
                          f"{i + 1} here ({' '.join(leaves)[:60]!r}, here {words[:60]!r}); "
                          "compare parsers on the same sentences")
    return trees

  def compare(self, baseline, outputs, references) -> dict:
    return parseval.paired_bootstrap(treebank.read_tree_texts(references, "reference"), baseline,
                                     treebank.read_tree_texts(outputs, "output"))

  def report_line(self, report: Mapping[str, Any]) -> str:
    if "f1" not in report:
      return ""
    return (f", F1 {report['f1']:.2f} (P {report['precision']:.2f}, R "
            f"{report['recall']:.2f}), exact match {report['exact_match']:.2f}, repaired "
            f"{report['repaired']}")

  def summary_table(self, reports: Sequence[Mapping[str, Any]]) -> str:
    """EVALB's two summaries: all sentences, and those of at most 40 words."""
    header = ["set", "step", "sentences", "perplexity", "F1", "P", "R", "exact",
              "F1 (<= 40 words)", "repaired", "sent/s"]
    rows = [[r["set"], r["step"], r.get("sentences"), r["perplexity"], r.get("f1"),
             r.get("precision"), r.get("recall"), r.get("exact_match"),
             (r.get("le40") or {}).get("f1"), r.get("repaired"), r.get("sentences_per_second")]
            for r in reports]
    return markdown.table(header, rows)


def _files(config, split: str) -> tuple[str, str]:
  """(the treebank folder, the split's file range) of the config."""
  d = config.data
  stem = {"train": d.train_files, "validation": d.eval_files, "test": d.test_files}[split]
  return os.path.join(os.path.abspath(os.path.expanduser(d.data_dir)), d.local_corpus), stem


@functools.lru_cache(maxsize=4)
def _with_copies(folder: str, stem: str, copies: int, seed: int) -> treebank.Records:
  """The training files' trees, then `copies` substituted copies of each (substitution.py);
  cached, as a run reads its training split several times (checks, vocabulary, batches)."""
  records = treebank.split_records(folder, stem, "train split")
  copied = substitution.substitute(records.examples, copies, seed)
  return treebank.Records(records.examples + copied, f"{records.key}_sub{copies}_seed{seed}")


TASK = Parsing()
