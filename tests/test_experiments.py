"""The sweep runner (experiments/): the Table 3 sweep and its paper values, scales, seeds and
protocols, up-front validation, printed commands for the three launchers, result files and the
skip/resume/retry bookkeeping around the training and evaluation CLIs, the verdicts and the
report, and a 2-step real run.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from experiments import report, results_files, run, sweeps
from tests.common import DATA_DIR, requires_data, table_row
from transformer_jax.config import ConfigError
from transformer_jax.overrides import parse_overrides

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
  return sweeps.load_sweep(TABLE3)


def _cli(*args, timeout=120):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  return subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _one_line_error(result) -> str:
  assert result.returncode == 2, (result.stdout, result.stderr)
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
  return lines[0]


# --- the sweep definitions, resolved ------------------------------------------------------------

def test_table3_rows_and_the_papers_values(table3):
  assert sweeps.row_ids(table3) == list(PAPER)
  for row_id, values in PAPER.items():
    assert table3.rows[row_id].paper.to_dict() == dict(zip(FIELDS, values)), row_id


def test_table3_overrides_agree_with_the_paperstable_row(table3):
  """Each row's hyperparameters (reference + overrides) are the paper's cell, or base's if blank."""
  base = dict(zip(FIELDS, PAPER["base"]))
  for row_id, values in PAPER.items():
    paper = dict(zip(FIELDS, values))
    ours = sweeps.paper_columns(table3, row_id)
    for col in FIELDS[:9]:
      assert ours[col] == (paper[col] if paper[col] is not None else base[col]), (row_id, col)
  assert table3.rows.E_learned_pe.overrides.model.pe_type == "learned"


def test_scales_shrink_widths_and_keep_heads_layers_and_ratios(table3):
  for scale in ("cpu", "tiny"):
    factor = table3.scales[scale].dim_factor
    for res in sweeps.resolve_all(table3, sweeps.row_ids(table3), scale):
      paper, ours = res.paper_hparams, res.hparams
      for col in ("d_model", "d_k", "d_v", "d_ff"):
        assert ours[col] == paper[col] * factor, (scale, res.row_id, col)
      for col in ("N", "h", "P_drop", "eps_ls"):
        assert ours[col] == paper[col], (scale, res.row_id, col)
      assert ours["train_steps"] == table3.scales[scale].num_steps  # every row, big too
      assert res.config.model.num_decoder_layers == ours["N"]
      assert res.bleu_sentences == table3.scales[scale].bleu_sentences
  base = sweeps.resolve(table3, "base", "cpu").config
  d = 512 * sweeps.CPU["dim_factor"]
  assert (base.model.d_model, base.model.num_heads, base.model.d_k, base.model.d_ff) == (d, 8, d / 8, 4 * d)
  assert (base.data.local_corpus, base.data.tokens_per_batch) == ("multi30k", sweeps.CPU["tokens_per_batch"])
  assert (base.train.warmup_steps, base.train.learning_rate_scale) == (
      sweeps.CPU["warmup_steps"], sweeps.CPU["learning_rate_scale"])
  assert base.train.max_eval_batches == 0  # the convergence curve is on the whole dev split
  assert table3.scales.cpu.seeds == list(sweeps.CPU["seeds"]) and len(table3.scales.cpu.base_seeds) >= 3
  assert sweeps.resolve(table3, "E_learned_pe", "tiny").config.model.pe_type == "learned"


def test_paper_scale_keeps_the_papers_steps_and_config(table3):
  base = sweeps.resolve(table3, "base", "paper")
  big = sweeps.resolve(table3, "big", "paper")
  assert base.config_spec == "configs/base.py" and base.overrides == []  # base.py is the paper's base
  assert base.config.train.num_steps == 100_000 and big.config.train.num_steps == 300_000
  assert big.config.model.dropout_rate == 0.3 and big.config.model.d_k == 64
  tpu = sweeps.resolve(table3, "base", "paper", base_config="configs/tpu.py")
  assert tpu.config_spec == "configs/tpu.py"


def test_paper_scale_parameter_counts_match_the_paper(table3):
  table = {p["row"]: p for p in report.paper_params_table(table3)}
  assert table["base"]["params"] == 63_045_632 and table["big"]["params"] == 214_171_648
  for row_id, p in table.items():
    reported = PAPER[row_id][-1] if PAPER[row_id][-1] is not None else PAPER["base"][-1]
    assert abs(p["params"] / 1e6 - reported) <= PARAM_TOLERANCE_M.get(row_id, 3.0), (row_id, p)


