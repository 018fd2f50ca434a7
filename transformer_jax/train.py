"""`train_and_evaluate(config, workdir)`: the training loop.

data -> model -> loss -> step -> checkpoint: batches from the grain pipeline are assembled into
global arrays on the mesh, the jitted train step updates the sharded state, metrics go to
TensorBoard, `metrics.jsonl` and a progress bar, and Orbax checkpoints (with the data
iterator's state) are written every N steps and/or minutes.

One run per workdir: the run holds the workdir's lock (workdir.claim) from start to end; a
second run on it stops at once with one line naming the holder.

Resumption: the same command on the same workdir continues from the newest good checkpoint;
on CPU in float32 the result equals an uninterrupted run bit for bit (same batches, and dropout
masks that depend only on (seed, step)). A resume continues the checkpoint's run: the same
vocabulary (its SHA-256 is in each checkpoint) and a config that changes only what the finished
steps never saw (branch.check_resume); the accepted changes are printed and recorded with their
step in `config_changes.jsonl`. When no checkpoint can be read the run starts again from step 0,
with step 0's data (checkpoint.restore_latest rewinds the iterator after each failed attempt) and
the old logs renamed aside. The logs follow the checkpoints: a resumed run drops
the metric lines and TensorBoard events past the restored step, `config.json` is written once
the run's first checkpoint is complete, and `train.max_train_minutes` counts the training time
of every run on the workdir (stored in each checkpoint).

Stops: SIGTERM (preemption) and a first Ctrl-C write a checkpoint of the current step and exit 0
(a second Ctrl-C stops at once). A non-finite
loss or gradient norm stops the run naming the step, before anything from that state is saved
(the last good checkpoint stays); a loss above `train.divergence_warn_factor` times the lowest
so far warns once. A checkpoint that cannot be written (exceptions.SaveError) or any other file
error (a full disk) stops the run with one line and the free space.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time

import jax
import ml_collections
import numpy as np
from absl import logging

from transformer_jax.data import pipeline, sources, tokenizer
from transformer_jax.inference import evaluate as evaluate_lib
from transformer_jax.model import attention, matmul, sharding
from transformer_jax.runtime import distributed, files
from transformer_jax.runtime.config import ModelConfig, validate
from transformer_jax.runtime.exceptions import ConfigError, TrainingError
from transformer_jax.tasks import registry
from transformer_jax.training import branch, checkpoint, step as step_lib, workdir as workdir_lib
from transformer_jax.training.metrics import (MetricsWriter, ProfileWindow, Progress, measure_peak_flops,
                                     mfu, train_flops)


# What training logs of the dev evaluation (metrics.jsonl / TensorBoard name, report key),
# before the task's own scores (Task.dev_metrics).
DEV_METRICS = (("loss", "loss"), ("nll", "nll"), ("perplexity", "perplexity"),
               ("tokens", "tokens"))


class _Preemption:
  """Turns SIGTERM (preemption) and a first Ctrl-C (SIGINT) into a flag the loop checks after each
  step: the run saves a checkpoint of that step and exits 0. A second Ctrl-C stops at once
  (KeyboardInterrupt: one line, errors.run)."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, write=print):
    self.requested = None  # the name of the signal received
    self._previous = {}
    self._write = write

  def __enter__(self):
    def handler(signum, frame):  # pylint: disable=unused-argument
      if self.requested == "SIGINT" and signum == signal.SIGINT:
        raise KeyboardInterrupt  # the second Ctrl-C
      if self.requested is None:
        self.requested = signal.Signals(signum).name
        if signum == signal.SIGINT:
          self._write("Ctrl-C: saving a checkpoint after this step (Ctrl-C again to stop at once, "
                      "without it)")
    try:
      for sig in self.SIGNALS:
        self._previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: no handler, no preemption support
      self._previous = {}
    return self

  def __exit__(self, *exc):
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)


