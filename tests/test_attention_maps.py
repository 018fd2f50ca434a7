"""Attention maps: captured weights are the model's own (shapes, rows sum to 1, equal to a numpy
recomputation of the whole forward pass), capturing leaves the logits unchanged, and the PNG and
HTML files are written with every layer and head; the CLI runs on a tiny workdir."""

import io
import json
import os
import shutil
import subprocess

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm

from tests.test_model import reference
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.inference.translate import Translator
from transformer_jax.model import sharding
from transformer_jax.model.transformer import Transformer
from transformer_jax.runtime.config import default_config, ModelConfig
from transformer_jax.tools import attention_maps as am
from transformer_jax.training import checkpoint, step

pytestmark = pytest.mark.xdist_group(__name__)  # one worker builds the fixture: see conftest

CORPUS = ["A man in a blue shirt is riding a bike through the park.",
          "Two dogs play in the snow.", "A woman is reading a book on a bench.",
          "The animal didn't cross the street because it was too tired.",
          "Children are playing football on the beach.", "A red car drives down the road."] * 4
SENTENCES = ["A man rides a bike.", "The animal was too tired."]


def _config(vocab_size):
  c = default_config()
  m = c.model
  m.vocab_size = vocab_size
  m.d_model, m.num_heads, m.d_k, m.d_v, m.d_ff = 32, 4, 8, 6, 48
  m.num_encoder_layers, m.num_decoder_layers = 2, 3   # different depths: no mix-up possible
  m.max_len, m.dropout_rate = 40, 0.0
  c.data.max_source_len = c.data.max_target_len = 30
  c.decode.beam_size, c.decode.batch_size, c.decode.max_extra_len = 2, 2, 5
  return c


@pytest.fixture(scope="module")
def setup():
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(CORPUS), model_writer=model, model_type="bpe", vocab_size=60,
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, minloglevel=2,
      num_threads=1)
  tok = Tokenizer(model.getvalue())
  config = _config(tok.vocab_size)
  cfg = ModelConfig.from_config(config.model)
  dummy = jnp.ones((1, 4), jnp.int32)
  params = nn.meta.unbox(Transformer(cfg).init(jax.random.key(0), dummy, dummy)["params"])
  translator = Translator(params, config, tok)
  maps = am.maps_from_translator(translator, SENTENCES)
  return {"tok": tok, "config": config, "cfg": cfg, "params": params, "translator": translator,
          "maps": maps}


def _ids(setup, m):
  src, tgt = np.asarray(m.source_ids), np.asarray(m.target_ids)
  assert src.tolist() == setup["tok"].encode_with_eos(m.source)
  assert tgt[-1] == 1 and 1 not in tgt[:-1] and 0 not in tgt
  assert [setup["tok"].id_to_piece(i) for i in tgt[:-1]] == m.target_pieces[:-1]
  return src, tgt


# --- tests ---------------------------------------------------------------------------------------

def test_shapes_per_kind_and_layer(setup):
  cfg = setup["cfg"]
  layers = {"encoder_self": cfg.num_encoder_layers, "decoder_self": cfg.num_decoder_layers,
            "cross": cfg.num_decoder_layers}
  for m in setup["maps"]:
    s, t = len(m.source_pieces), len(m.target_pieces)
    assert m.source_pieces[-1] == "</s>" and m.target_pieces[-1] == "</s>"
    assert m.decoder_input_pieces == ["<s>"] + m.target_pieces[:-1]
    want = {"encoder_self": (s, s), "decoder_self": (t, t), "cross": (t, s)}
    for kind in am.KINDS:
      assert m.weights[kind].shape == (layers[kind], cfg.num_heads, *want[kind]), kind
      rows, cols = m.axes(kind)
      assert (len(rows), len(cols)) == want[kind]
  assert len(setup["maps"][0].source_pieces) != len(setup["maps"][1].source_pieces)  # padded batch


