"""The sweep definitions (experiments/harness/define.py, experiments/table3/): the Table 3 rows and the
paper's values, scales, seeds and protocols, up-front validation of bad input, and the printed
commands for the three launchers. The runner: test_sweep_runner.py; the report:
test_sweep_report.py."""

import json
import os
import shlex
import subprocess

import pytest
from absl import flags
from ml_collections import config_flags

from experiments.harness import define, resolve, study, verdicts
from experiments.table3 import scales
from tests.common import REPO
from tests.sweep_fakes import one_line_error, sweep_cli, TABLE3
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.runtime.overrides import parse_overrides


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
  return study.load_sweep(TABLE3)


# --- the sweep definitions, resolved ------------------------------------------------------------

def test_table3_rows_and_the_papers_values(table3):
  assert study.row_ids(table3) == list(PAPER)
  for row_id, values in PAPER.items():
    assert table3.rows[row_id].paper.to_dict() == dict(zip(FIELDS, values)), row_id


def test_table3_overrides_agree_with_the_paperstable_row(table3):
  """Each row's hyperparameters (reference + overrides) are the paper's cell, or base's if blank."""
  base = dict(zip(FIELDS, PAPER["base"]))
  for row_id, values in PAPER.items():
    paper = dict(zip(FIELDS, values))
    ours = resolve.resolve(table3, row_id, "paper").paper_hparams
    for col in FIELDS[:9]:
      assert ours[col] == (paper[col] if paper[col] is not None else base[col]), (row_id, col)
  assert table3.rows.E_learned_pe.overrides.model.pe_type == "learned"


def test_scales_shrink_widths_and_keep_heads_layers_and_ratios(table3):
  for scale in ("cpu", "tiny"):
    factor = table3.scales[scale].dim_factor
    for res in resolve.resolve_all(table3, study.row_ids(table3), scale):
      paper, ours = res.paper_hparams, res.hparams
      for col in ("d_model", "d_k", "d_v", "d_ff"):
        assert ours[col] == paper[col] * factor, (scale, res.row_id, col)
      for col in ("N", "h", "P_drop", "eps_ls"):
        assert ours[col] == paper[col], (scale, res.row_id, col)
      assert ours["train_steps"] == table3.scales[scale].num_steps  # every row, big too
      assert res.config.model.num_decoder_layers == ours["N"]
      assert res.bleu_sentences == table3.scales[scale].bleu_sentences
  base = resolve.resolve(table3, "base", "cpu").config
  d = 512 * scales.CPU["dim_factor"]
  assert (base.model.d_model, base.model.num_heads, base.model.d_k, base.model.d_ff) == (d, 8, d / 8, 4 * d)
  assert (base.data.local_corpus, base.data.tokens_per_batch) == ("multi30k", 2048)
  assert (base.train.warmup_steps, base.train.learning_rate_scale, base.model.pre_ln) == (400, 0.5, True)
  assert base.train.max_eval_batches == 0  # the convergence curve is on the whole dev split
  assert table3.scales.cpu.seeds == list(scales.CPU["seeds"]) and len(table3.scales.cpu.base_seeds) >= 3
  assert resolve.resolve(table3, "E_learned_pe", "tiny").config.model.pe_type == "learned"


def test_paper_scale_keeps_the_papers_steps_and_config(table3):
  base = resolve.resolve(table3, "base", "paper")
  big = resolve.resolve(table3, "big", "paper")
  assert base.config_spec == "configs/base.py" and base.overrides == []  # base.py is the paper's base
  assert base.config.train.num_steps == 100_000 and big.config.train.num_steps == 300_000
  assert big.config.model.dropout_rate == 0.3 and big.config.model.d_k == 64
  tpu = resolve.resolve(table3, "base", "paper", base_config="configs/tpu.py")
  assert tpu.config_spec == "configs/tpu.py"


def test_paper_scale_parameter_counts_match_the_paper(table3):
  table = {p["row"]: p for p in verdicts.paper_params_table(table3)}
  assert table["base"]["params"] == 63_045_632 and table["big"]["params"] == 214_171_648
  for row_id, p in table.items():
    reported = PAPER[row_id][-1] if PAPER[row_id][-1] is not None else PAPER["base"][-1]
    assert abs(p["params"] / 1e6 - reported) <= PARAM_TOLERANCE_M.get(row_id, 3.0), (row_id, p)


