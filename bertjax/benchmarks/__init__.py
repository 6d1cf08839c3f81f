"""Benchmarks, one module per subcommand of `python -m bertjax.benchmark <name>`.

Each module `bertjax.benchmarks.<name>` defines `main(argv)` (absl-style argv, flags
parsed by the module). Speed and memory goals are measured here, never in timed tests.
"""