def test_rows_sum_to_one_over_real_tokens_and_padding_is_zero(setup):
  tok = setup["tok"]
  src = am._pad([tok.encode_with_eos(s) for s in SENTENCES])
  tgt = am._pad([[5, 6, 7, 1], [8, 9, 1]])
  _, w = am.capture(setup["cfg"], setup["params"], src, tgt)
  real_s, real_t = src != 0, tgt != 0
  for kind, (q_real, k_real) in {"encoder_self": (real_s, real_s), "decoder_self": (real_t, real_t),
                                 "cross": (real_t, real_s)}.items():
    x = w[kind]  # [L, B, N, Q, K]
    sums = x.sum(-1)
    qmask = np.broadcast_to(q_real[None, :, None, :], sums.shape)
    np.testing.assert_allclose(sums[qmask], 1.0, atol=1e-5, err_msg=kind)
    assert np.all(sums[~qmask] == 0.0), kind          # padding queries attend nothing
    kmask = np.broadcast_to(k_real[None, :, None, None, :], x.shape)
    assert np.all(x[~kmask] == 0.0), kind             # padding keys get exactly zero
  t = tgt.shape[1]
  future = np.triu(np.ones((t, t), bool), 1)
  assert np.all(w["decoder_self"][..., future] == 0.0)  # causal


def test_weights_equal_a_direct_recomputation(setup):
  for m in setup["maps"]:
    src, tgt = _ids(setup, m)
    logits_ref, w_ref = reference(setup["params"], src, tgt)
    for kind in am.KINDS:
      np.testing.assert_allclose(m.weights[kind], w_ref[kind], atol=2e-5, err_msg=kind)
    logits, _ = am.capture(setup["cfg"], setup["params"], src[None], tgt[None])
    np.testing.assert_allclose(logits[0], logits_ref, atol=2e-4, rtol=1e-4)


def test_capturing_leaves_the_logits_unchanged(setup):
  cfg, params = setup["cfg"], setup["params"]
  tok = setup["tok"]
  src = am._pad([tok.encode_with_eos(s) for s in SENTENCES])
  tgt = am._pad([[5, 6, 7, 1], [8, 9, 1]])
  plain = jax.jit(lambda p, s, t: Transformer(cfg).apply({"params": p}, s, t))(params, src, tgt)
  captured, _ = am.capture(cfg, params, src, tgt)
  np.testing.assert_allclose(captured, np.asarray(plain), rtol=1e-6, atol=1e-6)
  # and the fused-attention config is captured through the einsum path, same maths
  fused = cfg.replace(attention_impl="dot_product_attention", d_v=cfg.d_k)
  p2 = nn.meta.unbox(Transformer(fused).init(jax.random.key(1), src, tgt)["params"])
  plain2 = Transformer(fused).apply({"params": p2}, src, tgt)
  captured2, w2 = am.capture(fused, p2, src, tgt)
  real = tgt != 0  # (at padding queries the fused kernel and the einsum path differ; unused)
  np.testing.assert_allclose(captured2[real], np.asarray(plain2)[real], rtol=1e-5, atol=1e-5)
  assert w2["cross"].shape[0] == fused.num_decoder_layers


def test_png_and_html_files(setup, tmp_path):
  cfg, maps = setup["cfg"], setup["maps"][:1]  # one sentence: ~1 s of matplotlib per figure
  written = am.write_all(maps, str(tmp_path), "test")
  per_sentence = cfg.num_encoder_layers + 2 * cfg.num_decoder_layers
  assert len(written["png"]) == len(maps) * per_sentence
  for path in written["png"]:
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 5000
  assert os.path.exists(tmp_path / "s0_cross_layer3.png")  # sentences from 0, layers from 1
  page = open(written["html"], encoding="utf-8").read()
  assert "http://" not in page and "https://" not in page and " src=" not in page  # self-contained
  data = read_html_data(written["html"])
  assert len(data["sentences"]) == len(maps)
  for m, entry in zip(maps, data["sentences"]):
    assert entry["source"] == m.source and entry["translation"] == m.translation
    for kind in am.KINDS:
      w = np.asarray(entry["weights"][kind])
      assert w.shape == m.weights[kind].shape      # every layer and head
      np.testing.assert_allclose(w, m.weights[kind], atol=6e-4)
      rows, cols = m.axes(kind)
      assert entry["labels"][kind] == {"rows": rows, "cols": cols}
  meta = json.load(open(tmp_path / "sentences.json", encoding="utf-8"))
  assert [s["source"] for s in meta["sentences"]] == SENTENCES[:1]


