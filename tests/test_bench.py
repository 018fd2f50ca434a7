"""The benchmark on tiny shapes (one train step, a two-sentence decode, a short data read): the
JSON schema and the markdown report; the command line's one-line errors."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from transformer_jax import metrics
from transformer_jax.bench import hlo_profile, runner, train_step
from transformer_jax.config import ModelConfig

from transformer_jax.config import ConfigError

from tests.common import DATA_DIR, REPO


def _number(x):
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench") / "bench"
  opts = runner.Options(
      train="tiny:2x16", steps=1, warmup=0, peak_n=128, profile=True,
      overrides=("train.dropout_rng_impl=rbg",), decode_config="tiny", decode_data="random",
      decode_sentences=2, decode_batch=2, decode_positions="5,20", decode_repeats=1,
      data="multi30k:pack@1024", data_seconds=0.2,
      command="python -m transformer_jax.bench --train=tiny:2x16")
  r = runner.run(opts)
  runner.write(r, str(out))
  return r, out


def test_json_schema(result):
  r, out = result
  with open(str(out) + ".json") as f:
    saved = json.load(f)
  assert saved == json.loads(json.dumps(r))
  assert saved["schema_version"] == runner.SCHEMA_VERSION
  assert saved["parts"] == ["train", "decode", "data"]
  for key in ("date", "command", "machine", "load_before", "load_after", "idle", "peak"):
    assert key in saved, key
  assert saved["command"].startswith("python -m transformer_jax.bench --train=tiny")
  assert saved["machine"]["cores"] >= 1 and saved["machine"]["backend"] == "cpu"
  assert _number(saved["peak"]["flops_per_s"]) and saved["peak"]["dtype"] == "float32"

  assert [e["batch"]["shape"] for e in saved["train"]] == ["2x16"]
  for e in saved["train"]:
    assert e["name"] == "tiny" and e["overrides"] == {"train.dropout_rng_impl": "rbg"}
    assert e["dropout_rng_impl"] == "rbg"
    assert len(e["step_s"]["samples"]) == 1 and e["step_s"]["median"] > 0
    for key in ("compile_s", "target_tokens_per_s", "model_flops_per_s", "mfu",
                "model_flops_per_step", "xla_flops_per_step"):
      assert _number(e[key]) and e[key] > 0, key
    rows, length = e["batch"]["rows"], e["batch"]["target_len"]
    assert e["target_tokens_per_step"] == rows * length   # synthetic rows are full
    cfg = ModelConfig.from_config(train_step.train_config("tiny")[0].model)
    assert e["model_flops_per_step"] == metrics.train_flops(cfg, rows, length, length)
    assert e["mfu"] == pytest.approx(e["model_flops_per_s"] / saved["peak"]["flops_per_s"])
    assert e["memory"]["process_peak_rss_bytes"] > 0 and e["memory"]["temp_bytes"] >= 0
    assert e["finite"] and "speedup_vs_flax_wmt" not in e
    h = e["hlo"]
    assert h["library_dot_fusions"] + h["eigen_dots"] > 0 and h["loop_fusions"] > 0
    cats = e["profile"]["categories"]
    assert sum(c["share"] for c in cats.values()) == pytest.approx(1.0)
    for c in cats.values():
      assert c["forward"] + c["backward"] == pytest.approx(c["share"])
    assert any("matmul" in name for name in cats) and e["profile"]["busy_s_per_step"] > 0

  d = saved["decode"]
  assert set(d["per_token_s"]) == {"5", "20"} and all(v > 0 for v in d["per_token_s"].values())
  assert d["throughput"]["sentences"] == 2 and d["throughput"]["sentences_per_second"] > 0
  assert d["beam_size"] == 4

  (entry,) = saved["data"]["entries"]
  assert entry["corpus"] == "multi30k"
  if DATA_DIR and os.path.isdir(os.path.join(DATA_DIR, "multi30k")):
    assert entry["real_target_tokens_per_s"] > 0 and entry["batches_per_s"] > 0
  else:
    assert "skipped" in entry or entry["real_target_tokens_per_s"] > 0


def test_markdown_report(result):
  r, out = result
  text = open(str(out) + ".md").read()
  assert text.startswith("# Benchmark")
  assert "| tiny (configs/tiny.py) | 2x16 | rbg |" in text
  assert "## Decoding (beam search)" in text and "| 20 |" in text
  assert "## Input pipeline" in text and "## Where the train step's time goes" in text
  assert ("Not idle" in text) == (not r["idle"])


def test_categories_follow_the_source_of_each_operation():
  c = hlo_profile.category
  assert c("jit(train_step)/jvp(Transformer)/Transformer.decode/decoder/shared_embedding.attend/"
           "vocab_projection/dot_general") == "vocabulary projection (matmul)"
  assert c("jit(train_step)/transpose(jvp(Transformer))/Transformer.encode/encoder/layer_0/"
           "attention_block/self_attention/btnk,bsnk->bnts/dot_general").startswith("attention QK")
  assert c("x/encoder/layer_1/ffn_block/ffn/wi/dot_general") == "FFN (matmul)"
  assert c("x/decoder/layer_2/ffn_block/Dropout_0/jit(_bernoulli)/jit(_uniform)/add").startswith(
      "dropout")
  assert c("jit(train_step)/jvp()/reduce_max") == "loss (log-softmax over the vocabulary)"
  assert c("jit(train_step)/add") == "optimizer (Adam) + gradient norm"
  assert c("anything", transposes=True) == "transposes / layout copies"


def test_options():
  with pytest.raises(ConfigError, match="unknown part"):
    runner.run(runner.Options(only=("nope",)))
  c, _ = train_step.train_config("base")
  assert c.model.vocab_size == 32000 and c.model.d_model == 512
  assert train_step.apply_overrides(c, ["train.dropout_rng_impl=rbg", "model.dropout_rate=0.2"]) == {
      "train.dropout_rng_impl": "rbg", "model.dropout_rate": 0.2}
  assert c.train.dropout_rng_impl == "rbg"
  with pytest.raises(ConfigError, match="unknown config key 'train.dropout_rng'"):
    train_step.apply_overrides(c, ["train.dropout_rng=rbg"])
  with pytest.raises(ConfigError, match="'model.num_heads' needs a int"):
    train_step.apply_overrides(c, ["model.num_heads=eight"])
  with pytest.raises(ConfigError, match="dropout_rng_impl"):
    train_step.apply_overrides(c, ["train.dropout_rng_impl=nope"])
  b = train_step.synthetic_batch(train_step.train_config("multi30k")[0], 3, 40)
  assert set(b) == {"inputs", "targets", "inputs_segmentation", "targets_segmentation",
                    "inputs_position", "targets_position"}
  seg, ids, pos = b["targets_segmentation"], b["targets"], b["targets_position"]
  assert np.all(seg > 0) and np.all(ids != 0)
  for r in range(3):
    last = np.flatnonzero(np.diff(seg[r]) != 0).tolist() + [39]
    assert all(ids[r, i] == 1 for i in last)        # every segment ends in EOS
    assert np.all(pos[r][np.r_[0, np.array(last[:-1]) + 1]] == 0)


@pytest.mark.parametrize("args, message", [
    (["--only=train,nope"], "error: --only: unknown part 'nope'"),
    (["--override=model.nope=1"], "error: --override 'model.nope=1': unknown config key 'model.nope'"),
    (["--steps=0"], "error: flag --steps=0"),
    (["--train=huge:2x16"], "error: unknown benchmark config 'huge'"),
])
def test_command_line_mistakes_are_one_line(args, message):
  """Checked before anything is timed or written: no traceback, exit status 2."""
  p = subprocess.run([sys.executable, "-m", "transformer_jax.bench", *args, "--out="], cwd=REPO,
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 2, p.stderr
  assert p.stderr.strip().startswith(message) and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_side_by_side_needs_the_flax_example(tmp_path):
  p = subprocess.run([sys.executable, "-m", "experiments.bench_flax_wmt",
                      f"--flax_wmt_dir={tmp_path}", "--out="], cwd=REPO, capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 2, p.stderr
  assert p.stderr.strip() == (f"error: --flax_wmt_dir={tmp_path}: no models.py (expected flax's "
                              "examples/wmt)"), p.stderr


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
