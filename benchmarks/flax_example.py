"""The flax WMT example's own code for the side-by-sides (flax_wmt.py: the train step;
flax_wmt_decode.py: beam-search decoding): loading its modules unchanged, its config for our
shapes, our trained weights in its parameter tree, and the interleaved timing of both sides.

Their model (examples/wmt/models.py) is pre-LN with a final LayerNorm on each stack, ties the
three embeddings, has no attention biases and ReLU feed-forward layers with biases: exactly our
model with `model.pre_ln=True` and the paper's other defaults. Three differences are absorbed
by the weight conversion (`to_flax_params`), their code and configuration fields used as they are:
- scaling: their embedding is not multiplied by sqrt(d_model) but their logits are divided by it,
  so their table is sqrt(d_model) times ours (the same inputs to the first layer, the same logits);
- positions: their sinusoids use other frequencies (10000^(-i/(d/2-1)), sines then cosines) than
  the paper's, so they are given a position table (`posemb_init`, their learned-embedding
  option) holding ours;
- end of sentence: their decoder stops on id 2 (SentencePiece's default), ours on id 1, so ids 1
  and 2 trade places in their vocabulary (`swap_eos`, applied to their inputs and outputs).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import statistics
import subprocess
import sys
import types

from absl import flags
import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from transformer_jax.model.positional import sinusoidal_table
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.special_ids import EOS_ID

FLAX_EOS_ID = 2  # their decode.EOS_ID


def define_flags(values: flags.FlagValues) -> None:
  """The flag both side-by-sides take: where flax's example is."""
  flags.DEFINE_string("flax_wmt_dir", None,
                      "folder with flax's examples/wmt models.py, train.py, decode.py",
                      flag_values=values)


def _module(name: str, **attributes) -> types.ModuleType:
  module = types.ModuleType(name)
  module.__dict__.update(attributes)
  return module


def load_flax_wmt(folder: str, with_decode: bool = False):
  """Their (models, train) modules.

  What train.py touches at import gets a stand-in while it loads, removed again afterwards:
  their bleu and input_pipeline modules always (they read data through TensorFlow and only the
  evaluation functions use them), and decode.py unless `with_decode` (it needs only jax, so
  the decoding side-by-side loads the real one); TensorFlow, when not installed, as a
  module whose `data.Dataset` exists (train.py's signatures annotate with it); clu, when not
  installed, with the `metric_writers` and `periodic_actions` it imports.
  """
  for name in ("models.py", "train.py"):
    if not os.path.isfile(os.path.join(folder, name)):
      raise ConfigError(f"--flax_wmt_dir={folder}: no {name} (expected flax's examples/wmt)")
  # What train.py imports from flax, first: their optional TensorFlow imports must see the truth.
  for name in ("flax.jax_utils", "flax.training.checkpoints", "flax.training.dynamic_scale"):
    importlib.import_module(name)
  stubbed = ("bleu", "input_pipeline") + (() if with_decode else ("decode",))
  stubs = {name: _module(name) for name in stubbed}
  if importlib.util.find_spec("tensorflow") is None:
    dataset = type("Dataset", (), {"__module__": "tensorflow.data"})
    stubs["tensorflow"] = _module("tensorflow", data=_module("tensorflow.data", Dataset=dataset))
  if importlib.util.find_spec("clu") is None:
    parts = {p: _module(f"clu.{p}") for p in ("metric_writers", "periodic_actions")}
    stubs.update({f"clu.{p}": m for p, m in parts.items()}, clu=_module("clu", **parts))
  added = [name for name in stubs if name not in sys.modules]
  sys.modules.update({name: stubs[name] for name in added})
  sys.path.insert(0, folder)
  try:
    return importlib.import_module("models"), importlib.import_module("train")
  finally:
    sys.path.remove(folder)
    for name in added + (["decode"] if with_decode else []):
      sys.modules.pop(name, None)  # their top-level names must not shadow anything later


def checkout(folder: str) -> dict:
  """Which of their code ran: the folder and its git commit (None outside a git checkout), since
  their example changes between flax versions."""
  try:
    commit = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True,
                            text=True, timeout=30, check=True).stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    commit = None
  return {"folder": folder, "commit": commit}


def code_line(r: dict) -> str:
  """The report line naming the flax code a side-by-side ran."""
  code = r["flax_wmt_code"]
  return f"Flax example: `{code['folder']}` at commit {code['commit'] or 'not recorded (no git)'}."


def check_command_line(argv, values: flags.FlagValues) -> str:
  """--flax_wmt_dir, after the side-by-sides' one-line errors (stray arguments, no folder)."""
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments {' '.join(argv[1:])}")
  if not values.flax_wmt_dir:
    raise ConfigError("--flax_wmt_dir is required (a checkout of flax's examples/wmt)")
  return values.flax_wmt_dir


