"""The side-by-side with flax's WMT example (benchmarks/flax_wmt.py, flax_example.py): loading
their code without TensorFlow, the interleaved timing, and our trained weights in their parameter
tree."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from benchmarks import flax_example, train_step
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError

from tests.common import REPO


def test_side_by_side_needs_the_flax_example(tmp_path):
  p = subprocess.run([sys.executable, "-m", "benchmarks.flax_wmt", f"--flax_wmt_dir={tmp_path}",
                      "--out="], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert p.returncode == 2, p.stderr
  assert p.stderr.strip() == (f"error: --flax_wmt_dir={tmp_path}: no models.py (expected flax's "
                              "examples/wmt)"), p.stderr


def test_side_by_side_loads_the_flax_example_without_tensorflow(tmp_path):
  """What flax's examples/wmt train.py touches at import: its sibling modules, TensorFlow (a
  `tf.data.Dataset` annotation, evaluated when the function is defined) and clu."""
  (tmp_path / "models.py").write_text("NAME = 'models'\n")
  (tmp_path / "train.py").write_text(textwrap.dedent("""\
      import bleu
      import decode
      import input_pipeline
      import models
      import tensorflow as tf
      from clu import metric_writers, periodic_actions
      from flax.training import checkpoints, dynamic_scale

      def evaluate(*, eval_ds: tf.data.Dataset, num_eval_steps: int):
        return num_eval_steps

      def train_step(state, batch):
        return state
      """))
  script = textwrap.dedent(f"""\
      import sys
      from benchmarks import flax_example
      before = set(sys.modules)
      models, train = flax_example.load_flax_wmt({str(tmp_path)!r})
      print(models.NAME, train.evaluate(eval_ds=None, num_eval_steps=3))
      stubs = {{"bleu", "decode", "input_pipeline", "tensorflow", "clu"}}
      print(sorted(stubs & (set(sys.modules) - before)))
      """)
  p = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                     timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
  assert p.returncode == 0, p.stderr[-2000:]
  lines = p.stdout.splitlines()
  assert lines == ["models 3", "[]"]  # loaded; the stand-ins are gone again
  # for the decoding side-by-side: their real decode.py, not a stand-in
  (tmp_path / "decode.py").write_text("EOS_ID = 2\n")
  script = textwrap.dedent(f"""\
      import sys
      from benchmarks import flax_example
      models, train = flax_example.load_flax_wmt({str(tmp_path)!r}, with_decode=True)
      print(train.decode.EOS_ID, "decode" in sys.modules)
      """)
  p = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                     timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
  assert p.returncode == 0, p.stderr[-2000:]
  assert p.stdout.split() == ["2", "False"]  # loaded, and their name 'decode' is not left behind


def test_side_by_side_interleaves_the_timed_steps():
  """Warm-up steps first, then rounds of one step of each side in turn, each timed alone."""
  calls = []

  def stepper(name, seconds):
    def run():
      calls.append(name)
      return seconds
    return run

  samples = train_step.time_interleaved([stepper("flax", 3.0), stepper("ours", 2.0)],
                                        steps=3, warmup=1)
  assert calls == ["flax", "ours"] + ["flax", "ours"] * 3
  assert samples == [[3.0] * 3, [2.0] * 3]


def _tiny_pre_ln_params(**changes):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from transformer_jax.model.transformer import Transformer  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig(vocab_size=12, d_model=8, num_heads=2, d_k=4, d_v=4, d_ff=16,
                    num_encoder_layers=1, num_decoder_layers=1, max_len=16, pre_ln=True)
  cfg = cfg.replace(**changes)
  dummy = jnp.ones((1, 4), jnp.int32)
  return cfg, nn.meta.unbox(Transformer(cfg).init(jax.random.key(0), dummy, dummy)["params"])


def test_trained_weights_fill_the_flax_examples_parameter_tree():
  """The converted tree has the flax WMT example's names and shapes (as its models.py builds
  them for one layer with share_embeddings and a position table); the side-by-side itself checks
  the function on teacher-forced logits, which needs their code."""
  import jax  # pylint: disable=g-import-not-at-top
  cfg, params = _tiny_pre_ln_params()
  tree = flax_example.to_flax_params(params, cfg, max_len=20)
  shapes = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
  attention = {f"['{n}']['kernel']": s for n, s in
               (("query", (8, 2, 4)), ("key", (8, 2, 4)), ("value", (8, 2, 4)), ("out", (2, 4, 8)))}
  mlp = {"['Dense_0']['kernel']": (8, 16), "['Dense_0']['bias']": (16,),
         "['Dense_1']['kernel']": (16, 8), "['Dense_1']['bias']": (8,)}
  norm = {"['scale']": (8,), "['bias']": (8,)}
  def under(prefix, parts):
    return {prefix + k: v for k, v in parts.items()}
  expected = {"['shared_embedding']['embedding']": (12, 8),
              "['encoder']['posembed_input']['pos_embedding']": (1, 20, 8),
              "['decoder']['posembed_output']['pos_embedding']": (1, 20, 8)}
  expected |= under("['encoder']['encoder_norm']", norm)
  expected |= under("['decoder']['encoderdecoder_norm']", norm)
  block = "['encoder']['encoderblock_0']"
  for i in range(2):
    expected |= under(f"{block}['LayerNorm_{i}']", norm)
  expected |= under(f"{block}['MultiHeadDotProductAttention_0']", attention)
  expected |= under(f"{block}['MlpBlock_0']", mlp)
  block = "['decoder']['encoderdecoderblock_0']"
  for i in range(3):
    expected |= under(f"{block}['LayerNorm_{i}']", norm)
  for i in range(2):
    expected |= under(f"{block}['MultiHeadDotProductAttention_{i}']", attention)
  expected |= under(f"{block}['MlpBlock_0']", mlp)
  assert shapes == expected
  # Their embedding is ours x sqrt(d_model) (their logits divide by it), rows 1 and 2 exchanged
  # (their EOS is 2); ids map back and forth through the same swap.
  ours = np.asarray(params["shared_embedding"]["embedding"]) * 8**0.5
  theirs = np.asarray(tree["shared_embedding"]["embedding"])
  np.testing.assert_allclose(theirs[[0, 1, 2, 3]], ours[[0, 2, 1, 3]], rtol=1e-6)
  ids = np.array([[5, 1, 2, 0]])
  np.testing.assert_array_equal(flax_example.swap_eos(ids), [[5, 2, 1, 0]])
  np.testing.assert_array_equal(flax_example.swap_eos(flax_example.swap_eos(ids)), ids)


@pytest.mark.parametrize("changes, message", [
    (dict(pre_ln=False), "model.pre_ln must be True"),
    (dict(num_decoder_layers=2), "model.num_encoder_layers and num_decoder_layers must be equal"),
    (dict(pe_type="learned"), "model.pe_type must be 'sinusoidal'"),
])
def test_weights_their_model_cannot_express_are_one_line(changes, message):
  cfg, _ = _tiny_pre_ln_params(**changes)
  with pytest.raises(ConfigError, match=f"^--workdir=w: {message}"):
    flax_example.check_convertible(cfg, "--workdir=w")
