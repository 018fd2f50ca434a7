"""Exporting a trained workdir (tools/export.py), as a user meets it: real processes on the tiny
config. The CTranslate2 model translates what ours translates (greedy, token for token); the
MarianMT folder's config loads in transformers without torch and holds the tensors MarianMT
expects, and with torch its logits are ours; settings a target cannot express, and each bad
input, are one line `error: ...` with exit status 2 and nothing written.
"""

import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from tests.common import REPO, requires_data
from tests.test_train_reliability import _env, _run

pytestmark = [requires_data, pytest.mark.slow, pytest.mark.xdist_group(__name__)]

ctranslate2 = pytest.importorskip("ctranslate2", reason="the export extra (ctranslate2) is not "
                                  "installed")


def _export(*args):
  return subprocess.run([sys.executable, "-m", "transformer_jax.tools.export", *args], cwd=REPO,
                        env=_env(), capture_output=True, text=True, timeout=300)


def _one_line(result, says):
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
      result.returncode, result.stderr[-2000:])
  assert says in lines[0], lines[0]


@pytest.fixture(scope="module")
def post_ln(tmp_path_factory):
  """Two steps of the tiny model (post-LN, tied, sinusoidal: what both targets express)."""
  run = str(tmp_path_factory.mktemp("export") / "run")
  result = _run(run, "--config.train.num_steps=2")
  assert result.returncode == 0, result.stderr[-3000:]
  return run


@pytest.fixture(scope="module")
def pre_ln(tmp_path_factory):
  """Two steps of the tiny model, pre-LN with scanned layers (CTranslate2 only)."""
  run = str(tmp_path_factory.mktemp("export_pre_ln") / "run")
  result = _run(run, "--config.train.num_steps=2", "--config.model.pre_ln=True",
                "--config.model.scan_layers=True")
  assert result.returncode == 0, result.stderr[-3000:]
  return run


def _ours_and_ct2(workdir, folder, count=4):
  """(our greedy output ids, CTranslate2's) on the first dev sentences, each at our limit."""
  from transformer_jax.data import sources
  from transformer_jax.inference.translate import Translator
  t = Translator.from_workdir(workdir, override_args=["--config.decode.beam_size=1"])
  texts = sources.load_split_texts(t.config, "validation")[0][:count]
  ids = t.encode(texts)
  ours = t.translate_ids(ids)
  tok, extra = t.tokenizer, t.config.decode.max_extra_len
  vocab = {tok.id_to_piece(i): i for i in range(tok.vocab_size)}
  model = ctranslate2.Translator(folder, device="cpu", intra_threads=1)
  theirs = []
  for s in ids:
    r = model.translate_batch([[tok.id_to_piece(i) for i in s[:-1]]], beam_size=1,
                              max_decoding_length=len(s) + extra - 1, min_decoding_length=0)
    theirs.append([vocab[p] for p in r[0].hypotheses[0]])
  return ours, theirs


