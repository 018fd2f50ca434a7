"""The sweep runner (experiments/harness/runner.py): result files and the skip/resume/retry bookkeeping
around the training and evaluation CLIs (faked: tests/sweep_fakes.py), results of another
protocol refused, the subprocess runner's errors, and a 2-step real run."""

import json
import os
import shutil
import sys
import threading
import time

import pytest

from experiments.harness import define, processes, records, resolve, study
from tests.common import DATA_DIR, requires_data
from tests.sweep_fakes import (REFERENCES, TABLE3, FakeCLI, SweepKilled, file_snapshot,
                               one_line_error, run_fake, sweep_cli)
from transformer_jax.runtime import results as results_lib
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import parse_overrides


@pytest.fixture(scope="module")
def table3():
  return study.load_sweep(TABLE3)


def test_rerun_skips_finished_runs_resumes_and_retries(table3, tmp_path):
  out, results = tmp_path / "sweep", tmp_path / "results"
  rows = ["base", "A_h1", "C_N8"]
  fake = FakeCLI(fail={("A_h1", 1)}, fail_eval={("C_N8", 0)}, stop_at={("base", 2): 1})
  states = run_fake(table3, out, results, rows, fake)
  assert [(s["row"], s["seed"], s["status"]) for s in states] == [
      ("base", 0, "done"), ("base", 1, "done"), ("base", 2, "unfinished"), ("A_h1", 0, "done"),
      ("A_h1", 1, "failed"), ("C_N8", 0, "failed"), ("C_N8", 1, "done")]
  failed = json.load(open(out / "A_h1" / "seed1" / "status.json"))
  assert (failed["error"], failed["stage"]) == ("config key 'model.d_k' boom", "train")
  assert json.load(open(out / "C_N8" / "seed0" / "status.json"))["error"] == "RuntimeError: out of memory"
  assert "rerun to resume" in states[2]["error"] and states[2]["steps"] == 1
  assert sorted(os.listdir(results)) == ["A_h1_seed0.json", "C_N8_seed1.json", "base_seed0.json",
                                         "base_seed1.json", "references.json"]
  assert json.load(open(results / "references.json"))["references"] == REFERENCES
  res = json.load(open(results / "base_seed1.json"))
  assert (res["row"], res["seed"], res["dev_ppl"], res["bleu_tokenized"], res["bleu"]) == ("base", 1, 9.0, 5.0, 4.0)
  assert res["dev_ppl_curve"] == [[1, 11.25], [2, 9.0]] and res["step"] == 2
  assert res["last_quarter"] == {"from_step": 1, "to_step": 2, "relative_change": -0.2}
  assert res["protocol"] == resolve.protocol(resolve.resolve(table3, "base", "tiny"), table3)
  assert res["protocol"]["num_steps"] == 2 and res["protocol"]["bleu_sentences"] == 4
  assert len(res["hypotheses"]) == 4 and res["params"] > 0 and res["step_seconds"] == 0.5
  assert res["machine"]["cores"] == os.cpu_count() and "--config.seed=1" in res["commands"]["train"]
  assert os.path.isdir(out / "_vocab")  # the first trained vocabulary, shared by all runs
  before = file_snapshot(results)
  # rerun: finished runs skipped, failed ones retried (A_h1 seed 1: trained; C_N8 seed 0: only
  # evaluated again), the unfinished one resumed
  fake.fail.clear()
  fake.fail_eval.clear()
  fake.calls.clear()
  states = run_fake(table3, out, results, rows, fake)
  assert [s["status"] for s in states] == ["done"] * 7
  assert fake.calls == [("train", "base", 2), ("eval", "base", 2), ("train", "A_h1", 1),
                        ("eval", "A_h1", 1), ("eval", "C_N8", 0)]
  assert json.load(open(out / "base" / "seed2" / "timing.json"))["train_attempts"] == 2
  after = file_snapshot(results)
  assert {n: after[n] for n in before} == before  # nothing finished was rewritten
  assert len(after) == len(before) + 3
  # a fresh clone: OUT is gone, the committed result files resume the sweep; nothing runs
  shutil.rmtree(out)
  fake.calls.clear()
  states = run_fake(table3, out, results, rows, fake)
  assert fake.calls == [] and [s["status"] for s in states] == ["done"] * 7
  assert file_snapshot(results) == after
  # eval_only: runs trained elsewhere are evaluated; untrained ones are reported, not trained
  states = run_fake(table3, out, results, ["A_h4"], fake, eval_only=True, seeds=(0,))
  assert states[0]["status"] == "unfinished" and "not trained yet" in states[0]["error"]
  assert fake.calls == []


