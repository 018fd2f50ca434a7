"""`python -m benchmarks` on tiny shapes (one train step, a two-sentence decode, a short data read):
the JSON result, the settings it records (which its command resolves to again) and the Markdown
report; the command line's one-line errors; parallel runs and the core budget. The side-by-side
with flax's example: test_bench_flax_example.py."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import decoding, hlo_profile, input_pipeline, settings, train_step
from transformer_jax.runtime import config as config_lib
from transformer_jax.runtime.config import ModelConfig
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.training import metrics

from tests.common import REPO

pytestmark = pytest.mark.xdist_group(__name__)  # one worker builds the fixture: see conftest

# The benchmark (run in REPO) reads the data folder as the training CLI does: the environment
# variable, else ../shared/data; the test expects the corpus exactly when that folder has it.
_HAS_MULTI30K = os.path.isdir(os.path.join(REPO, input_pipeline.data_dir(), "multi30k"))


def _number(x):
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _bench(*args, timeout=600):
  return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench") / "bench"
  p = _bench("--train=tiny:2x16", "--steps=1", "--warmup=0", "--peak_n=128", "--profile",
             "--config.train.dropout_rng_impl=rbg", "--decode_config=tiny",
             "--decode_sentences=2", "--decode_batch=2",
             "--data=multi30k:pack@1024,multi30k:pack-balanced@1024", "--data_seconds=0.2",
             f"--out={out}")
  assert p.returncode == 0, p.stderr[-3000:]
  with open(str(out) + ".json") as f:
    saved = json.load(f)
  with open(str(out) + ".md") as f:
    text = f.read()
  return saved, text, p.stdout


def test_json_result(result):
  r, _, _ = result
  assert r["parts"] == ["train", "decode", "data"]
  for key in ("date", "command", "machine", "load_before", "load_after", "idle", "peak"):
    assert key in r, key
  assert r["command"].startswith("python -m benchmarks --train=tiny:2x16")
  assert r["machine"]["cores"] >= 1 and r["machine"]["backend"] == "cpu"
  assert _number(r["peak"]["flops_per_s"]) and r["peak"]["dtype"] == "float32"

  (e,) = r["train"]
  assert e["name"] == "tiny" and e["batch"]["shape"] == "2x16"
  assert e["overrides"] == {"train.dropout_rng_impl": "rbg"} and e["dropout_rng_impl"] == "rbg"
  assert len(e["step_s"]["samples"]) == 1 and e["step_s"]["median"] > 0
  for key in ("compile_s", "target_tokens_per_s", "model_flops_per_s", "mfu",
              "model_flops_per_step", "xla_flops_per_step"):
    assert _number(e[key]) and e[key] > 0, key
  tiny = train_step.train_config("tiny", {"train.dropout_rng_impl": "rbg"})[0]
  batch = train_step.synthetic_batch(tiny, 2, 16)  # the same seeded batch: its non-pad targets
  assert e["target_tokens_per_step"] == int((batch["targets"] != 0).sum())
  cfg = ModelConfig.from_config(tiny.model)
  assert e["model_flops_per_step"] == metrics.train_flops(cfg, 2, 16, 16)
  assert e["devices"] == 1 and e["page_faults_per_step"] >= 0
  assert e["attention"] == ["attention: einsum (written out, XLA fuses it)"]
  assert e["mfu"] == pytest.approx(e["model_flops_per_s"] / (r["peak"]["flops_per_s"] * e["devices"]))
  assert e["memory"]["process_peak_rss_bytes"] > 0 and e["memory"]["temp_bytes"] >= 0
  assert e["finite"]
  cats = e["profile"]["categories"]
  assert sum(c["share"] for c in cats.values()) == pytest.approx(1.0)
  for c in cats.values():
    assert c["forward"] + c["backward"] == pytest.approx(c["share"])
  assert any("matmul" in name for name in cats) and e["profile"]["busy_s_per_step"] > 0

  d = r["decode"]
  t = d["throughput"]
  assert t["sentences"] == 2 and t["sentences_per_second"] > 0 and t["compile_seconds"] > 0
  assert sum(b["steps"] for b in t["per_batch"]) == t["decoder_steps"] > 0
  assert d["beam_size"] == 4

  c = r["data"]["corpora"]["multi30k"]
  if not _HAS_MULTI30K:
    assert "skipped" in c
    return
  assert c["pairs_kept"] <= c["pairs"] and c["tfds_prepare_s"] >= 0
  plain, balanced = c["entries"]
  assert plain["key"] == "pack@1024" and balanced["key"].startswith("pack@1024 (rows ")
  for entry in (plain, balanced):
    assert 0 < entry["real_share"] <= 1 and entry["batches_per_epoch"] > 0
    assert entry["distinct_shapes"] == 1 and entry["over_budget_batches"] == 0
    assert entry["real_target_tokens_per_s"] > 0 and entry["batches_per_s"] > 0


def test_recorded_settings_are_what_the_command_resolves_to(result):
  """benchmarks.settings.resolve(command) gives the settings a fresh result recorded, key by key;
  the data folder (where the corpus is read from) is not one of them."""
  r, _, _ = result
  s = r["settings"]
  assert settings.resolve(r["command"]) == s
  assert s["benchmark.parts"] == ["train", "decode", "data"] and s["benchmark.steps"] == 1
  assert s["benchmark.train"] == ["tiny:2x16"] and s["benchmark.profile"] is True
  assert s["train:tiny.model.d_model"] == 64 and s["train:tiny.train.dropout_rng_impl"] == "rbg"
  assert s["decode:tiny.model.vocab_size"] == 1000 and s["benchmark.decode_alpha"] == decoding.ALPHA
  assert not any(k.startswith("decode:tiny.train.") for k in s)  # decoding reads only the model
  assert s["data:multi30k.model.vocab_size"] == input_pipeline.CORPORA["multi30k"][3]
  assert not any(k.endswith(tuple(settings.PLACE_KEYS)) for k in s)
  assert {k.split(".")[0] for k in s} == {"benchmark", "train:tiny", "decode:tiny",
                                          "data:multi30k"}
  assert settings.config_key("train:tiny.model.d_model") == "model.d_model"
  assert settings.config_key("benchmark.steps") is None


def test_a_changed_default_resolves_to_other_settings(result, monkeypatch):
  """A config default or a benchmark constant that moved since the result was written: the
  command resolves to settings that differ exactly where it moved."""
  r, _, _ = result
  default_config = config_lib.default_config

  def moved():
    c = default_config()
    c.model.layer_norm_epsilon = 1e-5
    return c
  monkeypatch.setattr(config_lib, "default_config", moved)  # what config files call
  monkeypatch.setattr(input_pipeline, "default_config", moved)  # imported by name there
  monkeypatch.setattr(decoding, "ALPHA", decoding.ALPHA + 0.1)
  now, then = settings.resolve(r["command"]), r["settings"]
  assert {k for k in set(now) | set(then) if now.get(k) != then.get(k)} == {
      "train:tiny.model.layer_norm_epsilon", "decode:tiny.model.layer_norm_epsilon",
      "data:multi30k.model.layer_norm_epsilon", "benchmark.decode_alpha"}


@pytest.mark.parametrize("command, message", [
    ("python -m transformer_jax.main --config=configs/tiny.py",
     "not a benchmark command (python -m benchmarks[.MODULE] ...): "),
    ("python -m benchmarks.report", "`python -m benchmarks.report` is not a benchmark entry point"),
    ("python -m benchmarks --stepz=3", "benchmark command `python -m benchmarks`: Unknown command "
                                       "line flag 'stepz'"),
    ("python -m benchmarks --steps=0", "benchmark command `python -m benchmarks`: flag --steps=0"),
    ("python -m benchmarks extra", "benchmark command `python -m benchmarks`: unexpected "
                                   "arguments extra"),
    ("python -m benchmarks --config.model.dropout_rat=0.2", "unknown config key "
                                                            "'model.dropout_rat'"),
    ("python -m benchmarks --only=train,nope", "--only: unknown part 'nope'"),
    ("python -m benchmarks.flax_wmt_decode --config.model.d_model=8",
     "benchmarks.flax_wmt_decode takes no config overrides"),
    ("python -m benchmarks 'unclosed", "does not parse as a shell line"),
])
def test_resolving_a_bad_command_is_one_line(command, message):
  with pytest.raises(ConfigError) as e:
    settings.resolve(command)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_every_entry_point_resolves_without_running():
  """The side-by-sides resolve our side's config (theirs is their code); with trained weights
  the model comes from the checkpoint, so only the flags are settings; environment assignments,
  absl's own flags and where a result goes change nothing."""
  train = settings.resolve("python -m benchmarks.flax_wmt --flax_wmt_dir=/nowhere --steps=2 "
                           "--config.train.dropout_rng_impl=rbg --out=")
  assert train["benchmark.steps"] == 2 and train["benchmark.shapes"] == ["8x128", "32x128"]
  assert train["train:base.model.vocab_size"] == train_step.FLAX_VOCAB
  assert train["train:base.model.relu_dropout_rate"] == 0.1
  assert train["train:base.train.dropout_rng_impl"] == "rbg"
  decode = settings.resolve("python -m benchmarks.flax_wmt_decode --flax_wmt_dir=/nowhere")
  assert decode["benchmark.weights"] == "random" and decode["decode:base.model.d_model"] == 512
  trained = settings.resolve("python -m benchmarks.flax_wmt_decode --flax_wmt_dir=/nowhere "
                             "--workdir=/gone --sentences=32")
  assert trained["benchmark.weights"] == "trained" and trained["benchmark.sentences"] == 32
  assert not any(k.startswith("decode:") for k in trained)
  plain = settings.resolve("python -m benchmarks --only=train --train=tiny:2x16")
  assert settings.resolve("TRANSFORMER_JAX_DATA_DIR=/x python -m benchmarks --only=train "
                          "--train=tiny:2x16 --verbosity=1 --out=/elsewhere && echo ok") == plain
  assert not any(k.startswith(("decode", "data", "benchmark.decode")) for k in plain)


