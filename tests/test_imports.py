"""The package's import graph: the library's layers import only the layers below them; no cycles,
counting the imports inside functions too (a cycle hidden in a function is still a cycle: it only
fails later, and in a different order); every import of our own modules inside a function is one
of the few listed here with its reason; exception types come from their one module."""

import ast
import os

from tests.common import REPO

PACKAGE = "transformer_jax"

# The library's layers, lowest first: a module imports only modules of its own layer or a lower
# one. A layer is a subpackage; the modules at the package's top (main, train and the translate
# shim) are the entry points, and tools/ sit above everything, so nothing in the library imports
# them.
LAYERS = ("runtime", "data", "model", "decoding", "tasks", "training", "inference", "<entry>",
          "tools")

EXCEPTIONS_MODULE = "transformer_jax.runtime.exceptions"

# (module, imported module): function-level imports of our own modules that stay, and why.
ALLOWED_LAZY = {
    # The entry point re-executes itself with malloc settings before jax is imported
    # (host_memory.py); these modules import jax, so main imports them only once it runs.
    ("transformer_jax.main", "transformer_jax.runtime.distributed"),
    ("transformer_jax.main", "transformer_jax.training.branch"),
    ("transformer_jax.main", "transformer_jax.train"),
    ("transformer_jax.main", "transformer_jax.training.averaging"),
    ("transformer_jax.main", "transformer_jax.inference.evaluate"),
    ("transformer_jax.main", "transformer_jax.inference.translate"),
    # The parameter count checks its flags and config before JAX loads (the model imports it).
    ("transformer_jax.tools.params", "transformer_jax.model.transformer"),
    # The exporter refuses a bad --out or --format before JAX loads (these modules import it).
    ("transformer_jax.tools.export", "transformer_jax.inference.trained"),
    ("transformer_jax.tools.export", "transformer_jax.model.positional"),
    ("transformer_jax.tools.export", "transformer_jax.model.transformer"),
    ("transformer_jax.tools.export", "transformer_jax.tasks.registry"),
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
        # `from pkg import mod` imports pkg.mod (and runs pkg/__init__.py, an edge _graph adds)
        targets = [f"{child.module}.{a.name}" if f"{child.module}.{a.name}" in known
                   else child.module for a in child.names]
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


def layer(module: str) -> str:
  """The layer of a module of ours: its subpackage, or '<entry>' at the package's top."""
  parts = module.split(".")
  if len(parts) == 1:
    return "<entry>"
  if len(parts) == 2 and parts[1] not in LAYERS:
    return "<entry>"
  return parts[1]


def layer_violations(graph) -> set[tuple[str, str]]:
  """The (module, imported module) edges that go up the layers."""
  rank = {name: i for i, name in enumerate(LAYERS)}
  return {(m, t) for m, targets in graph.items() for t in targets
          if rank[layer(t)] > rank[layer(m)]}


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


def test_each_layer_imports_only_the_layers_below_it():
  graph, _ = _graph()
  for module in graph:
    assert layer(module) in LAYERS, f"{module} is in no layer of LAYERS"
  found = layer_violations(graph)
  assert not found, "imports up the layers: " + ", ".join(
      f"{m} imports {t}" for m, t in sorted(found))


def test_the_layer_check_finds_an_import_up_the_layers():
  graph = {"transformer_jax.model.attention": {"transformer_jax.training.step"},
           "transformer_jax.training.step": {"transformer_jax.model.attention"},
           "transformer_jax.main": {"transformer_jax.tools.params"},
           "transformer_jax.tools.params": {"transformer_jax.main"}}
  assert layer_violations(graph) == {
      ("transformer_jax.model.attention", "transformer_jax.training.step"),
      ("transformer_jax.main", "transformer_jax.tools.params")}
  assert layer("transformer_jax.train") == "<entry>"
  assert layer("transformer_jax.tasks.parsing.treebank") == "tasks"


def _exception_imports(path):
  """(line, name, module) of each exception type imported from anywhere but its module."""
  from transformer_jax.runtime import exceptions  # pylint: disable=g-import-not-at-top
  names = {n for n in vars(exceptions) if isinstance(getattr(exceptions, n), type)}
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
      for a in node.names:
        if a.name in names and node.module != EXCEPTIONS_MODULE:
          found.append((node.lineno, a.name, node.module))
    elif (isinstance(node, ast.Attribute) and node.attr in names
          and isinstance(node.value, ast.Name) and node.value.id != "exceptions"):
      found.append((node.lineno, node.attr, node.value.id))
  return found


def test_exception_types_come_from_their_one_module():
  bad = []
  for top in (PACKAGE, "experiments", "benchmarks", "launch", "tests", "configs"):
    for folder, _, names in os.walk(os.path.join(REPO, top)):
      for name in names:
        if name.endswith(".py"):
          path = os.path.join(folder, name)
          bad += [f"{os.path.relpath(path, REPO)}:{line}: {n} from {m}"
                  for line, n, m in _exception_imports(path)]
  assert not bad, "\n".join(bad)