def test_rows_that_change_only_decoding_are_evaluated_on_the_run_they_share(tmp_path):
  """A row whose own settings are decode.* ones (beam, alpha, averaging, the constraint's limits)
  trains nothing: it is scored on the run of the row it equals otherwise, after that run has
  trained (even when the sweep lists it first), with its settings given to the evaluation."""
  sweep = study.load_sweep(TABLE3)
  define.add_row(sweep, "alpha0", overrides={"decode.alpha": 0.0})
  define.add_row(sweep, "avg2", overrides={"decode.average_checkpoints": 2})
  define.add_row(sweep, "h1_beam1", overrides={"model.num_heads": 1, "model.d_k": 512,
                                               "model.d_v": 512, "decode.beam_size": 1})
  assert [resolve.shared_training(sweep, r) for r in ("base", "alpha0", "avg2", "A_h1", "h1_beam1")] \
      == ["base", "base", "base", "A_h1", "A_h1"]  # h1_beam1 is A_h1 decoded greedily
  out, results = tmp_path / "sweep", tmp_path / "results"
  fake = FakeCLI()
  states = run_fake(sweep, out, results, ["alpha0", "avg2", "base"], fake, seeds=(0,),
                    base_seeds=(0,), parallel=2)
  assert sorted(s["status"] for s in states) == ["done"] * 3
  assert sorted(c for c in fake.calls if c[0] == "train") == [("train", "base", 0)]
  evals = [c for c in fake.calls if c[0] == "eval"]
  assert sorted(evals) == [("eval", "base", 0), ("eval", "base", 0, "--average=2"),
                           ("eval", "base", 0, "--config.decode.alpha=0.0")]
  assert fake.calls.index(("train", "base", 0)) < min(map(fake.calls.index, evals))
  assert not (out / "alpha0").exists() and not (out / "avg2").exists()
  assert sorted(os.listdir(out / "base" / "seed0" / "eval")) == sorted(
      f"validation_step2{tag}_bleu4.{ext}" for tag in ("", "_avg2", "_alpha0.0")
      for ext in ("json", "jsonl"))
  alpha0 = json.load(open(results / "alpha0_seed0.json"))
  assert "--config.decode.alpha=0.0" in alpha0["commands"]["eval"]
  assert "decode.alpha" not in alpha0["commands"]["train"]
  assert alpha0["protocol"] == resolve.protocol(resolve.resolve(sweep, "alpha0", "tiny"), sweep)
  assert alpha0["protocol"]["hash"] != json.load(open(results / "base_seed0.json"))["protocol"]["hash"]


def test_a_run_with_a_time_budget_is_done_when_its_checkpoint_records_the_budget(table3, tmp_path):
  """train.max_train_minutes: a run that stopped before num_steps is evaluated when its last
  checkpoint records the whole budget, and resumed when it records less."""
  out, results = tmp_path / "sweep", tmp_path / "results"
  budget = {"train.max_train_minutes": 1.0}
  short = FakeCLI(stop_at={("base", 0): 1}, recorded_seconds=30.0)
  states = run_fake(table3, out, results, ["base"], short, base_seeds=(0,), overrides=budget)
  assert states[0]["status"] == "unfinished" and "rerun to resume" in states[0]["error"]
  spent = FakeCLI(stop_at={("base", 0): 1}, recorded_seconds=60.0)
  states = run_fake(table3, out, results, ["base"], spent, base_seeds=(0,), overrides=budget)
  assert states[0]["status"] == "done" and spent.calls == [("train", "base", 0), ("eval", "base", 0)]
  assert json.load(open(results / "base_seed0.json"))["step"] == 1
  assert processes.trained_seconds(str(out / "base" / "seed0"), 1) == 60.0
  assert processes.trained_seconds(str(out / "base" / "seed0"), 7) == 0.0  # no such checkpoint


