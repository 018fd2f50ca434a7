"""The interface of a task: what training, evaluation and translation ask of `data.task`.

The layers below stay generic: the data layer reads a split with the reader a task hands it,
and the search takes a constraint object; everything the task changes is a method here, so a new
task is a new subclass registered in registry.py, not a branch at every call site.
"""

from __future__ import annotations

import abc
from typing import Any, Mapping, Sequence

import ml_collections

from transformer_jax.data import sources


class Task(abc.ABC):
  """One task. Subclasses are stateless: one instance serves every config (and pickles into
  grain's worker processes with the split reader)."""

  name: str = ""
  # What training logs of a dev evaluation besides the loss: (metric name, report key); the
  # first is the task's headline score, `score_name` what a results record calls it.
  dev_metrics: tuple[tuple[str, str], ...] = ()
  score_name: str = ""
  # SentencePiece may cut a piece where the Unicode script changes (data/tokenizer.py).
  split_by_script: bool = True
  # Config keys that turn on something of this task only, with what they do: another task's
  # config must leave them off (registry.get).
  switches: Mapping[str, str] = {}
  # Why a model of this task cannot be exported to another toolkit (tools/export.py), one
  # clause; '' when its outputs are the decoded texts as they are.
  export_refusal: str = ""

  def __repr__(self) -> str:
    return f"<task {self.name!r}>"

  def validate(self, config: ml_collections.ConfigDict) -> None:
    """ConfigError (one line naming the key) for settings this task cannot run with."""
    del config

  @abc.abstractmethod
  def read_split(self, config: ml_collections.ConfigDict, split: str) -> sources.SplitSource:
    """The split's records (a sources.SplitReader; called through sources.split_source)."""

  def training_warnings(self, config: ml_collections.ConfigDict) -> list[str]:
    """Lines training prints before it starts, about its training data."""
    del config
    return []

  def word_starts(self, tokenizer) -> tuple[int, ...]:
    """The vocabulary ids that begin a word, for `model.word_positions` (training fills
    `model.word_starts` with them): every piece that begins a whitespace-separated token."""
    return tokenizer.word_start_ids()

  def decode_constraint(self, config: ml_collections.ConfigDict, tokenizer) -> Any:
    """What the beam search's outputs must obey (a decode.Constraint), or None: free."""
    del config, tokenizer
    return None

  def postprocess(self, config: ml_collections.ConfigDict, sources_: Sequence[str],
                  outputs: Sequence[str]) -> list[str]:
    """Decoded texts of `sources_` -> the task's outputs, as translation writes them."""
    del config, sources_
    return list(outputs)

  @abc.abstractmethod
  def score(self, config: ml_collections.ConfigDict, sources_: Sequence[str],
            outputs: Sequence[str], references: Sequence[str],
            tokenized_references: Sequence[str] | None = None) -> tuple[dict, list[str]]:
    """(metrics, post-processed outputs) of the decoded texts of `sources_` against
    `references`."""

  def read_baseline(self, lines: Sequence[str], what: str,
                    sources: Sequence[str] | None = None) -> Sequence[Any]:
    """Another system's outputs as `compare` takes them, for `sources` (the sentences scored
    here, one per line); a ConfigError naming `what` and the line when they cannot be, or are
    outputs of other sentences as far as the task can tell (read before anything is decoded)."""
    del what, sources
    return lines

  @abc.abstractmethod
  def compare(self, baseline: Sequence[Any], outputs: Sequence[str],
              references: Sequence[str]) -> dict:
    """Paired significance test of `outputs` against `baseline` (read_baseline's)."""

  @abc.abstractmethod
  def report_line(self, report: Mapping[str, Any]) -> str:
    """The scores of an evaluation report as a piece of its printed line, ', metric value ...'
    ('' when it holds none)."""

  @abc.abstractmethod
  def summary_table(self, reports: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table, one row per evaluated set."""
