"""Evaluation: the one path from parameters and an evaluation set to scores.

`Evaluator` scores parameters on one evaluation set (a configured split such as 'validation' or
'test', or any parallel files):
- teacher-forced over the whole set: `loss` (label-smoothed, the training objective), `nll` and
  `perplexity` = exp(nll) per target token;
- beam search (the config's `decode.*` settings) on the first `bleu_sentences` sentences (0: all),
  scored as the config's task scores its outputs (Task.score: for translation sacreBLEU BLEU,
  chrF and TER and the paper's tokenized BLEU; for a parser bracket F1 over repaired trees).
Training (dev metrics every `train.eval_every_steps`), `--mode=eval` (`evaluate_workdir`), the
sweep runner (through `--mode=eval`) and experiments/harness/run_report.py all go through it.

`evaluate_workdir` loads a checkpoint (or the average of the last k), applies the user's
`decode.*` / `data.*` overrides on top of the checkpoint's config (a `model.*` or `train.*`
override cannot change a trained model: a ConfigError), evaluates each requested set and writes
per set, in `WORKDIR/eval/`:
- `<set>_step<N>[_avg<k>][_<decode settings>][_bleu<n>].txt` (workdir.eval_stem): one
  translation per source line;
- `... .jsonl`: per sentence: index, source, reference, hypothesis;
- `... .json`: the report: metrics, signatures, decode settings, timing (`decode_seconds`,
  compiling included, and `decoder_steps`, the steps the searches ran: time per step apart from
  the number of steps), and with `compare`, the task's paired bootstrap against the other system
  (Task.compare);
and, for several sets, `summary_step<N>[...].md`, one row per set.

With `ensemble` (`--ensemble=OTHER,...`), the other workdirs' models are scored together with
WORKDIR's, as the mean of their next-token probabilities (step.ensemble_eval_step for the
perplexity, decode.ensemble_step_fn for the search): the report names them, and its file names
carry `_ensemble-<their names>`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from typing import Sequence

import jax
import ml_collections

from transformer_jax.data import pipeline, sources as sources_lib
from transformer_jax.inference import trained
from transformer_jax.inference.translate import Translator
from transformer_jax.model import sharding
from transformer_jax.runtime import files as files_lib
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.files import read_lines
from transformer_jax.tasks import registry
from transformer_jax.tasks.base import Task
from transformer_jax.training import step as step_lib, workdir as workdir_lib


@dataclasses.dataclass
class EvalSet:
  """Aligned source and reference sentences, and their teacher-forcing batches."""
  name: str                 # 'validation', 'test', or a file stem
  origin: str               # where the sentences came from, for the report
  sources: list[str]
  references: list[str]
  batches: list[dict]
  tokenized_references: list[str] | None = None  # for the paper's BLEU, as get_ende_bleu.sh


def load_eval_set(config, tok, *, split: str | None = None, files: tuple[str, ...] | None = None,
                  batch_multiple: int = 1) -> EvalSet:
  """A configured split, or (source_file, reference_file[, tokenized_reference_file]) of any
  parallel text; a tokenized reference file is what the paper's BLEU scores against."""
  common = dict(batch_multiple=batch_multiple, process_index=jax.process_index(),
                process_count=jax.process_count())
  if files is not None:
    src_path, ref_path, *tokenized = files
    texts = sources_lib.read_parallel_files(src_path, ref_path,
                                            html_unescape=config.data.html_unescape)
    tokenized_refs = None
    if tokenized and tokenized[0]:
      _, tokenized_refs = sources_lib.read_parallel_files(src_path, tokenized[0])
    batches = pipeline.make_eval_batches(config, tok, None, texts=texts, **common)
    name = os.path.basename(src_path).split(".")[0]
    return EvalSet(name, f"files {src_path} / {ref_path}", *texts, batches, tokenized_refs)
  reader = registry.get(config).read_split
  texts = sources_lib.load_split_texts(config, split, reader)
  batches = pipeline.make_eval_batches(config, tok, split, reader=reader, **common)
  return EvalSet(split, f"split {split} of {config.data.dataset} {config.data.local_corpus}".strip(),
                 *texts, batches)


