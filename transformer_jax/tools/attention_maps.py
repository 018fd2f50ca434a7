"""Attention maps: every layer and head of the encoder self-attention, the decoder (masked)
self-attention and the cross-attention, for sentences and their translations.

  python -m transformer_jax.tools.attention_maps --workdir=W --out=DIR [--sentence="..."]...

Writes one PNG per (kind, layer), all heads as subplots, and one self-contained HTML page
(`DIR/attention_maps.html`) where a reader picks sentence, kind, layer and head. The model
translates each sentence, then is applied once, teacher forced on that translation, with the
'intermediates' collection mutable: `MultiHeadAttention` sows its weights there on the einsum
path, so the maps are the model's own weights, its maths unchanged. How to read the axes:
docs/workflow.md, "Attention maps".
"""

from __future__ import annotations

import dataclasses
import functools
import html
import json
import math
import os
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from transformer_jax.inference.translate import Translator
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime import cli
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.special_ids import EOS_ID
from transformer_jax.training import checkpoint

KINDS = ("encoder_self", "decoder_self", "cross")
KIND_TITLES = {"encoder_self": "encoder self-attention",
               "decoder_self": "decoder self-attention (masked)",
               "cross": "encoder-decoder (cross) attention"}
DEFAULT_SENTENCE = "The animal didn't cross the street because it was too tired."
START_LABEL, EOS_LABEL = "<s>", "</s>"


def capture_model_config(model_cfg: ModelConfig) -> ModelConfig:
  """The config to capture with: the einsum attention (same maths; the fused one sows nothing)."""
  return model_cfg.replace(attention_impl="einsum")


@functools.lru_cache(maxsize=None)
def _jitted_apply(model_cfg: ModelConfig):
  model = Transformer(model_cfg)

  def apply(params, inputs_BxS, targets_BxT):
    logits_BxTxV, state = model.apply({"params": params}, inputs_BxS, targets_BxT,
                                      mutable=["intermediates"])
    return logits_BxTxV, state["intermediates"]

  return jax.jit(apply)


def _weights_of(tree) -> np.ndarray:
  (w_BxNxQxK,) = tree["attention_weights"]  # one sow per call
  return np.asarray(w_BxNxQxK)


def capture(model_cfg: ModelConfig, params, inputs_BxS, targets_BxT):
  """Teacher-forced logits [B, T, V] and attention weights of every layer.

  Returns (logits, weights) with weights[kind] a float32 array [layers, B, heads, queries, keys]:
  encoder_self [L, B, N, S, S], decoder_self [L, B, N, T, T], cross [L, B, N, T, S]. Padding
  (id 0) rows and columns are zero; every real query row sums to 1 over its visible keys.
  """
  cfg = capture_model_config(model_cfg)
  logits, inter = _jitted_apply(cfg)(params, jnp.asarray(inputs_BxS, jnp.int32),
                                     jnp.asarray(targets_BxT, jnp.int32))
  enc, dec = inter["encoder"], inter["decoder"]
  weights = {
      "encoder_self": np.stack([_weights_of(enc[f"layer_{i}"]["self_attention"])
                                for i in range(cfg.num_encoder_layers)]),
      "decoder_self": np.stack([_weights_of(dec[f"layer_{i}"]["self_attention"])
                                for i in range(cfg.num_decoder_layers)]),
      "cross": np.stack([_weights_of(dec[f"layer_{i}"]["cross_attention"])
                         for i in range(cfg.num_decoder_layers)]),
  }
  return np.asarray(logits), weights


@dataclasses.dataclass
class SentenceMaps:
  """The attention maps of one sentence, cropped to its real tokens."""

  source: str
  translation: str
  source_pieces: list[str]          # source ids incl. EOS
  target_pieces: list[str]          # translation ids incl. EOS: what each decoder row predicts
  decoder_input_pieces: list[str]   # '<s>' + target pieces without the last
  weights: dict[str, np.ndarray]    # kind -> [layers, heads, queries, keys]
  source_ids: list[int] = dataclasses.field(default_factory=list)  # incl. EOS
  target_ids: list[int] = dataclasses.field(default_factory=list)  # incl. EOS

  def axes(self, kind: str) -> tuple[list[str], list[str]]:
    """(row labels, column labels) of a kind's maps."""
    if kind == "encoder_self":
      return self.source_pieces, self.source_pieces
    if kind == "cross":
      return self.target_pieces, self.source_pieces
    return self.target_pieces, self.decoder_input_pieces


