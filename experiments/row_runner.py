"""Runs the rows of a sweep: training and evaluation subprocesses, and their bookkeeping.

Per row, in OUT/<row>/: the training CLI in a subprocess (`python -m transformer_jax.main
--config=... --workdir=OUT/<row> --config...`, output in train.log; a workdir with checkpoints
resumes by itself), then an evaluation subprocess (`python -m experiments.run --eval_row=...`:
eval.log, eval.json): dev loss (label-smoothed) and NLL on the whole dev split, perplexity =
exp(NLL) per target token, beam search (the config's beam and alpha, no checkpoint averaging, as
the paper's Table 3) on the first N dev sentences for sacreBLEU and the paper-compatible
tokenized BLEU, and the parameter count. result.json marks a finished row: a rerun skips it,
resumes an unfinished one, and retries a failed one. A row's failure (its error line) is written
to its result.json and the sweep goes on. The vocabulary is trained once and shared by all rows
(OUT/_vocab), so perplexities compare. SIGTERM (`forward_sigterm`) reaches the running
subprocess, and the sweep stops after that row.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from experiments import sweep_report
from experiments.row_commands import quote, train_command
from experiments.sweep_rows import REPO, Resolved

_CHILD: list = []              # the running subprocess, for SIGTERM forwarding
_STOP = {"requested": False}


# ----------------------------------------------------------------------------- small helpers

def _write_json(path, obj):
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=False, default=str)
  os.replace(tmp, path)


def latest_step(workdir: str):
  """The newest finished checkpoint's step (Orbax renames a checkpoint to its step when done)."""
  d = os.path.join(workdir, "checkpoints")
  steps = [int(n) for n in os.listdir(d) if n.isdigit()] if os.path.isdir(d) else []
  return max(steps) if steps else None


def error_line(log_text: str, returncode: int) -> str:
  """The line that says why a subprocess failed: 'error: ...', else the exception, else the last."""
  lines = [l.strip() for l in log_text.splitlines() if l.strip()]
  for line in reversed(lines):
    if line.startswith("error:"):
      return line[len("error:"):].strip()
  for line in reversed(lines):
    head = line.split(":", 1)[0]
    if head.endswith(("Error", "Exception", "Interrupt")) and " " not in head:
      return line
  return (lines[-1] if lines else "") + f" (exit status {returncode})"


def _env():
  env = dict(os.environ)
  env.setdefault("PYTHONUNBUFFERED", "1")
  return env


def subprocess_runner(cmd: list[str], log_path: str, timeout_s: float = 0.0):
  """Runs cmd from the repository root, output to log_path; (returncode, error line or '')."""
  with open(log_path, "a") as log:
    log.write(f"\n# {datetime.datetime.now().isoformat(timespec='seconds')}: {quote(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    _CHILD[:] = [proc]
    timed_out = False
    try:
      proc.wait(timeout=timeout_s or None)
    except subprocess.TimeoutExpired:
      timed_out = True
      proc.send_signal(signal.SIGTERM)  # the training CLI saves a checkpoint and exits 0
      try:
        proc.wait(timeout=180)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
      _CHILD[:] = []
  if timed_out:
    return 1, f"timed out after {timeout_s / 60:g} minutes (rerun to resume from its checkpoint)"
  if proc.returncode == 0:
    return 0, ""
  with open(log_path, errors="replace") as f:
    return proc.returncode, error_line(f.read()[-20000:], proc.returncode)


def forward_sigterm(signum, frame):  # pylint: disable=unused-argument
  """SIGTERM handler: passes the signal to the running row, and no further row starts."""
  _STOP["requested"] = True
  for proc in _CHILD:
    proc.send_signal(signal.SIGTERM)


def stop_requested() -> bool:
  return _STOP["requested"]


# ----------------------------------------------------------------------------- one row

def _vocab_key(config) -> str:
  d = config.data.to_dict()
  d.pop("data_dir", None)
  blob = json.dumps([d, config.model.vocab_size], sort_keys=True, default=str)
  return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _share_vocab(out: str, workdir: str, config, direction: str) -> None:
  """One vocabulary for all rows: copied into a new row's workdir, or stashed from a trained one."""
  cache = os.path.join(out, "_vocab", _vocab_key(config))
  row_vocab = os.path.join(workdir, "vocab")
  if direction == "in" and os.path.isdir(cache) and not os.path.exists(row_vocab):
    shutil.copytree(cache, row_vocab)
  elif direction == "out" and os.path.isdir(row_vocab) and not os.path.isdir(cache):
    tmp = cache + f".tmp{os.getpid()}"
    shutil.copytree(row_vocab, tmp)
    os.replace(tmp, cache)


def _train_stats(workdir: str) -> dict:
  """Mean seconds per step and tokens/s from metrics.jsonl (the first window, with compilation, left out)."""
  rows = []
  try:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(l) for l in f if l.strip()]
  except OSError:
    return {}
  train = [r for r in rows if r.get("split") == "train"]
  steady = train[1:] or train
  if not steady:
    return {}
  return {"step_seconds": sum(r["step_time"] for r in steady) / len(steady),
          "tokens_per_second": sum(r["tokens_per_second"] for r in steady) / len(steady),
          "final_train_loss": train[-1]["loss"]}


