"""Study folders (experiments/<study>/): what each must hold, the one-line errors when it does
not, and that the generic code beside them names no study."""

import glob
import os

import pytest

from experiments.harness import study
from tests.common import REPO
from tests.sweep_fakes import one_line_error, sweep_cli
from transformer_jax.runtime.exceptions import ConfigError

SWEEP = ("from experiments.harness import define\n\ndef get_config():\n"
         "  c = define.new_sweep('mine')\n  define.add_row(c, 'base')\n{extra}  return c\n")


def _study(tmp_path, sweep=True, readme=True, extra=""):
  folder = tmp_path / "mine"
  folder.mkdir()
  if sweep:
    (folder / "sweep.py").write_text(SWEEP.format(extra=extra))
  if readme:
    (folder / "README.md").write_text("# mine\n")
  return folder


def test_every_study_folder_holds_its_sweep_readme_and_names_existing_files():
  folders = study.study_folders()
  assert {os.path.basename(f) for f in folders} >= {"table3", "head_width", "multi30k_levers",
                                                    "wsj_parsing", "grid_example"}
  for folder in folders:
    sweep = study.load_sweep(os.path.relpath(folder, REPO))
    assert sweep.folder == folder and os.path.isfile(os.path.join(folder, "README.md"))
    assert study.default_results_dir(sweep, "x") == os.path.join(folder, "results", f"{sweep.name}_x")


@pytest.mark.parametrize("missing, what", [("sweep", "sweep.py: missing; a study folder holds its sweep"),
                                           ("readme", "README.md: missing; a study folder holds its README")])
def test_a_study_folder_without_its_sweep_or_readme_is_one_line_naming_the_file(tmp_path, missing, what):
  folder = _study(tmp_path, sweep=missing != "sweep", readme=missing != "readme")
  out = tmp_path / "out"
  error = one_line_error(sweep_cli(f"--sweep={folder}", "--scale=tiny", f"--out={out}"))
  assert error == f"error: {folder}/{what}" + error.split(what, 1)[1] and not out.exists()
  with pytest.raises(ConfigError, match="missing; a study folder holds"):
    study.load_sweep(str(folder))


def test_a_sweep_naming_a_missing_protocol_or_sections_file_is_one_line(tmp_path):
  folder = _study(tmp_path, extra="  c.scales.tiny.config = 'experiments/mine/protocol.py:v'\n")
  out = tmp_path / "out"
  assert one_line_error(sweep_cli(f"--sweep={folder}", "--scale=tiny", f"--out={out}")) == (
      f"error: sweep file {folder}/sweep.py: scale 'tiny' names the protocol "
      "experiments/mine/protocol.py, which does not exist")
  assert not out.exists()
  (folder / "sweep.py").write_text(SWEEP.format(extra="  c.report_sections = ['nope/report.py']\n"))
  assert one_line_error(sweep_cli(f"--sweep={folder}", "--report", "--scale=tiny")) == (
      f"error: sweep file {folder}/sweep.py: its report_sections names nope/report.py, which "
      "does not exist")


def test_a_study_folder_gets_its_own_results_folder(tmp_path):
  sweep = study.load_sweep(str(_study(tmp_path)))
  assert study.default_results_dir(sweep, "tiny") == str(tmp_path / "mine" / "results" / "mine_tiny")
  loose = tmp_path / "loose.py"
  loose.write_text(SWEEP.format(extra=""))
  assert study.default_results_dir(study.load_sweep(str(loose)), "tiny") == os.path.join(
      REPO, "experiments", "results", "mine_tiny")


def test_the_generic_code_names_no_study():
  names = [os.path.basename(f) for f in study.study_folders()]
  for path in glob.glob(os.path.join(REPO, "experiments", "harness", "*.py")):
    text = open(path, encoding="utf-8").read()
    for name in names:
      assert name not in text, (path, name)
    assert "Table 3" not in text and "table3" not in text, path
