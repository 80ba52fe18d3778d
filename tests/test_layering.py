"""The package's layering: no import cycles and every import to the same stage or one below it.
Stages, bottom to top:

  runtime → data → model → config → workdir → interop → decoding → evaluation → training
  → commands → (cli.py, __main__.py)

The graph is read with `ast`, without importing anything, so the test is fast and sees imports
inside functions too (commands import their library that way). `python tests/test_layering.py`
prints the measurements: import levels, the longest chain, the longest file and the longest
function. A module's length is a guide (~450 lines), not a test: a module is split when it holds
two responsibilities, never only to meet a number.

ALLOWED_UPWARD holds today's upward imports. Each split that fixes one removes it from the list;
the test fails both on a new violation and on a listed one that no longer occurs, so the list
cannot go stale."""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "transformer_mt"
STAGES = (
  "runtime",
  "data",
  "model",
  "config",
  "workdir",
  "interop",
  "decoding",
  "evaluation",
  "training",
  "commands",
  "entry",  # cli.py and __main__.py
)

# Experiment files (the repository's experiments/, loaded by path) belong to the config stage.
EXPERIMENTS = "experiments"

# (importer, imported) module pairs that point up a stage, to be fixed by a split.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def module_files() -> dict[str, pathlib.Path]:
  """Every module of the package and every experiment file, by dotted name (packages by the
  name of their folder)."""
  files = {}
  for root, prefix in ((ROOT / PACKAGE, PACKAGE), (ROOT / EXPERIMENTS, EXPERIMENTS)):
    for path in sorted(root.rglob("*.py")):
      parts = [prefix, *path.relative_to(root).with_suffix("").parts]
      if parts[-1] == "__init__":
        parts.pop()
      files[".".join(parts)] = path
  return files


def stage(module: str) -> str:
  parts = module.split(".")
  if parts[0] == EXPERIMENTS:
    return "config"
  if len(parts) == 1:  # transformer_mt/__init__.py: empty, beneath everything
    return STAGES[0]
  if parts[1] in ("cli", "__main__"):
    return "entry"
  return parts[1]


def _resolve(name: str, modules: dict[str, pathlib.Path]) -> str | None:
  """The module `name` names, or the closest enclosing one (`a.b.attr` → `a.b`)."""
  while name and name not in modules:
    name = name.rpartition(".")[0]
  return name or None


def _imported_names(node: ast.AST, importer: str, is_package: bool) -> list[str]:
  """Dotted names one import statement (or `importlib.import_module("…")` call) brings in."""
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names]
  if isinstance(node, ast.ImportFrom):
    base = node.module or ""
    if node.level:
      package = importer.split(".")
      if not is_package:
        package = package[:-1]
      package = package[: len(package) - (node.level - 1)]
      base = ".".join([*package, base] if base else package)
    # `from a import b` may name a module a.b or an attribute of a: try the module first.
    return [f"{base}.{alias.name}" for alias in node.names]
  if (
    isinstance(node, ast.Call)
    and isinstance(node.func, ast.Attribute)
    and node.func.attr == "import_module"
    and node.args
    and isinstance(node.args[0], ast.Constant)
    and isinstance(node.args[0].value, str)
  ):
    return [node.args[0].value]
  return []


def import_graph(module_level_only: bool = False) -> dict[str, set[str]]:
  """module → the package modules it imports, anywhere in the file (or at module level only)."""
  modules = module_files()
  graph = {}
  for module, path in modules.items():
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if module_level_only else ast.walk(tree)
    targets = set()
    for node in nodes:
      for name in _imported_names(node, module, path.name == "__init__.py"):
        if name.split(".")[0] not in (PACKAGE, EXPERIMENTS):
          continue
        target = _resolve(name, modules)
        if target and target != module:
          targets.add(target)
    graph[module] = targets
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for target in sorted(graph[node]):
      if target not in index:
        visit(target)
        low[node] = min(low[node], low[target])
      elif target in on_stack:
        low[node] = min(low[node], index[target])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return found


def upward_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
  return {
    (module, target)
    for module, targets in graph.items()
    for target in targets
    if STAGES.index(stage(target)) > STAGES.index(stage(module))
  }


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
  """The longest import chain, importer first; its length is the number of import levels (a module
  importing nothing from the package is level 1). The graph must be acyclic."""
  chains: dict[str, list[str]] = {}

  def chain(node):
    if node not in chains:
      below = max((chain(target) for target in sorted(graph[node])), key=len, default=[])
      chains[node] = [node, *below]
    return chains[node]

  return max((chain(node) for node in sorted(graph)), key=len)


def line_counts() -> dict[str, int]:
  return {
    module: len(path.read_text().splitlines())
    for module, path in module_files().items()
    if module.startswith(PACKAGE)
  }


def longest_function() -> tuple[str, int]:
  """(module:function at line, lines) of the longest function or method in the package, nested
  functions counted in their enclosing one."""
  best = ("", 0)
  for module, path in module_files().items():
    if not module.startswith(PACKAGE):
      continue
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        lines = node.end_lineno - node.lineno + 1
        if lines > best[1]:
          best = (f"{module}:{node.name} (line {node.lineno})", lines)
  return best


def test_no_import_cycles():
  assert cycles(import_graph()) == []


def test_imports_point_to_the_same_stage_or_below():
  upward = upward_edges(import_graph())
  assert sorted(upward - ALLOWED_UPWARD) == [], "new upward imports"
  assert sorted(ALLOWED_UPWARD - upward) == [], "fixed: remove them from ALLOWED_UPWARD"


def test_every_module_has_a_known_stage():
  assert [module for module in module_files() if stage(module) not in STAGES] == []


def test_stage_packages_only_document():
  """A stage's __init__.py imports nothing, so importing one module never imports its stage."""
  for path in (ROOT / PACKAGE).rglob("__init__.py"):
    tree = ast.parse(path.read_text())
    assert not any(isinstance(node, ast.Import | ast.ImportFrom) for node in tree.body), path


def report() -> str:
  """The measurements, one per line."""
  lines = []
  for label, only in (("all imports", False), ("module-level imports only", True)):
    chain = longest_chain(import_graph(only))
    lines.append(f"import levels ({label}): {len(chain)}: {' → '.join(chain)}")
  counts = line_counts()
  longest = max(counts, key=counts.get)
  lines.append(f"longest file: {longest} ({counts[longest]} lines)")
  lines.append("longest function: {} ({} lines)".format(*longest_function()))
  graph = import_graph()
  lines.append(f"cycles: {cycles(graph) or 'none'}")
  lines.append(f"upward imports: {sorted(upward_edges(graph)) or 'none'}")
  lines.append(
    "modules over ~450 lines (a guide): "
    + (", ".join(f"{m} ({n})" for m, n in sorted(counts.items()) if n > 450) or "none")
  )
  return "\n".join(lines)


if __name__ == "__main__":
  print(report())
  sys.exit(0)