def run_row(res: Resolved, out: str, *, trainer=subprocess_runner, evaluator=subprocess_runner,
            eval_only: bool = False, bleu_sentences: int | None = None, timeout_s: float = 0.0,
            log=print) -> dict:
  """Trains (or resumes) and evaluates one row; returns its result (also OUT/<row>/result.json)."""
  workdir = os.path.join(os.path.abspath(out), res.row_id)
  result_path = os.path.join(workdir, "result.json")
  previous = sweep_report.read_json(result_path)
  if previous and previous.get("status") == "done":
    if previous.get("overrides") != res.overrides:
      log(f"  {res.row_id}: finished earlier with other settings (see {result_path}); kept. "
          "Delete that file to run it again.")
    else:
      log(f"  {res.row_id}: done earlier, skipped")
    return previous
  os.makedirs(workdir, exist_ok=True)
  train_cmd = train_command(res, workdir, python=sys.executable)
  n_bleu = res.bleu_sentences if bleu_sentences is None or bleu_sentences < 0 else bleu_sentences
  eval_cmd = [sys.executable, "-m", "experiments.run", f"--eval_row={workdir}",
              f"--bleu_sentences={n_bleu}"]
  _write_json(os.path.join(workdir, "row.json"),
              dict(res.to_json(), train_command=quote(train_cmd),
                   eval_command=quote(eval_cmd)))
  timing_path = os.path.join(workdir, "timing.json")
  timing = sweep_report.read_json(timing_path) or {"train_seconds": 0.0, "train_attempts": 0}
  target = res.config.train.num_steps
  result = dict(res.to_json(), status="", error="", target_steps=target,
                train_command=quote(train_cmd))

  def finish(status, error="", **extra):
    result.update(status=status, error=error, **extra)
    result["finished_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    _write_json(result_path, result)
    return result

  trained = latest_step(workdir)
  if not eval_only and trained is not None and trained >= target:
    log(f"  {res.row_id}: trained earlier (step {trained})")
  elif not eval_only:
    _share_vocab(out, workdir, res.config, "in")
    log(f"  {res.row_id}: training ({target} steps), log {workdir}/train.log")
    start = time.time()
    rc, error = trainer(train_cmd, os.path.join(workdir, "train.log"), timeout_s)
    timing["train_seconds"] += time.time() - start
    timing["train_attempts"] += 1
    _write_json(timing_path, timing)
    if rc != 0:
      log(f"  {res.row_id}: FAILED in training: {error}")
      return finish("failed", error, stage="train", steps=latest_step(workdir), **timing)
  step = latest_step(workdir)
  if step is None or step < target:
    why = (f"not trained yet (step {step or 0} of {target})" if eval_only else
           f"training stopped at step {step or 0} of {target}; rerun to resume")
    log(f"  {res.row_id}: {why}")
    return finish("unfinished", why, stage="train", steps=step, **timing)
  _share_vocab(out, workdir, res.config, "out")
  log(f"  {res.row_id}: evaluating (dev loss/perplexity, BLEU on "
      f"{n_bleu or 'all'} dev sentences), log {workdir}/eval.log")
  start = time.time()
  eval_json = os.path.join(workdir, "eval.json")
  if os.path.exists(eval_json):
    os.remove(eval_json)
  rc, error = evaluator(eval_cmd, os.path.join(workdir, "eval.log"), timeout_s)
  eval_seconds = time.time() - start
  metrics = sweep_report.read_json(eval_json)
  if rc != 0 or metrics is None:
    error = error or "the evaluation wrote no eval.json"
    log(f"  {res.row_id}: FAILED in evaluation: {error}")
    return finish("failed", error, stage="eval", steps=step, **timing)
  result = finish("done", steps=step, eval_seconds=eval_seconds, **timing, **metrics,
                  **_train_stats(workdir))
  log(f"  {res.row_id}: done: dev PPL {metrics['dev_ppl']:.2f}, BLEU {metrics['bleu_tokenized']:.2f} "
      f"(tokenized; sacreBLEU {metrics['bleu']:.2f}), {timing['train_seconds'] / 60:.1f} min training")
  return result


# ----------------------------------------------------------------------------- evaluation (subprocess)

def evaluate_row(workdir: str, bleu_sentences: int) -> dict:
  """Dev loss, NLL and perplexity (whole dev split), BLEU on the first N dev sentences, params."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax import checkpoint, params as params_lib, sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax import evaluate as evaluate_lib, step as step_lib, train  # pylint: disable=g-import-not-at-top
  from transformer_jax.data import pipeline, tokenizer  # pylint: disable=g-import-not-at-top
  _enable_compilation_cache(jax)
  params, config, step = checkpoint.load_params(checkpoint.checkpoint_dir(workdir))
  config.train.max_eval_batches = 0  # the whole dev split, whatever the run evaluated
  mesh = sharding.make_mesh(config.mesh)
  _, state_sh = step_lib.state_shardings(config, mesh)
  tok = tokenizer.load_or_train_tokenizer(config, workdir)
  start = time.time()
  batches = pipeline.make_eval_batches(config, tok, "validation",
                                       batch_multiple=sharding.batch_parallelism(mesh))
  dev = train.make_eval_fn(config, mesh, state_sh.params, batches)(params)
  dev_seconds = time.time() - start
  report, (_, _, hyps) = evaluate_lib.translate_and_score(
      config, params, tok, "validation", limit=bleu_sentences, mesh=mesh, progress=False)
  with open(os.path.join(workdir, "dev_translations.txt"), "w", encoding="utf-8") as f:
    f.writelines(h + "\n" for h in hyps)
  out = {"step": step, "dev_loss": dev["loss"], "dev_nll": dev["nll"], "dev_ppl": dev["perplexity"],
         "dev_tokens": dev["tokens"], "dev_seconds": dev_seconds,
         "bleu": report["sacrebleu"], "bleu_tokenized": report["tokenized_bleu"],
         "bleu_signature": report["sacrebleu_signature"], "bleu_sentences": report["sentences"],
         "decode_seconds": report["decode_seconds"], "beam_size": config.decode.beam_size,
         "alpha": config.decode.alpha, "params": params_lib.count_tree(params)}
  _write_json(os.path.join(workdir, "eval.json"), out)
  print(json.dumps({k: v for k, v in out.items() if k != "bleu_signature"}), flush=True)
  return out


def _enable_compilation_cache(jax):
  """As the training CLI: compiled programs are reused across rows and reruns."""
  path = os.environ.get("TRANSFORMER_JAX_JIT_CACHE",
                        os.path.join(os.path.expanduser("~"), ".cache", "transformer_jax", "jit"))
  if path:
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# ----------------------------------------------------------------------------- the sweep

def run_sweep(resolved: list[Resolved], out: str, record: dict, *, trainer=subprocess_runner,
              evaluator=subprocess_runner, eval_only=False, bleu_sentences=None, timeout_s=0.0,
              log=print) -> list[dict]:
  os.makedirs(out, exist_ok=True)
  _write_json(os.path.join(out, "sweep.json"), record)
  results = []
  start = time.time()
  for i, res in enumerate(resolved):
    if stop_requested():
      log("stopped (SIGTERM); rerun the same command to resume")
      break
    log(f"[{i + 1}/{len(resolved)}] {res.row_id}: {res.label}")
    try:
      results.append(run_row(res, out, trainer=trainer, evaluator=evaluator, eval_only=eval_only,
                             bleu_sentences=bleu_sentences, timeout_s=timeout_s, log=log))
    except OSError as e:  # e.g. a full disk in one row's workdir: record it, go on
      log(f"  {res.row_id}: FAILED: {e}")
      results.append({"row": res.row_id, "status": "failed", "error": str(e)})
  done = sum(r.get("status") == "done" for r in results)
  log(f"{done} of {len(resolved)} rows done ({(time.time() - start) / 60:.1f} min this run)")
  return results