def test_grid_example_rows():
  grid = study.load_sweep("experiments/grid_example")
  ids = study.row_ids(grid)
  assert len(ids) == 17 and ids[0] == "base" and "h4_dk32_drop0p3_pelearned" in ids
  m = resolve.resolve(grid, "h4_dk32_drop0p3_pelearned", "small").config.model
  dk = round(32 * grid.scales.small.dim_factor)  # d_k 32 in paper units, scaled as every width
  assert (m.num_heads, m.d_k, m.d_v, m.dropout_rate, m.pe_type) == (4, dk, dk, 0.3, "learned")
  assert len(resolve.resolve_all(grid, ids, "paper")) == 17


def test_postln_pilot_scales_are_the_cpu_protocol_with_another_rate(table3):
  """#53's pilot: post-LN, the cpu widths and steps, and the three rates its docstring names."""
  cpu = resolve.resolve(table3, "base", "cpu").config
  peaks = {}
  for scale in scales.POSTLN_PILOTS:
    c = resolve.resolve(table3, "base", scale).config
    assert not c.model.pre_ln and c.model.d_model == cpu.model.d_model == 64
    assert c.train.num_steps == cpu.train.num_steps == 3000
    peaks[scale] = c.train.learning_rate_scale * 64 ** -0.5 * c.train.warmup_steps ** -0.5
  paper_peak = 512 ** -0.5 * 4000 ** -0.5  # the paper's base schedule at its step 4000
  assert abs(peaks["postln_pilot_paper_lr"] / paper_peak - 1) < 1e-3
  assert peaks["postln_pilot_paper_lr_clip"] == peaks["postln_pilot_paper_lr"]
  assert resolve.resolve(table3, "base", "postln_pilot_paper_lr_clip").config.train.grad_clip_norm == 1.0
  cpu_peak = cpu.train.learning_rate_scale * 64 ** -0.5 * cpu.train.warmup_steps ** -0.5
  assert abs(peaks["postln_pilot_long_warmup"] / cpu_peak - 1) < 1e-9
  assert resolve.resolve(table3, "base", "postln_pilot_long_warmup").config.train.warmup_steps == 1600


def test_printed_overrides_reproduce_each_rows_config(table3):
  """The training CLI's own config flags, given a row's overrides, rebuild the resolved config."""
  for res in resolve.resolve_all(table3, study.row_ids(table3), "cpu"):
    argv = ["prog", f"--config={os.path.join(REPO, res.config_spec)}", *res.overrides]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                    sys_argv=argv)
    fv(argv)
    assert fv.config.to_dict() == res.config.to_dict(), res.row_id


def test_select_rows(table3):
  assert study.select_rows(table3, "C_N*,D") == ["C_N2", "C_N4", "C_N8", "D_pdrop0", "D_pdrop02",
                                                  "D_ls0", "D_ls02"]
  assert study.select_rows(table3, "big, base") == ["base", "big"]  # the sweep's order
  assert study.select_rows(table3, "") == study.row_ids(table3)


# --- bad input: one line, before anything runs --------------------------------------------------

def test_unknown_rows_scales_andfile_snapshot(table3, tmp_path):
  with pytest.raises(ConfigError, match=r"--rows: no row matches 'bsae' \(did you mean 'base'\?\); "
                                        r"rows: base, A_h1,"):
    study.select_rows(table3, "A_h1,bsae")
  with pytest.raises(ConfigError, match=r"unknown scale 'cpuu' \(did you mean 'cpu'\?\); the sweep "
                                        r"defines: .*tiny"):
    resolve.resolve(table3, "base", "cpuu")
  with pytest.raises(ConfigError, match=r"unknown row 'bgi' \(did you mean 'big'\?\)"):
    resolve.resolve(table3, "bgi", "cpu")
  with pytest.raises(ConfigError, match="sweep file experiments/nope.py not found"):
    study.load_sweep("experiments/nope.py")
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config():\n  return 3\n")
  with pytest.raises(ConfigError, match="must return an ml_collections.ConfigDict"):
    study.load_sweep(str(bad))
  out = tmp_path / "out"
  assert "no row matches 'bsae' (did you mean 'base'?)" in one_line_error(
      sweep_cli(f"--sweep={TABLE3}", f"--out={out}", "--rows=bsae"))
  assert "unknown scale 'cpuu' (did you mean 'cpu'?)" in one_line_error(
      sweep_cli(f"--sweep={TABLE3}", f"--out={out}", "--scale=cpuu"))
  assert one_line_error(sweep_cli(f"--sweep={TABLE3}", f"--out={out}", "--no_such_flag")).startswith(
      "error: Unknown command line flag 'no_such_flag'")
  assert not out.exists()