def test_grid_example_rows():
  grid = sweeps.load_sweep("experiments/grid_example.py")
  ids = sweeps.row_ids(grid)
  assert len(ids) == 17 and ids[0] == "base" and "h4_dk32_drop0p3_pelearned" in ids
  m = sweeps.resolve(grid, "h4_dk32_drop0p3_pelearned", "cpu").config.model
  dk = round(32 * sweeps.CPU["dim_factor"])  # d_k 32 in paper units, scaled as every width
  assert (m.num_heads, m.d_k, m.d_v, m.dropout_rate, m.pe_type) == (4, dk, dk, 0.3, "learned")
  assert len(sweeps.resolve_all(grid, ids, "paper")) == 17


def test_pilot_scales():
  pilot = sweeps.load_sweep("experiments/table3_pilot.py")
  for scale, d_model in (("pilot_w4", 128), ("pilot_w8", 64)):
    res = sweeps.resolve(pilot, "C_N2", scale)
    assert (res.config.model.d_model, res.config.model.num_encoder_layers) == (d_model, 2)
    assert res.config.train.num_steps == 3000 and res.config.train.eval_every_steps == 200


def test_printed_overrides_reproduce_each_rows_config(table3):
  """The training CLI's own config flags, given a row's overrides, rebuild the resolved config."""
  for res in sweeps.resolve_all(table3, sweeps.row_ids(table3), "cpu"):
    argv = ["prog", f"--config={os.path.join(REPO, res.config_spec)}", *res.overrides]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                    sys_argv=argv)
    fv(argv)
    assert fv.config.to_dict() == res.config.to_dict(), res.row_id


def test_select_rows(table3):
  assert sweeps.select_rows(table3, "C_N*,D") == ["C_N2", "C_N4", "C_N8", "D_pdrop0", "D_pdrop02",
                                                  "D_ls0", "D_ls02"]
  assert sweeps.select_rows(table3, "big, base") == ["base", "big"]  # the sweep's order
  assert sweeps.select_rows(table3, "") == sweeps.row_ids(table3)


# --- bad input: one line, before anything runs --------------------------------------------------

def test_unknown_rows_scales_and_files(table3, tmp_path):
  with pytest.raises(ConfigError, match=r"--rows: no row matches 'bsae' \(did you mean 'base'\?\); "
                                        r"rows: base, A_h1,"):
    sweeps.select_rows(table3, "A_h1,bsae")
  with pytest.raises(ConfigError, match=r"unknown scale 'cpuu' \(did you mean 'cpu'\?\); the sweep "
                                        r"defines: .*tiny"):
    sweeps.resolve(table3, "base", "cpuu")
  with pytest.raises(ConfigError, match=r"unknown row 'bgi' \(did you mean 'big'\?\)"):
    sweeps.resolve(table3, "bgi", "cpu")
  with pytest.raises(ConfigError, match="sweep file experiments/nope.py not found"):
    sweeps.load_sweep("experiments/nope.py")
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config():\n  return 3\n")
  with pytest.raises(ConfigError, match="must return an ml_collections.ConfigDict"):
    sweeps.load_sweep(str(bad))
  out = tmp_path / "out"
  assert "no row matches 'bsae' (did you mean 'base'?)" in _one_line_error(
      _cli(f"--sweep={TABLE3}", f"--out={out}", "--rows=bsae"))
  assert "unknown scale 'cpuu' (did you mean 'cpu'?)" in _one_line_error(
      _cli(f"--sweep={TABLE3}", f"--out={out}", "--scale=cpuu"))
  assert _one_line_error(_cli(f"--sweep={TABLE3}", f"--out={out}", "--no_such_flag")).startswith(
      "error: Unknown command line flag 'no_such_flag'")
  assert not out.exists()