def test_a_killed_sweeps_training_time_is_counted_when_it_resumes(table3, tmp_path):
  # A sweep killed mid-training (a session's end) cannot record that attempt's time itself; the
  # resumed run counts it, up to the last metrics row the attempt logged.
  out, results = tmp_path / "sweep", tmp_path / "results"
  fake = FakeCLI(kill_at={("base", 0): 1}, train_seconds=0.3)
  with pytest.raises(SweepKilled):
    run_fake(table3, out, results, ["base"], fake, base_seeds=(0,))
  assert json.load(open(out / "base" / "seed0" / "timing.json"))["train_attempts"] == 0
  fake.calls.clear()
  states = run_fake(table3, out, results, ["base"], fake, base_seeds=(0,))
  assert [s["status"] for s in states] == ["done"]
  assert fake.calls == [("train", "base", 0), ("eval", "base", 0)]
  res = json.load(open(results / "base_seed0.json"))
  assert res["train_attempts"] == 2 and res["train_minutes"] * 60 >= 0.6


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores")
def test_parallel_runs_each_on_its_own_cores(table3, tmp_path):
  """--parallel=2: the shared vocabulary first (`--mode=vocab`, on every core), then every run two
  at a time, each on its own half of the cores, recorded in its result; the same results as one
  at a time, and a rerun skips them all."""
  rows = ["base", "A_h1", "C_N8"]
  serial = FakeCLI()
  run_fake(table3, tmp_path / "serial", tmp_path / "serial_results", rows, serial)
  fake = FakeCLI(train_seconds=0.3)
  out, results = tmp_path / "sweep", tmp_path / "results"
  inside, lines = [], []

  def slow_log(line):  # print: the text, then the newline; two threads must not interleave them
    inside.append(line)
    time.sleep(0.01)
    lines.append((len(inside), line))
    inside.pop()

  states = run_fake(table3, out, results, rows, fake, parallel=2, log=slow_log)
  assert lines and all(n == 1 for n, _ in lines), [l for n, l in lines if n > 1]
  assert [(s["row"], s["seed"], s["status"]) for s in states] == [
      (r, s, "done") for r, s in [("base", 0), ("base", 1), ("base", 2), ("A_h1", 0), ("A_h1", 1),
                                  ("C_N8", 0), ("C_N8", 1)]]
  halves = processes.cpu_shares(2)
  assert sorted(halves[0] + halves[1]) == sorted(os.sched_getaffinity(0)) and halves[0] and halves[1]
  assert fake.calls[0] == ("vocab", "base", 0) and fake.vocab_cores is None  # every core
  assert sorted(map(tuple, set(map(tuple, fake.cores.values())))) == sorted(map(tuple, halves))
  assert fake.most_at_once == 2
  for name in os.listdir(results):
    ours, theirs = json.load(open(results / name)), json.load(open(tmp_path / "serial_results" / name))
    for r in (ours, theirs):
      for key in ("train_minutes", "eval_minutes", "date", "commands", "cpu_share"):
        r.pop(key, None)
    assert ours == theirs, name
  assert json.load(open(results / "A_h1_seed0.json"))["cpu_share"] in halves
  report = sweep_cli("--report", f"--sweep={TABLE3}", "--scale=tiny", f"--results_dir={results}",
                     f"--out={out}")
  assert report.returncode == 0, report.stderr
  text = (tmp_path / "results.md").read_text()
  assert "7 of them ran beside other runs, each on its own share of the cores (`--parallel`" in text
  assert "; result files: `results/`" in text  # outside the checkout: as seen from the report
  before, fake.calls = file_snapshot(results), []
  run_fake(table3, out, results, rows, fake, parallel=2)
  assert fake.calls == [] and file_snapshot(results) == before
  # the vocabulary step failing: the first run trains the vocabulary alone, the rest side by side
  fake = FakeCLI(fail_vocab=True)
  states = run_fake(table3, tmp_path / "sweep2", tmp_path / "results2", ["base"], fake, parallel=2)
  assert [s["status"] for s in states] == ["done"] * 3 and fake.calls[0] == ("vocab", "base", 0)
  assert fake.cores[("base", 0)] is None and fake.cores[("base", 1)] in halves
  with pytest.raises(ConfigError, match="--parallel=.*CPU cores; give at most one run per core"):
    processes.cpu_shares(len(os.sched_getaffinity(0)) + 1)


def test_a_sweep_given_cores_pins_its_runs_to_them(table3, tmp_path):
  """--cores=K: one run at a time, each pinned to core K and recording it (a second sweep on the
  core another leaves free); a core this process may not use, a repeat or a non-number: one line."""
  core = max(os.sched_getaffinity(0))
  fake = FakeCLI()
  states = run_fake(table3, tmp_path / "out", tmp_path / "results", ["A_h1"], fake, cores=str(core))
  assert [s["status"] for s in states] == ["done", "done"]
  assert set(map(tuple, fake.cores.values())) == {(core,)}
  assert json.load(open(tmp_path / "results" / "A_h1_seed1.json"))["cpu_share"] == [core]
  assert processes.cpu_shares(1, f" {core}") == [[core]]
  for bad in (str(core + 1), f"{core},{core}", "x"):
    with pytest.raises(ConfigError, match=f"--cores={bad}: .* is not one of this process's cores"):
      processes.cpu_shares(1, bad)