def test_inconsistent_rows_are_named(table3):
  heads = parse_overrides(["--config.model.num_heads=16"])
  d_model = round(512 * scales.CPU["dim_factor"])
  dk = d_model // 8
  with pytest.raises(ConfigError, match=rf"row 'base' at scale 'cpu': h\*d_k = 16\*{dk} = {16 * dk} "
                                        rf"differs from d_model={d_model}"):
    resolve.resolve_all(table3, study.row_ids(table3), "cpu", heads)
  tp = parse_overrides(["--config.mesh.tensor=8"])
  with pytest.raises(ConfigError, match="row 'A_h1' at scale 'paper': config key 'model.num_heads'=1 "
                                        "is not divisible by the tensor-parallel size mesh.tensor=8"):
    resolve.resolve_all(table3, study.row_ids(table3), "paper", tp)


def _write_sweep(tmp_path, rows_code):
  path = tmp_path / "my_sweep.py"
  path.write_text("from experiments.harness import define\n\ndef get_config():\n"
                  "  c = define.new_sweep('mine')\n"
                  "  define.add_row(c, 'base')\n" + rows_code + "  return c\n")
  return str(path)


def test_every_row_is_validated_before_anything_runs(tmp_path):
  """The last row is bad: the CLI prints one line naming it, exits 2, and creates nothing."""
  spec = _write_sweep(tmp_path, "  define.add_row(c, 'wide', overrides={'model.n_heads': 4})\n")
  out = tmp_path / "out"
  assert one_line_error(sweep_cli(f"--sweep={spec}", "--scale=small", f"--out={out}")) == (
      "error: row 'wide' at scale 'small': unknown config key 'model.n_heads' (did you mean "
      "'num_heads'?)")
  assert not out.exists()
  assert one_line_error(sweep_cli("--sweep=experiments/head_width", "--params")) == (
      "error: the sweep 'head_width' has no 'paper' scale to count its rows at (its scales: "
      "cpu_long)")
  spec = _write_sweep(tmp_path, "  define.add_row(c, 'tiny_dk', overrides={'model.d_k': 2})\n")
  f = define.standard_scales().tiny.dim_factor
  with pytest.raises(ConfigError, match=rf"row 'tiny_dk' at scale 'tiny': model.d_k=2 x {f:g} = "
                                        rf"{2 * f:g} is not a positive whole number"):
    resolve.resolve_all(study.load_sweep(spec), ["base", "tiny_dk"], "tiny")
  error = one_line_error(sweep_cli(f"--sweep={TABLE3}", f"--out={out}", "--config.train.num_step=3"))
  assert "unknown config key 'train.num_step' (did you mean 'num_steps'?)" in error


def test_an_out_folder_holds_one_sweep_at_one_scale(tmp_path):
  out = tmp_path / "t3"
  out.mkdir()
  (out / "sweep.json").write_text(json.dumps({"sweep": "table3", "scale": "tiny", "rows": []}))
  error = one_line_error(sweep_cli(f"--sweep={TABLE3}", "--scale=cpu", f"--out={out}",
                               f"--results_dir={tmp_path / 'results'}"))
  assert "holds the sweep 'table3' at scale 'tiny'" in error and "another --out" in error
  assert sorted(os.listdir(out)) == ["sweep.json"]


# --- printed commands -------------------------------------------------------------------------

def _dryrun_fake(table3, out, launcher, rows, *extra):
  """(per-run commands, the follow-up command, the rows resolved here) of a --dry_run."""
  result = sweep_cli(f"--sweep={TABLE3}", "--scale=paper", f"--out={out}", "--dry_run",
                f"--launcher={launcher}", f"--rows={rows}", *extra)
  assert result.returncode == 0, result.stderr
  commands = [shlex.split(l) for l in result.stdout.splitlines() if l and not l.startswith("#")]
  user = parse_overrides([a for a in extra if a.startswith("--config.")])
  resolved = resolve.resolve_all(table3, rows.split(","), "paper", user)
  return commands[:-1], commands[-1], resolved