def translated_count(eval_set, bleu_sentences: int) -> int:
  """How many of a set's sentences an evaluation translates: all for 0, else the first n."""
  return min(bleu_sentences or len(eval_set.sources), len(eval_set.sources))


class Evaluator:
  """Scores parameters on one EvalSet; the teacher-forced step is compiled once."""

  def __init__(self, config: ml_collections.ConfigDict, tok, mesh, eval_set: EvalSet,
               params_sharding=None, ensemble=()):
    """`ensemble`: (model config, parameters) of models scored together with the given one
    (the mean of their next-token probabilities, in perplexity as in translation)."""
    self.config, self.tok, self.mesh, self.eval_set = config, tok, mesh, eval_set
    self.task = registry.get(config)
    self.ensemble = tuple(ensemble)
    if self.ensemble:
      cfgs = (ModelConfig.from_config(config.model), *(c for c, _ in self.ensemble))
      self._step = step_lib.jit_ensemble_eval_step(cfgs, config.train.label_smoothing, mesh)
      return
    if params_sharding is None:
      params_sharding = step_lib.state_shardings(config, mesh)[1].params
    self._step = step_lib.jit_eval_step(config, mesh, params_sharding)

  def __call__(self, params, *, bleu_sentences: int | None = 0, max_batches: int = 0,
               progress: bool = False) -> tuple[dict, list[str]]:
    """(report, hypotheses). `bleu_sentences`: None translates nothing, 0 all sentences, n the
    first n. `max_batches` > 0 limits the teacher-forced pass (training's quick dev loss)."""
    start = time.time()
    report = self._teacher_forced(params, max_batches)
    hypotheses: list[str] = []
    if bleu_sentences is not None:
      n = translated_count(self.eval_set, bleu_sentences)
      sources, references = self.eval_set.sources[:n], self.eval_set.references[:n]
      decode_start = time.time()
      translator = Translator(params, self.config, self.tok, self.mesh, ensemble=self.ensemble)
      outputs = translator.translate(sources, progress=progress, raw=True)
      report["decode_seconds"] = time.time() - decode_start  # compiling included
      report["sentences_per_second"] = len(sources) / max(report["decode_seconds"], 1e-9)
      report["decoder_steps"] = translator.decoder_steps
      tokenized = self.eval_set.tokenized_references
      scores, hypotheses = self.task.score(self.config, sources, outputs, references,
                                           tokenized[:n] if tokenized else None)
      report.update(scores)
      report["sentences"] = len(sources)
    report["eval_seconds"] = time.time() - start
    return report, hypotheses

  def _teacher_forced(self, params, max_batches: int) -> dict:
    if self.ensemble:
      params = (params, *(p for _, p in self.ensemble))
    totals = {"loss_sum": 0.0, "nll_sum": 0.0, "tokens": 0.0}
    batches = self.eval_set.batches[:max_batches or None]
    for batch in batches:
      batch = {k: v for k, v in batch.items() if k in step_lib.BATCH_KEYS}
      out = self._step(params, sharding.global_batch(self.mesh, batch))
      for k in totals:
        totals[k] += float(out[k])
    tokens = max(totals["tokens"], 1.0)
    nll = totals["nll_sum"] / tokens
    return {"loss": totals["loss_sum"] / tokens, "nll": nll,
            "perplexity": math.exp(min(nll, 50.0)), "tokens": totals["tokens"]}


def ensemble_tag(workdirs: Sequence[str]) -> str:
  """'_ensemble-s1-3fa2c1' for the other members' (resolved) workdirs: their folder names and a
  hash of their full paths, so that two ensembles of like-named runs never overwrite each
  other's reports; '' for none. Part of the report's file name (workdir.eval_stem)."""
  if not workdirs:
    return ""
  names = "-".join(os.path.basename(w.rstrip("/")) for w in workdirs)
  return f"_ensemble-{names}-{hashlib.sha1(chr(10).join(workdirs).encode()).hexdigest()[:6]}"