def test_inconsistent_rows_are_named(table3):
  heads = parse_overrides(["--config.model.num_heads=16"])
  d_model = round(512 * sweeps.CPU["dim_factor"])
  dk = d_model // 8
  with pytest.raises(ConfigError, match=rf"row 'base' at scale 'cpu': h\*d_k = 16\*{dk} = {16 * dk} "
                                        rf"differs from d_model={d_model}"):
    sweeps.resolve_all(table3, sweeps.row_ids(table3), "cpu", heads)
  tp = parse_overrides(["--config.mesh.tensor=8"])
  with pytest.raises(ConfigError, match="row 'A_h1' at scale 'paper': config key 'model.num_heads'=1 "
                                        "is not divisible by the tensor-parallel size mesh.tensor=8"):
    sweeps.resolve_all(table3, sweeps.row_ids(table3), "paper", tp)


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
  assert _one_line_error(_cli(f"--sweep={spec}", "--scale=cpu", f"--out={out}")) == (
      "error: row 'wide' at scale 'cpu': unknown config key 'model.n_heads' (did you mean "
      "'num_heads'?)")
  assert not out.exists()
  spec = _write_sweep(tmp_path, "  sweeps.add_row(c, 'tiny_dk', overrides={'model.d_k': 2})\n")
  f = sweeps.CPU["dim_factor"]
  with pytest.raises(ConfigError, match=rf"row 'tiny_dk' at scale 'cpu': model.d_k=2 x {f:g} = "
                                        rf"{2 * f:g} is not a positive whole number"):
    sweeps.resolve_all(sweeps.load_sweep(spec), ["base", "tiny_dk"], "cpu")
  error = _one_line_error(_cli(f"--sweep={TABLE3}", f"--out={out}", "--config.train.num_step=3"))
  assert "unknown config key 'train.num_step' (did you mean 'num_steps'?)" in error


def test_an_out_folder_holds_one_sweep_at_one_scale(tmp_path):
  out = tmp_path / "t3"
  out.mkdir()
  (out / "sweep.json").write_text(json.dumps({"sweep": "table3", "scale": "tiny", "rows": []}))
  error = _one_line_error(_cli(f"--sweep={TABLE3}", "--scale=cpu", f"--out={out}",
                               f"--results_dir={tmp_path / 'results'}"))
  assert "holds the sweep 'table3' at scale 'tiny'" in error and "another --out" in error
  assert sorted(os.listdir(out)) == ["sweep.json"]


# --- printed commands -------------------------------------------------------------------------

def _dry_run(table3, out, launcher, rows, *extra):
  """(per-run commands, the follow-up command, the rows resolved here) of a --dry_run."""
  result = _cli(f"--sweep={TABLE3}", "--scale=paper", f"--out={out}", "--dry_run",
                f"--launcher={launcher}", f"--rows={rows}", *extra)
  assert result.returncode == 0, result.stderr
  commands = [shlex.split(l) for l in result.stdout.splitlines() if l and not l.startswith("#")]
  user = parse_overrides([a for a in extra if a.startswith("--config.")])
  resolved = sweeps.resolve_all(table3, rows.split(","), "paper", user)
  return commands[:-1], commands[-1], resolved


def test_dry_run_local_one_command_per_row_and_seed(table3, tmp_path):
  out = tmp_path / "t3"
  commands, follow, resolved = _dry_run(table3, out, "local", "base,A_h1", "--seeds=0,1",
                                        "--base_seeds=0,1,2", "--config.train.warmup_steps=8000")
  runs = [(res, seed) for res in resolved for seed in ((0, 1, 2) if res.row_id == "base" else (0, 1))]
  for cmd, (res, seed) in zip(commands, runs, strict=True):
    assert cmd == ["python", "-m", "transformer_jax.main", "--config=configs/base.py",
                   f"--workdir={out}/{res.row_id}/seed{seed}", *res.overrides, f"--config.seed={seed}"]
    assert "--config.train.warmup_steps=8000" in cmd
  assert "--config.model.num_heads=1" in commands[3]
  assert follow[:3] == ["python", "-m", "experiments.run"] and "--eval_only" not in follow
  assert {"--rows=base,A_h1", "--scale=paper", f"--out={out}", "--seeds=0,1", "--base_seeds=0,1,2",
          "--config.train.warmup_steps=8000"} <= set(follow)
  assert not out.exists()


