"""The task registry (tasks/registry.py): `data.task` chooses one task object, an unknown name is
one line naming the choices (in the library and on the command line, before anything is
written), each task checks its own keys, and no code outside tasks/ branches on a task's name."""

import ast
import os
import subprocess
import sys

import pytest

from tests.common import REPO
from tests.test_train_reliability import _cmd, _env
from transformer_jax.runtime.config import default_config
from transformer_jax.runtime.exceptions import ConfigError
from transformer_jax.tasks import base, registry
from transformer_jax.tasks.parsing import task as parsing
from transformer_jax.tasks.translation import task as translation

PACKAGE = os.path.join(REPO, "transformer_jax")
TASKS_FOLDER = os.path.join(PACKAGE, "tasks")
UNKNOWN = "config key 'data.task' is 'nope'; expected one of translation, parsing"


def test_both_tasks_are_registered_by_name():
  assert registry.names() == ("translation", "parsing")
  assert registry.for_name("translation") is translation.TASK
  assert registry.for_name("parsing") is parsing.TASK
  for name, task in registry.TASKS.items():
    assert isinstance(task, base.Task) and task.name == name
  assert registry.get(default_config()) is translation.TASK


def test_an_unknown_task_is_one_line_naming_the_choices():
  c = default_config()
  c.data.task = "nope"
  for call in (lambda: registry.get(c), lambda: registry.for_name("nope")):
    with pytest.raises(ConfigError) as e:
      call()
    assert str(e.value) == UNKNOWN


def test_each_task_checks_its_own_keys_and_leaves_others_switches_off():
  c = default_config()
  c.decode.parse_constraint = True  # the parser's switch, on a translation config
  with pytest.raises(ConfigError, match=r"decode.parse_constraint.*data.task='parsing'"):
    registry.get(c)
  c.data.task = "parsing"
  with pytest.raises(ConfigError, match="data.dataset='local'"):  # parsing reads local .mrg files
    registry.get(c)
  c.data.dataset = "local"
  assert registry.get(c) is parsing.TASK
  c.data.parse_leaves = "pos"
  with pytest.raises(ConfigError, match="data.parse_leaves"):
    registry.get(c)


def test_the_cli_rejects_an_unknown_task_in_one_line_and_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  result = subprocess.run(_cmd(workdir, "--config.data.task=nope"), cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert errors == [f"error: {UNKNOWN}"], result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == errors[0]
  assert not workdir.exists()


def task_branches(source: str, path: str = "<source>") -> list[str]:
  """'path:line' of each comparison that branches on a task: one side `task` (or `x.task`) or a
  registered task's name, with ==, !=, in, not in, is or is not."""
  names = set(registry.names())
  found = []
  for node in ast.walk(ast.parse(source, path)):
    if not isinstance(node, ast.Compare):
      continue
    for operand in (node.left, *node.comparators):
      if ((isinstance(operand, ast.Name) and operand.id == "task")
          or (isinstance(operand, ast.Attribute) and operand.attr == "task")
          or (isinstance(operand, ast.Constant) and operand.value in names)):
        found.append(f"{path}:{node.lineno}")
        break
  return found


def test_no_code_outside_the_tasks_branches_on_the_task():
  found = []
  for folder, _, files in os.walk(PACKAGE):
    if os.path.commonpath([folder, TASKS_FOLDER]) == TASKS_FOLDER:
      continue
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as f:
          found += task_branches(f.read(), os.path.relpath(path, REPO))
  assert not found, "task branches outside transformer_jax/tasks/ (ask the task instead): " + (
      ", ".join(found))


def test_the_branch_check_finds_a_branch():
  assert task_branches('if config.data.task == "parsing":\n  pass\n') == ["<source>:1"]
  assert task_branches('x = 1\nsplit = d.task != "translation"\n') == ["<source>:2"]
  assert task_branches('ok = "parsing" in (task_name,)\n') == ["<source>:1"]
  assert task_branches("if task is other:\n  pass\n") == ["<source>:1"]
  assert task_branches("task = registry.get(config)\nif task.split_by_script:\n  pass\n") == []
  assert task_branches('if mode == "train":\n  pass\n') == []


def test_a_missing_nltk_is_one_line_at_its_first_use_not_at_import():
  code = ("import importlib.util, sys\n"
          "real = importlib.util.find_spec\n"
          "importlib.util.find_spec = lambda n, *a: None if n == 'nltk' else real(n, *a)\n"
          "from transformer_jax.tasks import registry\n"
          "from transformer_jax.tasks.parsing import treebank\n"
          "from transformer_jax.runtime.exceptions import ConfigError\n"
          "try:\n  treebank.nltk.Tree\nexcept ConfigError as e:\n  print(e)\n")
  p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                     timeout=120)
  assert p.returncode == 0, p.stderr[-2000:]
  assert p.stdout.strip() == ("the nltk package is not installed (pip install nltk); parsing "
                              "reads and writes trees with it")
