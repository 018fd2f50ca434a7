"""The sweep runner (experiments/): the Table 3 sweep and its paper values, scales, up-front
validation, printed commands, skip/resume/failure bookkeeping, the report, and a 2-step real run.
"""

import json
import os
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from experiments import run as run_lib
from experiments import row_commands, row_runner, sweep_report, sweep_rows
from tests.common import DATA_DIR, requires_data
from transformer_jax.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE3 = "experiments/table3.py"

# The paper's Table 3, as printed (None: blank, "as base").
#        row            N     d_model d_ff  h     d_k   d_v   P_drop eps_ls steps    PPL   BLEU  params
PAPER = {
    "base":         (6,    512,  2048, 8,    64,   64,   0.1,   0.1,   100_000, 4.92, 25.8, 65),
    "A_h1":         (None, None, None, 1,    512,  512,  None,  None,  None,    5.29, 24.9, None),
    "A_h4":         (None, None, None, 4,    128,  128,  None,  None,  None,    5.00, 25.5, None),
    "A_h16":        (None, None, None, 16,   32,   32,   None,  None,  None,    4.91, 25.8, None),
    "A_h32":        (None, None, None, 32,   16,   16,   None,  None,  None,    5.01, 25.4, None),
    "B_dk16":       (None, None, None, None, 16,   None, None,  None,  None,    5.16, 25.1, 58),
    "B_dk32":       (None, None, None, None, 32,   None, None,  None,  None,    5.01, 25.4, 60),
    "C_N2":         (2,    None, None, None, None, None, None,  None,  None,    6.11, 23.7, 36),
    "C_N4":         (4,    None, None, None, None, None, None,  None,  None,    5.19, 25.3, 50),
    "C_N8":         (8,    None, None, None, None, None, None,  None,  None,    4.88, 25.5, 80),
    "C_dmodel256":  (None, 256,  None, None, 32,   32,   None,  None,  None,    5.75, 24.5, 28),
    "C_dmodel1024": (None, 1024, None, None, 128,  128,  None,  None,  None,    4.66, 26.0, 168),
    "C_dff1024":    (None, None, 1024, None, None, None, None,  None,  None,    5.12, 25.4, 53),
    "C_dff4096":    (None, None, 4096, None, None, None, None,  None,  None,    4.75, 26.2, 90),
    "D_pdrop0":     (None, None, None, None, None, None, 0.0,   None,  None,    5.77, 24.6, None),
    "D_pdrop02":    (None, None, None, None, None, None, 0.2,   None,  None,    4.95, 25.5, None),
    "D_ls0":        (None, None, None, None, None, None, None,  0.0,   None,    4.67, 25.3, None),
    "D_ls02":       (None, None, None, None, None, None, None,  0.2,   None,    5.47, 25.7, None),
    "E_learned_pe": (None, None, None, None, None, None, None,  None,  None,    4.92, 25.7, None),
    "big":          (6,    1024, 4096, 16,   None, None, 0.3,   None,  300_000, 4.33, 26.4, 213),
}
FIELDS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "train_steps", "ppl",
          "bleu", "params_m")
# tests/test_model.py: the paper's 168M (C d_model=1024) and 213M (big) cannot both hold.
PARAM_TOLERANCE_M = {"C_dmodel1024": 4.5}


@pytest.fixture(scope="module")
def table3():
  return sweep_rows.load_sweep(TABLE3)


def _cli(*args, timeout=120):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  return subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


# --- the sweep definitions --------------------------------------------------------------------

def test_table3_rows_and_the_papers_values(table3):
  assert sweep_rows.row_ids(table3) == list(PAPER)
  for row_id, values in PAPER.items():
    assert table3.rows[row_id].paper.to_dict() == dict(zip(FIELDS, values)), row_id


def test_table3_overrides_agree_with_the_papers_cells(table3):
  """Each row's hyperparameters (reference + overrides) are the paper's cell, or base's if blank."""
  base = dict(zip(FIELDS, PAPER["base"]))
  for row_id, values in PAPER.items():
    paper = dict(zip(FIELDS, values))
    ours = sweep_rows.paper_columns(table3, row_id)
    for col in FIELDS[:9]:
      assert ours[col] == (paper[col] if paper[col] is not None else base[col]), (row_id, col)
  assert table3.rows.E_learned_pe.overrides.model.pe_type == "learned"
  assert table3.rows.big.overrides.model.dropout_rate == 0.3


