"""The repository's reproductions: `python -m benchmarks <name> [flags]`, from a checkout's
root (this package is not installed: pyproject.toml installs bertjax and configs only).

Each module `benchmarks.<name>` reproduces a side-by-side or a report's figures, the
evidence behind the documentation rather than the library: pretraining and fine-tuning
against transformers (`pretrain_fidelity`, `fidelity`, `finetune`, `continued_hf`), the
embedding model against sentence-transformers (`retrieval_example`) and exact search
against faiss (`search`), ELECTRA's claim (`electra_claim`), the one-call GPU check and
its program levers (`gpu`, `levers`); `text_tasks`, `docstrings` and `gpu_report` are
their helpers. A benchmark module defines `main(argv)` (absl-style argv, flags parsed by
the module). They import bertjax freely; nothing under bertjax/ imports them. The user's
measuring tools (`benchmark plan`, `train`, `profile`, `data`, ...) stay in the package:
`python -m bertjax.benchmark <name>` (bertjax/benchmarks/).
"""

import importlib.util
import os

import ml_collections

_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "configs")


def recipe(name: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of configs/NAME.py, loaded by path as --config loads it."""
  spec = importlib.util.spec_from_file_location(
      f"bertjax_recipe_{name.replace('/', '_')}", os.path.join(_CONFIGS, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)
