"""The import graph of bertjax/ flows one way (read from the source with `ast`, every
import counted, function-level ones included): no cycle, nothing imports `configs/`,
the checkpoint layer sits below the trainer, and no module reaches for another's
private (`_name`) attributes. A program's `if __name__ == "__main__":` block is its
entry point, not a library import, and is left out."""

from __future__ import annotations

import ast
import graphlib
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "bertjax")


def _module_names() -> dict[str, str]:
  """{dotted module name: file path} of every module under bertjax/."""
  out = {}
  for root, _, names in os.walk(PACKAGE):
    for name in names:
      if name.endswith(".py"):
        rel = os.path.relpath(os.path.join(root, name), REPO)[:-3].replace(os.sep, ".")
        out[rel.removesuffix(".__init__")] = os.path.join(root, name)
  return out


def _is_main_guard(node: ast.AST) -> bool:
  return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
          and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _nodes(tree: ast.Module):
  """Every node of the module outside its `if __name__ == "__main__":` blocks."""
  stack = [n for n in tree.body if not _is_main_guard(n)]
  while stack:
    node = stack.pop()
    yield node
    stack.extend(ast.iter_child_nodes(node))


def _imports(path: str, module: str, modules: set[str]):
  """(imported bertjax modules, `configs` imports, aliases of bertjax modules, tree)."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  found, configs, aliases = set(), [], {}
  for node in _nodes(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name.split(".")[0] == "configs":
          configs.append(a.name)
        if a.name in modules:
          found.add(a.name)
          aliases[a.asname or a.name] = a.name
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative import
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([node.module] if node.module else []))
      if base.split(".")[0] == "configs":
        configs.append(base)
      for a in node.names:
        full = f"{base}.{a.name}"
        if full in modules:  # `from bertjax.train import loop`: the module
          found.add(full)
          aliases[a.asname or a.name] = full
        elif base in modules:  # `from bertjax.errors import ConfigError`: a name
          found.add(base)
  return found, configs, aliases, tree


def _graph():
  """({module: modules it imports}, {module: configs imports}, [private uses])."""
  modules = _module_names()
  graph, configs, private = {}, {}, []
  for module, path in modules.items():
    found, cfg, aliases, tree = _imports(path, module, set(modules))
    graph[module] = found - {module}
    if cfg:
      configs[module] = cfg
    for node in _nodes(tree):
      if isinstance(node, ast.ImportFrom):
        private += [f"{module}: from {node.module} import {a.name}" for a in node.names
                    if a.name.startswith("_") and a.name != "__version__"]
      elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in aliases and node.attr.startswith("_")
            and not node.attr.startswith("__")):
        private.append(f"{module}: {node.value.id}.{node.attr}")
  return graph, configs, private


GRAPH, CONFIG_IMPORTS, PRIVATE = _graph()


def _below(module: str) -> set[str]:
  """Every module `module` imports, directly or not."""
  seen, todo = set(), [module]
  while todo:
    for m in GRAPH[todo.pop()] - seen:
      seen.add(m)
      todo.append(m)
  return seen


def test_no_import_cycles():
  try:
    graphlib.TopologicalSorter(GRAPH).prepare()
  except graphlib.CycleError as e:
    raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None


def test_nothing_under_bertjax_imports_configs():
  assert not CONFIG_IMPORTS, CONFIG_IMPORTS


def test_checkpoint_sits_below_the_trainer():
  below = _below("bertjax.checkpoint")
  assert not {m for m in below if m.startswith("bertjax.train")}, below


def test_no_module_uses_another_modules_private_names():
  assert not PRIVATE, PRIVATE


def test_the_graph_is_read():
  """The checks above see real edges (a parser that found none would pass them)."""
  assert "bertjax.checkpoint" in GRAPH["bertjax.train.loop"]
  assert "bertjax.convert" in GRAPH["bertjax.api"]
  assert len(GRAPH) > 60
