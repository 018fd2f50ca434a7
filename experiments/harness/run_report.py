"""Turns a finished training workdir into a results record: Markdown, JSON and a PNG.

  python -m experiments.harness.run_report --workdir=workdirs/multi30k --name=multi30k \
      --command="python -m transformer_jax.main --config=configs/multi30k.py --workdir=..."

Every score comes from the one evaluation, the evaluation CLI (`python -m transformer_jax.main
--mode=eval`, run per checkpoint; its reports and translations land in WORKDIR/eval/):
- the task's dev scores (its headline first: sacreBLEU, or a parser's bracket F1; beam search,
  the config's beam and alpha) and dev perplexity of up to --curve_points kept checkpoints,
  against the training wall time at which each was written;
- with --curve_test, the test score of each of those checkpoints too, and the wall time at which
  the curve first reaches each --reach score (reported, never used to choose anything);
- the --test_split scores of the average of the last --average checkpoints (and of the last one
  alone): for translation sacreBLEU with its signature and the paper-compatible tokenized BLEU
  (a split without a test set, as the treebank sample, names `validation`). With
  --average_choices the number averaged is chosen on the dev split (the best dev headline score
  over all dev sentences), so the test split chooses nothing;
- sample outputs of that split, and a few sentences through the `Translator` API.
Writes experiments/results/<name>.{md,json,png} (the JSON holds the run's resolved config, which
experiments/harness/provenance.py checks against --command at HEAD). An evaluation report already in WORKDIR/eval/,
written after its checkpoint with the run's decode settings, is reused rather than decoded again.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import shlex
import subprocess
import sys

from absl import flags

from experiments.harness import plots, resolve
from transformer_jax.runtime import cli, markdown, results
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.results import write_result
from transformer_jax.training import metrics, workdir as workdir_lib

_WORKDIR = flags.DEFINE_string("workdir", None, "The trained workdir.", required=True)
_NAME = flags.DEFINE_string("name", None, "Results file stem.", required=True)
_COMMAND = flags.DEFINE_string("command", "", "The exact training command, for the record.")
_AVERAGE = flags.DEFINE_integer("average", 5, "Checkpoints to average for the test score.")
_CURVE_POINTS = flags.DEFINE_integer("curve_points", 6, "Checkpoints on the BLEU-vs-time curve.")
_CURVE_SENTENCES = flags.DEFINE_integer("curve_sentences", 0, "Dev sentences for BLEU per curve point (0: all).")
_TEST_SPLIT = flags.DEFINE_string("test_split", "test", "Split for the final score.")
_ALSO_LAST = flags.DEFINE_bool("also_last", True, "Also score the last checkpoint alone on the test split.")
_AVERAGE_CHOICES = flags.DEFINE_list(
    "average_choices", [], "Numbers of last checkpoints to average, tried on the dev split; the "
    "best dev sacreBLEU's is used for the test score (replaces --average).")
_CURVE_TEST = flags.DEFINE_bool("curve_test", False, "Also score each curve checkpoint on the test split.")
_REACH = flags.DEFINE_list("reach", [], "With --curve_test: report the wall time the test curve first reaches these sacreBLEU scores.")
_NOTES = flags.DEFINE_string("notes", "", "Circumstances of the run worth recording (Markdown).")
API_SENTENCES = [
    "A man rides a bike.",
    "Two dogs are playing in the snow.",
    "A little girl in a pink dress is climbing the stairs.",
    "A group of people are standing in front of a building.",
    "The woman is reading a book on the beach.",
]
SAMPLE_LINES = (0, 1, 2, 100, 500)
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def read_metrics(workdir: str, log_every_steps: int) -> tuple[list[dict], list[dict]]:
  """(train rows, dev rows) of metrics.jsonl, each with `minutes` since training started (the
  first logged window started log_every_steps steps before it was written)."""
  rows = metrics.read_rows(workdir)
  train = [r for r in rows if r["split"] != "dev"]
  if not train:
    raise ConfigError(f"{os.path.join(workdir, 'metrics.jsonl')}: no training rows to report on")
  start = train[0]["time"] - train[0].get("step_time", 0.0) * log_every_steps
  for r in rows:
    r["minutes"] = (r["time"] - start) / 60
  return train, [r for r in rows if r["split"] == "dev"]


def curve_steps(steps: list[int], points: int) -> list[int]:
  """Up to `points` of the kept checkpoint steps, evenly spaced, the first and last included
  (one point: the last)."""
  steps = sorted(steps)
  n = min(points, len(steps))
  if n == 1:
    return steps[-1:]
  return sorted({steps[round(i * (len(steps) - 1) / max(n - 1, 1))] for i in range(n)})


def samples(workdir: str, report: dict, split: str, average: int) -> list[dict]:
  """A few translations from the evaluation's output (source and reference where it wrote them)."""
  stem = workdir_lib.eval_stem(workdir, split, report["step"], average)
  if os.path.exists(stem + ".jsonl"):
    with open(stem + ".jsonl", encoding="utf-8") as f:
      lines = [json.loads(line) for line in f]
  else:
    with open(stem + ".txt", encoding="utf-8") as f:
      lines = [{"hypothesis": line.rstrip("\n")} for line in f]
  return [lines[i] for i in SAMPLE_LINES if i < len(lines)]