def evaluate_workdir(workdir: str, *, splits: Sequence[str] = ("test",),
                     files: Sequence[tuple[str, ...]] = (), average: int = 0,
                     step: int | None = None, override_args: Sequence[str] = (),
                     bleu_sentences: int = 0, compare: str = "",
                     ensemble: Sequence[str] = ()) -> list[dict]:
  """`--mode=eval`: evaluates a workdir's checkpoint (with `ensemble`: together with other
  workdirs' models, ensemble_members) on each split and each (source, reference[, tokenized
  reference]) set of files; returns the reports (also written to WORKDIR/eval/)."""
  asked_step = step
  if bleu_sentences < 0:
    raise ConfigError(f"--bleu_sentences={bleu_sentences}: expected 0 (all) or a positive count")
  workdir = files_lib.resolve(workdir)
  if jax.process_index() == 0:  # where the reports go, checked before anything is decoded
    eval_dir = files_lib.join(workdir, workdir_lib.EVAL_FOLDER)
    where = eval_dir if files_lib.isdir(eval_dir) else workdir  # created when the first is written
    reason = files_lib.cannot_write_in(where) if files_lib.isdir(workdir) else None
    if reason:
      raise ConfigError(f"cannot write the reports to {eval_dir} ({reason}); nothing was evaluated")
  loaded = trained.load(workdir, override_args, average=average, step=step)
  params, config, step, overrides, tok = (loaded.params, loaded.config, loaded.step,
                                          loaded.overrides, loaded.tokenizer)
  members = trained.ensemble_members(workdir, ensemble, average=average, step=asked_step, tok=tok)
  mesh = sharding.make_mesh(config.mesh)
  rows = sharding.batch_parallelism(mesh)
  requested = [dict(split=s) for s in splits] + [dict(files=tuple(f)) for f in files]
  sets = [load_eval_set(config, tok, batch_multiple=rows, **r) for r in requested]  # errors first
  tag = workdir_lib.settings_tag(overrides) + ensemble_tag([m["workdir"] for m in members])
  # The other system's outputs, read (and, for parsers, checked as trees) before anything is
  # decoded: a wrong --compare is one line at once, not after a whole decode.
  task = registry.get(config)
  baselines = [_read_baseline(task, compare, s, translated_count(s, bleu_sentences))
               if compare else None for s in sets]
  reports = []
  for eval_set, baseline in zip(sets, baselines):
    report, hypotheses = Evaluator(config, tok, mesh, eval_set,
                                   ensemble=[(m["model"], m["params"]) for m in members])(
        params, bleu_sentences=bleu_sentences, progress=True)
    report.update(set=eval_set.name, origin=eval_set.origin, split=eval_set.name, step=step,
                  averaged_checkpoints=average, decode=dict(config.decode.to_dict()),
                  overrides={k: v for k, v in overrides.items()})
    if members:
      report["ensemble"] = [{k: m[k] for k in ("workdir", "step", "averaged_checkpoints")}
                            for m in members]
    if compare:
      test = task.compare(baseline, hypotheses, eval_set.references[:len(hypotheses)])
      report["compare"] = {"baseline": compare, **test}
    if jax.process_index() == 0:
      _write_set(workdir_lib.eval_stem(workdir, eval_set.name, step, average, tag, bleu_sentences),
                 report, eval_set, hypotheses, task)
    reports.append(report)
  if len(reports) > 1 and jax.process_index() == 0:
    files_lib.write_text(
        workdir_lib.eval_stem(workdir, "summary", step, average, tag, bleu_sentences) + ".md",
        task.summary_table(reports))
    print(task.summary_table(reports), end="", flush=True)
  return reports


def _write_set(stem: str, report: dict, eval_set: EvalSet, hypotheses: list[str],
               task: Task) -> None:
  files_lib.makedirs(os.path.dirname(stem))
  files_lib.write_text(stem + ".txt", "".join(h + "\n" for h in hypotheses))
  files_lib.write_text(stem + ".jsonl", "".join(
      json.dumps({"index": i, "source": s, "reference": r, "hypothesis": h}, ensure_ascii=False)
      + "\n" for i, (s, r, h) in enumerate(zip(eval_set.sources, eval_set.references, hypotheses))))
  files_lib.write_text(stem + ".json", json.dumps(report, indent=2))
  line = f"{eval_set.name} step {report['step']}"
  if "ensemble" in report:
    line += " with " + ", ".join(f"{m['workdir']} step {m['step']}" for m in report["ensemble"])
  line += f": perplexity {report['perplexity']:.2f}" + task.report_line(report)
  if "compare" in report:
    c = report["compare"]
    line += f"; vs {c['baseline']}: " + ", ".join(
        f"{name} {c[key]['delta']:+.2f} (p={c[key]['p_value']:.4f})"
        for key, name in (("f1", "F1"), ("bleu", "BLEU"), ("chrf", "chrF")) if key in c)
  print(f"{line}; wrote {stem}.*", flush=True)