def test_a_run_on_one_core_is_pinned_and_single_threaded(tmp_path):
  """subprocess_runner with cpus: the child inherits the calling thread's affinity and XLA's
  one-core flag; the caller's other threads keep every core."""
  cores = sorted(os.sched_getaffinity(0))
  probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)), os.environ.get('XLA_FLAGS'))"]
  log = tmp_path / "probe.log"
  outcome = []
  worker = threading.Thread(target=lambda: outcome.append(processes.subprocess_runner(probe, str(log), cpus=[cores[-1]])))
  worker.start()
  worker.join()
  assert outcome == [(0, "")]
  assert f"[{cores[-1]}] " in log.read_text() and processes.ONE_CORE_XLA_FLAGS in log.read_text()
  assert sorted(os.sched_getaffinity(0)) == cores


def test_results_of_another_protocol_or_row_stop_everything(table3, tmp_path):
  out, results = tmp_path / "sweep", tmp_path / "results"
  run_fake(table3, out, results, ["base"], FakeCLI(), base_seeds=(0,))
  before = file_snapshot(results)
  fake = FakeCLI()
  with pytest.raises(ConfigError, match=r"base_seed0.json comes from another protocol \(learning_rate_scale: "
                                        r"2.0 there, 0.5 now\)"):
    run_fake(table3, out, results, ["base", "A_h1"], fake,
         overrides=parse_overrides(["--config.train.learning_rate_scale=0.5"]))
  error = one_line_error(sweep_cli(f"--sweep={TABLE3}", "--scale=tiny", f"--out={out}",
                               f"--results_dir={results}", "--config.train.num_steps=3"))
  assert error.startswith(f"error: {results}/base_seed0.json comes from another protocol "
                          "(num_steps: 2 there, 3 now)")
  assert fake.calls == [] and file_snapshot(results) == before
  (results / "nope_seed0.json").write_text("{}")
  with pytest.raises(ConfigError, match="nope_seed0.json: row 'nope' is not a row of the sweep 'table3'"):
    run_fake(table3, out, results, ["base"], fake)


def test_subprocess_runner_reports_errors_and_timeouts(tmp_path):
  log = str(tmp_path / "row.log")
  fail = [sys.executable, "-c", "import sys; print('step 1'); print('error: bad thing', file=sys.stderr); sys.exit(2)"]
  assert processes.subprocess_runner(fail, log) == (2, "bad thing")
  slow = [sys.executable, "-c", "import time; time.sleep(60)"]
  rc, error = processes.subprocess_runner(slow, log, timeout_s=0.5)
  assert rc == 1 and error.startswith("timed out after") and "rerun to resume" in error
  assert open(log).read().count("\n# ") == 2  # each command is logged before its output


def test_error_line_picks_the_reason():
  assert processes.error_line("x\nerror: bad key\nmore\n", 2) == "bad key"
  assert processes.error_line("Traceback\n  File x\nValueError: boom\nI0 log\n", 1) == "ValueError: boom"
  assert processes.error_line("killed\n", -9) == "killed (exit status -9)"


def test_last_quarter_change():
  assert records.last_quarter_change([[100, 20.0], [200, 12.0], [300, 10.0], [400, 9.5]]) == {
      "from_step": 300, "to_step": 400, "relative_change": -0.05}
  assert records.last_quarter_change([[400, 9.5]]) is None
  assert records.last_quarter_change([[390, 9.6], [400, 9.5]]) is None  # no point at or before 3/4


def test_step_time_is_the_median_window_so_a_paused_window_does_not_move_it():
  train = [{"step_time": 9.0, "tokens_per_second": 10.0},  # the compilation's window: left out
           {"step_time": 0.5, "tokens_per_second": 4000.0},
           {"step_time": 3600.0, "tokens_per_second": 0.5},  # the run was stopped for an hour
           {"step_time": 0.6, "tokens_per_second": 3500.0}]
  assert records.median_window(train) == 0.6
  assert records.median_window(train, "tokens_per_second") == 3500.0
  assert records.median_window(train[:1]) is None