def flax_config(models, cfg: ModelConfig, max_len: int, dropout: float = 0.0,
                position_table: bool = False):
  """Their TransformerConfig for our model's shapes: float32, one shared embedding, their
  initializers; `dropout` on residuals and attention weights (deterministic when 0);
  `position_table`: positions from a table (to_flax_params fills it) instead of their sinusoids."""
  return models.TransformerConfig(
      vocab_size=cfg.vocab_size, output_vocab_size=cfg.vocab_size, share_embeddings=True,
      logits_via_embedding=True, dtype=jnp.float32, emb_dim=cfg.d_model,
      num_heads=cfg.num_heads, num_layers=cfg.num_encoder_layers,
      qkv_dim=cfg.num_heads * cfg.d_k, mlp_dim=cfg.d_ff, max_len=max_len, dropout_rate=dropout,
      attention_dropout_rate=dropout, deterministic=not dropout, decode=False,
      kernel_init=nn.initializers.xavier_uniform(), bias_init=nn.initializers.normal(stddev=1e-6),
      **({"posemb_init": nn.initializers.zeros} if position_table else {}))


def check_convertible(cfg: ModelConfig, where: str) -> None:
  """One line naming the first config key their model cannot express."""
  problems = [
      (not cfg.pre_ln, "model.pre_ln must be True (their model is pre-LN)"),
      (not cfg.tie_embeddings, "model.tie_embeddings must be True (their logits use the shared "
                               "embedding)"),
      (cfg.num_encoder_layers != cfg.num_decoder_layers,
       "model.num_encoder_layers and num_decoder_layers must be equal (their num_layers)"),
      (cfg.d_k != cfg.d_v, "model.d_k and d_v must be equal (their qkv_dim)"),
      (cfg.pe_type != "sinusoidal", "model.pe_type must be 'sinusoidal'"),
      (cfg.layer_norm_epsilon != 1e-6, "model.layer_norm_epsilon must be 1e-6 (their LayerNorm's)"),
  ]
  for bad, message in problems:
    if bad:
      raise ConfigError(f"{where}: {message}")


def swap_eos(ids: np.ndarray) -> np.ndarray:
  """Our ids <-> theirs: 1 and 2 exchanged (the map is its own inverse)."""
  ids = np.asarray(ids)
  out = ids.copy()
  out[ids == EOS_ID] = FLAX_EOS_ID
  out[ids == FLAX_EOS_ID] = EOS_ID
  return out


def to_flax_params(params: dict, cfg: ModelConfig, max_len: int) -> dict:
  """Their parameter tree holding our (unboxed, unstacked) parameters."""
  check_convertible(cfg, "--workdir")
  table = np.asarray(params["shared_embedding"]["embedding"]) * cfg.d_model**0.5
  table = table[swap_eos(np.arange(cfg.vocab_size))]
  positions = jnp.asarray(sinusoidal_table(max_len, cfg.d_model))[None]

  def block(layer, sublayers):  # sublayers: (our block name, our attention name or None)
    out = {"MlpBlock_0": {"Dense_0": dict(layer["ffn"]["wi"]), "Dense_1": dict(layer["ffn"]["wo"])}}
    for i, (norm, attention) in enumerate(sublayers):
      out[f"LayerNorm_{i}"] = {k: layer[norm]["norm"][k] for k in ("scale", "bias")}
      if attention:
        out[f"MultiHeadDotProductAttention_{i}"] = {
            name: {"kernel": layer[attention][name]} for name in ("query", "key", "value", "out")}
    return out

  def norm(stack):
    return {k: stack["final_norm"][k] for k in ("scale", "bias")}

  enc, dec = params["encoder"], params["decoder"]
  encoder = {"posembed_input": {"pos_embedding": positions}, "encoder_norm": norm(enc)}
  for i in range(cfg.num_encoder_layers):
    encoder[f"encoderblock_{i}"] = block(enc[f"layer_{i}"], [
        ("attention_block", "self_attention"), ("ffn_block", None)])
  decoder = {"posembed_output": {"pos_embedding": positions}, "encoderdecoder_norm": norm(dec)}
  for i in range(cfg.num_decoder_layers):
    decoder[f"encoderdecoderblock_{i}"] = block(dec[f"layer_{i}"], [
        ("self_attention_block", "self_attention"),
        ("cross_attention_block", "cross_attention"), ("ffn_block", None)])
  return {"shared_embedding": {"embedding": jnp.asarray(table)}, "encoder": encoder,
          "decoder": decoder}


def speedup(flax_s, ours_s) -> dict:
  """Flax's median time over ours, and that ratio within each round of interleaved timing."""
  return {"speedup": statistics.median(flax_s) / statistics.median(ours_s),
          "speedup_per_round": [f / o for f, o in zip(flax_s, ours_s)]}


def speedup_cells(e: dict) -> list[str]:
  """The side-by-side tables' last two columns: the speed-up of the medians, its range per round."""
  return [f"**{e['speedup']:.2f}x**",
          f"{min(e['speedup_per_round']):.2f}-{max(e['speedup_per_round']):.2f}x"]


ROUNDS_NOTE = ("timed in rounds of one {0} of each side in turn, so that a drift of the machine's "
               "speed hits both alike; 'per round' is the range of flax's {0} time over ours "
               "within a round.")