def finished(path: str, checkpoint_path: str, decode: dict) -> dict | None:
  """An earlier evaluation report at `path`, if it can stand for a new one: written after the
  checkpoint, with the run's own decode settings and no overrides (None otherwise). So a report
  that was interrupted, or is rerun for its notes, decodes only what it has not decoded yet."""
  try:
    with open(path, encoding="utf-8") as f:
      report = json.load(f)
    fresh = os.path.getmtime(path) >= os.path.getmtime(checkpoint_path)
  except (OSError, ValueError):
    return None
  same = report.get("decode") == decode and not report.get("overrides")
  return report if fresh and same else None


def evaluate(workdir: str, split: str, step: int, *, average: int = 0, bleu_sentences: int = 0,
             ckpt_dir: str = "", decode: dict | None = None) -> dict:
  """The evaluation CLI on one checkpoint (or the average of the last `average` up to `step`);
  its report, WORKDIR/eval/<split>_step<step>[_avg<k>].json, reused when `finished` (given the
  checkpoint folder and the run's `decode` settings). A failed evaluation (its error printed)
  ends this script with the same exit status."""
  average = average if average > 1 else 0  # the average of one checkpoint is that checkpoint
  path = workdir_lib.eval_stem(workdir, split, step, average, bleu_sentences=bleu_sentences) + ".json"
  if ckpt_dir and decode is not None:
    earlier = finished(path, os.path.join(ckpt_dir, str(step)), decode)
    if earlier is not None:
      print(f"reusing {path} (written after the checkpoint, same decode settings)", flush=True)
      return earlier
  cmd = resolve.eval_command(workdir, split, bleu_sentences=bleu_sentences, step=step,
                             average=average, python=sys.executable)
  rc = subprocess.run(cmd, check=False).returncode
  if rc:
    sys.exit(rc)
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _numbers(flag, kind):
  """The values of a list flag as `kind` (int: positive), or one error line naming the flag."""
  try:
    values = [kind(v) for v in flag.value]
  except ValueError:
    values = []
  if len(values) != len(flag.value) or (kind is int and any(v < 1 for v in values)):
    want = "positive whole numbers" if kind is int else "numbers"
    raise ConfigError(f"--{flag.name}={','.join(flag.value)}: expected {want}, comma-separated")
  return values


def first_reaching(curve: list[dict], score: float) -> dict | None:
  """The first curve point whose test-split score is at least `score` (None: never)."""
  return next((c for c in curve if c.get("test_score", -1.0) >= score), None)


