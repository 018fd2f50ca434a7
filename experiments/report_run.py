"""Turns a finished training workdir into a results record: Markdown, JSON and a PNG.

  python -m experiments.report_run --workdir=workdirs/multi30k --name=multi30k \
      --command="python -m transformer_jax.main --config=configs/multi30k.py --workdir=..."

What it measures, all with the repo's own code:
- dev BLEU (beam search, the config's beam and alpha) of each kept checkpoint, against the
  training wall time at which it was written: the BLEU-vs-time curve;
- the final test score of the average of the last `--average` checkpoints: sacreBLEU (with its
  signature) and the paper-compatible tokenized BLEU (`--mode=eval` does the same);
- dev perplexity from the run's metrics.jsonl; sample translations of the test set and of a few
  sentences through the `Translator` API.
Writes experiments/results/<name>.{md,json,png}.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
import time

from absl import app, flags

_WORKDIR = flags.DEFINE_string("workdir", None, "The trained workdir.", required=True)
_NAME = flags.DEFINE_string("name", None, "Results file stem.", required=True)
_COMMAND = flags.DEFINE_string("command", "", "The exact training command, for the record.")
_AVERAGE = flags.DEFINE_integer("average", 5, "Checkpoints to average for the test score.")
_CURVE_POINTS = flags.DEFINE_integer("curve_points", 6, "Checkpoints on the BLEU-vs-time curve.")
_CURVE_SENTENCES = flags.DEFINE_integer("curve_sentences", 0, "Dev sentences per curve point (0: all).")
_TEST_SPLIT = flags.DEFINE_string("test_split", "test", "Split for the final score.")
_ALSO_LAST = flags.DEFINE_bool("also_last", True, "Also score the last checkpoint alone on the test split.")
_NOTES = flags.DEFINE_string("notes", "", "Circumstances of the run worth recording (Markdown).")
_API_SENTENCES = [
    "A man rides a bike.",
    "Two dogs are playing in the snow.",
    "A little girl in a pink dress is climbing the stairs.",
    "A group of people are standing in front of a building.",
    "The woman is reading a book on the beach.",
]
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _read_metrics(workdir):
  train, dev = [], []
  path = os.path.join(workdir, "metrics.jsonl")
  with open(path) as f:
    for line in f:
      row = json.loads(line)
      (dev if row["split"] == "dev" else train).append(row)
  return train, dev


def _wall_time_at(step, train_rows, start_time):
  """Seconds since the run started at which `step` was logged (nearest logged step)."""
  best = min(train_rows, key=lambda r: abs(r["step"] - step))
  return best["time"] - start_time


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax import checkpoint, evaluate  # pylint: disable=g-import-not-at-top
  from transformer_jax.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  from transformer_jax.translate import Translator  # pylint: disable=g-import-not-at-top

  workdir = os.path.abspath(_WORKDIR.value)
  train_rows, dev_rows = _read_metrics(workdir)
  config, last_step = checkpoint.saved_config(checkpoint.checkpoint_dir(workdir))
  first = train_rows[0]
  # the first logged window started log_every_steps steps before it was written
  start_time = first["time"] - first.get("step_time", 0.0) * config.train.log_every_steps
  tok = tok_lib.load_or_train_tokenizer(config, workdir)

  # BLEU vs wall time over kept checkpoints (evenly spaced, always including the last)
  manager = checkpoint.make_manager(checkpoint.checkpoint_dir(workdir), read_only=True,
                                    with_data=False)
  steps = sorted(manager.all_steps())
  n = min(_CURVE_POINTS.value, len(steps))
  picks = sorted({steps[round(i * (len(steps) - 1) / max(n - 1, 1))] for i in range(n)})
  curve = []
  for s in picks:
    params, _, _ = checkpoint.load_params(checkpoint.checkpoint_dir(workdir), s)
    report, _ = evaluate.translate_and_score(config, params, tok, "validation",
                                             limit=_CURVE_SENTENCES.value, progress=False)
    curve.append({"step": s, "wall_minutes": _wall_time_at(s, train_rows, start_time) / 60,
                  "dev_bleu": report["sacrebleu"],
                  "dev_bleu_tokenized": report["tokenized_bleu"]})
    print(f"step {s}: dev sacreBLEU {curve[-1]['dev_bleu']:.2f}", flush=True)

  t0 = time.time()
  final = evaluate.evaluate_workdir(workdir, split=_TEST_SPLIT.value,
                                    average=min(_AVERAGE.value, len(steps)))
  final_last = (evaluate.evaluate_workdir(workdir, split=_TEST_SPLIT.value)
                if _ALSO_LAST.value else None)
  eval_seconds = time.time() - t0
  samples = []
  with open(os.path.join(workdir, "eval", f"{_TEST_SPLIT.value}_step{final['step']}"
                         f"_avg{min(_AVERAGE.value, len(steps))}.jsonl")) as f:
    for i, line in enumerate(f):
      if i in (0, 1, 2, 100, 500):
        samples.append(json.loads(line))
  translator = Translator.from_workdir(workdir, average=min(_AVERAGE.value, len(steps)))
  api = list(zip(_API_SENTENCES, translator.translate(_API_SENTENCES)))

  last_train = train_rows[-1]
  result = {
      "name": _NAME.value, "command": _COMMAND.value, "workdir": workdir,
      "date": datetime.date.today().isoformat(),
      "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {jax.devices()[0].platform}",
      "config": config.to_dict(), "final_step": last_step,
      "train_wall_minutes": (last_train["time"] - start_time) / 60,
      "final_train_metrics": last_train, "dev_metrics": dev_rows,
      "curve": curve, "test_averaged": final, "test_last_checkpoint": final_last,
      "eval_seconds": eval_seconds, "samples": samples, "api_translations": api,
      "curve_sentences": _CURVE_SENTENCES.value, "report_command": shlex.join(["python", "-m", "experiments.report_run", *sys.argv[1:]]),
      "notes": _NOTES.value,
  }
  os.makedirs(RESULTS, exist_ok=True)
  stem = os.path.join(RESULTS, _NAME.value)
  with open(stem + ".json", "w") as f:
    json.dump(result, f, indent=2, ensure_ascii=False)
  _plot(curve, dev_rows, train_rows, start_time, stem + ".png", _NAME.value)
  with open(stem + ".md", "w") as f:
    f.write(_markdown(result))
  print(f"wrote {stem}.md/.json/.png")


def _plot(curve, dev_rows, train_rows, start_time, path, name):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  ax1.plot([c["wall_minutes"] for c in curve], [c["dev_bleu"] for c in curve], "o-",
           label="sacreBLEU")
  ax1.plot([c["wall_minutes"] for c in curve], [c["dev_bleu_tokenized"] for c in curve], "s--",
           label="tokenized BLEU")
  ax1.set_xlabel("training wall time (minutes)")
  ax1.set_ylabel("dev BLEU (beam search)")
  ax1.set_title(f"{name}: dev BLEU vs wall time")
  ax1.grid(alpha=0.3)
  ax1.legend()
  ax2.plot([(r["time"] - start_time) / 60 for r in train_rows], [r["perplexity"] for r in train_rows],
           label="train")
  ax2.plot([(r["time"] - start_time) / 60 for r in dev_rows], [r["perplexity"] for r in dev_rows],
           "o-", label="dev")
  ax2.set_yscale("log")
  ax2.set_xlabel("training wall time (minutes)")
  ax2.set_ylabel("perplexity per target wordpiece")
  ax2.grid(alpha=0.3)
  ax2.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def _markdown(r):
  avg, last = r["test_averaged"], r["test_last_checkpoint"]
  last_rows = [] if last is None else [
      f"| test sacreBLEU, last checkpoint only | {last['sacrebleu']:.2f} |",
      f"| test tokenized BLEU, last checkpoint | {last['tokenized_bleu']:.2f} |"]
  dev = r["dev_metrics"][-1] if r["dev_metrics"] else {}
  lines = [
      f"# {r['name']}", "",
      f"Date: {r['date']}. Machine: {r['machine']}.", "",
      "Command:", "", "```", r["command"],
      r["report_command"], "```", "",
      "| measure | value |", "|---|---|",
      f"| steps | {r['final_step']} |",
      f"| training wall time | {r['train_wall_minutes']:.1f} min |",
      f"| dev perplexity (last eval) | {dev.get('perplexity', float('nan')):.2f} |",
      f"| test sacreBLEU, average of last {avg['averaged_checkpoints']} | **{avg['sacrebleu']:.2f}** |",
      f"| test tokenized BLEU (paper-style), averaged | {avg['tokenized_bleu']:.2f} |",
      *last_rows,
      f"| beam, alpha | {avg['beam_size']}, {avg['alpha']} |", "",
      f"sacreBLEU signature: `{avg['sacrebleu_signature']}`", "",
      f"![BLEU vs wall time]({r['name']}.png)", "",
      "## Dev BLEU vs training wall time", "",
      f"Beam search on the {'first ' + str(r['curve_sentences']) if r['curve_sentences'] else 'all'} "
      "dev sentences, one checkpoint at a time (no averaging).", "",
      "| step | minutes | dev sacreBLEU | dev tokenized BLEU |",
      "|---|---|---|---|",
  ]
  lines += [f"| {c['step']} | {c['wall_minutes']:.1f} | {c['dev_bleu']:.2f} | {c['dev_bleu_tokenized']:.2f} |"
            for c in r["curve"]]
  lines += ["", "## Sample test translations (averaged checkpoint)", ""]
  for s in r["samples"]:
    lines += [f"- **src** {s['source']}", f"  **ref** {s['reference']}", f"  **hyp** {s['hypothesis']}"]
  lines += ["", "## Translator API", "", "```python",
            "Translator.from_workdir(workdir, average=5).translate(sentences)", "```", ""]
  lines += [f"- {src} → {hyp}" for src, hyp in r["api_translations"]]
  if r["notes"]:
    lines += ["", "## Notes", "", r["notes"]]
  lines += ["", f"Config: `{r['name']}.json` holds the full config and every number above.", ""]
  return "\n".join(lines)


if __name__ == "__main__":
  app.run(main)
