"""`python -m benchmarks <name> [flags]`, from the repository root: runs `benchmarks.<name>`.

The available names are the modules of the `benchmarks` package (the reproductions;
the user's tools are `python -m bertjax.benchmark <name>`).
"""

import importlib
import pkgutil
import sys

import benchmarks
from bertjax.console import cli


def available() -> list[str]:
  return sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)
                if not m.name.startswith("_"))


def main() -> None:
  names = available()
  if len(sys.argv) < 2 or sys.argv[1] not in names:
    print(f"usage: python -m benchmarks {{{','.join(names)}}} [flags]", file=sys.stderr)
    sys.exit(2)
  module = importlib.import_module(f"benchmarks.{sys.argv[1]}")
  if hasattr(module, "define_flags"):  # Modules whose flags would clash when imported
    module.define_flags()              # next to another benchmark (tests) define late.
  cli.run(module.main, argv=[f"{sys.argv[0]} {sys.argv[1]}", *sys.argv[2:]])


if __name__ == "__main__":
  main()
