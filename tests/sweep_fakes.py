"""Shared by the sweep tests: the experiments.harness.runner CLI in a subprocess, and a fake of the training
and evaluation CLIs that the runner drives (its workdir and result-file contracts, in seconds)."""

import functools
import json
import os
import subprocess
import sys
import threading
import time

from experiments.harness import processes, runner
from tests.common import REPO, xla_flags
from transformer_jax.data import tokenizer
from transformer_jax.runtime.overrides import parse_overrides
from transformer_jax.training import workdir as workdir_lib

TABLE3 = "experiments/table3"


def sweep_cli(*args, timeout=120):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = xla_flags()  # none of the caller's (a device count, say)
  return subprocess.run([sys.executable, "-m", "experiments.harness.runner", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


def one_line_error(result) -> str:
  assert result.returncode == 2, (result.stdout, result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
  return lines[0]


REFERENCES = ["Ein Hund läuft im Park .", "Zwei Männer spielen Fußball .",
              "Eine Frau liest ein Buch .", "Kinder spielen am Strand ."]
# a parser's: the gold trees of the same sentences, and its worse outputs' flat trees
TREES = [f"(TOP (S (NP (XX {s.split()[0]}) (XX {s.split()[1]})) (VP {' '.join(f'(XX {w})' for w in s.split()[2:])})))"
         for s in REFERENCES]


class SweepKilled(BaseException):
  """The sweep process dies with its training run (SIGKILL at a session's end): nothing the
  runner's caller would do after the call happens."""


@functools.lru_cache(maxsize=None)
def _vocab() -> bytes:
  """A real (tiny) SentencePiece model: results record its sha256 and fingerprint."""
  return tokenizer.train_sentencepiece([f"ein kleiner satz nummer {i}" for i in range(50)],
                                       vocab_type="bpe", vocab_size=30)


def _write_vocab(workdir):
  os.makedirs(os.path.join(workdir, "vocab"), exist_ok=True)
  with open(os.path.join(workdir, "vocab", "spm.model"), "wb") as f:
    f.write(_vocab())


class FakeCLI:
  """Stands in for the training and evaluation CLIs, with their workdir semantics: training (with
  --config.seed) leaves checkpoints/<step>, vocab/ and metrics.jsonl (train and dev rows);
  evaluation writes eval/validation_step<step>.{json,jsonl}. `scores`: (row, seed) -> (dev PPL,
  tokenized BLEU); `fail`, `fail_eval`: (row, seed) pairs; `stop_at`, `kill_at`: (row, seed) -> step.
  `train_seconds`: how long a training call takes; `parse_scores`: F1 and the like, as a parser's
  evaluation reports them; `cores` records each call's cores (None: all)
  and `most_at_once` the most training calls that overlapped. `--mode=vocab` (the shared
  vocabulary) writes vocab/, or fails with `fail_vocab`; `vocab_cores`: its cores."""

  def __init__(self, fail=(), fail_eval=(), stop_at=None, scores=None, train_seconds=0.0,
               kill_at=None, fail_vocab=False, parse_scores=None, recorded_seconds=None):
    self.fail, self.fail_eval, self.fail_vocab = set(fail), set(fail_eval), fail_vocab
    self.parse_scores = parse_scores  # a parser's evaluation: these keys in its report too
    self.recorded_seconds = recorded_seconds  # training time the last checkpoint records
    self.vocab_cores = "not called"
    self.stop_at, self.scores, self.calls = dict(stop_at or {}), dict(scores or {}), []
    self.kill_at = dict(kill_at or {})
    self.train_seconds, self.cores, self.most_at_once = train_seconds, {}, 0
    self._lock, self._active = threading.Lock(), 0

  @staticmethod
  def _arg(cmd, name):
    return next(a.split("=", 1)[1] for a in cmd if a.startswith(name + "="))

  def __call__(self, cmd, log_path, timeout_s, cpus=None):
    workdir = self._arg(cmd, "--workdir")
    key = (os.path.basename(os.path.dirname(workdir)), int(os.path.basename(workdir)[len("seed"):]))
    if "--mode=eval" in cmd:
      return self._evaluate(cmd, workdir, key)
    if "--mode=vocab" in cmd:  # the sweep's shared vocabulary, before --parallel runs
      with self._lock:
        self.calls.append(("vocab", *key))
        self.vocab_cores = cpus
      if self.fail_vocab:
        return 1, "error: the training split has no non-empty sentence"
      _write_vocab(workdir)
      return 0, ""
    assert int(self._arg(cmd, "--config.seed")) == key[1]
    with self._lock:
      self.calls.append(("train", *key))
      self.cores[key] = cpus
      self._active += 1
      self.most_at_once = max(self.most_at_once, self._active)
    try:
      time.sleep(self.train_seconds)
      return self._train(cmd, workdir, key, log_path)
    finally:
      with self._lock:
        self._active -= 1

  def _train(self, cmd, workdir, key, log_path):
    if key in self.fail:
      with open(log_path, "a") as f:
        f.write("Traceback ...\nerror: config key 'model.d_k' boom\n")
      return 2, processes.error_line(open(log_path).read(), 2)
    steps = int(self._arg(cmd, "--config.train.num_steps"))
    killed = key in self.kill_at
    done = self.kill_at.pop(key, None) or self.stop_at.pop(key, steps)  # an interrupted run stops
    # early, exit 0 (as SIGTERM does); a killed one takes the sweep down with it (SweepKilled)
    os.makedirs(os.path.join(workdir, "checkpoints", str(done)), exist_ok=True)
    if self.recorded_seconds is not None:  # as checkpoint.py's JSON 'progress' item
      os.makedirs(os.path.join(workdir, "checkpoints", str(done), "progress"), exist_ok=True)
      with open(os.path.join(workdir, "checkpoints", str(done), "progress", "metadata"), "w") as f:
        json.dump({"train_seconds": self.recorded_seconds}, f)
    _write_vocab(workdir)
    ppl = self.scores.get(key, (9.0, 5.0))[0]
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
      for step in range(1, done + 1):
        f.write(json.dumps({"step": step, "split": "train", "time": time.time(), "loss": 3.0,
                            "step_time": 0.5, "tokens_per_second": 100.0}) + "\n")
        f.write(json.dumps({"step": step, "split": "dev", "time": time.time(),
                            "perplexity": ppl * (1 + (done - step) / 4)}) + "\n")
    if killed:
      raise SweepKilled(f"killed at step {done}")
    return 0, ""

  def _evaluate(self, cmd, workdir, key):
    step_arg = [a for a in cmd if a.startswith("--step=")]  # a kept earlier checkpoint
    average_arg = [a for a in cmd if a.startswith("--average=")]
    decode = [a for a in cmd if a.startswith("--config.decode.")]  # a row's decode settings
    bleu_arg = [a for a in cmd if a.startswith("--bleu_sentences=")]
    assert cmd[1:] == ["-m", "transformer_jax.main", "--mode=eval", f"--workdir={workdir}",
                       "--split=validation", *step_arg, *average_arg, *bleu_arg, *decode]
    average = int(average_arg[0].split("=")[1]) if average_arg else 0
    with self._lock:
      self.calls.append(("eval", *key, *average_arg, *decode) if average_arg or decode
                        else ("eval", *key))
    if key in self.fail_eval:
      return 1, "RuntimeError: out of memory"
    step = int(step_arg[0].split("=")[1]) if step_arg else processes.latest_step(workdir)
    ppl, bleu = self.scores.get(key, (9.0, 5.0))
    if step_arg:  # earlier in training: worse
      ppl, bleu = ppl * 1.5, bleu - 2
    stem = workdir_lib.eval_stem(workdir, "validation", step, average,
                                 workdir_lib.settings_tag(parse_overrides(decode)),
                                 bleu_sentences=int(self._arg(cmd, "--bleu_sentences")))
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    scores = self.parse_scores or {"sacrebleu": bleu - 1, "sacrebleu_signature": "nrefs:1|...",
                                   "chrf": 30.0, "tokenized_bleu": bleu}  # a parser: no BLEU
    with open(stem + ".json", "w") as f:
      json.dump({"loss": 2.5, "nll": 2.2, "perplexity": ppl, "tokens": 1000, "sentences": 4,
                 "step": step, "split": "validation", "eval_seconds": 3.0,
                 "decode": {"beam_size": 2, "alpha": 0.6, "max_extra_len": 4, "batch_size": 8},
                 **scores}, f)
    words = "Ein Hund läuft".split()[:1 + int(bleu) % 3]  # systems that differ
    with open(stem + ".jsonl", "w") as f:
      for i, ref in enumerate(TREES if self.parse_scores else REFERENCES):
        hyp = ref if i < bleu / 10 else (
            f"(TOP (S {' '.join(f'(XX {w})' for w in REFERENCES[i].split())}))" if self.parse_scores
            else " ".join(words) + " .")
        f.write(json.dumps({"index": i, "source": "x", "reference": ref, "hypothesis": hyp}) + "\n")
    return 0, ""


def run_fake(table3, out, results, rows, fake, scale="tiny", seeds=(0, 1), base_seeds=(0, 1, 2),
         overrides=None, **kw):
  runs, protocols = runner.plan(table3, scale, rows, overrides or {}, "", -1, list(seeds),
                             list(base_seeds), str(results))
  kw.setdefault("log", lambda *_: None)
  return runner.run_sweep(runs, str(out), str(results), protocols, runner=fake, **kw)


def file_snapshot(folder):
  """{name: (mtime_ns, contents)} of a folder's files."""
  return {n: (os.stat(folder / n).st_mtime_ns, (folder / n).read_bytes()) for n in os.listdir(folder)}