def test_dry_run_slurm(table3, tmp_path):
  out = tmp_path / "t3"
  script = tmp_path / "t3_slurm.sh"
  commands, follow, resolved = _dry_run(table3, out, "slurm", "base,A_h1,big",
                                        f"--commands_file={script}")
  for cmd, res in zip(commands, resolved, strict=True):  # the paper scale: one seed per row
    assert cmd == ["sbatch", f"--job-name=tj-{res.row_id}-seed0", "launch/slurm.sbatch",
                   "configs/base.py", f"{out}/{res.row_id}/seed0", *res.overrides, "--config.seed=0"]
  assert "--config.train.num_steps=300000" in commands[2]
  assert "--eval_only" in follow and "--rows=base,A_h1,big" in follow
  assert [shlex.split(l) for l in script.read_text().splitlines()
          if l.startswith("sbatch ")] == commands and os.access(script, os.X_OK)
  assert not out.exists()
  # the printed sbatch line, given to the batch script's own dry run, runs the training CLI
  env = dict(os.environ, SLURM_JOB_NUM_NODES="2")
  srun = subprocess.run(["bash", *commands[1][2:3], "--dry-run", *commands[1][3:]], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=60)
  assert srun.returncode == 0, srun.stderr
  assert shlex.join(["python", "-m", "transformer_jax.main", "--config=configs/base.py",
                     f"--workdir={out}/A_h1/seed0", *resolved[1].overrides, "--config.seed=0"]) in srun.stdout


def test_dry_run_tpu_vm(table3, tmp_path):
  out = tmp_path / "t3"
  commands, follow, resolved = _dry_run(table3, out, "tpu_vm", "A_h1,E_learned_pe", "--seeds=3")
  for cmd, res, name in zip(commands, resolved, ("tj-a-h1-seed3", "tj-e-learned-pe-seed3"), strict=True):
    assert cmd == ["launch/tpu_vm.sh", "--name", name, "configs/base.py", f"{out}/{res.row_id}/seed3",
                   "--", *res.overrides, "--config.seed=3"]
  assert "--config.model.pe_type=learned" in commands[1] and "--eval_only" in follow


# --- seeds and protocols: bad input is one line, nothing written ------------------------------

def test_seed_lists():
  assert sweeps.parse_seeds("0,1, 2", "--seeds") == [0, 1, 2]
  for text, why in (("", "the seed list is empty"), (" , ", "the seed list is empty"),
                    ("0,-1", "'-1' is not a seed"), ("1.5", "'1.5' is not a seed"),
                    ("0,x", "'x' is not a seed"), ("1,1", "seed 1 is listed twice")):
    with pytest.raises(ConfigError, match=why):
      sweeps.parse_seeds(text, "--seeds")


def test_bad_seeds_on_the_command_line(tmp_path):
  out, results = tmp_path / "out", tmp_path / "results"
  for flag, text in (("--seeds=", "--seeds: the seed list is empty"),
                     ("--base_seeds=0,-2", "--base_seeds=0,-2: '-2' is not a seed"),
                     ("--config.seed=4", "use --seeds=0,1 and --base_seeds=0,1,2")):
    assert text in _one_line_error(_cli(f"--sweep={TABLE3}", "--scale=tiny", f"--out={out}",
                                        f"--results_dir={results}", flag))
  assert not out.exists() and not results.exists()


# --- skip, resume, retry (the subprocesses faked, the evaluation through its file contract) ----

REFERENCES = ["Ein Hund läuft im Park .", "Zwei Männer spielen Fußball .",
              "Eine Frau liest ein Buch .", "Kinder spielen am Strand ."]