def test_cpu_scale_shrinks_widths_and_keeps_heads_layers_and_ratios(table3):
  rows = sweep_rows.resolve_all(table3, sweep_rows.row_ids(table3), "cpu")
  factor = table3.scales.cpu.dim_factor
  assert factor == 0.25
  for res in rows:
    paper, ours = res.paper_hparams, res.hparams
    for col in ("d_model", "d_k", "d_v", "d_ff"):
      assert ours[col] == paper[col] * factor, (res.row_id, col)
    for col in ("N", "h", "P_drop", "eps_ls"):
      assert ours[col] == paper[col], (res.row_id, col)
    assert ours["h"] * ours["d_k"] / ours["d_model"] == paper["h"] * paper["d_k"] / paper["d_model"]
    assert ours["train_steps"] == table3.scales.cpu.num_steps  # the same for every row, big too
    assert res.config.model.num_decoder_layers == ours["N"]
    assert res.config.data.local_corpus == "multi30k"
  base = rows[0].config
  assert (base.model.d_model, base.model.num_heads, base.model.d_k, base.model.d_ff) == (128, 8, 16, 512)
  assert rows[-1].config.model.pe_type == "sinusoidal"
  assert {r.row_id: r.config.model.pe_type for r in rows}["E_learned_pe"] == "learned"


def test_paper_scale_keeps_the_papers_steps_and_config(table3):
  base = sweep_rows.resolve(table3, "base", "paper")
  big = sweep_rows.resolve(table3, "big", "paper")
  assert base.config_spec == "configs/base.py" and base.overrides == []  # base.py is the paper's base
  assert base.config.train.num_steps == 100_000 and big.config.train.num_steps == 300_000
  assert big.config.model.dropout_rate == 0.3 and big.config.model.d_k == 64


def test_paper_scale_parameter_counts_match_the_paper(table3):
  table = {p["row"]: p for p in row_commands.paper_params_table(table3)}
  assert table["base"]["params"] == 63_045_632 and table["big"]["params"] == 214_171_648
  for row_id, p in table.items():
    reported = PAPER[row_id][-1] if PAPER[row_id][-1] is not None else PAPER["base"][-1]
    assert abs(p["params"] / 1e6 - reported) <= PARAM_TOLERANCE_M.get(row_id, 3.0), (row_id, p)


def test_grid_example_rows():
  grid = sweep_rows.load_sweep("experiments/grid_example.py")
  ids = sweep_rows.row_ids(grid)
  assert len(ids) == 17 and ids[0] == "base" and "h4_dk32_drop0p3_pelearned" in ids
  res = sweep_rows.resolve(grid, "h4_dk32_drop0p3_pelearned", "cpu")
  m = res.config.model
  assert (m.num_heads, m.d_k, m.d_v, m.dropout_rate, m.pe_type) == (4, 8, 8, 0.3, "learned")
  assert len(sweep_rows.resolve_all(grid, ids, "paper")) == 17


def test_printed_commands_reproduce_each_rows_config(table3):
  """The CLI's own config flags, given a row's printed overrides, rebuild the resolved config."""
  for res in sweep_rows.resolve_all(table3, sweep_rows.row_ids(table3), "cpu"):
    argv = ["prog", f"--config={os.path.join(REPO, res.config_spec)}", *res.overrides]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                    sys_argv=argv)
    fv(argv)
    assert fv.config.to_dict() == res.config.to_dict(), res.row_id


