"""The Transformer (paper §3, Figure 1): encoder and decoder stacks and the full model.

Batches use token id 0 for padding. The decoder reads the targets shifted right by one, with 0
as the start symbol (as tensor2tensor); in packed rows the shift restarts at every segment.

`Transformer.encode`, `Transformer.decode` and `Transformer.__call__` are the entry points;
with `incremental=True` the decoder runs one position per call over a KV cache (see attention.py
and beam_search.py).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.model import masks
from transformer_jax.model.embedding import Embedding
from transformer_jax.model.layers import DecoderLayer, EncoderLayer, layer_norm
from transformer_jax.model.positional import PositionalEncoding, WordPositions, word_counts
from transformer_jax.model.word_pointer import WordPointer
from transformer_jax.runtime.config import ModelConfig


def shift_right(targets_BxT: jnp.ndarray, segments_BxT: jnp.ndarray | None = None) -> jnp.ndarray:
  """Decoder inputs: targets shifted right with 0 in front (of each segment when packed)."""
  shifted_BxT = jnp.pad(targets_BxT, ((0, 0), (1, 0)))[:, :-1]
  if segments_BxT is not None:
    prev_BxT = jnp.pad(segments_BxT, ((0, 0), (1, 0)))[:, :-1]
    shifted_BxT = jnp.where(segments_BxT == prev_BxT, shifted_BxT, 0)
  return shifted_BxT


class _Scanned(nn.Module):
  """One layer as a scan body: the carry is the activations, everything else is broadcast."""

  layer: Any
  config: ModelConfig
  kwargs: dict

  @nn.compact
  def __call__(self, x, *args):
    return self.layer(self.config, **self.kwargs, name="layer")(x, *args), None


def _stack(cls, cfg: ModelConfig, num_layers: int, deterministic_argnum: int,
           decoding: bool = False, **kwargs):
  """The N layers of a stack as one callable `(x, *args) -> x`.

  `model.remat='layer'`: each layer in nn.remat (training and scoring only: incremental decoding
  keeps no activations for a backward pass). `model.scan_layers`: one nn.scan over a layer
  whose parameters (and decode cache) are stacked along a leading 'layers' axis, so XLA
  compiles one layer instead of N; unrolled, the layers are separate modules `layer_{i}`.
  The two store parameters differently, so a checkpoint belongs to one of them.
  """
  layer = cls
  if cfg.remat == "layer" and not decoding:
    layer = nn.remat(cls, static_argnums=(deterministic_argnum,))  # argnum 0 is the module
  if not cfg.scan_layers:
    layers = [layer(cfg, **kwargs, name=f"layer_{i}") for i in range(num_layers)]

    def unrolled(x, *args):
      for l in layers:
        x = l(x, *args)
      return x
    return unrolled
  scanned = nn.scan(_Scanned, variable_axes={"params": 0, "cache": 0, "intermediates": 0},
                    split_rngs={"params": True, "dropout": True}, in_axes=nn.broadcast,
                    length=num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
  stack = scanned(layer, cfg, kwargs, name="layers")
  return lambda x, *args: stack(x, *args)[0]


def unstack_layers(model_cfg: ModelConfig, params) -> tuple[ModelConfig, Any]:
  """A `scan_layers` model's (config, parameters) as the unrolled model's: the stacked 'layers'
  of each stack become `layer_0..layer_{N-1}` (the identity for an unrolled model). Decoding
  uses it, so its cache and beam reordering keep one layout."""
  if not model_cfg.scan_layers:
    return model_cfg, params
  out = dict(params)
  for stack, n in (("encoder", model_cfg.num_encoder_layers), ("decoder", model_cfg.num_decoder_layers)):
    tree = dict(params[stack])
    stacked = tree.pop("layers")["layer"]
    tree.update({f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n)})
    out[stack] = tree
  return model_cfg.replace(scan_layers=False), out


def _positions(tokens_BxL, positions_BxL):
  if positions_BxL is not None:
    return positions_BxL
  return jnp.broadcast_to(jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32), tokens_BxL.shape)


class Encoder(nn.Module):
  """Embedding + PE (+ word positions) + dropout, then N encoder layers (+ final LayerNorm when
  pre-LN)."""

  config: ModelConfig
  embedding: Embedding
  word_positions: WordPositions | None = None

  @nn.compact
  def __call__(self, inputs_BxS, positions_BxS=None, segments_BxS=None, deterministic=True):
    cfg = self.config
    x_BxSxD = self.embedding.embed(inputs_BxS)
    x_BxSxD = x_BxSxD + PositionalEncoding(cfg, name="positional")(_positions(inputs_BxS, positions_BxS))
    if self.word_positions is not None:  # each token's word: the words before it
      words_BxS = word_counts(inputs_BxS, cfg.word_starts, cfg.vocab_size, segments_BxS) - 1
      x_BxSxD = x_BxSxD + self.word_positions(jnp.maximum(words_BxS, 0))
    x_BxSxD = nn.Dropout(cfg.dropout_rate)(x_BxSxD, deterministic=deterministic)
    x_BxSxD = nn.with_logical_constraint(x_BxSxD, ("batch", "length", "embed"))
    mask = masks.encoder_self_mask(inputs_BxS, segments_BxS)
    x_BxSxD = _stack(EncoderLayer, cfg, cfg.num_encoder_layers, 3)(x_BxSxD, mask, deterministic)
    if cfg.pre_ln:
      x_BxSxD = layer_norm(cfg, "final_norm")(x_BxSxD)
    return x_BxSxD


class Decoder(nn.Module):
  """Embedding + PE (+ word positions, + the word pointer) + dropout, N decoder layers (+ final
  LayerNorm), pre-softmax projection."""

  config: ModelConfig
  embedding: Embedding
  output_embedding: Embedding | None = None  # untied pre-softmax projection
  incremental: bool = False
  max_decode_len: int = 0
  beam_size: int = 1  # decoding: rows are sentences x beams (attention.py reads caches by beam)
  word_positions: WordPositions | None = None
  word_pointer: WordPointer | None = None

  @nn.compact
  def __call__(self, decoder_inputs_BxT, encoded_BxSxD, self_mask, cross_mask,
               positions_BxT=None, deterministic=True, project=True, segments_BxT=None,
               inputs_BxS=None, inputs_segments_BxS=None):
    """`inputs_BxS` (and their segments when packed): the source, which the word pointer reads."""
    cfg = self.config
    y_BxTxD = self.embedding.embed(decoder_inputs_BxT)
    y_BxTxD = y_BxTxD + PositionalEncoding(cfg, length=self.max_decode_len, name="positional")(
        _positions(decoder_inputs_BxT, positions_BxT))
    if self.word_positions is not None or self.word_pointer is not None:
      next_word_BxT = self._words_written(decoder_inputs_BxT, segments_BxT)  # the next word's index
      if self.word_positions is not None:
        y_BxTxD = y_BxTxD + self.word_positions(next_word_BxT)
      if self.word_pointer is not None:
        y_BxTxD = y_BxTxD + self.word_pointer(next_word_BxT, encoded_BxSxD, inputs_BxS,
                                              inputs_segments_BxS, segments_BxT)
    y_BxTxD = nn.Dropout(cfg.dropout_rate)(y_BxTxD, deterministic=deterministic)
    y_BxTxD = nn.with_logical_constraint(y_BxTxD, ("batch", "length", "embed"))
    y_BxTxD = _stack(DecoderLayer, cfg, cfg.num_decoder_layers, 5, self.incremental,
                     incremental=self.incremental, max_decode_len=self.max_decode_len,
                     beam_size=self.beam_size)(
                         y_BxTxD, encoded_BxSxD, self_mask, cross_mask, deterministic)
    if cfg.pre_ln:
      y_BxTxD = layer_norm(cfg, "final_norm")(y_BxTxD)
    if not project:  # the caller applies the pre-softmax projection (a chunked loss)
      return y_BxTxD
    projection = self.output_embedding or self.embedding
    logits_BxTxV = projection.attend(y_BxTxD)
    return nn.with_logical_constraint(logits_BxTxV, ("batch", "length", "vocab"))

  def _words_written(self, decoder_inputs_BxT, segments_BxT):
    """Words among the decoder inputs up to each position; incremental decoding keeps each
    row's count in the cache under `per_beam`, which follows its beam (beam_search.py)."""
    cfg = self.config
    written_BxT = word_counts(decoder_inputs_BxT, cfg.word_starts, cfg.vocab_size,
                              None if self.incremental else segments_BxT)
    if not self.incremental:
      return written_BxT
    count = self.variable("cache", "per_beam", jnp.zeros, (decoder_inputs_BxT.shape[0],),
                          jnp.int32)
    written_BxT = written_BxT + count.value[:, None]
    count.value = written_BxT[:, -1]
    return written_BxT


