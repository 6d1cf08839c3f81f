"""The import graph of bertjax/ flows one way (read from the source with `ast`, every
import counted, function-level ones included): every module sits on a floor of
`FLOORS` and imports only its own floor and those below, with no cycle; nothing imports
`configs/` or the repository's `benchmarks/` (the reproductions: they import bertjax and
are not installed with it), and no module reaches for another's private (`_name`)
attributes. A program's `if __name__ == "__main__":` block is its entry point, not a
library import, and is left out.

  python -m tests.test_imports   # the floors, modules per folder, cycles, back-edges
"""

from __future__ import annotations

import ast
import graphlib
import os
import tempfile

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


# Top-level packages of the repository that bertjax/ never imports: the recipes (read by
# path, as --config reads them) and the reproductions (`python -m benchmarks NAME`).
OUTSIDE = ("configs", "benchmarks")


def _imports(path: str, module: str, modules: set[str]):
  """(imported bertjax modules, `configs` and `benchmarks` imports, aliases of bertjax
  modules, tree)."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  found, configs, aliases = set(), [], {}
  for node in _nodes(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name.split(".")[0] in OUTSIDE:
          configs.append(a.name)
        if a.name in modules:
          found.add(a.name)
          aliases[a.asname or a.name] = a.name
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative import
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([node.module] if node.module else []))
      if base.split(".")[0] in OUTSIDE:
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
  """({module: modules it imports}, {module: its configs and benchmarks imports},
  [private uses])."""
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


GRAPH, OUTSIDE_IMPORTS, PRIVATE = _graph()


# The floors of bertjax/, bottom up: a module imports its own floor and those below.
# A package's modules share its floor (data/prepare.py, an entry point inside data/,
# included); the top floor holds the programs and the Python API.
FLOORS = (
    # one-line errors; what the terminal shows; the names of a workdir's files
    ("bertjax.errors", "bertjax.console", "bertjax.checkpoint.files"),
    ("bertjax.model", "bertjax.parallel"),  # Flax modules and their configs; the mesh
    ("bertjax.objectives",),  # pretraining objectives by name: fields, heads, losses
    # corpora, tokenizers, prepare, example rows, masking, pipeline; what a command may
    # write (bertjax.writes: prepare's output, every workdir and export)
    ("bertjax.data", "bertjax.writes"),
    ("bertjax.hf",),  # Hugging Face checkpoints <-> parameters
    ("bertjax.checkpoint",),  # workdirs: orbax, config.json, parameters, pretrained
    ("bertjax.train",),  # THE trainer, the step, optimizers, pretraining's run
    ("bertjax.tasks",),  # fine-tuning tasks, their run, sweep, predictions
    ("bertjax.embeddings",),  # contextual embeddings from a pretrained encoder
    ("bertjax.benchmarks",),  # `python -m bertjax.benchmark NAME`
    ("bertjax", "bertjax.api", "bertjax.main", "bertjax.finetune", "bertjax.predict",
     "bertjax.embed", "bertjax.fill_mask", "bertjax.convert", "bertjax.plot", "bertjax.mine",
     "bertjax.rerank", "bertjax.merge", "bertjax.benchmark"),  # the programs and the Python API
)


def floor_of(module: str) -> int | None:
  """The floor `module` (or the package it lies in) is listed on; None: on none."""
  for level, names in enumerate(FLOORS):
    if module in names or any(module.startswith(n + ".") for n in names if n != "bertjax"):
      return level
  return None


def back_edges() -> list[str]:
  """'a -> b' for every import of a module on a higher floor than the importer's."""
  return sorted(f"{m} -> {d}" for m, deps in GRAPH.items() for d in deps
                if floor_of(d) is not None and floor_of(m) is not None
                and floor_of(d) > floor_of(m))


def cycles() -> list[list[str]]:
  """The strongly connected components of more than one module (each holds a cycle)."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in GRAPH[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(GRAPH):
    if v not in index:
      visit(v)
  return out


def test_every_module_is_on_a_floor():
  assert not [m for m in GRAPH if floor_of(m) is None], (
      "modules on no floor of FLOORS (add each where it belongs): "
      f"{sorted(m for m in GRAPH if floor_of(m) is None)}")


def test_no_module_imports_a_higher_floor():
  assert not back_edges(), f"imports that run back up the floors: {back_edges()}"


def test_no_import_cycles():
  assert not cycles(), f"import cycles among: {cycles()}"
  graphlib.TopologicalSorter(GRAPH).prepare()  # the same, by another algorithm


def test_nothing_under_bertjax_imports_configs_or_the_reproductions():
  assert not OUTSIDE_IMPORTS, OUTSIDE_IMPORTS


def test_no_module_uses_another_modules_private_names():
  assert not PRIVATE, PRIVATE


def test_the_graph_is_read():
  """The checks above see real edges (a parser that found none would pass them): a
  known edge of each kind of import, and a planted back-edge and cycle are found."""
  assert "bertjax.checkpoint.manager" in GRAPH["bertjax.train.trainer"]  # from a import b
  assert "bertjax.checkpoint.pretrained" in GRAPH["bertjax.api"]  # from a.b import c
  assert "bertjax.train.pretrain" in GRAPH["bertjax.main"]  # inside a function
  assert len(GRAPH) > 60
  for source in ("import benchmarks.gpu", "from benchmarks import gpu_report",
                 "def f():\n  from configs import bert_tiny"):
    with tempfile.TemporaryDirectory() as d:
      path = os.path.join(d, "planted.py")
      with open(path, "w") as f:
        f.write(source + "\n")
      assert _imports(path, "bertjax.planted", set(GRAPH))[1], source
  GRAPH["bertjax.errors"].add("bertjax.train.trainer")
  try:
    assert "bertjax.errors -> bertjax.train.trainer" in back_edges()
    assert any("bertjax.errors" in c and "bertjax.train.trainer" in c for c in cycles())
  finally:
    GRAPH["bertjax.errors"].discard("bertjax.train.trainer")


if __name__ == "__main__":
  import collections
  paths = _module_names()
  folders = collections.Counter(os.path.relpath(os.path.dirname(paths[m]), REPO)
                                for m in GRAPH)
  for level, names in reversed(list(enumerate(FLOORS))):
    print(f"floor {level}: " + ", ".join(names))
  print("modules per folder:", dict(sorted(folders.items())))
  print(f"modules {len(GRAPH)} | imports {sum(map(len, GRAPH.values()))} | cycles "
        f"{cycles() or 0} | back-edges {back_edges() or 0}")