# A minimal DOM for node: runs the page's script, switches kind and head, counts rendered cells.
_DOM_SHIM = r"""
// Minimal DOM shim: runs the page's script and counts the rendered heatmap cells.
const fs = require("fs");
const page = fs.readFileSync(process.argv[2], "utf8");
const scripts = [...page.matchAll(/<script([^>]*)>([\s\S]*?)<\/script>/g)];
const dataText = scripts.find((m) => m[1].includes("attention-data"))[2];
const code = scripts.find((m) => !m[1].includes("attention-data"))[2];
class El {
  constructor(tag) { this.tag = tag; this.children = []; this.style = {}; this._value = "";
    this.listeners = {}; this.textContent = ""; }
  appendChild(c) { this.children.push(c); return c; }
  set innerHTML(v) { this.children = []; }
  get options() { return this.children.filter((c) => c.tag === "option"); }
  get value() { return this._value || (this.options[0] ? this.options[0].value : ""); }
  set value(v) { this._value = v; }
  addEventListener(t, f) { this.listeners[t] = f; }
  count(tag) { return this.children.reduce((n, c) => n + (c.tag === tag) + c.count(tag), 0); }
}
const els = {"attention-data": Object.assign(new El("script"), {textContent: dataText})};
for (const id of ["sentence", "kind", "layer", "head", "pair", "maps"]) els[id] = new El(id);
global.document = {getElementById: (id) => els[id], createElement: (t) => new El(t)};
eval(code);
const out = {};
const data = JSON.parse(dataText);
for (const [kind] of Object.entries(data.kinds)) {
  els.kind.value = kind;
  for (const head of ["all", "mean", "0"]) {
    els.head.value = head; els.layer.value = "0"; els.kind.listeners.change();
    out[`${kind}/${head}`] = {tables: els.maps.count("table"), cells: els.maps.count("td"),
                              layers: els.layer.options.length, heads: els.head.options.length - 2};
  }
}
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's script")
def test_html_page_script_renders_every_kind(setup, tmp_path):
  maps = setup["maps"][:1]
  page = am.write_html(maps, str(tmp_path / "page.html"))
  (tmp_path / "shim.js").write_text(_DOM_SHIM)
  out = subprocess.run(["node", str(tmp_path / "shim.js"), page], capture_output=True, text=True,
                       timeout=60, check=True).stdout
  got = json.loads(out)
  m, heads = maps[0], setup["cfg"].num_heads
  for kind in am.KINDS:
    q, k = m.weights[kind].shape[-2:]
    assert got[f"{kind}/all"] == {"tables": heads, "cells": heads * q * k,
                                  "layers": m.weights[kind].shape[0], "heads": heads}
    assert got[f"{kind}/mean"]["cells"] == got[f"{kind}/0"]["cells"] == q * k


def test_cli_on_a_tiny_workdir(setup, tmp_path, capsys):
  config, tok = setup["config"], setup["tok"]
  work = tmp_path / "work"
  os.makedirs(work / "vocab")
  (work / "vocab" / "spm.model").write_bytes(tok.model_proto)
  mesh = sharding.make_mesh(config.mesh)
  state = step.create_state(config, mesh)
  manager = checkpoint.make_manager(checkpoint.checkpoint_dir(str(work)), async_save=False,
                                    with_data=False)
  checkpoint.save(manager, 1, state, config)
  manager.wait_until_finished()
  out = tmp_path / "maps"
  assert am.main([f"--workdir={work}", f"--out={out}", "--sentence=Two dogs play."]) == 0
  printed = capsys.readouterr().out
  assert "Two dogs play." in printed and "attention_maps.html" in printed
  data = read_html_data(str(out / "attention_maps.html"))
  assert data["title"].startswith("Attention maps: work, checkpoint 1 (")
  assert len(data["sentences"][0]["weights"]["decoder_self"]) == config.model.num_decoder_layers
  assert len(list(out.glob("*.png"))) == config.model.num_encoder_layers + 2 * config.model.num_decoder_layers


def read_html_data(path: str) -> dict:
  """The JSON a page written by `write_html` embeds ."""
  with open(path, encoding="utf-8") as f:
    page = f.read()
  start = page.index('<script id="attention-data" type="application/json">')
  start = page.index(">", start) + 1
  return json.loads(page[start:page.index("</script>", start)].replace("<\\/", "</"))
