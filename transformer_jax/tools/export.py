"""A trained workdir as a CTranslate2 model or a Hugging Face MarianMT folder, in one command.

  python -m transformer_jax.tools.export --workdir=W --format=ctranslate2 --out=DIR \
      [--quantization=float32|int8] [--step=N] [--average=K]
  python -m transformer_jax.tools.export --workdir=W --format=hf --out=DIR [--step=N] [--average=K]

The workdir is read through the one loader (inference/trained.py: checkpoint, config and
vocabulary checked together). Both targets translate what ours translates with the same weights:
- CTranslate2: a `TransformerSpec` (post-LN or pre-LN, ReLU, sqrt(d_model)-scaled embeddings)
  saved with CTranslate2's own `ModelSpec.save`. Our position table is written as its position
  encodings, so no dimension is permuted; the decoder starts from our start symbol (id 0, the
  pad piece), not from CTranslate2's zero embedding, since our start row is a trained embedding.
  The source gets EOS appended by CTranslate2 (`add_source_eos`), as our translator does, and
  the pad id is never written (a -1e9 bias on its logit), as our search bans it.
  `--quantization=int8` stores int8 weight matrices (CTranslate2's `optimize`).
- MarianMT: `config.json`, `generation_config.json`, `model.safetensors` (NumPy API) and the
  files MarianTokenizer reads. Marian computes its own sinusoids at load, concatenated
  [sin | cos], where ours are interleaved: every weight is permuted along d_model by the one
  permutation that maps ours onto Marian's (LayerNorm is elementwise, attention and the logits
  are sums over d_model), so the table is not written. Marian's LayerNorm epsilon is fixed at
  1e-5; ours is `model.layer_norm_epsilon` (1e-6 by default), a small difference in every
  normalisation that the agreement benchmark measures. The pad id is banned from outputs by
  `generation_config.json` (`bad_words_ids`), so the logits stay the model's own.
Settings a target cannot express are refused in one line naming the config key. Output goes to
a temporary folder beside `--out`, renamed at the end: a failed export leaves nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from absl import flags

from transformer_jax.runtime import cli
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.special_ids import EOS_ID, PAD_ID

FORMATS = ("ctranslate2", "hf")
QUANTIZATIONS = ("float32", "int8")
PAD_LOGIT_BIAS = -1e9  # CTranslate2's projection bias on the pad id: never chosen

# Its own flag set: other modules (benchmarks, tests) import this one beside their own flags.
FLAGS = flags.FlagValues()
flags.DEFINE_string("workdir", None, "Trained workdir to export.", flag_values=FLAGS)
flags.DEFINE_enum("format", None, FORMATS, "Target: CTranslate2 model or Hugging Face MarianMT "
                  "folder.", flag_values=FLAGS)
flags.DEFINE_string("out", None, "Folder to write (must not exist, or be empty).",
                    flag_values=FLAGS)
flags.DEFINE_enum("quantization", "float32", QUANTIZATIONS, "Weight type of the CTranslate2 "
                  "model (the MarianMT folder is float32).", flag_values=FLAGS)
flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest); with --average, the "
                     "newest of the averaged ones.", flag_values=FLAGS)
flags.DEFINE_integer("average", 0, "Export the average of the last K checkpoints.",
                     lower_bound=0, flag_values=FLAGS)


def check_out(out: str) -> None:
  """A ConfigError unless `out` can be written whole: absent, or an empty folder."""
  if not out:
    raise ConfigError("--out is required: the folder to write the exported model to")
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise ConfigError(f"--out={out} exists and is not an empty folder; name a new one")
  parent = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(parent):
    raise ConfigError(f"--out={out}: its folder {parent} does not exist")


def check_exportable(config, target: str) -> None:
  """A one-line ConfigError, naming the key, for a trained config that `target` ('ctranslate2'
  or 'hf') cannot express; nothing for one it can."""
  from transformer_jax.tasks import registry  # pylint: disable=g-import-not-at-top
  task = registry.for_name(config.data.task)
  if task.export_refusal:
    raise ConfigError(f"config key 'data.task'={task.name!r}: {task.export_refusal}")
  m = config.model
  if m.d_k != m.d_v:
    raise ConfigError(f"config keys 'model.d_k'={m.d_k} and 'model.d_v'={m.d_v} differ; "
                      "neither target has separate query/key and value head sizes")
  for key, input_part in (("word_positions", "an embedding of word indices"),
                          ("word_pointer", "the encoder's output at the next word")):
    if getattr(m, key):
      raise ConfigError(f"config key 'model.{key}'=True: neither target adds {input_part} to "
                        "the model's inputs, which its outputs depend on")
  if target == "hf":
    name = "MarianMT"
    if m.pre_ln:
      raise ConfigError(f"config key 'model.pre_ln'=True: {name} is post-LN only; export a "
                        "pre-LN model with --format=ctranslate2")
    if m.pe_type != "sinusoidal":
      raise ConfigError(f"config key 'model.pe_type'={m.pe_type!r}: {name} computes its own "
                        "fixed sinusoids and never loads a position table; use "
                        "--format=ctranslate2")
    if m.num_heads * m.d_k != m.d_model:
      raise ConfigError(f"config key 'model.d_k'={m.d_k}: {name}'s heads are d_model / "
                        f"num_heads = {m.d_model / m.num_heads:g} wide")


def position_rows(config) -> int:
  """Rows of the position table a target needs: a learned table's own rows; for sinusoids,
  the longest source and output our decoder allows (model.max_len, data.max_source_len +
  decode.max_extra_len)."""
  m = config.model
  if m.pe_type == "learned":
    return m.max_len
  return max(m.max_len, config.data.max_source_len + config.decode.max_extra_len)


def _numpy_params(loaded):
  """(unrolled ModelConfig, parameters as nested dicts of float32 numpy arrays)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from transformer_jax.model.transformer import unstack_layers  # pylint: disable=g-import-not-at-top
  cfg, params = unstack_layers(ModelConfig.from_config(loaded.config.model),
                               nn.meta.unbox(loaded.params))
  # Writable copies: CTranslate2 quantizes its arrays in place.
  return cfg, jax.tree.map(lambda x: np.array(x, np.float32), jax.device_get(params))


