"""Every `python -m` command in the README's and the docs' code blocks resolves: its module is
ours and exists, each `--flag` is one that module defines, each `--config.KEY` is in the config
schema and each config file it names exists. Nothing is run."""

import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.common import REPO

OURS = ("transformer_jax", "experiments", "benchmarks", "launch")
SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "2>&1", "&"}
_FENCE = re.compile(r"^```(?:bash|sh|shell)?\n(.*?)^```", re.M | re.S)


def doc_files() -> list[str]:
  found = [os.path.join(REPO, "README.md"), os.path.join(REPO, "launch", "README.md")]
  found += glob.glob(os.path.join(REPO, "docs", "*.md"))
  found += glob.glob(os.path.join(REPO, "experiments", "**", "README.md"), recursive=True)
  return sorted(p for p in found if os.path.isfile(p) and "archive" not in p.split(os.sep))


def commands(text: str) -> list[tuple[str, list[str]]]:
  """(module, its arguments up to the next shell operator) of each `python -m` in the code
  blocks of Markdown `text` (continued lines joined, comments dropped)."""
  out = []
  for block in _FENCE.findall(text):
    for line in block.replace("\\\n", " ").splitlines():
      try:
        words = shlex.split(line, comments=True)
      except ValueError:
        continue
      for i, word in enumerate(words[:-2]):
        if word.endswith("python") or word.endswith("python3"):
          if words[i + 1] == "-m":
            args = []
            for w in words[i + 3:]:
              if w in SHELL_OPERATORS:
                break
              args.append(w)
            out.append((words[i + 2], args))
  return out


def test_commands_are_found_in_code_blocks():
  text = "x\n```bash\nA=1 python -m pkg.mod --a=1 \\\n  --b 2 | cat  # note\n```\n`python -m no`\n"
  assert commands(text) == [("pkg.mod", ["--a=1", "--b", "2"])]


def _module_flags(modules) -> dict[str, list[str] | str]:
  """{module: the absl flag names it defines, or why it does not import}, one process each (two
  modules may define the same flag name)."""
  script = ("import importlib, json, sys\nfrom absl import flags\nname = sys.argv[1]\n"
            "spec = importlib.util.find_spec(name)\n"
            "m = importlib.import_module(name + '.__main__' if spec.submodule_search_locations "
            "else name)\n"
            "own = getattr(m, 'FLAGS', flags.FLAGS)  # or a flag set of its own\n"
            "if hasattr(m, 'define_flags'):  # flags defined only when it runs\n"
            "  own = flags.FlagValues()\n"
            "  try:\n    m.define_flags(own)\n  except TypeError:\n"
            "    own = flags.FLAGS\n    m.define_flags()\n"
            "print(json.dumps(sorted(set(flags.FLAGS) | set(own))))\n")
  out = {}
  for module in modules:
    p = subprocess.run([sys.executable, "-c", script, module], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    out[module] = (json.loads(p.stdout.splitlines()[-1]) if p.returncode == 0
                   else (p.stderr.strip().splitlines() or ["?"])[-1])
  return out


@pytest.mark.slow
def test_every_documented_command_resolves():
  from transformer_jax.runtime import exceptions  # pylint: disable=g-import-not-at-top
  from transformer_jax.runtime.overrides import schema_default  # pylint: disable=g-import-not-at-top
  found = [(os.path.relpath(path, REPO), module, args) for path in doc_files()
           for module, args in commands(open(path, encoding="utf-8").read())
           if module.split(".")[0] in OURS]
  assert len(found) > 20, "the README's commands were not found"
  defined = _module_flags(sorted({m for _, m, _ in found}))
  bad = []
  for doc, module, args in found:
    if isinstance(defined[module], str):
      bad.append(f"{doc}: python -m {module}: {defined[module]}")
      continue
    for arg in args:
      if not arg.startswith("--"):
        continue
      name, _, value = arg[2:].partition("=")
      if name.startswith("config."):
        try:
          schema_default(name[len("config."):])
        except exceptions.ConfigError as e:
          bad.append(f"{doc}: python -m {module} {arg}: {e}")
      elif name not in defined[module] and not (name.startswith("no")
                                                and name[2:] in defined[module]):
        bad.append(f"{doc}: python -m {module} has no flag --{name}")
      elif name in ("config", "sweep") and value.endswith(".py") or ".py:" in value:
        path = value.split(":")[0]
        if not ("..." in path or "<" in path) and not os.path.isfile(os.path.join(REPO, path)):
          bad.append(f"{doc}: python -m {module} {arg}: no file {path}")
  assert not bad, "\n".join(bad)
