"""`train_and_evaluate(config, workdir)`: the training loop.

data -> model -> loss -> step -> checkpoint: batches from the grain pipeline are assembled into
global arrays on the mesh, the jitted train step updates the sharded state, metrics go to
TensorBoard, `metrics.jsonl` and a progress bar, and Orbax checkpoints (with the data
iterator's state) are written every N steps and/or minutes.

Resumption: the same command on the same workdir continues from the newest good checkpoint;
on CPU in float32 the result equals an uninterrupted run bit for bit (same batches, and dropout
masks that depend only on (seed, step)). SIGTERM (preemption) writes a checkpoint of the current
step and exits 0. A NaN/Inf loss stops the run naming the step; the last good checkpoint stays.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import time

import jax
import ml_collections
import numpy as np
from absl import logging

from transformer_jax import checkpoint, distributed, sharding, step as step_lib
from transformer_jax.config import ConfigError, ModelConfig, validate
from transformer_jax.metrics import MetricsWriter, measure_peak_flops, train_flops


class TrainingError(RuntimeError):
  """The run cannot go on (e.g. a non-finite loss); the message is one line."""


def prepare_workdir(workdir: str) -> str:
  workdir = os.path.abspath(os.path.expanduser(workdir))
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_test_{socket.gethostname()}_{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ConfigError(f"workdir {workdir} is not writable ({e.strerror})") from None
  return workdir


class _Preemption:
  """Turns SIGTERM into a flag the loop checks after each step."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    def handler(signum, frame):  # pylint: disable=unused-argument
      self.requested = True
    try:
      self._previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: no handler, no preemption support
      self._previous = None
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def make_eval_fn(config, mesh, params_sharding, eval_batches):
  """Returns evaluate(params) -> {loss, nll, perplexity, tokens} over the dev batches."""
  eval_step = step_lib.jit_eval_step(config, mesh, params_sharding)
  limit = config.train.max_eval_batches or len(eval_batches)

  def evaluate(params):
    totals = {"loss_sum": 0.0, "nll_sum": 0.0, "tokens": 0.0}
    for batch in eval_batches[:limit]:
      batch = {k: v for k, v in batch.items() if k in step_lib.BATCH_KEYS}
      out = eval_step(params, sharding.global_batch(mesh, batch))
      for k in totals:
        totals[k] += float(out[k])
    tokens = max(totals["tokens"], 1.0)
    nll = totals["nll_sum"] / tokens
    return {"loss": totals["loss_sum"] / tokens, "nll": nll,
            "perplexity": math.exp(min(nll, 50.0)), "tokens": totals["tokens"]}
  return evaluate