def _embeddings(cfg, p):
  """(source, target, output projection) tables [V, D]: one array three times when tied."""
  if cfg.tie_embeddings:
    e = p["shared_embedding"]["embedding"]
    return e, e, e
  return (p["source_embedding"]["embedding"], p["target_embedding"]["embedding"],
          p["output_projection"]["embedding"])


def _position_table(cfg, p, rows: int):
  from transformer_jax.model import positional  # pylint: disable=g-import-not-at-top
  if cfg.pe_type == "learned":
    return p["encoder"]["positional"]["pos_embedding"], p["decoder"]["positional"]["pos_embedding"]
  table = positional.sinusoidal_table(rows, cfg.d_model)
  return table, table


def _in(w_DxNxK):
  """A projection [D, heads, size] as a [heads*size, D] (out, in) matrix."""
  d = w_DxNxK.shape[0]
  return w_DxNxK.reshape(d, -1).T


def _out(w_NxVxD):
  """The output projection [heads, size, D] as a [D, heads*size] (out, in) matrix."""
  return w_NxVxD.reshape(-1, w_NxVxD.shape[-1]).T


# ------------------------------------------------------------------------------ CTranslate2


def ctranslate2_spec(config, cfg, p, tok):
  """The CTranslate2 TransformerSpec holding these parameters (validated, not yet optimized)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from ctranslate2.specs import common_spec, transformer_spec  # pylint: disable=g-import-not-at-top
  head_dim = None if cfg.num_heads * cfg.d_k == cfg.d_model else cfg.d_k
  common = dict(pre_norm=cfg.pre_ln, activation=common_spec.Activation.RELU, head_dim=head_dim)
  encoder = transformer_spec.TransformerEncoderSpec(cfg.num_encoder_layers, cfg.num_heads,
                                                    **common)
  decoder = transformer_spec.TransformerDecoderSpec(cfg.num_decoder_layers, cfg.num_heads,
                                                    **common)
  spec = transformer_spec.TransformerSpec(encoder, decoder)
  src, tgt, out = _embeddings(cfg, p)
  enc_pe, dec_pe = _position_table(cfg, p, position_rows(config))

  def norm(s, n):
    s.gamma, s.beta = n["scale"], n["bias"]

  def linear(s, w, b=None):
    s.weight = np.ascontiguousarray(w)
    if b is not None:
      s.bias = b

  def ffn(s, block, f):
    linear(s.linear_0, f["wi"]["kernel"].T, f["wi"]["bias"])
    linear(s.linear_1, f["wo"]["kernel"].T, f["wo"]["bias"])
    norm(s.layer_norm, block["norm"])

  def self_attention(s, block, a):
    linear(s.linear[0], np.concatenate([_in(a["query"]), _in(a["key"]), _in(a["value"])]))
    linear(s.linear[1], _out(a["out"]))
    norm(s.layer_norm, block["norm"])

  encoder.embeddings[0].weight = src
  encoder.scale_embeddings = True  # sqrt(d_model)
  encoder.position_encodings.encodings = enc_pe
  for i, layer in enumerate(encoder.layer):
    e = p["encoder"][f"layer_{i}"]
    self_attention(layer.self_attention, e["attention_block"], e["self_attention"])
    ffn(layer.ffn, e["ffn_block"], e["ffn"])
  decoder.embeddings.weight = tgt
  decoder.scale_embeddings = True
  decoder.position_encodings.encodings = dec_pe
  # Our search never writes the pad id (beam_search._step_log_probs); CTranslate2 has no such
  # setting in its model, so a bias of -1e9 on that logit (and 0 elsewhere) bans it there.
  banned = np.zeros(cfg.vocab_size, np.float32)
  banned[tok.pad_id] = PAD_LOGIT_BIAS
  linear(decoder.projection, out, banned)
  for i, layer in enumerate(decoder.layer):
    d = p["decoder"][f"layer_{i}"]
    self_attention(layer.self_attention, d["self_attention_block"], d["self_attention"])
    c = d["cross_attention"]
    linear(layer.attention.linear[0], _in(c["query"]))
    linear(layer.attention.linear[1], np.concatenate([_in(c["key"]), _in(c["value"])]))
    linear(layer.attention.linear[2], _out(c["out"]))
    norm(layer.attention.layer_norm, d["cross_attention_block"]["norm"])
    ffn(layer.ffn, d["ffn_block"], d["ffn"])
  if cfg.pre_ln:
    norm(encoder.layer_norm, p["encoder"]["final_norm"])
    norm(decoder.layer_norm, p["decoder"]["final_norm"])
  tokens = pieces(tok)
  spec.register_source_vocabulary(tokens)
  spec.register_target_vocabulary(tokens)
  c = spec.config
  c.layer_norm_epsilon = float(cfg.layer_norm_epsilon)
  c.unk_token, c.eos_token = tokens[tok.unk_id], tokens[tok.eos_id]
  c.bos_token = tokens[tok.pad_id]  # no bos in our vocabulary; never added (add_source_bos)
  c.decoder_start_token = tokens[tok.pad_id]  # our start symbol: id 0, a trained embedding
  c.add_source_eos = True  # our sources end with EOS
  spec.validate()
  return spec


def pieces(tok) -> list[str]:
  """The vocabulary's pieces in id order."""
  return [tok.id_to_piece(i) for i in range(tok.vocab_size)]