class FakeCLI:
  """Stands in for the training and evaluation CLIs, with their workdir semantics: training (with
  --config.seed) leaves checkpoints/<step>, vocab/ and metrics.jsonl (train and dev rows);
  evaluation writes eval/validation_step<step>.{json,jsonl}. `scores`: (row, seed) -> (dev PPL,
  tokenized BLEU); `fail`, `fail_eval`: (row, seed) pairs; `stop_at`: (row, seed) -> step."""

  def __init__(self, fail=(), fail_eval=(), stop_at=None, scores=None):
    self.fail, self.fail_eval = set(fail), set(fail_eval)
    self.stop_at, self.scores, self.calls = dict(stop_at or {}), dict(scores or {}), []

  @staticmethod
  def _arg(cmd, name):
    return next(a.split("=", 1)[1] for a in cmd if a.startswith(name + "="))

  def __call__(self, cmd, log_path, timeout_s):
    workdir = self._arg(cmd, "--workdir")
    key = (os.path.basename(os.path.dirname(workdir)), int(os.path.basename(workdir)[len("seed"):]))
    if "--mode=eval" in cmd:
      return self._evaluate(cmd, workdir, key)
    assert int(self._arg(cmd, "--config.seed")) == key[1]
    self.calls.append(("train", *key))
    if key in self.fail:
      with open(log_path, "a") as f:
        f.write("Traceback ...\nerror: config key 'model.d_k' boom\n")
      return 2, run.error_line(open(log_path).read(), 2)
    steps = int(self._arg(cmd, "--config.train.num_steps"))
    done = self.stop_at.pop(key, steps)  # an interrupted run stops early, exit 0 (as SIGTERM does)
    os.makedirs(os.path.join(workdir, "checkpoints", str(done)), exist_ok=True)
    os.makedirs(os.path.join(workdir, "vocab"), exist_ok=True)
    with open(os.path.join(workdir, "vocab", "spm.model"), "wb") as f:
      f.write(b"vocabulary")
    ppl = self.scores.get(key, (9.0, 5.0))[0]
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
      for step in range(1, done + 1):
        f.write(json.dumps({"step": step, "split": "train", "loss": 3.0, "step_time": 0.5,
                            "tokens_per_second": 100.0}) + "\n")
        f.write(json.dumps({"step": step, "split": "dev", "perplexity": ppl * (1 + (done - step) / 4)}) + "\n")
    return 0, ""

  def _evaluate(self, cmd, workdir, key):
    assert cmd[1:] == ["-m", "transformer_jax.main", "--mode=eval", f"--workdir={workdir}",
                       "--split=validation", cmd[-1]]
    self.calls.append(("eval", *key))
    if key in self.fail_eval:
      return 1, "RuntimeError: out of memory"
    step = run.latest_step(workdir)
    ppl, bleu = self.scores.get(key, (9.0, 5.0))
    stem = os.path.join(workdir, "eval", f"validation_step{step}")
    os.makedirs(os.path.dirname(stem), exist_ok=True)
    with open(stem + ".json", "w") as f:
      json.dump({"loss": 2.5, "nll": 2.2, "perplexity": ppl, "tokens": 1000, "sacrebleu": bleu - 1,
                 "sacrebleu_signature": "nrefs:1|...", "chrf": 30.0, "tokenized_bleu": bleu,
                 "sentences": 4, "step": step, "split": "validation", "eval_seconds": 3.0,
                 "decode": {"beam_size": 2, "alpha": 0.6, "max_extra_len": 4, "batch_size": 8}}, f)
    words = "Ein Hund läuft".split()[:1 + int(bleu) % 3]  # systems that differ
    with open(stem + ".jsonl", "w") as f:
      for i, ref in enumerate(REFERENCES):
        hyp = ref if i < bleu / 10 else " ".join(words) + " ."
        f.write(json.dumps({"index": i, "source": "x", "reference": ref, "hypothesis": hyp}) + "\n")
    return 0, ""


def _run(table3, out, results, rows, fake, scale="tiny", seeds=(0, 1), base_seeds=(0, 1, 2),
         overrides=None, **kw):
  runs, protocols = run.plan(table3, scale, rows, overrides or {}, "", -1, list(seeds),
                             list(base_seeds), str(results))
  return run.run_sweep(runs, str(out), str(results), protocols, runner=fake, log=lambda *_: None,
                       **kw)


def _files(folder):
  """{name: (mtime_ns, contents)} of a folder's files."""
  return {n: (os.stat(folder / n).st_mtime_ns, (folder / n).read_bytes()) for n in os.listdir(folder)}


def test_rerun_skips_finished_runs_resumes_and_retries(table3, tmp_path):
  out, results = tmp_path / "sweep", tmp_path / "results"
  rows = ["base", "A_h1", "C_N8"]
  fake = FakeCLI(fail={("A_h1", 1)}, fail_eval={("C_N8", 0)}, stop_at={("base", 2): 1})
  states = _run(table3, out, results, rows, fake)
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
  assert res["protocol"] == sweeps.protocol(sweeps.resolve(table3, "base", "tiny"), table3)
  assert res["protocol"]["num_steps"] == 2 and res["protocol"]["bleu_sentences"] == 4
  assert len(res["hypotheses"]) == 4 and res["params"] > 0 and res["step_seconds"] == 0.5
  assert res["machine"]["cores"] == os.cpu_count() and "--config.seed=1" in res["commands"]["train"]
  assert os.path.isdir(out / "_vocab")  # the first trained vocabulary, shared by all runs
  before = _files(results)
  # rerun: finished runs skipped, failed ones retried (A_h1 seed 1: trained; C_N8 seed 0: only
  # evaluated again), the unfinished one resumed
  fake.fail.clear()
  fake.fail_eval.clear()
  fake.calls.clear()
  states = _run(table3, out, results, rows, fake)
  assert [s["status"] for s in states] == ["done"] * 7
  assert fake.calls == [("train", "base", 2), ("eval", "base", 2), ("train", "A_h1", 1),
                        ("eval", "A_h1", 1), ("eval", "C_N8", 0)]
  assert json.load(open(out / "base" / "seed2" / "timing.json"))["train_attempts"] == 2
  after = _files(results)
  assert {n: after[n] for n in before} == before  # nothing finished was rewritten
  assert len(after) == len(before) + 3
  # a fresh clone: OUT is gone, the committed result files resume the sweep; nothing runs
  shutil.rmtree(out)
  fake.calls.clear()
  states = _run(table3, out, results, rows, fake)
  assert fake.calls == [] and [s["status"] for s in states] == ["done"] * 7
  assert _files(results) == after
  # eval_only: runs trained elsewhere are evaluated; untrained ones are reported, not trained
  states = _run(table3, out, results, ["A_h4"], fake, eval_only=True, seeds=(0,))
  assert states[0]["status"] == "unfinished" and "not trained yet" in states[0]["error"]
  assert fake.calls == []


