"""Our trained weights in the flax WMT example's model, so that both decoders search the same
function (benchmarks/flax_wmt_decode.py --workdir=...).

Their model (examples/wmt/models.py) is pre-LN with a final LayerNorm on each stack, ties the
three embeddings, has no attention biases and ReLU feed-forward layers with biases: exactly our
model with `model.pre_ln=True` and the paper's other defaults. Three differences are absorbed
by the conversion, their code and configuration fields used as they are:
- scaling: their embedding is not multiplied by sqrt(d_model) but their logits are divided by it,
  so their table is sqrt(d_model) times ours (the same inputs to the first layer, the same logits);
- positions: their sinusoids use other frequencies (10000^(-i/(d/2-1)), sines then cosines) than
  the paper's, so they are given a position table (`posemb_init`, their learned-embedding
  option) holding ours;
- end of sentence: their decoder stops on id 2 (SentencePiece's default), ours on id 1, so ids 1
  and 2 trade places in their vocabulary (`swap_eos`, applied to their inputs and outputs).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from transformer_jax.config import ConfigError, ModelConfig
from transformer_jax.positional import sinusoidal_table
from transformer_jax.special_ids import EOS_ID

FLAX_EOS_ID = 2  # their decode.EOS_ID


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


def flax_config(models, cfg: ModelConfig, max_len: int, decode: bool = False):
  """Their TransformerConfig for our model's shapes (deterministic: no dropout)."""
  return models.TransformerConfig(
      vocab_size=cfg.vocab_size, output_vocab_size=cfg.vocab_size, share_embeddings=True,
      logits_via_embedding=True, dtype=jnp.float32, emb_dim=cfg.d_model,
      num_heads=cfg.num_heads, num_layers=cfg.num_encoder_layers,
      qkv_dim=cfg.num_heads * cfg.d_k, mlp_dim=cfg.d_ff, max_len=max_len, dropout_rate=0.0,
      attention_dropout_rate=0.0, deterministic=True, decode=decode,
      posemb_init=nn.initializers.zeros)


def swap_eos(ids: np.ndarray) -> np.ndarray:
  """Our ids <-> theirs: 1 and 2 exchanged (the map is its own inverse)."""
  ids = np.asarray(ids)
  out = ids.copy()
  out[ids == EOS_ID] = FLAX_EOS_ID
  out[ids == FLAX_EOS_ID] = EOS_ID
  return out


def _norm(ours: dict) -> dict:
  return {"scale": ours["scale"], "bias": ours["bias"]}


def _attention(ours: dict) -> dict:
  return {name: {"kernel": ours[name]} for name in ("query", "key", "value", "out")}


def _mlp(ours: dict) -> dict:
  return {"Dense_0": dict(ours["wi"]), "Dense_1": dict(ours["wo"])}


def to_flax_params(params: dict, cfg: ModelConfig, max_len: int) -> dict:
  """Their parameter tree holding our (unboxed, unstacked) parameters."""
  check_convertible(cfg, "--workdir")
  table = np.asarray(params["shared_embedding"]["embedding"]) * cfg.d_model**0.5
  table = table[swap_eos(np.arange(cfg.vocab_size))]
  positions = jnp.asarray(sinusoidal_table(max_len, cfg.d_model))[None]
  enc, dec = params["encoder"], params["decoder"]
  encoder = {"posembed_input": {"pos_embedding": positions},
             "encoder_norm": _norm(enc["final_norm"])}
  for i in range(cfg.num_encoder_layers):
    layer = enc[f"layer_{i}"]
    encoder[f"encoderblock_{i}"] = {
        "LayerNorm_0": _norm(layer["attention_block"]["norm"]),
        "MultiHeadDotProductAttention_0": _attention(layer["self_attention"]),
        "LayerNorm_1": _norm(layer["ffn_block"]["norm"]),
        "MlpBlock_0": _mlp(layer["ffn"])}
  decoder = {"posembed_output": {"pos_embedding": positions},
             "encoderdecoder_norm": _norm(dec["final_norm"])}
  for i in range(cfg.num_decoder_layers):
    layer = dec[f"layer_{i}"]
    decoder[f"encoderdecoderblock_{i}"] = {
        "LayerNorm_0": _norm(layer["self_attention_block"]["norm"]),
        "MultiHeadDotProductAttention_0": _attention(layer["self_attention"]),
        "LayerNorm_1": _norm(layer["cross_attention_block"]["norm"]),
        "MultiHeadDotProductAttention_1": _attention(layer["cross_attention"]),
        "LayerNorm_2": _norm(layer["ffn_block"]["norm"]),
        "MlpBlock_0": _mlp(layer["ffn"])}
  return {"shared_embedding": {"embedding": jnp.asarray(table)}, "encoder": encoder,
          "decoder": decoder}