def write_ctranslate2(config, cfg, p, tok, folder: str, quantization: str) -> None:
  spec = ctranslate2_spec(config, cfg, p, tok)
  spec.optimize(quantization=quantization)  # aliases the tied tables, quantizes
  spec.register_file(_spm_file(folder, tok), "spm.model")
  spec.save(folder)


def _spm_file(folder: str, tok) -> str:
  """The SentencePiece model written beside `folder` (for register_file, which copies it)."""
  path = os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.spm")
  with open(path, "wb") as f:
    f.write(tok.model_proto)
  return path


# ------------------------------------------------------------------------------ MarianMT


def marian_permutation(d_model: int):
  """perm such that ours[..., perm] is Marian's layout: our interleaved (sin, cos) pairs at
  2i, 2i+1 become Marian's [sin_0..sin_{D/2-1} | cos_0..cos_{D/2-1}]."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def marian_tensors(cfg, p) -> dict:
  """MarianMTModel's state dict (names as its modules, torch (out, in) matrices) of these
  parameters, every d_model axis permuted (marian_permutation); positions and tied copies are
  left out, as Marian's own save_pretrained leaves them."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  perm = marian_permutation(cfg.d_model)
  src, tgt, out = _embeddings(cfg, p)
  t = {}
  if cfg.tie_embeddings:
    t["model.shared.weight"] = src[:, perm]
  else:
    t["model.encoder.embed_tokens.weight"] = src[:, perm]
    t["model.decoder.embed_tokens.weight"] = tgt[:, perm]
    t["lm_head.weight"] = out[:, perm]
  t["final_logits_bias"] = np.zeros((1, cfg.vocab_size), np.float32)

  def attention(prefix, a):
    for name, hf in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
      w = a[name][perm]  # the input (d_model) axis
      t[f"{prefix}.{hf}.weight"] = _in(w)
      t[f"{prefix}.{hf}.bias"] = np.zeros(w.shape[1] * w.shape[2], np.float32)
    t[f"{prefix}.out_proj.weight"] = _out(a["out"][..., perm])
    t[f"{prefix}.out_proj.bias"] = np.zeros(cfg.d_model, np.float32)

  def norm(name, block):
    t[f"{name}.weight"], t[f"{name}.bias"] = block["norm"]["scale"][perm], block["norm"]["bias"][perm]

  def ffn(prefix, f):
    t[f"{prefix}.fc1.weight"] = f["wi"]["kernel"][perm].T
    t[f"{prefix}.fc1.bias"] = f["wi"]["bias"]
    t[f"{prefix}.fc2.weight"] = f["wo"]["kernel"][:, perm].T
    t[f"{prefix}.fc2.bias"] = f["wo"]["bias"][perm]

  for i in range(cfg.num_encoder_layers):
    e, pre = p["encoder"][f"layer_{i}"], f"model.encoder.layers.{i}"
    attention(f"{pre}.self_attn", e["self_attention"])
    norm(f"{pre}.self_attn_layer_norm", e["attention_block"])
    ffn(pre, e["ffn"])
    norm(f"{pre}.final_layer_norm", e["ffn_block"])
  for i in range(cfg.num_decoder_layers):
    d, pre = p["decoder"][f"layer_{i}"], f"model.decoder.layers.{i}"
    attention(f"{pre}.self_attn", d["self_attention"])
    norm(f"{pre}.self_attn_layer_norm", d["self_attention_block"])
    attention(f"{pre}.encoder_attn", d["cross_attention"])
    norm(f"{pre}.encoder_attn_layer_norm", d["cross_attention_block"])
    ffn(pre, d["ffn"])
    norm(f"{pre}.final_layer_norm", d["ffn_block"])
  return {k: np.ascontiguousarray(v, np.float32) for k, v in t.items()}