def _dev_bleu(config, params, tok, mesh):
  """BLEU of beam search on the first `train.eval_bleu_sentences` dev sentences."""
  from transformer_jax import evaluate as evaluate_lib  # pylint: disable=g-import-not-at-top
  n = config.train.eval_bleu_sentences
  report, _ = evaluate_lib.translate_and_score(config, params, tok, "validation", limit=n,
                                               mesh=mesh, progress=False)
  return report


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains (or resumes) the run in `workdir`; returns the final dev metrics."""
  validate(config)
  workdir = prepare_workdir(workdir)
  mesh = sharding.make_mesh(config.mesh)
  sharding.check_divisibility(config, mesh)
  abstract_state, state_sh = step_lib.state_shardings(config, mesh)

  manager = checkpoint.make_manager(checkpoint.checkpoint_dir(workdir),
                                    keep=config.train.keep_checkpoints)
  try:  # closed on every exit: its background threads must not outlive an error
    return _train(config, workdir, manager, mesh, abstract_state, state_sh)
  finally:
    manager.close()


def _train(config, workdir, manager, mesh, abstract_state, state_sh) -> dict:
  """The body of train_and_evaluate, once the checkpoint manager exists."""
  from transformer_jax.data import pipeline, tokenizer  # pylint: disable=g-import-not-at-top
  t_cfg = config.train
  model_cfg = ModelConfig.from_config(config.model)
  # Refuse an incompatible workdir before anything is written into it.
  if manager.latest_step() is not None:
    checkpoint.check_compatible(manager, manager.latest_step(), abstract_state)

  tok = distributed.process_zero_first(  # trained once into WORKDIR/vocab, then loaded by all
      "vocab", lambda: tokenizer.load_or_train_tokenizer(config, workdir))
  if tok.vocab_size != model_cfg.vocab_size:
    raise ConfigError(f"config key 'model.vocab_size'={model_cfg.vocab_size} but the vocabulary in "
                      f"{workdir}/vocab has {tok.vocab_size} pieces")
  rows_multiple = max(sharding.batch_parallelism(mesh), jax.process_count())
  train_iter = pipeline.make_train_iterator(
      config, tok, batch_multiple=rows_multiple, process_index=jax.process_index(),
      process_count=jax.process_count(), workdir=workdir)
  eval_batches = list(pipeline.make_eval_batches(
      config, tok, "validation", batch_multiple=rows_multiple,
      process_index=jax.process_index(), process_count=jax.process_count()))

  state, start_step = checkpoint.restore_latest(manager, abstract_state, train_iter)
  if state is None:
    state, start_step = step_lib.create_state(config, mesh), 0
    logging.info("starting a new run in %s", workdir)
  else:
    print(f"resuming from the checkpoint at step {start_step} in {workdir}", flush=True)
  if jax.process_index() == 0:
    checkpoint.write_config_json(workdir, config)

  train_fn = step_lib.jit_train_step(config, mesh, state_sh)
  evaluate = make_eval_fn(config, mesh, state_sh.params, eval_batches)
  writer = MetricsWriter(workdir)
  peak = t_cfg.peak_flops or measure_peak_flops(np.dtype(model_cfg.dtype))
  accum = t_cfg.grad_accum_steps
  bar = None
  if t_cfg.progress_bar and jax.process_index() == 0:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm(total=t_cfg.num_steps, initial=start_step, desc="train", unit="step",
               dynamic_ncols=True)

  def save(step_num):
    checkpoint.save(manager, step_num, state, config, train_iter)

  step_num, last_saved = start_step, start_step
  window = {"loss_sum": 0.0, "nll_sum": 0.0, "tokens": 0.0, "flops": 0.0}
  window_start = last_ckpt_time = run_start = time.time()
  pending = None  # the previous step's metrics, read one step late to keep the device busy
  dev_metrics = {}
  with _Preemption() as preemption:
    while step_num < t_cfg.num_steps:
      for _ in range(accum):
        batch = {k: v for k, v in next(train_iter).items() if k in step_lib.BATCH_KEYS}
        b, s = batch["inputs"].shape
        window["flops"] += train_flops(model_cfg, b * jax.process_count(), s,
                                       batch["targets"].shape[1])
        state, metrics = train_fn(state, sharding.global_batch(mesh, batch))
        if pending is not None:
          _accumulate(window, pending, step_num)
        pending = metrics
      step_num += 1
      last = step_num == t_cfg.num_steps
      out_of_time = t_cfg.max_train_minutes and (time.time() - run_start) / 60 >= t_cfg.max_train_minutes
      if step_num % t_cfg.log_every_steps == 0 or last or preemption.requested or out_of_time:
        _accumulate(window, pending, step_num)
        pending = None
        now = time.time()
        elapsed = max(now - window_start, 1e-9)
        tokens = max(window["tokens"], 1.0)
        scalars = {"loss": window["loss_sum"] / tokens, "nll": window["nll_sum"] / tokens,
                   "perplexity": math.exp(min(window["nll_sum"] / tokens, 50.0)),
                   "learning_rate": metrics["learning_rate"], "grad_norm": metrics["grad_norm"],
                   "tokens_per_second": window["tokens"] / elapsed,
                   "step_time": elapsed / t_cfg.log_every_steps,
                   "model_flops_per_second": window["flops"] / elapsed,
                   "mfu": window["flops"] / elapsed / peak}
        writer.write(step_num, scalars, "train")
        if bar is not None:
          bar.set_postfix(loss=f"{scalars['loss']:.3f}", ppl=f"{scalars['perplexity']:.1f}",
                          tok_s=f"{scalars['tokens_per_second']:.0f}")
        window = dict.fromkeys(window, 0.0)
        window_start = time.time()
      if bar is not None:
        bar.update(1)
      if step_num % t_cfg.eval_every_steps == 0 or last or out_of_time:
        if pending is not None:
          _accumulate(window, pending, step_num)
          pending = None
        dev_metrics = evaluate(state.params)
        if t_cfg.eval_bleu_sentences:
          report = _dev_bleu(config, state.params, tok, mesh)
          dev_metrics["bleu"] = report["sacrebleu"]
          dev_metrics["bleu_tokenized"] = report["tokenized_bleu"]
        writer.write(step_num, dev_metrics, "dev")
        _console(bar, f"step {step_num}: dev " + ", ".join(f"{k} {v:.3f}" for k, v in dev_metrics.items()
                                                           if k != "tokens"))
      due_minutes = t_cfg.checkpoint_every_minutes and (time.time() - last_ckpt_time) / 60 >= t_cfg.checkpoint_every_minutes
      if (step_num % t_cfg.checkpoint_every_steps == 0 or last or due_minutes
          or preemption.requested or out_of_time):
        if pending is not None:  # never save parameters that came from a non-finite loss
          _accumulate(window, pending, step_num)
          pending = None
        save(step_num)
        last_saved, last_ckpt_time = step_num, time.time()
      if preemption.requested:
        _console(bar, f"SIGTERM: saved a checkpoint at step {step_num}; exiting")
        break
      if out_of_time:
        _console(bar, f"train.max_train_minutes reached: saved a checkpoint at step {step_num}")
        break
  manager.wait_until_finished()
  writer.close()
  if bar is not None:
    bar.close()
  logging.info("finished at step %d (last checkpoint %d)", step_num, last_saved)
  return dev_metrics


def _accumulate(window, metrics, step_num):
  loss_sum = float(metrics["loss_sum"])
  if not math.isfinite(loss_sum):
    raise TrainingError(f"non-finite loss ({loss_sum}) at step {step_num}; stopping. The last "
                        "good checkpoint is kept; lower train.learning_rate_scale or enable "
                        "train.grad_clip_norm")
  window["loss_sum"] += loss_sum
  window["nll_sum"] += float(metrics["nll_sum"])
  window["tokens"] += float(metrics["tokens"])


def _console(bar, message):
  if jax.process_index() != 0:
    return
  if bar is not None:
    bar.write(message)
  else:
    print(message, flush=True)