def test_machine_names_the_cpu_generation_that_a_shared_model_name_hides(tmp_path):
  def cpu(text):
    (tmp_path / "cpuinfo").write_text(text)
    return results_lib.machine(str(tmp_path / "cpuinfo"))["cpu"]
  epyc = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: {}\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 {}\n\nprocessor\t: 1\nmodel\t\t: 99\n"
  assert cpu(epyc.format(17, "avx512f avx512bw")) == "AMD EPYC (family 25 model 17, AVX-512)"  # Zen 4
  assert cpu(epyc.format(1, "fma")) == "AMD EPYC (family 25 model 1, AVX2)"  # Zen 3: only the first processor is read
  assert cpu("processor\t: 0\nFeatures\t: fp asimd\n").endswith("(NEON)")  # arm: no model name
  assert results_lib.machine(str(tmp_path / "none"))["cores"] == os.cpu_count()  # no cpuinfo: still a machine


# --- a real run: 2 training steps of a tiny model, evaluated --------------------------------------

@requires_data
def test_tiny_real_run_trains_evaluates_and_is_skipped_on_rerun(tmp_path):
  out, results = tmp_path / "real", tmp_path / "results"
  args = (f"--sweep={TABLE3}", "--scale=tiny", f"--out={out}", f"--results_dir={results}",
          "--rows=B_dk16", "--seeds=1", "--config.model.num_encoder_layers=1",
          "--config.model.num_decoder_layers=1",
          # a vocabulary from 4000 sentences and one step shape: less to train and compile
          "--config.data.vocab_train_sentences=4000", "--config.data.num_buckets=1")
  os.environ.setdefault("TRANSFORMER_JAX_DATA_DIR", DATA_DIR)
  result = sweep_cli(*args, timeout=300)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  res = json.load(open(results / "B_dk16_seed1.json"))
  assert res["seed"] == 1 and res["step"] == 2, res
  assert res["hparams"]["d_k"] == 1 and res["hparams"]["d_v"] == 4  # 16/16 and 64/16
  assert res["dev_ppl"] > 1 and abs(res["dev_ppl"] - 2.718281828 ** res["dev_nll"]) < 1e-6 * res["dev_ppl"]
  assert res["dev_loss"] > 0 and res["bleu_sentences"] == 4 and res["params"] > 0
  assert res["beam_size"] == 2 and len(res["hypotheses"]) == 4
  assert [p[0] for p in res["dev_ppl_curve"]] == [2] and res["last_quarter"] is None
  assert len(json.load(open(results / "references.json"))["references"]) == 4
  assert (tmp_path / "results.md").exists()
  rerun = sweep_cli(*args, timeout=120)
  assert rerun.returncode == 0 and "B_dk16_seed1: done earlier" in rerun.stdout


def test_a_config_key_added_later_at_its_default_is_the_same_protocol():
  from experiments.harness.records import protocol_difference  # pylint: disable=g-import-not-at-top
  ours = {"hash": "b", "num_steps": 3, "resolved": {"model.d_model": 64, "model.remat": "none"}}
  older = {"hash": "a", "num_steps": 3, "resolved": {"model.d_model": 64}}  # before remat existed
  assert protocol_difference(ours, older) == ""
  ours["resolved"]["model.remat"] = "layer"  # not the default: a different computation
  assert protocol_difference(ours, older) == "resolved.model.remat: None there, 'layer' now"
  assert protocol_difference(ours, {**older, "num_steps": 2}) == "num_steps: 2 there, 3 now"


def test_the_same_config_reached_through_other_overrides_is_the_same_protocol():
  # The config file's default moved to what the scale overrides: the override list shrinks, the
  # resolved config does not change, and neither do the committed results.
  from experiments.harness.records import protocol_difference  # pylint: disable=g-import-not-at-top
  before = {"hash": "a", "overrides": ["--config.data.tokens_per_batch=2048", "--config.model.d_model=64"],
            "resolved": {"data.tokens_per_batch": 2048, "model.d_model": 64}}
  now = {"hash": "b", "overrides": ["--config.model.d_model=64"],
         "resolved": {"data.tokens_per_batch": 2048, "model.d_model": 64}}
  assert protocol_difference(now, before) == ""
  now["resolved"]["data.tokens_per_batch"] = 4096  # a real change is still found, by its key
  assert protocol_difference(now, before) == "resolved.data.tokens_per_batch: 2048 there, 4096 now"