# --- bad input: one line, before anything runs --------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--config.model.num_head=4"], "unknown config key 'model.num_head' (did you mean 'num_heads'?)"),
    (["--config.trian.num_steps=4"], "unknown config key 'trian' (did you mean 'train'?)"),
    (["--config.train.num_steps=abc"], "config key 'train.num_steps' must be int, got 'abc'"),
    (["--config.model=4"], "config key 'model' is a section"),
])
def test_bad_overrides(args, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
    sweep_rows.parse_overrides(args)


def test_bad_sweep_scale_and_rows(table3, tmp_path):
  with pytest.raises(ConfigError, match="sweep file experiments/nope.py not found"):
    sweep_rows.load_sweep("experiments/nope.py")
  with pytest.raises(ConfigError, match="unknown scale 'laptop'; the sweep defines: cpu, paper"):
    sweep_rows.resolve(table3, "base", "laptop")
  with pytest.raises(ConfigError, match="--rows: no row matches 'bsae' \\(did you mean 'base'\\?\\); rows: base, A_h1,"):
    sweep_rows.select_rows(table3, "A_h1,bsae")
  assert sweep_rows.select_rows(table3, "C_N*,D") == ["C_N2", "C_N4", "C_N8", "D_pdrop0", "D_pdrop02",
                                                   "D_ls0", "D_ls02"]
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config():\n  return 3\n")
  with pytest.raises(ConfigError, match="must return an ml_collections.ConfigDict"):
    sweep_rows.load_sweep(str(bad))


def test_inconsistent_rows_are_named(table3):
  heads = sweep_rows.parse_overrides(["--config.model.num_heads=16"])
  with pytest.raises(ConfigError, match=r"row 'base' at scale 'cpu': h\*d_k = 16\*16 = 256 differs "
                                        r"from d_model=128"):
    sweep_rows.resolve_all(table3, sweep_rows.row_ids(table3), "cpu", heads)
  tp = sweep_rows.parse_overrides(["--config.mesh.tensor=8"])
  with pytest.raises(ConfigError, match="row 'A_h1' at scale 'paper': config key 'model.num_heads'=1 "
                                        "is not divisible by the tensor-parallel size mesh.tensor=8"):
    sweep_rows.resolve_all(table3, sweep_rows.row_ids(table3), "paper", tp)
  odd = sweep_rows.parse_overrides(["--config.model.d_model=130"])
  with pytest.raises(ConfigError, match="row 'base'.*differs from d_model=130"):
    sweep_rows.resolve(table3, "base", "cpu", odd)


def _write_sweep(tmp_path, rows_code):
  path = tmp_path / "my_sweep.py"
  path.write_text("from experiments import sweeps\n\ndef get_config():\n"
                  "  c = sweeps.new_sweep('mine')\n"
                  "  sweeps.add_row(c, 'base')\n" + rows_code + "  return c\n")
  return str(path)


def test_every_row_is_validated_before_anything_runs(tmp_path):
  """The last row is bad: the CLI prints one line naming it, exits 2, and creates nothing."""
  spec = _write_sweep(tmp_path, "  sweeps.add_row(c, 'wide', overrides={'model.n_heads': 4})\n")
  out = tmp_path / "out"
  result = _cli(f"--sweep={spec}", "--scale=cpu", f"--out={out}")
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      "error: row 'wide' at scale 'cpu': unknown config key 'model.n_heads' (did you mean "
      "'num_heads'?)"]
  assert not out.exists()
  spec = _write_sweep(tmp_path, "  sweeps.add_row(c, 'tiny_dk', overrides={'model.d_k': 2})\n")
  with pytest.raises(ConfigError, match=r"row 'tiny_dk' at scale 'cpu': model.d_k=2 x 0.25 = 0.5 "
                                        "is not a positive whole number"):
    sweep_rows.resolve_all(sweep_rows.load_sweep(spec), ["base", "tiny_dk"], "cpu")
  result = _cli("--sweep=experiments/nope.py", f"--out={out}")
  assert (result.returncode, result.stderr.strip()) == (2, "error: sweep file experiments/nope.py not found")
  result = _cli(f"--sweep={TABLE3}", f"--out={out}", "--config.train.num_step=3")
  assert result.returncode == 2 and result.stderr.strip() == (
      "error: unknown config key 'train.num_step' (did you mean 'num_steps'?) in --config.train.num_step")


# --- printed commands -------------------------------------------------------------------------