def marian_config(config, cfg) -> dict:
  """config.json's fields: a MarianConfig for this model (post-LN, static sinusoids, ReLU,
  sqrt(d_model)-scaled embeddings, our special ids; decoding starts from id 0 as ours)."""
  return dict(
      architectures=["MarianMTModel"], model_type="marian", vocab_size=cfg.vocab_size,
      decoder_vocab_size=cfg.vocab_size, d_model=cfg.d_model,
      encoder_layers=cfg.num_encoder_layers, decoder_layers=cfg.num_decoder_layers,
      encoder_attention_heads=cfg.num_heads, decoder_attention_heads=cfg.num_heads,
      encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function="relu",
      dropout=cfg.dropout_rate, attention_dropout=cfg.attention_dropout_rate,
      activation_dropout=cfg.relu_dropout_rate, max_position_embeddings=position_rows(config),
      scale_embedding=True, static_position_embeddings=True, normalize_before=False,
      normalize_embedding=False, add_bias_logits=False,
      share_encoder_decoder_embeddings=cfg.tie_embeddings, tie_word_embeddings=cfg.tie_embeddings,
      is_encoder_decoder=True, pad_token_id=PAD_ID, eos_token_id=EOS_ID,
      decoder_start_token_id=PAD_ID, forced_eos_token_id=EOS_ID)


