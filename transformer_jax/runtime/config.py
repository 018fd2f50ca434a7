"""Run configuration schema and the frozen model configuration.

Every run config (``configs/*.py``) starts from :func:`default_config`, the single schema of
all keys with the paper's values as defaults. :func:`validate` checks a finished run config
(unknown keys with the nearest valid one, types, sizes, choices, model dimensions a fixed mesh
axis cannot split evenly) and raises :class:`ConfigError` with one line naming the key, so a user
mistake never reaches jit; what depends on `data.task` is the task's to check (tasks/registry.py).
:class:`ModelConfig` is the one frozen dataclass the model modules read. Config files and
`--config.KEY=VALUE` overrides are read by transformer_jax/runtime/overrides.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from typing import Any, Mapping

import ml_collections

from transformer_jax.runtime.exceptions import ConfigError

PE_TYPES = ("sinusoidal", "learned")
ATTENTION_IMPLS = ("einsum", "dot_product_attention", "cudnn")
REMAT_POLICIES = ("none", "layer")
DTYPES = ("float32", "bfloat16", "float16")
VOCAB_TYPES = ("bpe", "unigram")
BATCH_MODES = ("bucket", "pack")
RNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
DATA_DIR_ENV = "TRANSFORMER_JAX_DATA_DIR"
MAX_SEED = 2**31 - 1  # seeds numpy, grain and jax.random alike
# Model dimensions split over a mesh axis, as transformer_jax/model/sharding.py's LOGICAL_RULES place
# them: 'heads', 'mlp' and 'vocab' over 'tensor', 'embed' over 'fsdp'. d_k and d_v ('kv') and
# max_len ('pos') are never split; batch rows ('batch') are padded at run time.
SHARDED_DIMS = (("tensor", "tensor-parallel", ("num_heads", "d_ff", "vocab_size")),
                ("fsdp", "FSDP", ("d_model",)))


def default_config() -> ml_collections.ConfigDict:
  """All keys a run config may set, with the paper's base model (Table 3 row 'base')."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.model = ml_collections.ConfigDict()
  m = c.model
  m.vocab_size = 37000            # shared source/target SentencePiece vocabulary
  m.d_model = 512
  m.num_heads = 8
  m.d_k = 64                      # per-head query/key size (independent of d_model/h)
  m.d_v = 64                      # per-head value size
  m.d_ff = 2048
  m.num_encoder_layers = 6
  m.num_decoder_layers = 6
  m.dropout_rate = 0.1            # P_drop: residual dropout and embedding+PE dropout
  m.attention_dropout_rate = 0.0  # deviation (tensor2tensor later used 0.1)
  m.relu_dropout_rate = 0.0       # deviation (tensor2tensor later used 0.1)
  m.pre_ln = False                # paper: post-LN, LayerNorm(x + Dropout(Sublayer(x)))
  m.tie_embeddings = True         # paper: one matrix for source, target and pre-softmax
  m.pe_type = "sinusoidal"        # 'sinusoidal' (paper) or 'learned' (Table 3 row E)
  m.max_len = 256                 # longest sequence the positional encoding covers
  m.layer_norm_epsilon = 1e-6
  m.dtype = "float32"             # compute dtype; parameters stay float32. 'bfloat16': bf16
                                  # matmul operands, f32 accumulation/softmax/LayerNorm/loss
  m.attention_impl = "einsum"     # 'einsum' | 'dot_product_attention' (XLA's) | 'cudnn' (GPU, bucketed batches)
  m.remat = "none"                # 'layer': recompute each layer's activations in the backward
                                  # pass (less memory, ~1/3 more compute); same results
  m.scan_layers = False           # nn.scan over each stack: one layer compiled instead of N
                                  # (parameters stacked on a 'layers' axis; same results)
  m.word_positions = False        # deviation: a learned embedding of each token's word index,
                                  # shared by both sides (model/positional.py); for a target that
                                  # writes the source's words in order (a parser's leaves)
  m.word_pointer = False          # deviation: the encoder's output at the next word the decoder
                                  # writes, added to its input (model/word_pointer.py); for the
                                  # same targets as word_positions
  m.word_starts = []              # the vocabulary ids that begin a word, for word_positions and
                                  # word_pointer: training fills them from the vocabulary
                                  # (Task.word_starts)

  c.data = ml_collections.ConfigDict()
  d = c.data
  d.data_dir = os.environ.get(DATA_DIR_ENV, "../shared/data")
  d.task = "translation"          # a name in tasks/registry.py, which checks it; 'parsing': .mrg
                                  # treebank files in local_corpus, words -> linearized trees
  d.parse_leaves = "xx"           # parsing targets write each word as 'xx': the placeholder XX
                                  # (Vinyals et al. 2015), or 'words': the word itself
  d.parse_substitute = 0          # deviation: this many copies of each training tree, one phrase
                                  # swapped for one of the same label (parsing/substitution.py)
  d.dataset = "wmt14_translate/de-en"  # a TFDS name, or 'local' for aligned text files
  d.local_corpus = ""             # for 'local': a folder under data_dir, e.g. 'multi30k'
  d.train_files = "train"         # file stem of the training split (X.en.gz / X.de.gz); for
                                  # parsing, .mrg files: 'wsj_0200-wsj_2199', a stem or a glob
  d.eval_files = "val"            # stem of the dev split
  d.test_files = "test"           # stem of the test split
  d.extra_train_files = ""        # for 'local': more training pairs, 'folder/stem,...' under
                                  # data_dir (e.g. 'wmt-news/train'), after the corpus's own
  d.upsample_primary = 1          # with extra_train_files: each pair of the corpus's own training
                                  # files this many times an epoch (fairseq's --upsample-primary)
  d.eval_data_dir = ""            # dev/test files from another folder (e.g. 'wmt14')
  d.source_lang = "en"
  d.target_lang = "de"
  d.tfds_data_dir = ""            # where TFDS keeps prepared ArrayRecord files
  d.vocab_type = "bpe"            # 'bpe' or 'unigram'
  d.bpe_dropout = 0.0             # >0: BPE-dropout (not in the paper): training pairs
                                  # re-segmented each epoch in memory (small corpora)
  d.bpe_dropout_target = True     # False: BPE-dropout on the source side only
  d.vocab_train_sentences = 2_000_000
  d.html_unescape = False
  d.skip_bad_utf8 = False
  d.max_source_len = 256
  d.max_target_len = 256
  d.tokens_per_batch = 25000      # source tokens and target tokens per (global) batch
  d.batch_mode = "bucket"         # 'bucket' (length buckets) or 'pack' (segments per row)
  d.num_buckets = 8               # bucket mode: padded lengths, so at most this many step shapes
  d.eval_batch_size = 64
  d.num_workers = 0               # grain worker processes (0: in-process threads)

  c.train = ml_collections.ConfigDict()
  t = c.train
  t.num_steps = 100_000
  t.learning_rate_scale = 1.0     # lrate = scale * d_model^-0.5 * min(s^-0.5, s*w^-1.5)
  t.warmup_steps = 4000
  t.cooldown_steps = 0            # >0: the last this-many steps decay the rate linearly to 0
                                  # (schedule.py; paper: none, checkpoint averaging instead)
  t.adam_b1 = 0.9
  t.adam_b2 = 0.98
  t.adam_eps = 1e-9
  t.weight_decay = 0.0             # AdamW (paper: none); biases and LayerNorm scales never decayed
  t.label_smoothing = 0.1
  t.grad_clip_norm = 0.0          # 0 disables clipping (paper: none)
  t.grad_accum_steps = 1
  t.log_every_steps = 100
  t.eval_every_steps = 1000
  t.eval_bleu_sentences = 0       # dev BLEU on this many sentences at each eval (0: off)
  t.max_eval_batches = 0          # 0: the whole dev split
  t.checkpoint_every_steps = 1000
  t.checkpoint_every_minutes = 0.0
  t.keep_checkpoints = 5          # kept for averaging (paper: last 5 for base, 20 for big)
  t.keep_every_steps = 0          # checkpoints at multiples of this are kept too (0: none)
  t.max_train_minutes = 0.0       # stop (with a checkpoint) after this training wall time,
                                  # counted across resumes; 0: off
  t.divergence_warn_factor = 4.0  # warn (once) when a step's loss exceeds this multiple of the
                                  # lowest loss so far; 0: off. Non-finite losses always stop.
  t.peak_flops = 0.0              # device peak FLOP/s for MFU; 0: measure with a jnp.dot
  t.loss_chunk_positions = 0      # >0: the loss projects and scores this many target positions
                                  # at a time (no [B, T, vocab] logits in memory; same loss)
  t.profile_steps = 0             # trace this many train steps into WORKDIR/profile (0: off)
  t.profile_after_steps = 10      # ... starting this many steps after the run (re)starts
  t.progress_bar = True
  t.dropout_rng_impl = "threefry2x32"  # dropout PRNG; threefry gives the same masks on any
                                  # mesh; 'rbg' bits depend on the sharding, and on the CPU it is
                                  # slower than unrolled threefry (both reproducible from (seed, step))
  t.unroll_threefry_on_cpu = True  # same bits, ~6x cheaper dropout masks on CPU (rng.py)

  c.decode = ml_collections.ConfigDict()
  dc = c.decode
  dc.beam_size = 4
  dc.alpha = 0.6                  # length penalty ((5+|Y|)/6)^alpha
  dc.max_extra_len = 50           # output limit: input length + 50
  dc.batch_size = 32
  dc.average_checkpoints = 0      # eval: average the last k checkpoints first (0: off)
  dc.drop_finished = True         # done sentences leave the batch (halved as they finish), so
                                  # they stop costing; the same outputs (decode.dropping_decode)
  dc.parse_constraint = False     # parsing: the search emits only trees over the source's words
                                  # (tree_constraint.py; a deviation: the paper decodes freely)
  dc.parse_max_opens_in_a_row = 8  # constrained search: opening brackets between two leaves
  dc.parse_max_unary_chain = 4    # and phrases in a unary chain (one span); training warns
                                  # where its trees need more (tree_constraint.search_limits)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1                # -1: all devices not used by the other axes
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  return c


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The model's hyperparameters: the only thing the Flax modules read."""

  vocab_size: int = 37000
  d_model: int = 512
  num_heads: int = 8
  d_k: int = 64
  d_v: int = 64
  d_ff: int = 2048
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  relu_dropout_rate: float = 0.0
  pre_ln: bool = False
  tie_embeddings: bool = True
  pe_type: str = "sinusoidal"
  max_len: int = 256
  layer_norm_epsilon: float = 1e-6
  dtype: str = "float32"
  attention_impl: str = "einsum"
  remat: str = "none"
  scan_layers: bool = False
  word_positions: bool = False
  word_pointer: bool = False
  word_starts: tuple[int, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "word_starts", tuple(self.word_starts))  # hashable: a jit static
    _check_model(self)

  @property
  def counts_words(self) -> bool:
    """Whether the model reads which ids begin a word (`word_starts`)."""
    return self.word_positions or self.word_pointer

  @classmethod
  def from_config(cls, model_cfg: ml_collections.ConfigDict | dict) -> "ModelConfig":
    d = dict(model_cfg.to_dict() if hasattr(model_cfg, "to_dict") else model_cfg)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in d:
      if key not in names:
        raise ConfigError(f"unknown config key 'model.{key}'{_suggest(key, names)}")
    return cls(**d)

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)


