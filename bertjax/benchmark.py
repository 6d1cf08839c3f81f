"""`python -m bertjax.benchmark <name> [flags]`: runs `bertjax.benchmarks.<name>`.

The available names are the modules of the `bertjax.benchmarks` package.
"""

import importlib
import pkgutil
import sys

import bertjax.benchmarks
from bertjax.console import cli


def available() -> list[str]:
  return sorted(m.name for m in pkgutil.iter_modules(bertjax.benchmarks.__path__))


def main() -> None:
  names = available()
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