def main(argv):
  del argv
  choices, reach = _numbers(_AVERAGE_CHOICES, int), _numbers(_REACH, float)
  if reach and not _CURVE_TEST.value:
    raise ConfigError("--reach needs --curve_test (the wall time is read off the test curve)")
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax.tasks import registry  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import checkpoint  # pylint: disable=g-import-not-at-top
  from transformer_jax.inference.translate import Translator  # pylint: disable=g-import-not-at-top

  workdir = os.path.abspath(_WORKDIR.value)
  ckpt_dir = checkpoint.checkpoint_dir(workdir)
  config, last_step = checkpoint.saved_config(ckpt_dir)
  task = registry.get(config)
  key, name = task.dev_metrics[0][1], task.score_name  # the headline: sacreBLEU, bracket F1
  split = _TEST_SPLIT.value
  train_rows, dev_rows = read_metrics(workdir, config.train.log_every_steps)
  steps = checkpoint.make_manager(ckpt_dir, read_only=True, with_data=False).all_steps()
  average = min(_AVERAGE.value, len(steps))
  run_eval = functools.partial(evaluate, workdir, ckpt_dir=ckpt_dir, decode=config.decode.to_dict())

  curve = []
  for s in curve_steps(steps, _CURVE_POINTS.value):
    dev = run_eval("validation", s, bleu_sentences=_CURVE_SENTENCES.value)
    logged = min(train_rows, key=lambda r: abs(r["step"] - s))  # the nearest logged step
    curve.append({"step": s, "wall_minutes": logged["minutes"], "dev_score": dev[key],
                  "dev_scores": {n: dev.get(k) for n, k in task.dev_metrics[1:]},
                  "dev_perplexity": dev["perplexity"]})
    if _CURVE_TEST.value:
      curve[-1]["test_score"] = run_eval(split, s)[key]
    print(f"step {s}: dev {name} {dev[key]:.2f}", flush=True)
  dev_averages = {}
  for k in sorted({min(k, len(steps)) for k in choices}):  # averaging chosen on dev, all sentences
    dev_averages[k] = run_eval("validation", last_step, average=k)[key]
    print(f"average of last {k}: dev {name} {dev_averages[k]:.2f}", flush=True)
  if dev_averages:
    average = max(dev_averages, key=lambda k: (dev_averages[k], -k))  # ties: fewer checkpoints
  averaged = average if average > 1 else 0  # the average of one checkpoint is that checkpoint
  final = run_eval(split, last_step, average=averaged)
  final_last = run_eval(split, last_step) if _ALSO_LAST.value and averaged else None
  translator = Translator.from_workdir(workdir, average=averaged)

  host = results.machine()
  result = {
      "name": _NAME.value, "command": _COMMAND.value, "workdir": workdir,
      "date": datetime.date.today().isoformat(),
      "machine": f"{host['cpu']}, {host['cores']} cores, jax on {jax.devices()[0].platform}",
      "config": config.to_dict(), "final_step": last_step,
      "score_name": name, "score_key": key, "score_metrics": [list(m) for m in task.dev_metrics],
      "test_split": split,
      "train_wall_minutes": train_rows[-1]["minutes"], "final_train_metrics": train_rows[-1],
      "dev_metrics": dev_rows, "curve": curve, "curve_sentences": _CURVE_SENTENCES.value,
      "averaged_checkpoints": average, "dev_score_by_average": dev_averages,
      "reach": {str(x): first_reaching(curve, x) for x in reach} if _CURVE_TEST.value else {},
      "test_averaged": final, "test_last_checkpoint": final_last,
      "samples": samples(workdir, final, split, averaged),
      "api_translations": list(zip(API_SENTENCES, translator.translate(API_SENTENCES))),
      "report_command": shlex.join(["python", "-m", "experiments.harness.run_report", *sys.argv[1:]]),
      "notes": _NOTES.value,
  }
  os.makedirs(RESULTS, exist_ok=True)
  stem = os.path.join(RESULTS, _NAME.value)
  plots.run_curves(curve, train_rows, dev_rows, stem + ".png", _NAME.value, name)
  write_result(stem, result, report_markdown(result))
  print(f"wrote {stem}.md/.json/.png")