def did_you_mean(key: str, valid) -> str:
  """' (did you mean 'x'?)' for the closest of `valid`, or ''."""
  close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
  return f" (did you mean '{close[0]}'?)" if close else ""


_suggest = did_you_mean


def _positive(prefix: str, name: str, value: Any, allow_zero: bool = False):
  if isinstance(value, bool) or not isinstance(value, int):
    raise ConfigError(f"config key '{prefix}{name}' must be an integer, got {value!r}")
  if value < 0 or (value == 0 and not allow_zero):
    raise ConfigError(f"config key '{prefix}{name}' must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _rate(prefix: str, name: str, value: Any):
  if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
    raise ConfigError(f"config key '{prefix}{name}' must be a rate in [0, 1), got {value!r}")


def _choice(prefix: str, name: str, value: Any, choices):
  if value not in choices:
    raise ConfigError(f"config key '{prefix}{name}' is {value!r}; expected one of {', '.join(choices)}")


def _check_model(m: ModelConfig, prefix: str = "model."):
  for name in ("vocab_size", "d_model", "num_heads", "d_k", "d_v", "d_ff",
               "num_encoder_layers", "num_decoder_layers", "max_len"):
    _positive(prefix, name, getattr(m, name))
  for name in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"):
    _rate(prefix, name, getattr(m, name))
  _choice(prefix, "pe_type", m.pe_type, PE_TYPES)
  _choice(prefix, "attention_impl", m.attention_impl, ATTENTION_IMPLS)
  _choice(prefix, "dtype", m.dtype, DTYPES)
  _choice(prefix, "remat", m.remat, REMAT_POLICIES)
  if m.word_starts and not 0 <= min(m.word_starts) <= max(m.word_starts) < m.vocab_size:
    raise ConfigError(f"config key '{prefix}word_starts' holds ids outside the vocabulary of "
                      f"{m.vocab_size}; it is filled from the run's vocabulary by training")
  if m.pe_type == "sinusoidal" and m.d_model % 2:
    raise ConfigError(f"config key '{prefix}d_model' must be even for sinusoidal positions, got {m.d_model}")
  if m.attention_impl in ("dot_product_attention", "cudnn"):
    if m.d_k != m.d_v:
      raise ConfigError(f"config key '{prefix}attention_impl'='{m.attention_impl}' needs d_k == d_v "
                        f"(got {m.d_k} and {m.d_v}); use 'einsum'")
    if m.attention_dropout_rate:
      raise ConfigError(f"config key '{prefix}attention_impl'='{m.attention_impl}' has no attention "
                        "dropout; set attention_dropout_rate=0 or use 'einsum'")
  if not m.layer_norm_epsilon > 0:
    raise ConfigError(f"config key '{prefix}layer_norm_epsilon' must be > 0")


def _check_keys(cfg, schema, prefix=""):
  for key in cfg.keys():
    if key not in schema:
      raise ConfigError(f"unknown config key '{prefix}{key}'{_suggest(key, schema.keys())}")
    value, ref = cfg[key], schema[key]
    if isinstance(ref, ml_collections.ConfigDict):
      if not isinstance(value, (ml_collections.ConfigDict, dict)):
        raise ConfigError(f"config key '{prefix}{key}' must be a section, got {value!r}")
      _check_keys(value, ref, f"{prefix}{key}.")
    elif ref is not None and value is not None:
      ok = isinstance(value, type(ref)) or (isinstance(ref, float) and isinstance(value, int))
      if isinstance(ref, (int, float)) and isinstance(value, bool):
        ok = isinstance(ref, bool)
      if not ok:
        raise ConfigError(f"config key '{prefix}{key}' must be {type(ref).__name__}, got {value!r}")
      if isinstance(value, float) and not math.isfinite(value):  # nan, inf: no key means them
        raise ConfigError(f"config key '{prefix}{key}' must be a finite number, got {value!r}")


def with_defaults(saved: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """A config saved by an older version, with the keys added since at their defaults (the
  behaviour the code had before they existed); the saved values win. Unknown keys stay, for
  validate() to name."""
  merged = default_config().to_dict()

  def merge(into: dict, values: Mapping[str, Any]):
    for key, value in values.items():
      if isinstance(value, Mapping) and isinstance(into.get(key), dict):
        merge(into[key], value)
      else:
        into[key] = value
  merge(merged, saved)
  return ml_collections.ConfigDict(merged)


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks a run config against the schema; raises ConfigError naming the first bad key."""
  _check_keys(config, default_config())
  if not 0 <= config.seed <= MAX_SEED:
    raise ConfigError(f"config key 'seed' must be in [0, {MAX_SEED}], got {config.seed}")
  model = ModelConfig.from_config(config.model)  # runs the model checks
  d, t, dc = config.data, config.train, config.decode
  _choice("data.", "vocab_type", d.vocab_type, VOCAB_TYPES)
  _choice("data.", "batch_mode", d.batch_mode, BATCH_MODES)
  _rate("data.", "bpe_dropout", d.bpe_dropout)
  if d.bpe_dropout and d.vocab_type != "bpe":
    raise ConfigError(f"config key 'data.bpe_dropout'={d.bpe_dropout} needs data.vocab_type='bpe', "
                      f"not {d.vocab_type!r}")
  if d.extra_train_files and d.dataset != "local":
    raise ConfigError(f"config key 'data.extra_train_files' needs data.dataset='local', not "
                      f"{d.dataset!r}")
  if d.upsample_primary != 1 and not d.extra_train_files:
    raise ConfigError(f"config key 'data.upsample_primary'={d.upsample_primary} weighs the corpus "
                      "against data.extra_train_files, which is empty")
  if d.upsample_primary != 1 and d.bpe_dropout:
    raise ConfigError(f"config key 'data.upsample_primary'={d.upsample_primary} does not work with "
                      "data.bpe_dropout (each epoch is then planned afresh from the whole split)")
  for name in ("max_source_len", "max_target_len", "tokens_per_batch", "eval_batch_size",
               "num_buckets", "upsample_primary"):
    _positive("data.", name, d[name])
  for name in ("max_source_len", "max_target_len"):
    if d[name] > model.max_len:
      raise ConfigError(f"config key 'data.{name}'={d[name]} exceeds model.max_len={model.max_len}")
  if d.tokens_per_batch < max(d.max_source_len, d.max_target_len):
    raise ConfigError(f"config key 'data.tokens_per_batch'={d.tokens_per_batch} is smaller than one "
                      f"sequence of max length {max(d.max_source_len, d.max_target_len)}")
  for name in ("num_steps", "warmup_steps", "grad_accum_steps", "log_every_steps",
               "eval_every_steps", "checkpoint_every_steps", "keep_checkpoints"):
    _positive("train.", name, t[name])
  _positive("train.", "keep_every_steps", t.keep_every_steps, allow_zero=True)
  _rate("train.", "label_smoothing", t.label_smoothing)
  _choice("train.", "dropout_rng_impl", t.dropout_rng_impl, RNG_IMPLS)
  for name in ("adam_b1", "adam_b2"):
    _rate("train.", name, t[name])
  if not t.adam_eps > 0:
    raise ConfigError("config key 'train.adam_eps' must be > 0")
  if t.learning_rate_scale <= 0:
    raise ConfigError(f"config key 'train.learning_rate_scale' must be > 0, got {t.learning_rate_scale}")
  _positive("train.", "profile_steps", t.profile_steps, allow_zero=True)
  _positive("train.", "loss_chunk_positions", t.loss_chunk_positions, allow_zero=True)
  _positive("train.", "cooldown_steps", t.cooldown_steps, allow_zero=True)
  if t.cooldown_steps > t.num_steps:
    raise ConfigError(f"config key 'train.cooldown_steps'={t.cooldown_steps} exceeds "
                      f"train.num_steps={t.num_steps}")
  _positive("train.", "profile_after_steps", t.profile_after_steps, allow_zero=True)
  for name in ("grad_clip_norm", "max_train_minutes", "peak_flops", "checkpoint_every_minutes",
               "weight_decay"):
    if t[name] < 0:
      raise ConfigError(f"config key 'train.{name}' must be >= 0, got {t[name]}")
  factor = t.divergence_warn_factor
  if factor != 0 and not factor > 1:
    raise ConfigError(f"config key 'train.divergence_warn_factor' must be 0 (off) or > 1, got {factor}")
  _positive("decode.", "beam_size", dc.beam_size)
  _positive("decode.", "batch_size", dc.batch_size)
  _positive("decode.", "max_extra_len", dc.max_extra_len, allow_zero=True)
  _positive("decode.", "average_checkpoints", dc.average_checkpoints, allow_zero=True)
  if dc.alpha < 0:
    raise ConfigError(f"config key 'decode.alpha' must be >= 0, got {dc.alpha}")
  _positive("decode.", "parse_max_opens_in_a_row", dc.parse_max_opens_in_a_row)
  _positive("decode.", "parse_max_unary_chain", dc.parse_max_unary_chain)
  for name in ("data", "fsdp", "tensor"):
    v = config.mesh[name]
    if not isinstance(v, int) or isinstance(v, bool) or (v < 1 and v != -1):
      raise ConfigError(f"config key 'mesh.{name}' must be a positive integer or -1, got {v!r}")
  if [config.mesh[n] for n in ("data", "fsdp", "tensor")].count(-1) > 1:
    raise ConfigError("config key 'mesh': at most one axis may be -1")
  check_sharded_dims(model, config.mesh)
  return config


def check_sharded_dims(model: ModelConfig, mesh_sizes) -> None:
  """Each model dimension split over a mesh axis (SHARDED_DIMS) must divide by the axis size.

  `mesh_sizes` maps axis names to sizes; an axis of -1 (sized from the device count) is checked
  once the mesh exists (sharding.check_divisibility).
  """
  for axis, what, names in SHARDED_DIMS:
    size = mesh_sizes[axis]
    if size == -1:
      continue
    for name in names:
      value = getattr(model, name)
      if value % size:
        raise ConfigError(f"config key 'model.{name}'={value} is not divisible by the {what} "
                          f"size mesh.{axis}={size}")