def _read_baseline(task: Task, compare: str, eval_set: EvalSet, count: int):
  """The other system's outputs for the first `count` sentences of `eval_set`, as the task's
  compare takes them, refused in one line unless they are outputs for the same sentences: the
  sources a report records (beside its .txt), and what the task can tell from the outputs
  themselves (a parser's leaves against the words)."""
  baseline = _comparison_hypotheses(compare, eval_set.name, count)
  what = f"--compare={compare}" + (f" ({baseline.path})" if baseline.path != compare else "")
  mine = eval_set.sources[:count]
  if baseline.sources is not None:
    for i, (theirs, ours) in enumerate(zip(baseline.sources, mine)):
      if theirs != ours:
        raise ConfigError(f"{what}: line {i + 1} is the output for another sentence (its "
                          f"source {theirs[:60]!r}, here {ours[:60]!r}, sentence {i + 1} of "
                          f"{eval_set.name}); compare "
                          "systems on the same sentences")
  return task.read_baseline(baseline.lines, what, sources=mine)


@dataclasses.dataclass
class _Baseline:
  """Another system's outputs: the file they were read from, and the sources its report
  records beside it (None for a bare hypotheses file)."""
  lines: list[str]
  path: str
  sources: list[str] | None = None


def _recorded_sources(txt_path: str, count: int) -> list[str] | None:
  """The sources of the first `count` sentences of the report beside an eval .txt (its .jsonl
  written by _write_set), or None when there is none to read."""
  jsonl = txt_path[:-len(".txt")] + ".jsonl"
  if not txt_path.endswith(".txt") or not os.path.isfile(jsonl):
    return None
  out = []
  for n, line in enumerate(read_lines(jsonl)[:count], start=1):
    try:
      out.append(str(json.loads(line)["source"]))
    except (ValueError, KeyError, TypeError):
      raise ConfigError(f"{jsonl} line {n} is not an evaluation record (JSON with a 'source')"
                        ) from None
  return out


def _comparison_hypotheses(path: str, set_name: str, count: int) -> _Baseline:
  """The other system's translations: a hypotheses file (one per line), an eval report (.json,
  its .txt beside it), or a trained workdir (loaded as trained.open_workdir checks one; its
  newest eval of the same set with as many sentences as translated here: a `--bleu_sentences=n`
  report is chosen only when n sentences were). A report's sources come with it."""
  files_lib.check_exists(path, f"--compare={path}")
  if os.path.isdir(path):
    trained.open_workdir(path, what=f"--compare={path}")
    folder = os.path.join(path, workdir_lib.EVAL_FOLDER)
    found = sorted((f for f in (os.listdir(folder) if os.path.isdir(folder) else [])
                    if f.startswith(f"{set_name}_step") and f.endswith(".txt")),
                   key=lambda f: os.path.getmtime(os.path.join(folder, f)), reverse=True)
    if not found:
      raise ConfigError(f"--compare={path}: no evaluation of '{set_name}' in {folder}; run "
                        f"--mode=eval on that workdir first")
    seen = []
    for f in found:  # newest first; read only until one fits
      lines = read_lines(os.path.join(folder, f))
      if len(lines) == count:
        chosen = os.path.join(folder, f)
        return _Baseline(lines, chosen, _recorded_sources(chosen, count))
      seen.append(f"{f} ({len(lines)})")
    raise ConfigError(f"--compare={path}: no evaluation of '{set_name}' with {count} sentences "
                      f"in {folder} (found: {', '.join(seen)}); compare systems on the same "
                      "sentences")
  report = path.endswith(".json")
  if report:
    path = path[:-len(".json")] + ".txt"
  lines = read_lines(path)
  if len(lines) != count:
    raise ConfigError(f"--compare={path} has {len(lines)} lines but {count} sentences were "
                      "translated here; compare systems on the same sentences")
  return _Baseline(lines, path, _recorded_sources(path, count) if report else None)
