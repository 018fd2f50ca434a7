"""launch/accelerator_check.sh, the lent GPU host's checks: its dry path on this machine (the
shell's stages and the cheap ones of the driver), each kind of bad input as one summary line with
the other stages still run, and the lock file against what the library imports."""

import ast
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement

from launch import accelerator_check, accelerator_stages

from tests.common import REPO

HOST_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                "implementation_name": "cpython", "platform_python_implementation": "CPython",
                "extra": ""}


def _norm(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _carried_or_on_host() -> set[str]:
  return {_norm(d) for d in (*accelerator_stages.HOST_PROVIDES, *accelerator_stages.read_lock())}


def _imported_top_level_names() -> dict[str, str]:
  """{top-level module: a file importing it} of transformer_jax/, by AST: import statements
  and the string names given to importlib.import_module / find_spec / a lazy import helper."""
  out = {}
  for root, _, names in os.walk(os.path.join(REPO, "transformer_jax")):
    for name in names:
      if not name.endswith(".py"):
        continue
      path = os.path.join(root, name)
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
      for node in ast.walk(tree):
        found = []
        if isinstance(node, ast.Import):
          found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
          found = [node.module]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
          func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
              node.func, "id", "")
          if func in ("import_module", "find_spec") or "import" in func:
            found = [node.args[0].value]
        for module in found:
          out.setdefault(module.split(".")[0], os.path.relpath(path, REPO))
  return out


def _optional_extras() -> set[str]:
  """The distributions of pyproject.toml's optional extras but `test` (an export's, a bucket's:
  features the accelerator check never runs, imported only where they are used)."""
  import tomllib  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
  return {_norm(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0])
          for name, reqs in extras.items() if name != "test" for req in reqs}


def test_the_lock_carries_every_import_the_host_lacks():
  stdlib = set(sys.stdlib_module_names)
  dists = md.packages_distributions()
  optional = _optional_extras()
  assert {"ctranslate2", "safetensors"} <= optional
  missing = []
  for module, where in sorted(_imported_top_level_names().items()):
    if module in stdlib or module == "transformer_jax":
      continue
    if module in dists and {_norm(d) for d in dists[module]} <= optional:
      continue
    assert module in dists, f"{where} imports {module}, which no installed distribution provides"
    if not {_norm(d) for d in dists[module]} & _carried_or_on_host():
      missing.append(f"{module} ({', '.join(dists[module])}; {where})")
  assert not missing, f"neither on the GPU host nor in {accelerator_stages.LOCK}: {missing}"


def test_the_locked_packages_need_nothing_else():
  """Every requirement of a locked package (for CPython 3.12 on Linux, no extras) is locked too
  or on the host: the host installs them with --no-deps."""
  lock = accelerator_stages.read_lock()
  missing = []
  for dist in lock:
    for text in md.requires(dist) or []:
      req = Requirement(text)
      if req.marker is not None and not req.marker.evaluate(HOST_MARKERS):
        continue
      if _norm(req.name) not in _carried_or_on_host():
        missing.append(f"{dist} needs {req.name}")
  assert not missing, missing


def test_the_lock_pins_exact_versions_and_never_the_hosts_frameworks():
  lock = accelerator_stages.read_lock()
  assert lock and all(re.fullmatch(r"\d+(\.\d+)*(\.post\d+)?", v) for v in lock.values()), lock
  assert not {_norm(d) for d in lock} & {_norm(d) for d in accelerator_stages.NEVER_CARRIED}
  assert not {_norm(d) for d in lock} & {_norm(d) for d in accelerator_stages.HOST_PROVIDES}


def test_the_gpu_stages_fit_in_eight_minutes():
  with open(os.path.join(REPO, "launch", "accelerator_check.sh"), encoding="utf-8") as f:
    shell = sum(int(x) for x in re.findall(r"^box=(\d+)$", f.read(), re.M))
  assert shell > 0
  assert shell + sum(accelerator_stages.PRESETS["gpu"]["timebox"].values()) <= 8 * 60
  assert set(accelerator_stages.PRESETS["gpu"]["timebox"]) == set(accelerator_check.STAGES)