def test_markdown_report(result):
  r, text, stdout = result
  assert text.startswith("# Benchmark") and text in stdout
  assert "| tiny (configs/tiny.py) | 2x16 | float32 | rbg |" in text
  assert "## Where the train step's time goes" in text
  assert "## Decoding (beam search)" in text and "| batch shape | buffer |" in text
  assert "## Input pipeline" in text
  if _HAS_MULTI30K:
    assert "| pack@1024 |" in text
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


def test_train_configs_and_synthetic_batches():
  c, description = train_step.train_config("base", {"model.dropout_rate": 0.2})
  assert c.model.vocab_size == 32000 and c.model.d_model == 512 and c.model.dropout_rate == 0.2
  assert description == "configs/base.py, vocab 32000"
  assert train_step.preset("base")[0].model.vocab_size == 37000
  with pytest.raises(ConfigError, match="dropout_rng_impl"):
    train_step.train_config("tiny", {"train.dropout_rng_impl": "nope"})
  assert train_step.parse_entry("base:8x128") == ("base", 8, 128)
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
    (["--config.model.dropout_rat=0.2"], "error: unknown config key 'model.dropout_rat' (did you "
                                         "mean 'dropout_rate'?)"),
    (["--config.model.pre_ln=ture"], "error: config key 'model.pre_ln' must be bool, got 'ture'"),
    (["--steps=0"], "error: flag --steps=0"),
    (["--train=huge:2x16"], "error: unknown benchmark config 'huge'"),
    (["--train=tiny:2y16"], "error: batch shape '2y16': expected ROWSxLENGTH"),
    (["--train=tiny:2x100"], "error: batch length 100 exceeds model.max_len=64"),
    (["--data=multi30k:packed@100"], "error: --data entry 'multi30k:packed@100': expected"),
])
def test_command_line_mistakes_are_one_line(args, message):
  """Checked before anything is timed or written: no traceback, exit status 2."""
  p = _bench(*args, "--out=", timeout=120)
  assert p.returncode == 2, p.stderr
  assert p.stderr.strip().startswith(message) and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_parallel_runs_sums_steps_per_second_over_processes(tmp_path, monkeypatch):
  """benchmarks.parallel_runs: the row's model overrides go to each benchmark process, the three
  set-ups are one run on every core, one pinned run, and one pinned run per core at once, and
  throughput is steps/s summed over the processes (the benchmark processes faked)."""
  from benchmarks import parallel_runs  # pylint: disable=g-import-not-at-top
  seen = []

  def fake_bench(args, overrides, folder, name, cpus):
    seen.append((name, cpus, tuple(overrides)))
    return {"cores": cpus, "step_s_median": 0.4 if cpus is None else 0.5, "mfu": 0.3,
            "load_before": [0.0], "command": "python -m benchmarks ..."}

  monkeypatch.setattr(parallel_runs, "_bench", fake_bench)
  parallel_runs.main(["parallel_runs", f"--out={tmp_path / 'p'}", "--steps=3"])
  cores = sorted(os.sched_getaffinity(0))
  assert [(n, c) for n, c, _ in seen[:2]] == [("all", None), ("one", [cores[0]])]
  assert sorted(c[0] for _, c, _ in seen[2:]) == cores
  assert "--config.model.d_model=64" in seen[0][2] and "--config.model.num_heads=8" in seen[0][2]
  data = json.loads((tmp_path / "p.json").read_text())
  assert data["command"] == f"python -m benchmarks.parallel_runs --out={tmp_path / 'p'} --steps=3"
  assert settings.resolve(data["command"]) == data["settings"]
  assert data["settings"]["train:multi30k.model.d_model"] == 64
  assert data["settings"]["benchmark.overrides"] == list(seen[0][2])
  steps = [s["steps_per_s"] for s in data["setups"]]
  assert steps == pytest.approx([2.5, 2.0, 2.0 * len(cores)])
  assert data["setups"][2]["vs_one_run_every_core"] == pytest.approx(0.8 * len(cores))
  assert "| one run, every core | 0.400 | 2.50 | 1.00x |" in (tmp_path / "p.md").read_text()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")