def report_markdown(r: dict) -> str:
  avg, last, k = r["test_averaged"], r["test_last_checkpoint"], r["averaged_checkpoints"]
  name, key, split = r["score_name"], r["score_key"], r["test_split"]
  others = r["score_metrics"][1:]  # the task's other scores: (name, report key)
  model = f"average of last {k}" if k > 1 else "last checkpoint"
  dev = r["dev_metrics"][-1] if r["dev_metrics"] else {}
  measures = [
      ["steps", r["final_step"]],
      ["training wall time", f"{r['train_wall_minutes']:.1f} min"],
      ["dev perplexity (last eval)", dev.get("perplexity")],
      [f"{split} {name}, {model}", f"**{avg[key]:.2f}**"]]
  measures += [[f"{split} {n}, {model}", avg.get(rk)] for n, rk in others]
  if last is not None:
    measures.append([f"{split} {name}, last checkpoint only", last[key]])
  measures.append(["beam, alpha", f"{avg['decode']['beam_size']}, {avg['decode']['alpha']}"])
  if avg.get("sentences_per_second"):
    measures.append([f"{split} decoding speed ({'averaged model' if k > 1 else 'last checkpoint'})",
                     f"{avg['sentences_per_second']:.1f} sentences/s ({avg['sentences']} sentences in "
                     f"{avg['decode_seconds']:.1f} s, compilation included)"])
  which = f"the first {r['curve_sentences']}" if r["curve_sentences"] else "all"
  with_test = any("test_score" in c for c in r["curve"])
  for score, point in r.get("reach", {}).items():
    measures.append([f"wall time to {split} {name} {score}",
                     f"{point['wall_minutes']:.1f} min (step {point['step']}, first curve point at or above)"
                     if point else "not reached"])
  if r.get("dev_score_by_average"):
    measures.append([f"checkpoints averaged, chosen on dev (dev {name}, all sentences)", ", ".join(
        f"{k}: {v:.2f}" for k, v in sorted(r["dev_score_by_average"].items(), key=lambda kv: int(kv[0])))])
  signature = avg.get("sacrebleu_signature")
  lines = [
      f"# {r['name']}", "", f"Date: {r['date']}. Machine: {r['machine']}.", "",
      "Command:", "", "```", r["command"], r["report_command"], "```", "",
      markdown.table(["measure", "value"], measures),
      *([f"sacreBLEU signature: `{signature}`", ""] if signature else []),
      f"![{name} vs wall time]({r['name']}.png)", "",
      f"## Dev {name} vs training wall time", "",
      f"Beam search on {which} dev sentences, one checkpoint at a time (no averaging); dev "
      "perplexity on all of them." + (f" {split.capitalize()} {name} of the same checkpoint on the "
                                      f"whole {split} split, reported only (nothing is chosen on "
                                      "it)." if with_test else ""), "",
      markdown.table(["step", "minutes", f"dev {name}", *(f"dev {n}" for n, _ in others),
                      "dev perplexity"] + ([f"{split} {name}"] if with_test else []),
                     [[c["step"], f"{c['wall_minutes']:.1f}", c["dev_score"],
                       *(c["dev_scores"].get(n) for n, _ in others), c["dev_perplexity"]]
                      + ([c.get("test_score")] if with_test else []) for c in r["curve"]]),
      f"## Sample {split} outputs ({model})", ""]
  for s in r["samples"]:
    if "source" in s:
      lines += [f"- **src** {s['source']}", f"  **ref** {s['reference']}", f"  **hyp** {s['hypothesis']}"]
    else:
      lines.append(f"- **hyp** {s['hypothesis']}")
  lines += ["", "## Translator API", "", "```python",
            f"Translator.from_workdir(workdir, average={k if k > 1 else 0}).translate(sentences)",
            "```", ""]
  lines += [f"- {src} → {hyp}" for src, hyp in r["api_translations"]]
  if r["notes"]:
    lines += ["", "## Notes", "", r["notes"]]
  lines += ["", f"Config: `{r['name']}.json` holds the full config and every number above.", ""]
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run(main, overrides=False)