def test_results_of_another_protocol_or_row_stop_everything(table3, tmp_path):
  out, results = tmp_path / "sweep", tmp_path / "results"
  _run(table3, out, results, ["base"], FakeCLI(), base_seeds=(0,))
  before = _files(results)
  fake = FakeCLI()
  with pytest.raises(ConfigError, match=r"base_seed0.json comes from another protocol \(learning_rate_scale: "
                                        r"2.0 there, 0.5 now\)"):
    _run(table3, out, results, ["base", "A_h1"], fake,
         overrides=parse_overrides(["--config.train.learning_rate_scale=0.5"]))
  error = _one_line_error(_cli(f"--sweep={TABLE3}", "--scale=tiny", f"--out={out}",
                               f"--results_dir={results}", "--config.train.num_steps=3"))
  assert error.startswith(f"error: {results}/base_seed0.json comes from another protocol "
                          "(num_steps: 2 there, 3 now)")
  assert fake.calls == [] and _files(results) == before
  (results / "nope_seed0.json").write_text("{}")
  with pytest.raises(ConfigError, match="nope_seed0.json: row 'nope' is not a row of the sweep 'table3'"):
    _run(table3, out, results, ["base"], fake)


def test_subprocess_runner_reports_errors_and_timeouts(tmp_path):
  log = str(tmp_path / "row.log")
  fail = [sys.executable, "-c", "import sys; print('step 1'); print('error: bad thing', file=sys.stderr); sys.exit(2)"]
  assert run.subprocess_runner(fail, log) == (2, "bad thing")
  slow = [sys.executable, "-c", "import time; time.sleep(60)"]
  rc, error = run.subprocess_runner(slow, log, timeout_s=0.5)
  assert rc == 1 and error.startswith("timed out after") and "rerun to resume" in error
  assert open(log).read().count("\n# ") == 2  # each command is logged before its output


def test_error_line_picks_the_reason():
  assert run.error_line("x\nerror: bad key\nmore\n", 2) == "bad key"
  assert run.error_line("Traceback\n  File x\nValueError: boom\nI0 log\n", 1) == "ValueError: boom"
  assert run.error_line("killed\n", -9) == "killed (exit status -9)"


def test_last_quarter_change():
  assert results_files.last_quarter_change([[100, 20.0], [200, 12.0], [300, 10.0], [400, 9.5]]) == {
      "from_step": 300, "to_step": 400, "relative_change": -0.05}
  assert results_files.last_quarter_change([[400, 9.5]]) is None
  assert results_files.last_quarter_change([[390, 9.6], [400, 9.5]]) is None  # no point at or before 3/4


# --- verdicts ---------------------------------------------------------------------------------