class _Window:
  """Token sums of the steps since the last log line, and the divergence guard on each step."""

  def __init__(self, warn_factor: float, warn):
    self.warn_factor, self.warn, self.lowest, self.warned = warn_factor, warn, math.inf, False
    self.reset()

  def reset(self):
    self.loss_sum = self.nll_sum = self.tokens = self.flops = 0.0
    self.steps, self.start = 0, time.time()

  def add(self, metrics, step_num: int) -> None:
    loss_sum, grad_norm = float(metrics["loss_sum"]), float(metrics["grad_norm"])
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
      what = f"loss ({loss_sum})" if not math.isfinite(loss_sum) else f"gradient norm ({grad_norm})"
      raise TrainingError(f"non-finite {what} at step {step_num}; stopping. The last good "
                          "checkpoint is kept; lower train.learning_rate_scale or enable "
                          "train.grad_clip_norm")
    tokens = float(metrics["tokens"])
    self.loss_sum, self.tokens = self.loss_sum + loss_sum, self.tokens + tokens
    self.nll_sum += float(metrics["nll_sum"])
    if tokens > 0:
      loss = loss_sum / tokens
      if self.warn_factor and not self.warned and loss > self.warn_factor * self.lowest:
        self.warned = True
        self.warn(f"warning: loss {loss:.4g} at step {step_num} is above "
                  f"{self.warn_factor:g} x the lowest so far ({self.lowest:.4g}); the run may be "
                  "diverging (lower train.learning_rate_scale or set train.grad_clip_norm)")
      self.lowest = min(self.lowest, loss)

  def scalars(self, metrics, peak: float, num_devices: int) -> dict:
    """The window's train scalars (step_time: elapsed / steps in this window); then resets."""
    elapsed, tokens = max(time.time() - self.start, 1e-9), max(self.tokens, 1.0)
    out = {"loss": self.loss_sum / tokens, "nll": self.nll_sum / tokens,
           "perplexity": math.exp(min(self.nll_sum / tokens, 50.0)),
           "learning_rate": metrics["learning_rate"], "grad_norm": metrics["grad_norm"],
           "tokens_per_second": self.tokens / elapsed, "step_time": elapsed / max(self.steps, 1),
           "model_flops_per_second": self.flops / elapsed, "mfu": mfu(self.flops / elapsed, peak, num_devices)}
    self.reset()
    return out


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes) the run in `workdir`; returns the final dev metrics."""
  with distributed.stop_if_process_lost():  # another process gone: one line, LOST_PROCESS_EXIT
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  validate(config)
  task = registry.get(config)  # the task's own checks, before anything is written
  attention.check_backend(ModelConfig.from_config(config.model))
  slow = matmul.slow_dtype_warning(config.model.dtype)
  if slow:
    logging.warning("%s", slow)
  mesh = sharding.make_mesh(config.mesh)
  sharding.check_divisibility(config, mesh)
  _check_inputs(config, task)
  with workdir_lib.claim(workdir, "training") as workdir:
    saver = checkpoint.Saver(checkpoint.make_manager(checkpoint.checkpoint_dir(workdir),
                                                     keep=config.train.keep_checkpoints,
                                                     keep_every=config.train.keep_every_steps),
                             config, workdir)
    try:  # closed on every exit: Orbax's background threads must not outlive an error
      with distributed.stop_if_process_lost():  # before close(), which would wait for it
        return _train(config, workdir, saver, mesh, task)
    except OSError as e:  # a full disk, a lost mount: one line
      raise TrainingError(f"{e.filename or workdir}: {e.strerror or e} ({workdir_lib.free_space(workdir)}); "
                          f"{checkpoint.kept_note(str(saver.manager.directory))}; stopping") from None
    finally:
      saver.close()


def prepare_vocabulary(config: ml_collections.ConfigDict, workdir: str) -> str:
  """`--mode=vocab`: the run's vocabulary in WORKDIR/vocab, trained from the training split as a
  training run's start would (or the one already there), under the workdir's lock; returns its
  path. A sweep trains the one vocabulary its runs share this way before they start side by
  side (experiments/harness/runner.py)."""
  validate(config)
  task = registry.get(config)
  with distributed.stop_if_process_lost():
    _check_inputs(config, task)
  with distributed.stop_if_process_lost(), workdir_lib.claim(workdir,
                                                               "training the vocabulary") as workdir:
    distributed.process_zero_first("vocab", lambda: _vocabulary(config, workdir, task))
    return tokenizer.vocab_path(workdir)


def _check_inputs(config, task) -> None:
  """Every split's files read and checked before the workdir is claimed or the vocabulary
  trained: a bad dev or test file is refused with nothing written (process 0 first, so the
  others read what it prepared; a refusal on any process is every process's one line, exit 2,
  through process_zero_first, instead of the others waiting for it)."""
  distributed.process_zero_first("inputs", lambda: sources.check_splits(config, task.read_split))


def _vocabulary(config, workdir: str, task) -> tokenizer.Tokenizer:
  """The workdir's vocabulary, trained on the task's training split when not there yet."""
  return tokenizer.load_or_train_tokenizer(config, workdir, reader=task.read_split,
                                           split_by_script=task.split_by_script)


def _train(config, workdir, saver, mesh, task) -> dict:
  """The body of train_and_evaluate, once the workdir is held."""
  t_cfg, manager = config.train, saver.manager
  model_cfg = ModelConfig.from_config(config.model)
  abstract_state, state_sh = step_lib.state_shardings(config, mesh)
  # Refuse an incompatible workdir before anything is written into it.
  if manager.latest_step() is not None:
    checkpoint.check_compatible(manager, manager.latest_step(), abstract_state, config)

  tok = distributed.process_zero_first(  # trained once into WORKDIR/vocab, then loaded by all
      "vocab", lambda: _vocabulary(config, workdir, task))
  if tok.vocab_size != model_cfg.vocab_size:
    raise ConfigError(f"config key 'model.vocab_size'={model_cfg.vocab_size} but the vocabulary in "
                      f"{workdir}/vocab has {tok.vocab_size} pieces")
  if model_cfg.counts_words:  # the model reads which ids begin a word; saved with the run
    _fill_word_starts(config, task, tok)
  rows_multiple = max(sharding.batch_parallelism(mesh), jax.process_count())
  train_iter = saver.data_iterator = pipeline.make_train_iterator(
      config, tok, batch_multiple=rows_multiple, process_index=jax.process_index(),
      process_count=jax.process_count(), reader=task.read_split)
  dev_set = evaluate_lib.load_eval_set(config, tok, split="validation", batch_multiple=rows_multiple)
  for line in task.training_warnings(config):
    logging.warning("%s", line)
    print(f"warning: {line}", file=sys.stderr, flush=True)

  saver.progress = {"vocab_sha256": tok.sha256,  # the bytes written to WORKDIR/vocab
                    "vocab_fingerprint": tok.fingerprint}
  restored = checkpoint.restore_latest(manager, abstract_state, train_iter,
                                       floor=branch.branch_step(workdir))
  state, start_step, spent = restored.state, restored.step, restored.train_seconds
  budget = t_cfg.max_train_minutes * 60.0
  minutes_left = (budget - spent) / 60.0 if budget else 0.0  # 0: no limit
  if state is None:
    state, start_step = step_lib.create_state(config, mesh, state_sh), 0
    logging.info("starting a new run in %s", workdir)
    if restored.quarantined:
      _set_aside_logs(workdir, restored.quarantined)
  elif start_step >= t_cfg.num_steps:  # checked as any resume, then nothing to do
    _check_resume(restored, config, workdir, saver, tok, announce=False)
    print(f"nothing to train: the checkpoint at step {start_step} in {workdir} is already "
          f"{'past' if start_step > t_cfg.num_steps else 'at'} the run's end, "
          f"train.num_steps={t_cfg.num_steps} (give a larger one to train on)", flush=True)
    return {}
  else:
    _check_resume(restored, config, workdir, saver, tok)
    left = (f" ({minutes_left:.2f} of train.max_train_minutes={budget / 60:.2f} left)"
            if budget and spent < budget else "")
    print(f"resuming from the checkpoint at step {start_step} in {workdir}{left}", flush=True)
  if budget and spent >= budget and start_step < t_cfg.num_steps:
    print(f"train.max_train_minutes={t_cfg.max_train_minutes:g} already used up ({spent / 60:.2f} "
          f"minutes up to step {start_step}); nothing to train", flush=True)
    return {}

  train_fn = step_lib.jit_train_step(config, mesh, state_sh)
  evaluator = evaluate_lib.Evaluator(config, tok, mesh, dev_set, state_sh.params)
  writer = MetricsWriter(workdir, start_step)
  peak = t_cfg.peak_flops or measure_peak_flops(np.dtype(model_cfg.dtype))
  bar = Progress(t_cfg.progress_bar and jax.process_index() == 0, t_cfg.num_steps, start_step,
                 minutes_left)
  window = _Window(t_cfg.divergence_warn_factor, bar.write)
  profile = ProfileWindow(workdir, start_step, t_cfg.profile_after_steps, t_cfg.profile_steps,
                          bar.write)
  step_num, pending = start_step, None  # pending: a step's metrics, read one step late
  last_ckpt_time = run_start = time.time()
  dev_metrics, hypotheses = {}, []

  def check_pending():  # before logging, evaluating or saving the state
    nonlocal pending
    if pending is not None:
      window.add(pending, step_num)
      pending = None

  with (_Preemption(bar.write) as preemption, contextlib.closing(writer), contextlib.closing(bar),
        contextlib.closing(profile)):
    while step_num < t_cfg.num_steps:
      profile.before_step(step_num)
      for _ in range(t_cfg.grad_accum_steps):
        batch = {k: v for k, v in next(train_iter).items() if k in step_lib.BATCH_KEYS}
        b, s = batch["inputs"].shape
        window.flops += train_flops(model_cfg, b * jax.process_count(), s,
                                    batch["targets"].shape[1])
        state, metrics = train_fn(state, sharding.global_batch(mesh, batch))
        check_pending()
        pending = metrics
      step_num += 1
      window.steps += 1
      profile.after_step(step_num, state.step)
      saver.poll()  # a failed background save stops the run now, not at the next save
      last = step_num == t_cfg.num_steps
      sigterm, out_of_time, due_minutes = distributed.agree(
          preemption.requested is not None, bool(budget and spent + time.time() - run_start >= budget),
          bool(t_cfg.checkpoint_every_minutes
               and (time.time() - last_ckpt_time) / 60 >= t_cfg.checkpoint_every_minutes))
      if step_num % t_cfg.log_every_steps == 0 or last or sigterm or out_of_time:
        check_pending()
        scalars = window.scalars(metrics, peak, mesh.devices.size)
        writer.write(step_num, scalars, "train")
        bar.update(step_num, loss=f"{scalars['loss']:.3f}", ppl=f"{scalars['perplexity']:.1f}",
                   tok_s=f"{scalars['tokens_per_second']:.0f}")
      bar.update(step_num)
      if step_num % t_cfg.eval_every_steps == 0 or last or out_of_time:
        check_pending()
        report, hypotheses = evaluator(state.params, bleu_sentences=t_cfg.eval_bleu_sentences or None,
                                       max_batches=t_cfg.max_eval_batches)
        dev_metrics = {name: report[key] for name, key in DEV_METRICS + task.dev_metrics
                       if key in report}
        writer.write(step_num, dev_metrics, "dev")
        writer.write_samples(step_num, dev_set.sources, dev_set.references, hypotheses)
        bar.write(f"step {step_num}: dev " + ", ".join(f"{k} {v:.3f}" for k, v in dev_metrics.items()
                                                           if k != "tokens"))
      if (step_num % t_cfg.checkpoint_every_steps == 0 or last or due_minutes or sigterm
          or out_of_time):
        check_pending()  # never save parameters that came from a non-finite step
        saver.save(step_num, state, spent + time.time() - run_start)
        last_ckpt_time = time.time()
      if sigterm:
        bar.write(f"{preemption.requested or 'SIGTERM'}: saved a checkpoint at step {step_num}; "
                  "exiting (the same command resumes it)")
        break
      if out_of_time:
        bar.write(f"train.max_train_minutes reached: saved a checkpoint at step {step_num}")
        break
    profile.close(state.step)  # a run that ended inside the window
    saver.finish()
  if hypotheses:
    _print_examples(bar, dev_set, hypotheses)
  logging.info("finished at step %d", step_num)
  return dev_metrics


def _fill_word_starts(config, task, tok) -> None:
  """config.model.word_starts from the vocabulary (`model.word_positions`, `model.word_pointer`):
  every checkpoint's config then holds them, so whatever loads the run gets the model it
  trained."""
  starts = tuple(task.word_starts(tok))
  given = tuple(config.model.word_starts)
  if given and given != starts:
    raise ConfigError("config key 'model.word_starts' differs from the ids that begin a word in "
                      "the vocabulary of this run; leave it unset: training fills it")
  config.model.word_starts = starts


def _check_resume(restored: checkpoint.Restored, config, workdir: str, saver, tok,
                  announce: bool = True) -> None:
  """A resume continues the run of its checkpoint: the same vocabulary, and a config that changes
  only what the finished steps never saw (branch.check_resume); the accepted changes are
  printed (unless not `announce`: a run with nothing to train records none) and recorded with
  the step (checkpoint.record_changes, once the resumed run's first checkpoint exists)."""
  checkpoint.check_vocabulary(restored.progress, tok, tokenizer.vocab_path(workdir), restored.step)
  changes = {}
  if restored.config is not None:
    changes = branch.check_resume(restored.config, config, restored.step, workdir)
  for key, (old, new) in changes.items() if announce else ():
    print(f"resuming with {key}={new!r} (was {old!r}); recorded in "
          f"{checkpoint.CHANGES_FILE}", flush=True)
  saver.resumed = (restored.step, changes)


def _set_aside_logs(workdir: str, quarantined) -> None:
  """A run that starts again from step 0 because no checkpoint could be read: the old run's
  metrics.jsonl, config_changes.jsonl and TensorBoard events are renamed aside (not dropped),
  as the checkpoints were, and the new run's logs start empty."""
  stamp = time.strftime("%Y%m%d-%H%M%S")
  kept = []
  for name in ("metrics.jsonl", checkpoint.CHANGES_FILE, "tb"):
    path = files.join(workdir, name)
    if files.exists(path):
      aside = files.join(workdir, f"{name}.before_restart_{stamp}")
      files.rename(path, aside)
      kept.append(aside)
  print(f"warning: no checkpoint in {workdir} could be read (steps "
        f"{', '.join(map(str, quarantined))} moved aside); starting again from step 0"
        + (f"; the old logs kept as {', '.join(kept)}" if kept else ""), flush=True)


def _print_examples(bar, dev_set, hypotheses, count: int = 3) -> None:
  """The last dev evaluation's first translations beside their references."""
  for i in range(min(count, len(hypotheses))):
    bar.write(f"example {i + 1}\n  source:     {dev_set.sources[i]}\n  reference:  "
              f"{dev_set.references[i]}\n  translation: {hypotheses[i]}")