def test_dry_run_prints_the_commands_for_the_launch_scripts(tmp_path):
  out = tmp_path / "t3"
  script = tmp_path / "t3_slurm.sh"
  result = _cli(f"--sweep={TABLE3}", "--scale=paper", f"--out={out}", "--dry_run",
                "--launcher=slurm", f"--commands_file={script}", "--rows=base,A_h1,big")
  assert result.returncode == 0, result.stderr
  commands = [l for l in result.stdout.splitlines() if l and not l.startswith("#")]
  assert commands[:3] == [
      f"sbatch --job-name=tj-base launch/slurm.sbatch configs/base.py {out}/base",
      f"sbatch --job-name=tj-A_h1 launch/slurm.sbatch configs/base.py {out}/A_h1 "
      "--config.model.d_k=512 --config.model.d_v=512 --config.model.num_heads=1",
      f"sbatch --job-name=tj-big launch/slurm.sbatch configs/base.py {out}/big "
      "--config.model.d_ff=4096 --config.model.d_model=1024 --config.model.dropout_rate=0.3 "
      "--config.model.num_heads=16 --config.train.num_steps=300000"]
  assert commands[3] == (f"python -m experiments.run --sweep={TABLE3} --scale=paper --out={out} "
                         "--rows=base,A_h1,big --eval_only")
  assert sum(l.startswith("sbatch ") for l in script.read_text().splitlines()) == 3
  assert os.access(script, os.X_OK)
  assert not out.exists()
  # the printed sbatch line, given to the batch script's own dry run, runs the training CLI
  argv = commands[1].split()[2:]  # drop 'sbatch --job-name=...'
  env = dict(os.environ, SLURM_JOB_NUM_NODES="2")
  srun = subprocess.run(["bash", argv[0], "--dry-run", *argv[1:]], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=60)
  assert srun.returncode == 0, srun.stderr
  assert (f"python -m transformer_jax.main --config=configs/base.py --workdir={out}/A_h1 "
          "--config.model.d_k=512 --config.model.d_v=512 --config.model.num_heads=1") in srun.stdout

  result = _cli(f"--sweep={TABLE3}", "--scale=cpu", f"--out={out}", "--print_commands",
                "--launcher=tpu_vm", "--rows=E_learned_pe")
  line = [l for l in result.stdout.splitlines() if l.startswith("launch/")][0]
  assert line.startswith(f"launch/tpu_vm.sh --name tj-e-learned-pe configs/multi30k.py "
                         f"{out}/E_learned_pe -- --config.data.tokens_per_batch=2048 ")
  assert "--config.model.pe_type=learned" in line and "--config.model.d_model=128" in line


# --- skip, resume, failures (a fake trainer and evaluator) --------------------------------------

class FakeCLI:
  """Stands in for the training and evaluation subprocesses, with their workdir semantics."""

  def __init__(self, fail=(), stop_at=None):
    self.fail, self.stop_at, self.calls = set(fail), dict(stop_at or {}), []

  @staticmethod
  def _arg(cmd, name):
    return next(a.split("=", 1)[1] for a in cmd if a.startswith(name + "="))

  def train(self, cmd, log_path, timeout_s):
    workdir = self._arg(cmd, "--workdir")
    row = os.path.basename(workdir)
    self.calls.append(("train", row))
    if row in self.fail:
      with open(log_path, "a") as f:
        f.write("Traceback ...\nerror: config key 'model.d_k' boom\n")
      return 2, row_runner.error_line(open(log_path).read(), 2)
    steps = int(self._arg(cmd, "--config.train.num_steps"))
    done = self.stop_at.pop(row, steps)  # an interrupted run stops early, exit 0 (as SIGTERM does)
    os.makedirs(os.path.join(workdir, "checkpoints", str(done)), exist_ok=True)
    os.makedirs(os.path.join(workdir, "vocab"), exist_ok=True)
    return 0, ""

  def evaluate(self, cmd, log_path, timeout_s):
    workdir = self._arg(cmd, "--eval_row")
    row = os.path.basename(workdir)
    self.calls.append(("eval", row))
    ppl = {"base": 10.0, "A_h1": 11.0, "C_N8": 12.0}.get(row, 9.0)
    with open(os.path.join(workdir, "eval.json"), "w") as f:
      json.dump({"step": 2, "dev_loss": 2.5, "dev_nll": 2.3, "dev_ppl": ppl, "bleu": 5.0,
                 "bleu_tokenized": 6.0, "bleu_sentences": 4, "params": 1000}, f)
    return 0, ""


def _run(table3, out, rows, fake, scale="tiny"):
  resolved = sweep_rows.resolve_all(table3, rows, scale)
  record = run_lib._sweep_record(table3, scale, rows, {}, "", ["run"], with_params=False)
  return row_runner.run_sweep(resolved, str(out), record, trainer=fake.train,
                           evaluator=fake.evaluate, log=lambda *_: None)