def test_core_budget_pins_one_run_per_core_and_scores_their_ensemble(tmp_path, monkeypatch):
  """benchmarks.core_budget: every one-core run is pinned to its own core with its own seed, the
  every-core run is not pinned, all share the first run's vocabulary, and the ensemble is the
  first run with the others, compared with the every-core run (training and evaluation faked)."""
  from benchmarks import core_budget  # pylint: disable=g-import-not-at-top
  cores = sorted(os.sched_getaffinity(0))
  trains, evals = [], []

  def fake_train(spec, overrides, workdir, seed, config, cpus):
    trains.append((os.path.basename(workdir), seed, cpus, tuple(overrides)))
    return {"steps": 10 + seed, "train_minutes": config.train.max_train_minutes}

  def fake_evaluate(workdir, values, cpus, *, ensemble=(), compare=""):
    evals.append((os.path.basename(workdir), cpus, tuple(map(os.path.basename, ensemble)),
                  os.path.basename(compare)))
    f1 = {"every_core": 60.0, "one_core_seed0": 58.0}.get(os.path.basename(workdir), 57.0)
    f1 += 4.0 if ensemble else 0.0
    return {"f1": f1, "precision": f1, "recall": f1, "exact_match": 1.0, "repaired": 0,
            "perplexity": 2.0, "sentences": 8, "decode_seconds": 1.0,
            **({"compare": {"f1": {"delta": f1 - 60.0, "p_value": 0.01}}} if compare else {})}

  monkeypatch.setattr(core_budget, "_train", fake_train)
  monkeypatch.setattr(core_budget, "_evaluate", fake_evaluate)
  (tmp_path / "w" / "one_core_seed0" / "vocab").mkdir(parents=True)
  (tmp_path / "w" / "one_core_seed0" / "vocab" / "spm.model").write_text("pieces")
  argv = ["core_budget", "--config=configs/wsj_parsing.py:sample", f"--workdir={tmp_path / 'w'}",
          f"--out={tmp_path / 'b'}", "--config.train.max_train_minutes=1.5"]
  core_budget.main(argv)
  singles = [f"one_core_seed{k}" for k in range(len(cores))]
  assert sorted(trains[:-1]) == sorted((n, k, [c], ("--config.train.max_train_minutes=1.5",))
                                       for k, (n, c) in enumerate(zip(singles, cores)))
  assert trains[-1][:3] == ("every_core", 0, None)
  for name in ["every_core", *singles[1:]]:
    assert (tmp_path / "w" / name / "vocab" / "spm.model").read_text() == "pieces"
  assert evals[0] == ("every_core", None, (), "")
  assert sorted(evals[1:-1]) == sorted((n, [c], (), "every_core") for n, c in zip(singles, cores))
  assert evals[-1] == ("one_core_seed0", None, tuple(singles[1:]), "every_core")
  data = json.loads((tmp_path / "b.json").read_text())
  assert settings.resolve(data["command"]) == data["settings"]
  assert data["settings"]["train.train.max_train_minutes"] == 1.5
  ensemble = data["setups"][-1]
  assert ensemble["scores"]["f1"] == 62.0 and ensemble["delta_vs_every_core"] == 2.0
  assert [r["steps"] for r in ensemble["runs"]] == [10 + k for k in range(len(cores))]
  text = (tmp_path / "b.md").read_text()
  assert f"| one core each, {len(cores)} runs as an ensemble |" in text and "| +2.00 | 0.010 |" in text


def test_core_budget_needs_a_time_budget():
  from benchmarks import core_budget  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match="max_train_minutes"):
    core_budget.main(["core_budget", "--config=configs/wsj_parsing.py", "--workdir=/nowhere"])
