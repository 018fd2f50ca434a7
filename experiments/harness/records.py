"""A sweep's result files: one JSON per finished (row, seed), written once and never replaced,
read back for the report, and checked against the protocol before anything runs.

The results folder (<study>/results/<sweep>_<scale>/, committed) holds `<row>_seed<k>.json`
(`build_result`: the run's protocol, dev scores, dev-perplexity curve and its change over the
last quarter, timing, machine, hypotheses) and the dev references (references.json). The
runner (experiments/harness/runner.py) writes them through transformer_jax.runtime.results;
the report (experiments/harness/report.py) reads them.
"""

from __future__ import annotations

import datetime
import glob
import os
import re

from experiments.harness import resolve
from transformer_jax.data import tokenizer
from transformer_jax.runtime import results
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import schema_default
from transformer_jax.runtime.results import read_json
from transformer_jax.training import metrics

_RESULT_NAME = re.compile(r"^(?P<row>.+)_seed(?P<seed>\d+)\.json$")


def added_later_at_default(key: str, ours: dict, theirs: dict, schema_key=None) -> bool:
  """A config key the code gained after `theirs` was written, set to its default (which is how
  the code behaved before it existed): not a difference. `schema_key` maps a settings key to its
  run-config key (None where it has none), for settings that prefix them."""
  if key in theirs or key not in ours:
    return False
  name = schema_key(key) if schema_key else key
  if name is None:
    return False
  try:
    return schema_default(name) == ours[key]
  except ConfigError:
    return False


# Protocol fields that record how a run was launched rather than what it computed: the config
# file's path and the override list (the difference between the row's config and that file)
# change when the file moves or its defaults do, while the resolved config (compared key by key)
# stays the same.
_LAUNCH_FIELDS = ("hash", "overrides", "config")


def differing_key(ours: dict, theirs: dict, ignore=frozenset(), schema_key=None) -> str | None:
  """The first key (in order) whose value differs, but for `ignore` and a key the code gained
  after `theirs` was written, at its default (see added_later_at_default); None if none."""
  for key in sorted(set(ours) | set(theirs)):
    if key not in ignore and ours.get(key) != theirs.get(key) and not added_later_at_default(
        key, ours, theirs, schema_key):
      return key
  return None


def protocol_difference(ours: dict, theirs: dict) -> str:
  """The first field in which two protocols differ ('field: theirs there, ours now'); '' if none."""
  for key in ours:
    if key in _LAUNCH_FIELDS:
      continue
    a, b = ours.get(key), (theirs or {}).get(key)
    both = isinstance(a, dict) and isinstance(b, dict)
    sub = differing_key(a, b) if both else None
    if sub:
      return f"{key}.{sub}: {b.get(sub)!r} there, {a.get(sub)!r} now"
    if not both and a != b:
      return f"{key}: {b!r} there, {a!r} now"
  return ""


def check_results_folder(results_dir: str, sweep, expected_protocol) -> None:
  """ConfigError (one line naming the file and the field) for a result file of a row the sweep
  lacks or of another protocol than `expected_protocol(row)`; nothing is changed."""
  names = sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []
  for name in names:
    if not name.endswith(".json") or name == "references.json":
      continue
    path, m = os.path.join(results_dir, name), _RESULT_NAME.match(name)
    if not m:
      raise ConfigError(f"{path}: not a result file (<row>_seed<k>.json) of the sweep runner")
    if m["row"] not in sweep.rows:
      raise ConfigError(f"{path}: row '{m['row']}' is not a row of the sweep '{sweep.name}'; "
                        "use another --results_dir")
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("protocol"), dict):
      raise ConfigError(f"{path}: unreadable result file (no 'protocol')")
    diff = protocol_difference(expected_protocol(m["row"]), data["protocol"])
    if diff:
      raise ConfigError(f"{path} comes from another protocol ({diff}); use another "
                        "--results_dir, or move that folder away to start anew")


def load_results(results_dir: str) -> dict[str, dict[int, dict]]:
  """{row: {seed: result}} of the result files in `results_dir`."""
  out: dict[str, dict[int, dict]] = {}
  for name in sorted(os.listdir(results_dir)) if os.path.isdir(results_dir) else []:
    m = _RESULT_NAME.match(name)
    data = read_json(os.path.join(results_dir, name)) if m else None
    if data is not None:
      out.setdefault(m["row"], {})[int(m["seed"])] = data
  return out


def load_states(out: str) -> dict[tuple[str, int], dict]:
  """{(row, seed): OUT/<row>/seed<k>/status.json} (failed and unfinished runs say why)."""
  states = {}
  for path in sorted(glob.glob(os.path.join(glob.escape(out), "*", "seed*", "status.json"))
                     if out else []):
    state = read_json(path)
    if state:
      states[(os.path.basename(os.path.dirname(os.path.dirname(path))), state.get("seed"))] = state
  return states


