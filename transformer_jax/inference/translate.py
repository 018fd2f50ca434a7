"""Translating text with a trained workdir: the Python API and the `--mode=translate` CLI.

  from transformer_jax.inference.translate import Translator
  Translator.from_workdir("workdirs/multi30k").translate(["A man rides a bike."])

The workdir's task (tasks/registry.py) says what the outputs are: a parser's workdir reads
tokenized sentences and writes trees. Sentences are encoded with the workdir's SentencePiece
model, sorted by length and decoded in batches padded to a few fixed widths (so jit compiles a
handful of shapes), then put back in input order. Empty lines give empty outputs; a line longer
than the model's source limit is cut to it with one warning naming the line.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging

from transformer_jax.decoding import decode
from transformer_jax.inference import trained
from transformer_jax.model import sharding
from transformer_jax.runtime import files
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.files import read_lines
from transformer_jax.tasks import registry


def _bucket_width(n: int) -> int:
  """Pads source widths to multiples of 16 (few shapes, little padding)."""
  return max(16, -(-n // 16) * 16)


class Translator:
  """Beam-search translation with fixed parameters, tokenizer and decoding settings."""

  def __init__(self, params, config: ml_collections.ConfigDict, tokenizer, mesh=None,
               ensemble: Sequence[tuple[ModelConfig, Any]] = ()):
    """With a mesh, each batch is split over its data-parallel devices (sharding.batch_parallelism
    rows per device at least); without one, batches run on the default device. `ensemble`:
    (model config, parameters) of other models with the same vocabulary that decode together
    with this one (decode.ensemble_step_fn)."""
    self.params = params
    self.mesh = mesh
    self.config = config
    self.model_config = ModelConfig.from_config(config.model)
    for cfg, _ in ensemble:
      if cfg.vocab_size != self.model_config.vocab_size:
        raise ConfigError(f"an ensemble member has {cfg.vocab_size} vocabulary pieces, this model "
                          f"{self.model_config.vocab_size}: ensemble members share one vocabulary")
    # What decode.translate_batch takes: one model, or the ensemble's tuples.
    self._models = (self.model_config, *(c for c, _ in ensemble)) if ensemble else self.model_config
    self._params = (params, *(p for _, p in ensemble)) if ensemble else params
    self.tokenizer = tokenizer
    self.beam_size = config.decode.beam_size
    self.alpha = config.decode.alpha
    self.batch_size = config.decode.batch_size
    if mesh is not None:
      self.batch_size = sharding.padded_rows(self.batch_size, mesh)
    self.task = registry.get(config)
    self.constraint = self.task.decode_constraint(config, tokenizer)  # None: a free search
    self.decoder_steps = 0  # run by the searches so far (a batch's search runs to its longest)
    self.max_source_len = min(config.data.max_source_len, self.model_config.max_len,
                              *(c.max_len for c, _ in ensemble))

  @classmethod
  def from_workdir(cls, workdir: str, *, step: int | None = None, average: int = 0,
                   override_args: Sequence[str] = (), ensemble: Sequence[str] = ()) -> "Translator":
    """The newest (or `step`) checkpoint of a training workdir, or the average of the last
    `average` checkpoints (up to `step`), with `decode.*` overrides ('--config.decode.beam_size=1')
    applied on top of its config; `ensemble`: other workdirs whose models decode with it
    (trained.ensemble_members)."""
    loaded = trained.load(workdir, override_args, average=average, step=step)
    members = trained.ensemble_members(workdir, ensemble, average=average, step=step,
                                       tok=loaded.tokenizer)
    return cls(loaded.params, loaded.config, loaded.tokenizer,
               sharding.make_mesh(loaded.config.mesh),
               ensemble=[(m["model"], m["params"]) for m in members])

  def encode(self, sentences: Sequence[str], first_line: int = 1) -> list[list[int]]:
    """Source ids with EOS, cut to the model's limit (warning once per cut line)."""
    out = []
    for i, text in enumerate(sentences):
      if not text.strip():
        out.append([])
        continue
      ids = self.tokenizer.encode_with_eos(text)
      if len(ids) > self.max_source_len:
        logging.warning("line %d has %d tokens; truncated to the model's limit of %d",
                        first_line + i, len(ids), self.max_source_len)
        print(f"warning: line {first_line + i} has {len(ids)} tokens; truncated to "
              f"{self.max_source_len}", file=sys.stderr)
        ids = ids[:self.max_source_len - 1] + [self.tokenizer.eos_id]
      out.append(ids)
    return out

  def batches(self, source_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    """The indices of the sentences each decoded batch holds: the non-empty sources sorted by
    length, `decode.batch_size` at a time (so a batch's sentences end at about one step)."""
    order = sorted((i for i, s in enumerate(source_ids) if s), key=lambda i: len(source_ids[i]))
    return [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]

  def translate_ids(self, source_ids: Sequence[Sequence[int]], progress: bool = False) -> list[list[int]]:
    """Output ids (no EOS) for each source, in input order; empty sources give []."""
    results: list[list[int]] = [[] for _ in source_ids]
    batches = self.batches(source_ids)
    bar = None
    if progress:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      bar = tqdm(total=sum(map(len, batches)), desc="translate", unit="sent", file=sys.stderr)
    for idx in batches:
      width = _bucket_width(max(len(source_ids[i]) for i in idx))
      inputs = np.zeros((self.batch_size, width), np.int32)  # fixed rows: one shape per width
      for row, i in enumerate(idx):
        inputs[row, :len(source_ids[i])] = source_ids[i]
      out, steps = decode.translate_batch(
          self._models, self._params, inputs, beam_size=self.beam_size, alpha=self.alpha,
          max_extra_len=self.config.decode.max_extra_len, mesh=self.mesh,
          constraint=self.constraint, drop_finished=self.config.decode.drop_finished)
      self.decoder_steps += int(steps)
      for row, ids in zip(idx, decode.strip_eos(jax.device_get(out))):
        results[row] = ids
      if bar is not None:
        bar.update(len(idx))
    if bar is not None:
      bar.close()
    return results

  def translate(self, sentences: Sequence[str], progress: bool = False,
                raw: bool = False) -> list[str]:
    """Outputs of `sentences`, one per input, in order, as the task writes them (Task.postprocess:
    a parser's are trees, one line each), or with `raw` the decoded texts as they are."""
    ids = self.translate_ids(self.encode(sentences), progress=progress)
    outputs = [self.tokenizer.decode(x) if x else "" for x in ids]
    return outputs if raw else self.task.postprocess(self.config, sentences, outputs)


def _write_lines(path: str, lines: Iterable[str]) -> None:
  text = "".join(line + "\n" for line in lines)
  if path == "-":
    sys.stdout.write(text)
    sys.stdout.flush()
    return
  files.write_text(path, text)


def translate_files(workdir: str, input_path: str, output_path: str, *, step: int | None = None,
                    average: int = 0, override_args: Sequence[str] = (),
                    ensemble: Sequence[str] = ()) -> None:
  """`--mode=translate`: input lines -> output lines, aligned one to one. Where they go is checked
  before anything is decoded."""
  files.check_writable(output_path, "--output")
  lines = read_lines(input_path)
  translator = Translator.from_workdir(workdir, step=step, average=average,
                                       override_args=override_args, ensemble=ensemble)
  _write_lines(output_path, translator.translate(lines, progress=input_path != "-"))