def test_verdicts_on_synthetic_results():
  base = [10.0, 10.1, 10.2]                                      # range 0.2
  assert report.verdict("+", [10.5, 10.7], base) == pytest.approx({"delta": 0.5, "noise": 0.2, "verdict": "✓"})
  assert report.verdict("-", [10.5, 10.7], base)["verdict"] == "✗"   # beyond the noise, other way
  assert report.verdict("+", [10.15, 10.25], base)["verdict"] == "="  # +0.1 within 0.2
  assert report.verdict("-", [9.0, 10.0], base)["verdict"] == "="     # -0.6, but the row's range is 1.0
  assert report.verdict("=", [10.5, 10.6], base)["verdict"] == "✗"    # the paper's unchanged row moved
  assert report.verdict("=", [10.1, 10.2], base)["verdict"] == "= ✓"
  assert report.verdict(None, [10.5, 10.7], base)["verdict"] == ""
  assert report.verdict("+", [], base) == {"delta": None, "noise": None, "verdict": ""}
  bleu_base = [20.0, 20.5, 19.8]
  assert report.verdict("-", [18.0, 18.4], bleu_base)["verdict"] == "✓"  # BLEU down, as the paper's
  assert report.verdict("+", [18.0, 18.4], bleu_base)["verdict"] == "✗"
  assert report.verdict("+", [10.3], [10.0])["verdict"] == "✓"            # one seed each: no spread
  assert report.expectation(5.12, 4.92, report.PPL_CLEAR) == "+"          # 0.2 at printed precision
  assert report.expectation(4.75, 4.92, report.PPL_CLEAR) == "="
  assert report.expectation(25.5, 25.8, report.BLEU_CLEAR) == "-"
  assert report.expectation(None, 4.92, report.PPL_CLEAR) is None


def test_clear_and_unchanged_rows_of_table3(table3):
  assert report.clear_rows(table3) == ["A_h1", "B_dk16", "C_N2", "C_N4", "C_dmodel256",
                                       "C_dmodel1024", "C_dff1024", "D_pdrop0", "D_ls0", "D_ls02", "big"]
  assert report.paper_unchanged(table3) == ["A_h16", "E_learned_pe"]


# --- the report -------------------------------------------------------------------------------

def test_report_of_a_partial_sweep(table3, tmp_path):
  out, results = tmp_path / "sweep", tmp_path / "t3_tiny"
  scores = {("base", 0): (10.0, 20.0), ("base", 1): (10.1, 20.5), ("base", 2): (9.9, 19.5),
            ("A_h1", 0): (11.0, 18.0), ("A_h1", 1): (11.2, 18.4),
            ("C_N8", 0): (10.05, 20.1), ("C_N8", 1): (10.15, 20.3),
            ("E_learned_pe", 0): (10.6, 20.0), ("E_learned_pe", 1): (10.8, 20.2),
            ("D_ls0", 0): (9.0, 21.0)}
  fake = FakeCLI(fail={("D_ls0", 1)}, scores=scores)
  _run(table3, out, results, ["base", "A_h1", "C_N8", "E_learned_pe", "D_ls0"], fake)
  (tmp_path / "t3_tiny_reading.md").write_text("Our reading: the tiny scale says nothing.\n")
  result = _cli("--report", f"--sweep={TABLE3}", "--scale=tiny", "--seeds=0,1", "--base_seeds=0,1,2",
                f"--results_dir={results}", f"--out={out}", timeout=120)
  assert result.returncode == 0, result.stderr
  md = (tmp_path / "t3_tiny.md").read_text()
  head = table_row(md, "row")
  row = lambda label: dict(zip(head, table_row(md, label)))  # noqa: E731
  base, a_h1 = row("base"), row("(A) h=1, d_k=d_v=512")
  assert (base["PPL paper"], base["PPL ours"], base["BLEU ours"]) == ("4.92", "10.00 (9.90–10.10, n=3)",
                                                                    "20.0 (19.5–20.5, n=3)")
  assert (base["params ×10⁶ paper"], base["params ×10⁶ at paper scale"]) == ("65", "63.0")
  assert a_h1["ΔPPL vs base"] == "+0.37 / +1.10 (noise 0.20)" and a_h1["PPL"] == "✓"
  assert a_h1["ΔBLEU vs base"] == "-0.90 / -1.80 (noise 1.00)" and a_h1["BLEU"] == "✓"
  assert 0 <= float(a_h1["p (BLEU)"]) <= 1
  c_n8 = row("(C) N=8")  # the paper: -0.04 PPL (small), -0.3 BLEU (clear)
  assert (c_n8["PPL"], c_n8["BLEU"]) == ("= ✓", "=")
  e = row("(E) positional embedding instead of sinusoids")
  assert (e["PPL"], e["BLEU"]) == ("✗", "= ✓")
  d_ls0 = row("(D) eps_ls=0.0")
  assert d_ls0["PPL ours"] == "9.00 (9.00–9.00, n=1 of 2)" and d_ls0["PPL"] == "pending"
  assert row("(A) h=4, d_k=d_v=128")["PPL ours"] == "pending"
  assert ("- PPL: 1 of 11 clear rows (the paper's |ΔPPL| ≥ 0.2) move in the paper's direction beyond "
          "the seed spread; 0 move the other way beyond it, 0 stay within it, 10 pending.") in md
  assert ("(E) positional embedding instead of sinusoids: ✗ (ours +0.70, noise 0.20)") in md
  assert "- Base over seeds 0, 1, 2: dev PPL 10.00 (9.90–10.10, range 0.20)" in md
  assert "D_ls0 seed 1: failed: config key 'model.d_k' boom" in md
  assert "- Runs finished: 10 of 41 (row × seed); rows complete: 4 of 20." in md
  assert "- Command: `python -m experiments.run" not in md  # runs made in-process record none
  assert "by more than 3M in: (C) d_model=1024, d_k=d_v=128 (163.8M vs 168M)" in md
  ran = md[md.index("## What each row ran"):]
  head2 = table_row(ran, "row")
  base_run = dict(zip(head2, table_row(ran, "base")))
  assert (base_run["d_model"], base_run["h"], base_run["steps"], base_run["seeds"]) == ("32", "8", "2", "0,1,2 of 0,1,2")
  assert base_run["last quarter ΔPPL"] == "-20.0% (-20.0%–-20.0%)" and base_run["status"] == "done"
  assert dict(zip(head2, table_row(ran, "D_ls0")))["status"].startswith("failed; seed 1: failed:")
  assert md.rstrip().endswith("## Reading\n\nOur reading: the tiny scale says nothing.")
  data = json.load(open(tmp_path / "t3_tiny.json"))
  by_row = {r["row"]: r for r in data["rows"]}
  assert len(data["rows"]) == 20 and by_row["A_h1"]["ppl_verdict"] == "✓"
  assert by_row["A_h4"]["status"] == "pending" and by_row["base"]["ppl"]["n"] == 3
  assert (tmp_path / "t3_tiny_curves.png").stat().st_size > 10_000
  assert (tmp_path / "t3_tiny.png").stat().st_size > 10_000