def _pieces(tokenizer, ids: Sequence[int]) -> list[str]:
  return [EOS_LABEL if i == EOS_ID else tokenizer.id_to_piece(i) for i in ids]


def _pad(rows: Sequence[Sequence[int]]) -> np.ndarray:
  width = max(len(r) for r in rows)
  out = np.zeros((len(rows), width), np.int32)
  for b, r in enumerate(rows):
    out[b, :len(r)] = r
  return out


def sentence_maps(model_cfg: ModelConfig, params, tokenizer, sources: Sequence[str],
                  source_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]]
                  ) -> list[SentenceMaps]:
  """Maps for (source ids incl. EOS, output ids without EOS) pairs, captured in one batch."""
  targets = [list(o) + [EOS_ID] for o in output_ids]
  _, weights = capture(model_cfg, params, _pad(source_ids), _pad(targets))
  out = []
  for b, (text, src, tgt) in enumerate(zip(sources, source_ids, targets)):
    s, t = len(src), len(tgt)
    crop = {"encoder_self": weights["encoder_self"][:, b, :, :s, :s],
            "decoder_self": weights["decoder_self"][:, b, :, :t, :t],
            "cross": weights["cross"][:, b, :, :t, :s]}
    target_pieces = _pieces(tokenizer, tgt)
    out.append(SentenceMaps(source=text, translation=tokenizer.decode(tgt),
                            source_pieces=_pieces(tokenizer, src), target_pieces=target_pieces,
                            decoder_input_pieces=[START_LABEL] + target_pieces[:-1],
                            weights={k: np.ascontiguousarray(v) for k, v in crop.items()},
                            source_ids=list(map(int, src)), target_ids=list(map(int, tgt))))
  return out


def maps_from_translator(translator, sentences: Sequence[str]) -> list[SentenceMaps]:
  """Translates `sentences` with beam search, then captures the maps of (sentence, translation)."""
  sentences = [s for s in sentences if s.strip()]
  if not sentences:
    raise ConfigError("--sentence: no non-empty sentence to draw")
  source_ids = translator.encode(sentences)
  output_ids = translator.translate_ids(source_ids)
  return sentence_maps(translator.model_config, translator.params, translator.tokenizer,
                       sentences, source_ids, output_ids)


# --- drawing ------------------------------------------------------------------------------------

def _plt():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def draw_png(maps: SentenceMaps, kind: str, layer: int, path: str) -> str:
  """One figure: every head of one (kind, layer) as a labelled heatmap."""
  plt = _plt()
  w_NxQxK = maps.weights[kind][layer]
  heads = w_NxQxK.shape[0]
  rows_labels, col_labels = maps.axes(kind)
  ncols = min(4, heads)
  nrows = math.ceil(heads / ncols)
  q, k = len(rows_labels), len(col_labels)
  cell = 0.2
  panel_w, panel_h = max(2.5, k * cell + 1.2), max(2.5, q * cell + 1.2)
  fig, axes = plt.subplots(nrows, ncols, figsize=(ncols * panel_w + 0.8, nrows * panel_h + 0.6),
                           squeeze=False, layout="constrained")
  fontsize = 7 if max(q, k) <= 30 else 5
  image = None
  for h in range(nrows * ncols):
    ax = axes[h // ncols][h % ncols]
    if h >= heads:
      ax.axis("off")
      continue
    image = ax.imshow(w_NxQxK[h], cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto",
                      interpolation="nearest")
    ax.set_title(f"head {h}", fontsize=9)
    ax.set_xticks(range(k))
    ax.set_xticklabels(col_labels, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(q))
    ax.set_yticklabels(rows_labels, fontsize=fontsize)
    ax.tick_params(length=0)
  fig.suptitle(f"{KIND_TITLES[kind]}, layer {layer + 1}: \"{maps.source}\" -> "
               f"\"{maps.translation}\"", fontsize=9)
  fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, pad=0.01, label="attention weight")
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def draw_all_png(maps_list: Sequence[SentenceMaps], out_dir: str) -> list[str]:
  """`s{i}_{kind}_layer{l}.png` for every sentence, kind and layer (layers counted from 1)."""
  paths = []
  for i, maps in enumerate(maps_list):
    for kind in KINDS:
      for layer in range(maps.weights[kind].shape[0]):
        paths.append(draw_png(maps, kind, layer,
                              os.path.join(out_dir, f"s{i}_{kind}_layer{layer + 1}.png")))
  return paths