@pytest.mark.parametrize("run", ["post_ln", "pre_ln"])
def test_the_ctranslate2_model_translates_what_ours_translates(run, request, tmp_path):
  workdir = request.getfixturevalue(run)
  out = str(tmp_path / "ct2")
  result = _export(f"--workdir={workdir}", "--format=ctranslate2", f"--out={out}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert {"model.bin", "config.json", "shared_vocabulary.json", "spm.model"} <= set(os.listdir(out))
  assert [n for n in os.listdir(tmp_path) if n != "ct2"] == []  # no temporary left beside it
  ours, theirs = _ours_and_ct2(workdir, out)
  assert ours == theirs


def test_int8_is_written_smaller(post_ln, tmp_path):
  result = _export(f"--workdir={post_ln}", "--format=ctranslate2", "--quantization=int8",
                   f"--out={tmp_path / 'int8'}")
  assert result.returncode == 0, result.stderr[-3000:]
  model = ctranslate2.Translator(str(tmp_path / "int8"), device="cpu")
  assert model.translate_batch([["▁a"]], max_decoding_length=3)  # loads and decodes


@pytest.fixture(scope="module")
def hf_folder(post_ln, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("hf") / "marian")
  result = _export(f"--workdir={post_ln}", "--format=hf", f"--out={out}")
  assert result.returncode == 0, result.stderr[-3000:]
  return out


def test_the_marian_config_loads_without_torch(hf_folder, post_ln):
  from transformers import MarianConfig
  config = MarianConfig.from_pretrained(hf_folder)
  saved = json.load(open(os.path.join(post_ln, "config.json")))["model"]
  assert (config.d_model, config.encoder_layers, config.decoder_layers,
          config.encoder_attention_heads, config.encoder_ffn_dim, config.vocab_size) == (
              saved["d_model"], saved["num_encoder_layers"], saved["num_decoder_layers"],
              saved["num_heads"], saved["d_ff"], saved["vocab_size"])
  assert config.scale_embedding and config.activation_function == "relu"
  assert (config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (0, 1, 0)
  assert {"source.spm", "target.spm", "vocab.json", "tokenizer_config.json",
          "generation_config.json"} <= set(os.listdir(hf_folder))


def _marian_names(config) -> dict:
  """The tensor names MarianMTModel's modules give (modeling_marian.py: MarianAttention's
  q/k/v/out_proj, its layers' *_layer_norm and fc1/fc2), with the shapes of torch's (out, in)
  Linear weights: the tied embeddings once as model.shared, no position tables (Marian's
  save_pretrained leaves both out). The torch test below checks this list against the model."""
  d, f, v = config.d_model, config.encoder_ffn_dim, config.vocab_size
  names = {"model.shared.weight": (v, d), "final_logits_bias": (1, v)}

  def attention(prefix):
    for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
      names.update({f"{prefix}.{p}.weight": (d, d), f"{prefix}.{p}.bias": (d,)})

  def rest(prefix, norms):
    names.update({f"{prefix}.fc1.weight": (f, d), f"{prefix}.fc1.bias": (f,),
                  f"{prefix}.fc2.weight": (d, f), f"{prefix}.fc2.bias": (d,)})
    for n in norms:
      names.update({f"{prefix}.{n}.weight": (d,), f"{prefix}.{n}.bias": (d,)})
  for i in range(config.encoder_layers):
    attention(f"model.encoder.layers.{i}.self_attn")
    rest(f"model.encoder.layers.{i}", ("self_attn_layer_norm", "final_layer_norm"))
  for i in range(config.decoder_layers):
    attention(f"model.decoder.layers.{i}.self_attn")
    attention(f"model.decoder.layers.{i}.encoder_attn")
    rest(f"model.decoder.layers.{i}",
         ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"))
  return names


def test_the_safetensors_hold_what_marian_expects(hf_folder):
  from safetensors.numpy import load_file
  from transformers import MarianConfig
  tensors = load_file(os.path.join(hf_folder, "model.safetensors"))
  expected = _marian_names(MarianConfig.from_pretrained(hf_folder))
  assert {k: v.shape for k, v in tensors.items()} == expected


def test_marian_loads_the_folder_and_its_logits_are_ours(hf_folder, post_ln):
  torch = pytest.importorskip("torch", reason="torch is not installed: MarianMT cannot load")
  import flax.linen as nn
  from transformers import MarianConfig, MarianMTModel
  from transformer_jax.inference import trained
  from transformer_jax.model.transformer import Transformer
  from transformer_jax.runtime.config import ModelConfig
  config = MarianConfig.from_pretrained(hf_folder)
  with torch.device("meta"):
    empty = MarianMTModel(config)
  skipped = set(empty._keys_to_ignore_on_save or ()) | set(empty._tied_weights_keys or {})
  expected = {k: tuple(v.shape) for k, v in empty.state_dict().items() if k not in skipped}
  assert expected == _marian_names(config)  # transformers' own names and shapes
  model, info = MarianMTModel.from_pretrained(hf_folder, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  loaded = trained.load(post_ln)
  tok = loaded.tokenizer
  x = np.array([tok.encode_with_eos("A man rides a bike.") + [0, 0]], np.int32)
  y = np.array([tok.encode_with_eos("Ein Mann fährt Rad.")], np.int32)
  ours = np.asarray(Transformer(ModelConfig.from_config(loaded.config.model)).apply(
      {"params": nn.meta.unbox(loaded.params)}, x, y))
  with torch.no_grad():
    theirs = model.eval()(input_ids=torch.tensor(x, dtype=torch.long),
                          attention_mask=torch.tensor(x != 0),
                          decoder_input_ids=torch.tensor(np.pad(y, ((0, 0), (1, 0)))[:, :-1],
                                                         dtype=torch.long)).logits.numpy()
  assert np.max(np.abs(theirs - ours)) < 1e-4


def test_what_a_target_cannot_express_is_refused_naming_the_key(pre_ln, tmp_path):
  out = tmp_path / "hf"
  _one_line(_export(f"--workdir={pre_ln}", "--format=hf", f"--out={out}"), "'model.pre_ln'")
  assert not list(tmp_path.iterdir())
  from transformer_jax.runtime.config import default_config
  from transformer_jax.runtime.exceptions import ConfigError
  from transformer_jax.tools import export
  for key, value, target, says in (("model.pe_type", "learned", "hf", "'model.pe_type'"),
                                   ("model.d_v", 32, "ctranslate2", "'model.d_v'"),
                                   ("model.word_positions", True, "ctranslate2",
                                    "'model.word_positions'"),
                                   ("model.word_pointer", True, "hf", "'model.word_pointer'"),
                                   ("data.task", "parsing", "ctranslate2", "'data.task'")):
    config = ml_collections.ConfigDict(default_config().to_dict())
    section, name = key.split(".")
    config[section][name] = value
    with pytest.raises(ConfigError, match=says):
      export.check_exportable(config, target)


def test_bad_inputs_are_one_line_and_write_nothing(post_ln, tmp_path):
  empty = tmp_path / "untrained"
  empty.mkdir()
  taken = tmp_path / "taken"
  taken.mkdir()
  (taken / "file").write_text("x")
  before = sorted(os.listdir(tmp_path))
  for args, says in (
      ([f"--workdir={empty}", "--format=ctranslate2", f"--out={tmp_path / 'a'}"], str(empty)),
      ([f"--workdir={post_ln}", "--format=ctranslate2", f"--out={taken}"], "not an empty folder"),
      ([f"--workdir={post_ln}", "--format=onnx", f"--out={tmp_path / 'b'}"], "format"),
      ([f"--workdir={post_ln}", "--format=hf", "--quantization=int8",
        f"--out={tmp_path / 'c'}"], "float32")):
    _one_line(_export(*args), says)
    assert sorted(os.listdir(tmp_path)) == before
    assert os.listdir(taken) == ["file"] and not os.listdir(empty)