def _check(tmp_path, *args, wheels=None, timeout=300):
  out = tmp_path / "out"
  env = dict(os.environ, PYTHON=sys.executable, WHEELS=str(wheels or tmp_path / "no_wheels"),
             TMPDIR=str(tmp_path))
  p = subprocess.run(["bash", "launch/accelerator_check.sh", str(out), *args], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=timeout)
  summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None
  return p, out, summary


def _by_name(summary):
  return {r["name"]: r for r in summary["stages"]}


def test_dry_path_with_no_wheelhouse_and_a_stage_over_its_box(tmp_path):
  p, out, summary = _check(tmp_path, "--preset=cpu", "--stages=env,imports,decode",
                           "--timebox=imports=0.5")
  assert p.returncode == 1, p.stdout[-3000:]
  stages = _by_name(summary)
  assert list(stages) == ["host", "wheels", "env", "imports", "decode"]
  assert stages["host"]["status"] == "ok"
  assert stages["wheels"]["status"] == "failed"
  assert stages["wheels"]["message"].startswith("no wheelhouse: no wheels in ")
  assert stages["env"]["status"] == "ok", stages["env"]  # everything is installed here
  assert stages["env"]["result"]["backend"] == "cpu"
  assert stages["imports"]["message"] == "over its time box of 0.5 s (killed)"
  assert stages["decode"]["status"] == "failed" and "no trained workdir" in stages["decode"]["message"]
  assert summary["failed"] == ["wheels", "imports", "decode"] and not summary["ok"]
  md_text = (out / "summary.md").read_text()
  assert "A rehearsal on a CPU" in md_text and "| imports | failed |" in md_text
  assert sorted(os.listdir(out)) == ["check.log", "pip.log", "summary.json", "summary.md"]
  assert len(os.listdir(out)) <= 2 + accelerator_check.MAX_OTHER_FILES
  assert "== env: ok" in (out / "check.log").read_text()


def test_a_wheel_that_does_not_install_and_no_gpu(tmp_path):
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  with zipfile.ZipFile(wheels / "broken-1.0-py3-none-any.whl", "w") as z:
    z.writestr("broken/__init__.py", "")  # no .dist-info: pip refuses it
  p, _, summary = _check(tmp_path, "--preset=gpu", "--stages=env", wheels=wheels)
  assert p.returncode == 1, p.stdout[-3000:]
  stages = _by_name(summary)
  if shutil.which("nvidia-smi") is None:
    assert stages["host"]["message"] == "no nvidia-smi on PATH: no NVIDIA driver visible"
  assert stages["wheels"]["message"] == "wheels that do not install: broken-1.0-py3-none-any.whl (pip.log)"
  if stages["env"]["status"] == "failed":  # no GPU here: one line saying so
    assert stages["env"]["message"].startswith("RuntimeError: no GPU visible: jax.devices() = ")


def test_imports_name_the_module_and_what_it_missed():
  try:
    try:
      raise ModuleNotFoundError("No module named 'six'")
    except ModuleNotFoundError:
      raise AttributeError("module 'tensorflow_datasets' has no attribute 'core'")  # noqa: B904
  except AttributeError as e:
    line = accelerator_stages.one_line(e)
  assert line == ("AttributeError: module 'tensorflow_datasets' has no attribute 'core' (after "
                  "ModuleNotFoundError: No module named 'six')")


def test_every_library_module_is_listed_for_the_import_stage():
  names = accelerator_stages.library_modules()
  assert "transformer_jax.model.matmul" in names and "transformer_jax.train" in names
  assert names[-3:] == ["benchmarks.train_step", "benchmarks.accelerator", "launch.flops"]


@pytest.mark.parametrize("text", ["nope=3", "env=0", "env=x"])
def test_a_bad_timebox_is_one_config_error(text):
  from transformer_jax.runtime.exceptions import ConfigError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match="expected NAME=SECONDS"):
    accelerator_check.parse_timeboxes("cpu", [text])