# ----------------------------------------------------------------------------- one run's record

def close_killed_attempt(timing: dict, workdir: str) -> dict:
  """`timing` (a run's timing.json) with a training attempt that never recorded its end counted.

  The runner writes `running_since` before it launches training and replaces it with the attempt's
  seconds when training returns; a sweep killed in between (the end of a session, a lost node)
  leaves it behind. That attempt lasted until the last row it logged to metrics.jsonl."""
  since = timing.pop("running_since", None)
  if since is None:
    return timing
  seen = [r["time"] for r in metrics.read_rows(workdir) if r.get("time", 0) >= since]
  timing["train_seconds"] += max(seen, default=since) - since
  timing["train_attempts"] += 1
  return timing


def dev_curve(workdir: str) -> list[list[float]]:
  """[[step, dev perplexity], ...] from metrics.jsonl (a step evaluated again after a resume: the
  later value)."""
  by_step = {r["step"]: r["perplexity"] for r in metrics.read_rows(workdir, "dev") if "perplexity" in r}
  return [[step, by_step[step]] for step in sorted(by_step)]


def median_window(train: list[dict], key: str = "step_time") -> float | None:
  """The median over the logged training windows of `key` (seconds per step, tokens/s), the
  first window (it holds the compilation) left out; None without another window. A median, so
  that a window in which the run was paused (SIGSTOP while something else is timed) or shared
  the machine does not move it."""
  windows = sorted(r[key] for r in train[1:] if r.get(key))
  return windows[len(windows) // 2] if windows else None


def last_quarter_change(curve: list[list[float]]):
  """Relative change of dev perplexity over the last quarter of training: from the last point at
  or before 3/4 of the final step to the final point; None without two such points."""
  if len(curve) < 2:
    return None
  end_step, end_ppl = curve[-1]
  earlier = [p for p in curve[:-1] if p[0] <= 0.75 * end_step]
  if not earlier:
    return None
  return {"from_step": earlier[-1][0], "to_step": end_step,
          "relative_change": (end_ppl - earlier[-1][1]) / earlier[-1][1]}


PARSE_SCORES = ("f1", "precision", "recall", "exact_match", "repaired")


def build_result(res: resolve.Resolved, seed: int, protocol: dict, workdir: str, evaluation: dict,
                 sentences: list[dict], timing: dict, commands: dict,
                 early: dict | None = None) -> dict:
  """The committed record of one finished (row, seed); `early`: the evaluation of its checkpoint
  at two thirds of training, where the scale asks for one."""
  from transformer_jax.runtime.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from transformer_jax.tools.params import count_params  # pylint: disable=g-import-not-at-top
  curve = dev_curve(workdir)
  train = metrics.read_rows(workdir, "train")
  vocab = tokenizer.load_tokenizer(workdir)
  decode = evaluation.get("decode") or {}
  return {
      "protocol": protocol, "row": res.row_id, "label": res.label, "seed": seed,
      "step": evaluation.get("step"), "hparams": res.hparams,
      "dev_loss": evaluation.get("loss"), "dev_nll": evaluation.get("nll"),
      "dev_ppl": evaluation.get("perplexity"), "dev_tokens": evaluation.get("tokens"),
      "bleu": evaluation.get("sacrebleu"), "bleu_signature": evaluation.get("sacrebleu_signature"),
      "chrf": evaluation.get("chrf"), "bleu_tokenized": evaluation.get("tokenized_bleu"),
      "bleu_sentences": evaluation.get("sentences"), "beam_size": decode.get("beam_size"),
      "alpha": decode.get("alpha"),
      # a parser's (data.task='parsing') bracket scores on the same sentences (parseval.py)
      **{k: evaluation[k] for k in PARSE_SCORES if k in evaluation},
      "two_thirds": early and {"step": early.get("step"), "dev_ppl": early.get("perplexity"),
                               "bleu": early.get("sacrebleu"),
                               "bleu_tokenized": early.get("tokenized_bleu")},
      "dev_ppl_curve": curve, "last_quarter": last_quarter_change(curve),
      "train_minutes": timing["train_seconds"] / 60, "train_attempts": timing["train_attempts"],
      "eval_minutes": timing["eval_seconds"] / 60,
      "cpu_share": timing.get("cpu_share"),  # cores of a --parallel run (None: all of them)
      "step_seconds": median_window(train, "step_time"),
      "tokens_per_second": median_window(train, "tokens_per_second"),
      "params": count_params(ModelConfig.from_config(res.config.model)),
      "vocab_sha256": vocab.sha, "vocab_fingerprint": vocab.fingerprint, "commands": commands,
      "machine": results.machine(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "hypotheses": [s["hypothesis"] for s in sentences]}