def html_data(maps_list: Sequence[SentenceMaps], title: str = "") -> dict:
  """What the HTML page embeds: labels and weights (3 decimals) of every kind/layer/head."""
  sentences = []
  for maps in maps_list:
    entry = {"source": maps.source, "translation": maps.translation, "labels": {}, "weights": {}}
    for kind in KINDS:
      rows, cols = maps.axes(kind)
      entry["labels"][kind] = {"rows": rows, "cols": cols}
      entry["weights"][kind] = np.round(maps.weights[kind].astype(np.float64), 3).tolist()
    sentences.append(entry)
  return {"title": title, "kinds": dict(KIND_TITLES), "sentences": sentences}


_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font-family:sans-serif;margin:1em;color:#222}
select{margin-right:1em}
.maps{display:flex;flex-wrap:wrap;gap:1.5em;margin-top:1em}
table.hm{border-collapse:collapse;font-size:11px}
table.hm td{width:16px;height:16px;padding:0;border:1px solid #fff}
table.hm th{font-weight:normal;padding:0 3px;white-space:nowrap}
table.hm th.col{writing-mode:vertical-rl;transform:rotate(180deg);text-align:left;height:auto}
table.hm th.row{text-align:right}
.note{color:#666;font-size:12px;max-width:60em}
</style></head><body>
<h2>__TITLE__</h2>
<p class="note">Rows are queries, columns keys; each row sums to 1. Encoder: source pieces on
both axes. Decoder rows are labelled with the piece the model predicts at that position; decoder
self-attention columns are the decoder inputs (target shifted right, &lt;s&gt; = start symbol).
'&#9601;' marks the start of a word. Hover over a cell for its weight.</p>
<div>
<label>sentence <select id="sentence"></select></label>
<label>kind <select id="kind"></select></label>
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
</div>
<p id="pair"></p>
<div class="maps" id="maps"></div>
<script id="attention-data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("attention-data").textContent);
const $ = (id) => document.getElementById(id);
function fill(sel, items) {
  const keep = sel.value;
  sel.innerHTML = "";
  for (const [value, text] of items) {
    const o = document.createElement("option");
    o.value = value; o.textContent = text; sel.appendChild(o);
  }
  if ([...sel.options].some((o) => o.value === keep)) sel.value = keep;
}
function color(v) {
  const r = Math.round(255 - v * (255 - 8)), g = Math.round(255 - v * (255 - 48)),
        b = Math.round(255 - v * (255 - 107));
  return `rgb(${r},${g},${b})`;
}
function table(w, rows, cols, caption) {
  const t = document.createElement("table");
  t.className = "hm";
  const cap = document.createElement("caption");
  cap.textContent = caption; t.appendChild(cap);
  const head = document.createElement("tr");
  head.appendChild(document.createElement("th"));
  for (const c of cols) {
    const th = document.createElement("th"); th.className = "col"; th.textContent = c;
    head.appendChild(th);
  }
  t.appendChild(head);
  w.forEach((row, i) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th"); th.className = "row"; th.textContent = rows[i];
    tr.appendChild(th);
    row.forEach((v, j) => {
      const td = document.createElement("td");
      td.style.background = color(v);
      td.title = `${rows[i]} \\u2192 ${cols[j]}: ${v.toFixed(3)}`;
      tr.appendChild(td);
    });
    t.appendChild(tr);
  });
  return t;
}
function meanOfHeads(layer) {
  const n = layer.length;
  return layer[0].map((row, i) => row.map((_, j) => layer.reduce((s, h) => s + h[i][j], 0) / n));
}
function render() {
  const s = DATA.sentences[+$("sentence").value], kind = $("kind").value;
  const layers = s.weights[kind];
  fill($("layer"), layers.map((_, l) => [String(l), `layer ${l + 1}`]));
  const heads = layers[0].length;
  fill($("head"), [["all", "all heads"], ["mean", "mean of heads"],
                   ...Array.from({length: heads}, (_, h) => [String(h), `head ${h}`])]);
  const layer = layers[+$("layer").value], lab = s.labels[kind], head = $("head").value;
  $("pair").textContent = `${s.source}  \\u2192  ${s.translation}`;
  const box = $("maps"); box.innerHTML = "";
  const title = `${DATA.kinds[kind]}, layer ${+$("layer").value + 1}`;
  if (head === "all") {
    layer.forEach((w, h) => box.appendChild(table(w, lab.rows, lab.cols, `${title}, head ${h}`)));
  } else if (head === "mean") {
    box.appendChild(table(meanOfHeads(layer), lab.rows, lab.cols, `${title}, mean of heads`));
  } else {
    box.appendChild(table(layer[+head], lab.rows, lab.cols, `${title}, head ${head}`));
  }
}
fill($("sentence"), DATA.sentences.map((s, i) => [String(i), `${i + 1}: ${s.source}`]));
fill($("kind"), Object.entries(DATA.kinds));
for (const id of ["sentence", "kind", "layer", "head"]) $(id).addEventListener("change", render);
render();
</script></body></html>
"""


def write_html(maps_list: Sequence[SentenceMaps], path: str, title: str = "Attention maps") -> str:
  """One self-contained page (inline JSON + JavaScript, no external assets)."""
  data = json.dumps(html_data(maps_list, title), separators=(",", ":"))
  data = data.replace("</", "<\\/")  # never closes the script element early
  page = _HTML.replace("__TITLE__", html.escape(title)).replace("__DATA__", data)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(page)
  return path


def write_all(maps_list: Sequence[SentenceMaps], out_dir: str, title: str = "Attention maps"
              ) -> dict:
  """PNGs + `attention_maps.html` + `sentences.json` (texts and pieces) under out_dir."""
  pngs = draw_all_png(maps_list, out_dir)
  page = write_html(maps_list, os.path.join(out_dir, "attention_maps.html"), title)
  index = [{"source": m.source, "translation": m.translation, "source_pieces": m.source_pieces,
            "target_pieces": m.target_pieces} for m in maps_list]
  with open(os.path.join(out_dir, "sentences.json"), "w", encoding="utf-8") as f:
    json.dump({"title": title, "sentences": index}, f, indent=1, ensure_ascii=False)
  return {"png": pngs, "html": page}


# Its own flag set: tests import this module beside the training CLI's global flags.
FLAGS = flags.FlagValues()
flags.DEFINE_string("workdir", None, "Training workdir (checkpoints + vocab).", flag_values=FLAGS)
flags.DEFINE_string("out", None, "Output folder.", flag_values=FLAGS)
flags.DEFINE_multi_string("sentence", None, f"Source sentence (repeatable); default: "
                          f"{DEFAULT_SENTENCE!r}.", flag_values=FLAGS)
flags.DEFINE_integer("step", None, "Checkpoint step (default newest).", lower_bound=0,
                     flag_values=FLAGS)
flags.DEFINE_integer("average", 0, "Average the last k checkpoints.", lower_bound=0,
                     flag_values=FLAGS)
flags.mark_flags_as_required(["workdir", "out"], flag_values=FLAGS)


def main(argv: Sequence[str] | None = None) -> int:
  """`python -m transformer_jax.tools.attention_maps --workdir=W --out=DIR [--sentence=...]`; `argv`
  without the program name (default: this process's). A mistake in them is a ConfigError."""
  args = sys.argv[1:] if argv is None else list(argv)
  return draw(cli.parse_or_raise(["attention_maps", *args], FLAGS, overrides=False))


def draw(rest: Sequence[str]) -> int:
  """The maps FLAGS ask for, once parsed (`rest`: the arguments left, program name first)."""
  if len(rest) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(rest[1:])}")
  args = FLAGS
  translator = Translator.from_workdir(args.workdir, step=args.step, average=args.average)
  if args.average:
    which = f"average of the last {args.average} checkpoints"
  else:
    which = f"checkpoint {checkpoint.saved_config(checkpoint.checkpoint_dir(args.workdir), args.step)[1]}"
  maps_list = maps_from_translator(translator, args.sentence or [DEFAULT_SENTENCE])
  cfg = translator.model_config
  title = (f"Attention maps: {os.path.basename(os.path.abspath(args.workdir))}, {which} "
           f"({cfg.num_encoder_layers}+{cfg.num_decoder_layers} layers, {cfg.num_heads} heads, "
           f"d_model {cfg.d_model}; translation by beam search, beam {translator.beam_size})")
  written = write_all(maps_list, args.out, title)
  for m in maps_list:
    print(f"{m.source}  ->  {m.translation}")
  print(f"wrote {len(written['png'])} PNG files and {written['html']}")
  return 0


if __name__ == "__main__":
  cli.run(draw, flag_values=FLAGS, overrides=False)