class Transformer(nn.Module):
  """The encoder-decoder Transformer. Logits are float32 [B, T, vocab_size]."""

  config: ModelConfig
  incremental: bool = False
  max_decode_len: int = 0
  beam_size: int = 1  # decoding: rows are sentences x beams (attention.py reads caches by beam)

  def setup(self):
    cfg = self.config
    if cfg.tie_embeddings:
      self.shared_embedding = Embedding(cfg)
      src, tgt, out = self.shared_embedding, self.shared_embedding, None
    else:
      self.source_embedding = Embedding(cfg)
      self.target_embedding = Embedding(cfg)
      self.output_projection = Embedding(cfg)
      src, tgt, out = self.source_embedding, self.target_embedding, self.output_projection
    words = None
    if cfg.word_positions:
      self.word_positions = WordPositions(cfg)
      words = self.word_positions
    pointer = None
    if cfg.word_pointer:
      self.word_pointer = WordPointer(cfg, incremental=self.incremental)
      pointer = self.word_pointer
    self.encoder = Encoder(cfg, embedding=src, word_positions=words)
    self.decoder = Decoder(cfg, embedding=tgt, output_embedding=out,
                           incremental=self.incremental, max_decode_len=self.max_decode_len,
                           beam_size=self.beam_size, word_positions=words, word_pointer=pointer)

  def encode(self, inputs_BxS, inputs_positions=None, inputs_segmentation=None, deterministic=True):
    return self.encoder(inputs_BxS, inputs_positions, inputs_segmentation, deterministic)

  def decode(self, encoded_BxSxD, inputs_BxS, decoder_inputs_BxT, targets_BxT=None,
             targets_positions=None, inputs_segmentation=None, targets_segmentation=None,
             deterministic=True, project=True):
    """Logits for every decoder position (`project=False`: the final hidden states instead).

    Training/scoring: `decoder_inputs` are the shifted targets and `targets` give the padding.
    Incremental decoding (`incremental=True`): one position per call; the KV cache supplies the
    causal context, so only the source padding is masked here.
    """
    if self.incremental:
      self_mask = None
      cross = masks.Mask(masks.padding_mask(jnp.ones_like(decoder_inputs_BxT), inputs_BxS))
    else:
      if targets_BxT is None:
        targets_BxT = decoder_inputs_BxT
      self_mask = masks.decoder_self_mask(targets_BxT, targets_segmentation)
      cross = masks.cross_mask(targets_BxT, inputs_BxS, targets_segmentation, inputs_segmentation)
    return self.decoder(decoder_inputs_BxT, encoded_BxSxD, self_mask, cross,
                        targets_positions, deterministic, project, targets_segmentation,
                        inputs_BxS, inputs_segmentation)

  def project(self, y_BxTxD):
    """The pre-softmax projection of decoder states: float32 logits [B, T, vocab_size]."""
    embedding = self.shared_embedding if self.config.tie_embeddings else self.output_projection
    return nn.with_logical_constraint(embedding.attend(y_BxTxD), ("batch", "length", "vocab"))

  def __call__(self, inputs_BxS, targets_BxT, inputs_positions=None, targets_positions=None,
               inputs_segmentation=None, targets_segmentation=None, deterministic=True,
               project=True):
    """Teacher-forced logits [B, T, V] for predicting `targets` from `inputs` (`project=False`:
    the decoder's final hidden states [B, T, D], for `Transformer.project`)."""
    encoded_BxSxD = self.encode(inputs_BxS, inputs_positions, inputs_segmentation, deterministic)
    decoder_inputs_BxT = shift_right(targets_BxT, targets_segmentation)
    return self.decode(encoded_BxSxD, inputs_BxS, decoder_inputs_BxT, targets_BxT,
                       targets_positions, inputs_segmentation, targets_segmentation, deterministic,
                       project)
