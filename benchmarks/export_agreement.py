"""Do the exported models translate what ours translates? Export, then decode side by side.

  TRANSFORMER_JAX_DATA_DIR=../shared/data python -m benchmarks.export_agreement --workdir=W

The workdir's newest checkpoint is exported (tools/export.py: CTranslate2 float32 and int8, a
MarianMT folder), each export timed and sized. On the first `--sentences` dev sentences, encoded
as our translator encodes them: greedy and beam-search outputs of each target against ours
(identical token ids), and the sacreBLEU of each beside ours (the task's own scoring). Output
limits are ours on every side: sentences are decoded in groups of one source length, each group
with our limit (length + decode.max_extra_len, EOS included). Beam outputs may differ where the
searches do: ours divides a hypothesis' log-probability by ((5 + n) / 6)^alpha
(decoding/beam_search.py) and stops when no live beam can win; CTranslate2 and Hugging Face
divide by n^alpha, with their own stopping rules. MarianMT (needs torch; skipped without it):
teacher-forced logits on a dev batch against ours, as exported (Marian's LayerNorm epsilon,
1e-5) and with our epsilon set on its LayerNorms, and MarianTokenizer's ids against ours.
"""

import os
import shlex
import sys
import tempfile

import numpy as np
from absl import flags, logging

from transformer_jax.inference import trained
from transformer_jax.runtime import cli
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.markdown import table
from transformer_jax.tasks import registry
from transformer_jax.tools import export

from benchmarks import ctranslate2_decode as ct2, report, settings as settings_lib

TARGETS = (("ctranslate2", "float32"), ("ctranslate2", "int8"), ("hf", "float32"))


def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in `values`."""
  def define(kind, name, default, help_text, **kwargs):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values, **kwargs)
  define("string", "workdir", None, "the trained workdir to export and compare")
  define("integer", "sentences", 100, "first dev sentences to translate", lower_bound=1)
  define("integer", "beam_size", 4, "beam size of the beam-search comparison", lower_bound=2)
  define("integer", "logit_sentences", 32, "dev pairs of the teacher-forced logits comparison",
         lower_bound=1)
  define("string", "out", None, "writes OUT.json and OUT.md ('' to write nothing; default: "
         "experiments/results/export_multi30k)")


def settings(values: flags.FlagValues, override_args) -> dict:
  """The flags (the model's config comes from its checkpoint, not resolved here)."""
  if override_args:
    raise ConfigError(f"benchmarks.export_agreement takes no config overrides: "
                      f"{' '.join(override_args)}")
  own = {k: values[k].value for k in ("workdir", "sentences", "beam_size", "logit_sentences")}
  return settings_lib.normalized(settings_lib.benchmark_settings(own))


def _limit_groups(ids) -> list[list[int]]:
  """Sentence indices grouped by source length (one output limit a group)."""
  groups: dict[int, list[int]] = {}
  for i, s in enumerate(ids):
    if s:
      groups.setdefault(len(s), []).append(i)
  return [groups[n] for n in sorted(groups)]


def hf_translate(model, ids, groups, *, beam_size: int, alpha: float, max_extra_len: int):
  """MarianMT's generate (its generation_config: start id 0, pad banned, EOS forced at the
  limit) for each group at our limit; output ids without EOS."""
  import torch  # pylint: disable=g-import-not-at-top
  out = [[] for _ in ids]
  for group in groups:
    x = torch.tensor([ids[j] for j in group], dtype=torch.long)
    with torch.no_grad():
      y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), num_beams=beam_size,
                         length_penalty=alpha, max_length=1 + x.shape[1] + max_extra_len,
                         do_sample=False, early_stopping=beam_size > 1)
    for j, row in zip(group, y.numpy().tolist()):
      row = row[1:]  # the start id
      out[j] = row[:row.index(1)] if 1 in row else [t for t in row if t != 0]
  return out


