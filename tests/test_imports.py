"""The package's import graph has no cycles, counting the imports inside functions too (a cycle
hidden in a function is still a cycle: it only fails later, and in a different order), and every
import of our own modules inside a function is one of the few listed here with its reason."""

import ast
import os

from tests.common import REPO

PACKAGE = "transformer_jax"

# (module, imported module): function-level imports of our own modules that stay, and why.
ALLOWED_LAZY = {
    # The entry point re-executes itself with malloc settings before jax is imported
    # (host_memory.py); these modules import jax, so main imports them only once it runs.
    ("transformer_jax.main", "transformer_jax.distributed"),
    ("transformer_jax.main", "transformer_jax.branch"),
    ("transformer_jax.main", "transformer_jax.train"),
    ("transformer_jax.main", "transformer_jax.averaging"),
    ("transformer_jax.main", "transformer_jax.evaluate"),
    ("transformer_jax.main", "transformer_jax.translate"),
}


def _modules():
  root = os.path.join(REPO, PACKAGE)
  out = {}
  for folder, _, names in os.walk(root):
    for name in names:
      if name.endswith(".py"):
        rel = os.path.relpath(os.path.join(folder, name), REPO)[:-3].replace(os.sep, ".")
        out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(folder, name)
  return out


def _imports(path, known):
  """[(imported module, inside a function?)] of our own modules in the file at `path`."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  found = []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
      targets = []
      if isinstance(child, ast.Import):
        targets = [a.name for a in child.names]
      elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
        targets = [child.module] + [f"{child.module}.{a.name}" for a in child.names]
      for t in targets:
        if t in known and t != PACKAGE:
          found.append((t, in_function))
      visit(child, inner)
  visit(tree, False)
  return found


def _graph():
  known = _modules()
  graph, lazy = {}, set()
  for module, path in known.items():
    edges = set()
    for target, in_function in _imports(path, known):
      if target == module:
        continue
      edges.add(target)
      parent = target.rsplit(".", 1)[0]
      if parent in known and parent != PACKAGE and parent != module:
        edges.add(parent)  # importing a.b runs a/__init__.py first
      if in_function:
        lazy.add((module, target))
    graph[module] = edges
  return graph, lazy


def _cycle(graph):
  """One cycle as a list of modules, or None (depth-first search)."""
  state, stack = {}, []

  def dfs(node):
    state[node] = "open"
    stack.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt):] + [nxt]
      if nxt not in state:
        found = dfs(nxt)
        if found:
          return found
    state[node] = "done"
    stack.pop()
    return None

  for node in sorted(graph):
    if node not in state:
      found = dfs(node)
      if found:
        return found
  return None


def test_no_import_cycles_counting_imports_inside_functions():
  graph, _ = _graph()
  cycle = _cycle(graph)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def test_imports_of_our_modules_inside_functions_are_only_the_listed_ones():
  _, lazy = _graph()
  assert lazy <= ALLOWED_LAZY, sorted(lazy - ALLOWED_LAZY)