def test_skip_resume_and_failure_recording(table3, tmp_path):
  out = tmp_path / "sweep"
  rows = ["base", "A_h1", "C_N8"]
  fake = FakeCLI(fail={"A_h1"}, stop_at={"C_N8": 1})
  results = _run(table3, out, rows, fake)
  assert [r["status"] for r in results] == ["done", "failed", "unfinished"]
  failed = json.load(open(out / "A_h1" / "result.json"))
  assert failed["error"] == "config key 'model.d_k' boom" and failed["stage"] == "train"
  assert "rerun to resume" in results[2]["error"] and results[2]["steps"] == 1
  assert fake.calls == [("train", "base"), ("eval", "base"), ("train", "A_h1"), ("train", "C_N8")]
  assert os.path.isdir(out / "_vocab")  # the first finished row's vocabulary, for the others
  # rerun: the finished row is skipped; the failed one retried; the unfinished one resumed
  fake.fail.clear()
  fake.calls.clear()
  results = _run(table3, out, rows, fake)
  assert [r["status"] for r in results] == ["done"] * 3
  assert fake.calls == [("train", "A_h1"), ("eval", "A_h1"), ("train", "C_N8"), ("eval", "C_N8")]
  timing = json.load(open(out / "C_N8" / "timing.json"))
  assert timing["train_attempts"] == 2 and results[2]["train_attempts"] == 2
  fake.calls.clear()
  _run(table3, out, rows, fake)
  assert fake.calls == []
  # eval_only: rows trained elsewhere are evaluated; untrained ones are reported, not trained
  resolved = sweep_rows.resolve_all(table3, ["A_h4"], "tiny")
  result = row_runner.run_row(resolved[0], str(out), trainer=fake.train, evaluator=fake.evaluate,
                           eval_only=True, log=lambda *_: None)
  assert result["status"] == "unfinished" and "not trained yet" in result["error"]
  assert fake.calls == []


def test_subprocess_runner_reports_errors_and_timeouts(tmp_path):
  log = str(tmp_path / "row.log")
  fail = [sys.executable, "-c", "import sys; print('step 1'); print('error: bad thing', file=sys.stderr); sys.exit(2)"]
  assert row_runner.subprocess_runner(fail, log) == (2, "bad thing")
  slow = [sys.executable, "-c", "import time; time.sleep(60)"]
  rc, error = row_runner.subprocess_runner(slow, log, timeout_s=0.5)
  assert rc == 1 and error.startswith("timed out after") and "rerun to resume" in error
  assert open(log).read().count("# ") == 2  # each command is logged before its output


def test_error_line_picks_the_reason():
  assert row_runner.error_line("x\nerror: bad key\nmore\n", 2) == "bad key"
  assert row_runner.error_line("Traceback\n  File x\nValueError: boom\nI0 log\n", 1) == "ValueError: boom"
  assert row_runner.error_line("killed\n", -9) == "killed (exit status -9)"


# --- the report -------------------------------------------------------------------------------