def test_dry_run_local_one_command_per_row_and_seed(table3, tmp_path):
  out = tmp_path / "t3"
  commands, follow, resolved = _dryrun_fake(table3, out, "local", "base,A_h1", "--seeds=0,1",
                                        "--base_seeds=0,1,2", "--config.train.warmup_steps=8000")
  runs = [(res, seed) for res in resolved for seed in ((0, 1, 2) if res.row_id == "base" else (0, 1))]
  for cmd, (res, seed) in zip(commands, runs, strict=True):
    assert cmd == ["python", "-m", "transformer_jax.main", "--config=configs/base.py",
                   f"--workdir={out}/{res.row_id}/seed{seed}", *res.overrides, f"--config.seed={seed}"]
    assert "--config.train.warmup_steps=8000" in cmd
  assert "--config.model.num_heads=1" in commands[3]
  assert follow[:3] == ["python", "-m", "experiments.harness.runner"] and "--eval_only" not in follow
  assert {"--rows=base,A_h1", "--scale=paper", f"--out={out}", "--seeds=0,1", "--base_seeds=0,1,2",
          "--config.train.warmup_steps=8000"} <= set(follow)
  assert not out.exists()


def test_dry_run_slurm(table3, tmp_path):
  out = tmp_path / "t3"
  script = tmp_path / "t3_slurm.sh"
  commands, follow, resolved = _dryrun_fake(table3, out, "slurm", "base,A_h1,big",
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
  commands, follow, resolved = _dryrun_fake(table3, out, "tpu_vm", "A_h1,E_learned_pe", "--seeds=3")
  for cmd, res, name in zip(commands, resolved, ("tj-a-h1-seed3", "tj-e-learned-pe-seed3"), strict=True):
    assert cmd == ["launch/tpu_vm.sh", "--name", name, "configs/base.py", f"{out}/{res.row_id}/seed3",
                   "--", *res.overrides, "--config.seed=3"]
  assert "--config.model.pe_type=learned" in commands[1] and "--eval_only" in follow


# --- seeds and protocols: bad input is one line, nothing written ------------------------------

def test_seed_lists():
  assert resolve.parse_seeds("0,1, 2", "--seeds") == [0, 1, 2]
  for text, why in (("", "the seed list is empty"), (" , ", "the seed list is empty"),
                    ("0,-1", "'-1' is not a seed"), ("1.5", "'1.5' is not a seed"),
                    ("0,x", "'x' is not a seed"), ("1,1", "seed 1 is listed twice")):
    with pytest.raises(ConfigError, match=why):
      resolve.parse_seeds(text, "--seeds")


def test_bad_seeds_and_parallel_on_the_command_line(tmp_path):
  out, results = tmp_path / "out", tmp_path / "results"
  for flag, text in (("--seeds=", "--seeds: the seed list is empty"),
                     ("--base_seeds=0,-2", "--base_seeds=0,-2: '-2' is not a seed"),
                     ("--config.seed=4", "use --seeds=0,1 and --base_seeds=0,1,2"),
                     (f"--parallel={len(os.sched_getaffinity(0)) + 1}",
                      "CPU cores; give at most one run per core"),
                     (f"--cores={max(os.sched_getaffinity(0)) + 1}",
                      "is not one of this process's cores, once each")):
    assert text in one_line_error(sweep_cli(f"--sweep={TABLE3}", "--scale=tiny", f"--out={out}",
                                        f"--results_dir={results}", flag))
  assert not out.exists() and not results.exists()


def test_cpu_long_is_the_cpu_protocol_twice_as_long_with_big_three_times(table3):
  """#53's converged protocol: the pinned cpu settings, 6000 steps (big 18000, the paper's 3x), a
  dev evaluation at two thirds (4000) and at three quarters (4500) of base's training, BLEU on
  the whole dev split, the checkpoint at two thirds saved, kept and evaluated (big's at 12000),
  and one seed only for the rows the paper calls unchanged."""
  cpu = resolve.resolve(table3, "base", "cpu").config
  long = {r: resolve.resolve(table3, r, "cpu_long") for r in ("base", "big", "C_N2", "A_h16")}
  base = long["base"].config
  assert base.model.pre_ln and base.model.d_model == cpu.model.d_model == 64
  assert {r: v.config.train.num_steps for r, v in long.items()} == {
      "base": 6000, "big": 18000, "C_N2": 6000, "A_h16": 6000}
  every = base.train.eval_every_steps
  assert 4000 % every == 0 and 4500 % every == 0 and long["big"].config.train.eval_every_steps == every
  assert long["base"].bleu_sentences == 0  # all 1014 dev sentences
  same = lambda c: {k: v for k, v in c.to_dict()["train"].items()  # noqa: E731
                    if k not in ("num_steps", "eval_every_steps", "checkpoint_every_steps",
                                 "keep_every_steps")}
  assert same(base) == same(cpu) and base.model.to_dict() == cpu.model.to_dict()
  assert {r: v.two_thirds_step for r, v in long.items()} == {
      "base": 4000, "big": 12000, "C_N2": 4000, "A_h16": 4000}
  for res in long.values():  # saved there, and kept past keep_checkpoints
    t = res.config.train
    assert res.two_thirds_step % t.checkpoint_every_steps == 0
    assert res.two_thirds_step % t.keep_every_steps == 0
  assert resolve.resolve(table3, "base", "cpu").two_thirds_step == 0
  assert [resolve.seeds_of(table3, "cpu_long", r) for r in ("base", "C_N2", "A_h16", "E_learned_pe")] \
      == [[0, 1, 2], [0, 1], [0], [0]]
  assert resolve.seeds_of(table3, "cpu_long", "A_h16", seeds=[0, 1]) == [0, 1]  # the flag wins
  paper = lambda r: table3.rows[r].paper  # noqa: E731
  for r in table3.scales.cpu_long.row_seeds:  # rows whose paper PPL and BLEU equal base's
    assert abs(paper(r).ppl - paper("base").ppl) < verdicts.PPL_CLEAR
    assert abs(paper(r).bleu - paper("base").bleu) < verdicts.BLEU_CLEAR


def test_the_parsing_pilot_sweep_resolves():
  """experiments/wsj_parsing: the pinned pilot protocol, one change a row, equal steps."""
  sweep = study.load_sweep(os.path.join(REPO, "experiments", "wsj_parsing"))
  runs = {r: resolve.resolve(sweep, r, "pilot").config for r in study.row_ids(sweep)}
  assert set(runs) == {"base", "lr10", "drop03", "words", "words_constrained"}
  for cfg in runs.values():
    assert cfg.data.task == "parsing" and cfg.train.num_steps == 900
    assert cfg.data.eval_files == "wsj_0160-wsj_0179" and not cfg.data.test_files
  assert runs["lr10"].train.learning_rate_scale == 1.0 and runs["drop03"].model.dropout_rate == 0.3
  assert runs["base"].train.learning_rate_scale == 0.7 and runs["base"].model.dropout_rate == 0.1
  assert not runs["words"].decode.parse_constraint and runs["words_constrained"].decode.parse_constraint
  assert runs["words_constrained"].data.parse_leaves == "words"


def test_the_head_width_sweep_crosses_head_count_with_head_width(table3):
  """experiments/head_width: h in {1, 8} x d_k = d_v in {8, 64} at cpu_long's protocol, two
  seeds a row; its base and h1_dk64 are table3's base and A h=1 at cpu_long, to the config key."""
  sweep = study.load_sweep(os.path.join(REPO, "experiments", "head_width"))
  assert list(sweep.scales) == ["cpu_long"]
  runs = {r: resolve.resolve(sweep, r, "cpu_long") for r in study.row_ids(sweep)}
  heads = {r: (v.config.model.num_heads, v.config.model.d_k, v.config.model.d_v)
           for r, v in runs.items()}
  assert heads == {"base": (8, 8, 8), "h1_dk64": (1, 64, 64), "h1_dk8": (1, 8, 8),
                   "h8_dk64": (8, 64, 64)}
  for r in runs:
    assert resolve.seeds_of(sweep, "cpu_long", r) == [0, 1]
    assert runs[r].config.train.num_steps == 6000 and runs[r].two_thirds_step == 4000
  for mine, theirs in (("base", "base"), ("h1_dk64", "A_h1")):
    t3 = resolve.resolve(table3, theirs, "cpu_long")
    assert runs[mine].config.to_dict() == t3.config.to_dict()
    assert runs[mine].overrides == t3.overrides