# --- a real run: 2 training steps of a tiny model, evaluated --------------------------------------

@requires_data
def test_tiny_real_run_trains_evaluates_and_is_skipped_on_rerun(tmp_path):
  out, results = tmp_path / "real", tmp_path / "results"
  args = (f"--sweep={TABLE3}", "--scale=tiny", f"--out={out}", f"--results_dir={results}",
          "--rows=B_dk16", "--seeds=1", "--config.model.num_encoder_layers=1",
          "--config.model.num_decoder_layers=1")
  os.environ.setdefault("TRANSFORMER_JAX_DATA_DIR", DATA_DIR)
  result = _cli(*args, timeout=300)
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
  rerun = _cli(*args, timeout=120)
  assert rerun.returncode == 0 and "B_dk16_seed1: done earlier" in rerun.stdout


def test_a_config_key_added_later_at_its_default_is_the_same_protocol():
  from experiments.results_files import protocol_difference  # pylint: disable=g-import-not-at-top
  ours = {"hash": "b", "num_steps": 3, "resolved": {"model.d_model": 64, "model.remat": "none"}}
  older = {"hash": "a", "num_steps": 3, "resolved": {"model.d_model": 64}}  # before remat existed
  assert protocol_difference(ours, older) == ""
  ours["resolved"]["model.remat"] = "layer"  # not the default: a different computation
  assert protocol_difference(ours, older) == "resolved.model.remat: None there, 'layer' now"
  assert protocol_difference(ours, {**older, "num_steps": 2}) == "num_steps: 2 there, 3 now"


def test_the_same_config_reached_through_other_overrides_is_the_same_protocol():
  # The config file's default moved to what the scale overrides: the override list shrinks, the
  # resolved config does not change, and neither do the committed results.
  from experiments.results_files import protocol_difference  # pylint: disable=g-import-not-at-top
  before = {"hash": "a", "overrides": ["--config.data.tokens_per_batch=2048", "--config.model.d_model=64"],
            "resolved": {"data.tokens_per_batch": 2048, "model.d_model": 64}}
  now = {"hash": "b", "overrides": ["--config.model.d_model=64"],
         "resolved": {"data.tokens_per_batch": 2048, "model.d_model": 64}}
  assert protocol_difference(now, before) == ""
  now["resolved"]["data.tokens_per_batch"] = 4096  # a real change is still found, by its key
  assert protocol_difference(now, before) == "resolved.data.tokens_per_batch: 2048 there, 4096 now"