def hf_logits(folder: str, loaded, count: int) -> dict:
  """Teacher-forced logits of MarianMT against ours on `count` dev pairs: max |diff| over real
  target positions, as exported and with our LayerNorm epsilon set on Marian's modules."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import MarianMTModel  # pylint: disable=g-import-not-at-top
  from transformer_jax.model.transformer import Transformer  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.config import ModelConfig  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig.from_config(loaded.config.model)
  texts, refs = ct2.dev_sentences(loaded.config, count)
  tok = loaded.tokenizer

  def pad(rows):
    out = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for r, s in zip(out, rows):
      r[:len(s)] = s
    return out
  x = pad([tok.encode_with_eos(t) for t in texts])
  y = pad([tok.encode_with_eos(t) for t in refs])
  ours = np.asarray(Transformer(cfg).apply({"params": nn.meta.unbox(loaded.params)}, x, y))
  model, info = MarianMTModel.from_pretrained(folder, output_loading_info=True)
  model.eval()
  missing = sorted(info["missing_keys"]) + sorted(info["unexpected_keys"])
  decoder_in = np.pad(y, ((0, 0), (1, 0)))[:, :-1]
  mask = y != 0

  def diff():
    with torch.no_grad():
      theirs = model(input_ids=torch.tensor(x, dtype=torch.long),
                     attention_mask=torch.tensor(x != 0),
                     decoder_input_ids=torch.tensor(decoder_in, dtype=torch.long)).logits.numpy()
    return float(np.max(np.abs(theirs - ours)[mask]))
  as_exported = diff()
  epsilons = sorted({m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)})
  for m in model.modules():
    if isinstance(m, torch.nn.LayerNorm):
      m.eps = cfg.layer_norm_epsilon
  return dict(sentences=len(texts), target_tokens=int(mask.sum()), max_abs_logit_diff=as_exported,
              max_abs_logit_diff_our_epsilon=diff(), max_abs_logit=float(np.abs(ours)[mask].max()),
              marian_layer_norm_epsilon=epsilons, our_layer_norm_epsilon=cfg.layer_norm_epsilon,
              keys_not_loaded=missing)


def run(workdir: str, count: int, beam_size: int, logit_count: int, command: str,
        recorded_settings: dict) -> dict:
  import ctranslate2  # pylint: disable=g-import-not-at-top
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    torch = transformers = None
  result = report.start(command, recorded_settings)
  loaded = trained.load(workdir)
  config, tok = loaded.config, loaded.tokenizer
  task = registry.get(config)
  alpha, extra = config.decode.alpha, config.decode.max_extra_len
  texts, refs = ct2.dev_sentences(config, count)
  searches = {"greedy": 1, f"beam {beam_size}": beam_size}
  outputs = {}
  ids = None
  for name, k in searches.items():
    ours = ct2.translator(loaded, k)
    ids = ours.encode(texts)
    outputs[("transformer_jax", "float32", name)] = ours.translate_ids(ids)
  groups = _limit_groups(ids)
  exports = []
  with tempfile.TemporaryDirectory() as tmp:
    for target, q in TARGETS:
      folder = os.path.join(tmp, f"{target}_{q}")
      done = export.export(workdir, target, folder, quantization=q, step=loaded.step)
      exports.append(dict(format=target, quantization=q, seconds=done["seconds"],
                          bytes=done["bytes"]))
      for name, k in searches.items():
        if target == "ctranslate2":
          out = ct2.ct2_translate(ct2.ct2_model(folder, 1), tok, ids, groups, beam_size=k,
                                  alpha=alpha, max_extra_len=extra)
        elif torch is not None:
          model = transformers.MarianMTModel.from_pretrained(folder).eval()
          out = hf_translate(model, ids, groups, beam_size=k, alpha=alpha, max_extra_len=extra)
        else:
          continue
        outputs[(target, q, name)] = out
    if torch is not None:
      hf = hf_logits(os.path.join(tmp, "hf_float32"), loaded, logit_count)
      marian_tok = transformers.MarianTokenizer.from_pretrained(os.path.join(tmp, "hf_float32"))
      hf["tokenizer_identical_ids"] = sum(
          marian_tok(t)["input_ids"] == tok.encode_with_eos(t) for t in texts)
    else:
      hf = None
  rows = []
  for (target, q, name), out in outputs.items():
    decoded = [tok.decode(x) if x else "" for x in out]
    metrics, _ = task.score(config, texts, decoded, refs)
    ours = outputs[("transformer_jax", "float32", name)]
    rows.append(dict(decoder=target, weights=q, search=name, bleu=metrics["sacrebleu"],
                     identical_to_ours=sum(a == b for a, b in zip(out, ours)),
                     output_tokens=sum(len(x) for x in out)))
  result.update(workdir=loaded.workdir, checkpoint_step=loaded.step, sentences=len(texts),
                alpha=alpha, max_extra_len=extra, ctranslate2_version=ctranslate2.__version__,
                transformers_version=getattr(transformers, "__version__", None),
                torch_version=getattr(torch, "__version__", None), exports=exports,
                agreement=rows, marian_logits=hf,
                bleu_signature=metrics["sacrebleu_signature"])
  return report.finish(result)


def markdown(r: dict) -> str:
  n = r["sentences"]
  lines = report.header("Exported models against ours: same outputs, same BLEU", r)
  lines += [
      f"Weights: {r['workdir']} step {r['checkpoint_step']}, exported with "
      f"`python -m transformer_jax.tools.export` (CTranslate2 {r['ctranslate2_version']}, "
      f"transformers {r['transformers_version']}, torch {r['torch_version']}). The first {n} "
      f"dev sentences, our output limits on every side (source length + {r['max_extra_len']}), "
      f"alpha {r['alpha']} in each side's own length-penalty formula; sacreBLEU against the "
      "dev references.", "",
      table(["format", "export s", "MB"],
            [[f"{e['format']} {e['quantization']}", f"{e['seconds']:.1f}",
              f"{e['bytes'] / 1e6:.1f}"] for e in r["exports"]]),
      table(["decoder", "weights", "search", f"identical to ours (of {n})", "sacreBLEU",
             "output tokens"],
            [[a["decoder"], a["weights"], a["search"], a["identical_to_ours"],
              f"{a['bleu']:.2f}", a["output_tokens"]] for a in r["agreement"]])]
  h = r["marian_logits"]
  if h is None:
    lines += ["MarianMT: not run (torch is not installed)."]
  else:
    lines += [
        f"MarianMT teacher-forced logits on {h['sentences']} dev pairs ({h['target_tokens']} "
        f"target tokens; largest |logit| {h['max_abs_logit']:.1f}): max |diff| "
        f"{h['max_abs_logit_diff']:.2e} as exported (Marian's LayerNorm epsilon "
        f"{h['marian_layer_norm_epsilon']}, ours {h['our_layer_norm_epsilon']}), "
        f"{h['max_abs_logit_diff_our_epsilon']:.2e} with our epsilon set on its LayerNorms. "
        f"Keys not loaded: {h['keys_not_loaded'] or 'none'}. MarianTokenizer gives our ids for "
        f"{h['tokenizer_identical_ids']} of {n} sentences."]
  lines += ["", "Beam outputs can differ where the searches differ: ours divides by "
            "((5 + n) / 6)^alpha and stops once no live beam can win (decoding/beam_search.py); "
            "CTranslate2 and Hugging Face divide by n^alpha and stop by their own rules. Greedy "
            "search has neither, so its outputs are the models' own."]
  return "\n".join(lines) + "\n"


def main(argv):
  values = flags.FLAGS
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not values.workdir:
    raise ConfigError("--workdir is required: a trained workdir (e.g. configs/multi30k.py:short)")
  r = run(values.workdir, values.sentences, values.beam_size, values.logit_sentences,
          shlex.join(["python", "-m", "benchmarks.export_agreement", *sys.argv[1:]]),
          settings(values, cli.OVERRIDE_ARGS))
  out = "experiments/results/export_multi30k" if values.out is None else values.out
  report.write(r, markdown(r), out)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  cli.run(main, verbosity=logging.WARNING)
