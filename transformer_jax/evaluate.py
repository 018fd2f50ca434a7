"""`--mode=eval`: a checkpoint (or an average of the last k) on a split -> translations + BLEU.

Writes, in `WORKDIR/eval/`:
- `<split>_step<N>[_avg<k>].txt`: one translation per source line, aligned with the input;
- `<split>_step<N>[_avg<k>].jsonl`: per sentence: index, source, reference, hypothesis;
- `<split>_step<N>[_avg<k>].json`: the BLEU report (sacreBLEU with its signature and the
  paper-compatible tokenized BLEU), decoding settings and timing.
"""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections

from transformer_jax import averaging, bleu, checkpoint
from transformer_jax.translate import Translator


def translate_and_score(config: ml_collections.ConfigDict, params, tok, split: str, *,
                        limit: int = 0, mesh=None, progress: bool = True):
  """(BLEU report, (sources, references, hypotheses)) for the first `limit` (0: all) lines."""
  del mesh  # decoding runs replicated; sharded decoding goes through decode.py's pure functions
  from transformer_jax.data import datasets  # pylint: disable=g-import-not-at-top
  sources, references = datasets.load_split_texts(config, split)
  if limit:
    sources, references = sources[:limit], references[:limit]
  translator = Translator(params, config, tok)
  start = time.time()
  hypotheses = translator.translate(sources, progress=progress)
  report = bleu.bleu_report(hypotheses, references, config.data.target_lang)
  report["decode_seconds"] = time.time() - start
  report["sentences"] = len(sources)
  return report, (sources, references, hypotheses)


def evaluate_workdir(workdir: str, *, split: str = "test", average: int = 0,
                     step: int | None = None, overrides=None) -> dict:
  """Evaluates a workdir's checkpoint on `split`; returns the report (also written to disk)."""
  del overrides
  from transformer_jax.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  directory = averaging.average_workdir(workdir, average) if average else checkpoint.checkpoint_dir(workdir)
  params, config, step = checkpoint.load_params(directory, None if average else step)
  tok = tok_lib.load_or_train_tokenizer(config, workdir)
  report, (sources, references, hypotheses) = translate_and_score(config, params, tok, split)
  report.update(step=step, averaged_checkpoints=average, split=split,
                beam_size=config.decode.beam_size, alpha=config.decode.alpha)
  if jax.process_index() == 0:
    out = os.path.join(workdir, "eval")
    os.makedirs(out, exist_ok=True)
    stem = os.path.join(out, f"{split}_step{step}" + (f"_avg{average}" if average else ""))
    with open(stem + ".txt", "w", encoding="utf-8") as f:
      f.writelines(h + "\n" for h in hypotheses)
    with open(stem + ".jsonl", "w", encoding="utf-8") as f:
      for i, (s, r, h) in enumerate(zip(sources, references, hypotheses)):
        f.write(json.dumps({"index": i, "source": s, "reference": r, "hypothesis": h},
                           ensure_ascii=False) + "\n")
    with open(stem + ".json", "w") as f:
      json.dump(report, f, indent=2)
    print(f"{split} step {step}{f' (average of {average})' if average else ''}: "
          f"sacreBLEU {report['sacrebleu']:.2f} ({report['sacrebleu_signature']}), "
          f"tokenized BLEU {report['tokenized_bleu']:.2f}; wrote {stem}.*", flush=True)
  return report
