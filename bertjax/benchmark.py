"""`python -m bertjax.benchmark <name> [flags]`: runs `bertjax.benchmarks.<name>`.

The available names are the modules of the `bertjax.benchmarks` package: the user's
measuring tools (`plan`: what fits a pod; `train`, `profile`: how fast a step is;
`data`, `soak`, `kernels`, ...). The reproductions of the documentation's side-by-sides
(against transformers, sentence-transformers, ELECTRA's claim; the GPU check) are not
part of the package: they live in the repository's top-level `benchmarks/` and run from
a checkout's root as `python -m benchmarks <name>`; such a name given here says so.
"""

import importlib
import os
import pkgutil
import sys

import bertjax.benchmarks
from bertjax.console import cli


def available() -> list[str]:
  return sorted(m.name for m in pkgutil.iter_modules(bertjax.benchmarks.__path__))


def _in_checkout(name: str) -> str | None:
  """The checkout root holding the reproduction `benchmarks/NAME.py`: the current
  folder, or the one that holds this bertjax (an editable install); None: neither."""
  if not name.isidentifier() or name.startswith("_"):
    return None
  package_root = os.path.dirname(os.path.dirname(os.path.abspath(bertjax.__file__)))
  for root in (os.getcwd(), package_root):
    if os.path.isfile(os.path.join(root, "benchmarks", f"{name}.py")):
      return root
  return None


def main() -> None:
  names = available()
  if len(sys.argv) >= 2 and sys.argv[1] not in names and _in_checkout(sys.argv[1]):
    print(f"error: `{sys.argv[1]}` is a reproduction of the repository, not a tool of "
          f"the package: run `python -m benchmarks {sys.argv[1]}` from the checkout's "
          f"root ({_in_checkout(sys.argv[1])})", file=sys.stderr)
    sys.exit(2)
  if len(sys.argv) < 2 or sys.argv[1] not in names:
    print(f"usage: python -m bertjax.benchmark {{{','.join(names)}}} [flags]",
          file=sys.stderr)
    sys.exit(2)
  module = importlib.import_module(f"bertjax.benchmarks.{sys.argv[1]}")
  if hasattr(module, "define_flags"):  # Modules whose flags would clash when imported
    module.define_flags()              # next to another benchmark (tests) define late.
  cli.run(module.main, argv=[f"{sys.argv[0]} {sys.argv[1]}", *sys.argv[2:]])


if __name__ == "__main__":
  main()
