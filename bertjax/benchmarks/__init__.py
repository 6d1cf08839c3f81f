"""Benchmarks, one module per subcommand of `python -m bertjax.benchmark <name>`.

Each module `bertjax.benchmarks.<name>` defines `main(argv)` (absl-style argv, flags
parsed by the module). Speed and memory goals are measured here, never in timed tests.
"""

import importlib.util
import os

import ml_collections

_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "configs")


def recipe(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of configs/NAME.py, loaded by path as --config loads it (bertjax
  imports nothing from configs/)."""
  spec = importlib.util.spec_from_file_location(
      f"bertjax_recipe_{name.replace('/', '_')}", os.path.join(_CONFIGS, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)