def test_report_from_synthetic_results(table3, tmp_path):
  out = tmp_path / "rep"
  rows = sweep_rows.row_ids(table3)
  record = run_lib._sweep_record(table3, "cpu", rows, {}, "", ["run"], with_params=False)
  for r in record["rows"]:  # as the paper, except the one known mismatch
    reported = r["paper"]["params_m"] or 65
    r["paper_scale_params"] = 163_815_424 if r["row"] == "C_dmodel1024" else reported * 1_000_000
  os.makedirs(out)
  with open(out / "sweep.json", "w") as f:
    json.dump(record, f)
  ours = {"base": (10.0, 20.0), "A_h1": (11.0, 18.0),        # paper: PPL up, BLEU down: same
          "C_N8": (10.5, 21.0),                                # paper: PPL down: opposite; BLEU down: opposite
          "E_learned_pe": (10.2, 20.0)}                        # paper PPL unchanged; ours BLEU unchanged
  for row, (ppl, bleu) in ours.items():
    os.makedirs(out / row)
    res = sweep_rows.resolve(table3, row, "cpu")
    with open(out / row / "result.json", "w") as f:
      json.dump(dict(res.to_json(), status="done", error="", steps=300, params=3_791_872,
                     dev_loss=2.6, dev_nll=2.3, dev_ppl=ppl, bleu=bleu - 1, bleu_tokenized=bleu,
                     bleu_sentences=500, train_seconds=240.0, eval_seconds=30.0,
                     step_seconds=0.7), f)
  os.makedirs(out / "D_pdrop0")
  with open(out / "D_pdrop0" / "result.json", "w") as f:
    json.dump({"status": "failed", "error": "non-finite loss at step 7"}, f)
  result = _cli("--report", f"--out={out}", timeout=60)
  assert result.returncode == 0, result.stderr
  md = (out / "table3_cpu.md").read_text()
  assert ("| row | N | d_model | d_ff | h | d_k | d_v | P_drop | ε_ls | train steps | PPL paper | "
          "PPL ours | BLEU paper | BLEU ours |") in md
  assert "| base | 6 | 512 | 2048 | 8 | 64 | 64 | 0.1 | 0.1 | 100K | 4.92 | 10.00 | 25.8 | 20.0 | 65 | 65.0 |" in md
  assert "| (A) h=1, d_k=d_v=512 |  |  |  | 1 | 512 | 512 |" in md
  assert "+0.37 / +1.00 ✓ | -0.90 / -2.00 ✓ |" in md
  assert "-0.04 / +0.50 ✗ | -0.30 / +1.00 ✗ |" in md
  assert "+0.00 / +0.20 (paper: =) | -0.10 / +0.00 ✗ |" in md
  assert "- PPL: moved in the paper's direction in 1 of 2 rows" in md
  assert "- BLEU: moved in the paper's direction in 1 of 3 rows" in md
  assert "D_pdrop0 (failed: non-finite loss at step 7)" in md
  assert "except (C) d_model=1024, d_k=d_v=128 (163.8M vs 168M)" in md
  data = json.load(open(out / "table3_cpu.json"))
  by_row = {r["row"]: r for r in data["rows"]}
  assert len(data["rows"]) == 20 and by_row["A_h1"]["ppl_direction"] == "same"
  assert by_row["C_N8"]["bleu_direction"] == "opposite"
  assert by_row["A_h4"]["status"] == "not run"
  csv_lines = (out / "table3_cpu.csv").read_text().strip().splitlines()
  assert len(csv_lines) == 21 and csv_lines[0].startswith("row,label,group,status,error,paper_N")
  assert (out / "table3_cpu.png").stat().st_size > 10_000


def test_direction():
  assert sweep_report.direction(5.29, 4.92, 11.0, 10.0) == "same"
  assert sweep_report.direction(4.88, 4.92, 11.0, 10.0) == "opposite"
  assert sweep_report.direction(4.92, 4.92, 11.0, 10.0) == "paper: ="
  assert sweep_report.direction(5.29, 4.92, 10.0, 10.0) == "ours: ="
  assert sweep_report.direction(5.29, 4.92, None, 10.0) == ""


# --- a real run: 2 training steps of a tiny model, evaluated --------------------------------------

@requires_data
def test_tiny_real_row_trains_evaluates_and_is_skipped_on_rerun(tmp_path):
  out = tmp_path / "real"
  args = (f"--sweep={TABLE3}", "--scale=tiny", f"--out={out}", "--rows=B_dk16",
          "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1")
  os.environ.setdefault("TRANSFORMER_JAX_DATA_DIR", DATA_DIR)
  result = _cli(*args, timeout=300)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  res = json.load(open(out / "B_dk16" / "result.json"))
  assert res["status"] == "done" and res["steps"] == 2
  assert res["hparams"]["d_k"] == 1 and res["hparams"]["d_v"] == 4  # 16/16 and 64/16
  assert res["dev_ppl"] > 1 and abs(res["dev_ppl"] - 2.718281828 ** res["dev_nll"]) < 1e-6 * res["dev_ppl"]
  assert res["dev_loss"] > 0 and res["bleu_sentences"] == 4 and res["params"] > 0
  assert res["beam_size"] == 2 and os.path.exists(out / "table3_tiny.md")
  rerun = _cli(*args, timeout=120)
  assert rerun.returncode == 0 and "B_dk16: done earlier, skipped" in rerun.stdout