def generation_config(config) -> dict:
  """generation_config.json: our search's settings where MarianMT has them (the output limit is
  one number for a batch there, ours is per sentence; the length penalty formulas differ)."""
  d = config.decode
  return dict(decoder_start_token_id=PAD_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
              forced_eos_token_id=EOS_ID, bad_words_ids=[[PAD_ID]], num_beams=d.beam_size,
              max_length=config.data.max_source_len + d.max_extra_len + 1)


def write_hf(config, cfg, p, tok, folder: str) -> None:
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  save_file(marian_tensors(cfg, p), os.path.join(folder, "model.safetensors"),
            metadata={"format": "pt"})
  _write_json(os.path.join(folder, "config.json"), marian_config(config, cfg))
  _write_json(os.path.join(folder, "generation_config.json"), generation_config(config))
  for name in ("source.spm", "target.spm"):
    with open(os.path.join(folder, name), "wb") as f:
      f.write(tok.model_proto)
  tokens = pieces(tok)
  _write_json(os.path.join(folder, "vocab.json"), {piece: i for i, piece in enumerate(tokens)})
  _write_json(os.path.join(folder, "tokenizer_config.json"), dict(
      tokenizer_class="MarianTokenizer", model_max_length=config.data.max_source_len,
      unk_token=tokens[tok.unk_id], eos_token=tokens[tok.eos_id], pad_token=tokens[tok.pad_id],
      separate_vocabs=False))


def _write_json(path: str, obj) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=1, ensure_ascii=False)
    f.write("\n")


# ------------------------------------------------------------------------------ the command


def export(workdir: str, target: str, out: str, *, quantization: str = "float32",
           step: int | None = None, average: int = 0) -> dict:
  """Writes `out` whole (a temporary folder beside it, renamed at the end); returns what was
  exported: step, seconds, bytes."""
  check_out(out)
  if target not in FORMATS:
    raise ConfigError(f"--format={target}: expected one of {', '.join(FORMATS)}")
  if target == "hf" and quantization != "float32":
    raise ConfigError(f"--quantization={quantization} is CTranslate2's; the MarianMT folder is "
                      "float32")
  from transformer_jax.inference import trained  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  # The checks of the stored config come before its parameters are read.
  check_exportable(trained.open_workdir(workdir, step=step).config, target)
  loaded = trained.load(workdir, average=average, step=step)
  check_exportable(loaded.config, target)
  cfg, p = _numpy_params(loaded)
  out = os.path.abspath(out)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=os.path.dirname(out))
  try:
    if target == "ctranslate2":
      write_ctranslate2(loaded.config, cfg, p, loaded.tokenizer, tmp, quantization)
    else:
      write_hf(loaded.config, cfg, p, loaded.tokenizer, tmp)
    _readable(tmp)
    if os.path.isdir(out):
      os.rmdir(out)  # empty (check_out)
    os.rename(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  finally:
    spm = os.path.join(os.path.dirname(tmp), f".{os.path.basename(tmp)}.spm")
    if os.path.exists(spm):
      os.remove(spm)
  size = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
  return dict(step=loaded.step, seconds=time.perf_counter() - start, bytes=size,
              format=target, quantization=quantization if target == "ctranslate2" else "float32")


def _readable(folder: str) -> None:
  """The umask's modes on `folder` and its files (mkdtemp and safetensors make them private)."""
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(folder, 0o777 & ~umask)
  for name in os.listdir(folder):
    os.chmod(os.path.join(folder, name), 0o666 & ~umask)


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS.workdir:
    raise ConfigError("--workdir is required: the trained workdir to export")
  if not FLAGS.format:
    raise ConfigError(f"--format is required: one of {', '.join(FORMATS)}")
  done = export(FLAGS.workdir, FLAGS.format, FLAGS.out, quantization=FLAGS.quantization,
                step=FLAGS.step, average=FLAGS.average)
  what = "CTranslate2 " + done["quantization"] if done["format"] == "ctranslate2" else "MarianMT"
  print(f"{FLAGS.workdir} (step {done['step']}) -> {FLAGS.out}: {what}, "
        f"{done['bytes'] / 1e6:.1f} MB in {done['seconds']:.1f} s")


if __name__ == "__main__":
  cli.run(main, flag_values=FLAGS, overrides=False)
