"""The user's measuring tools, one module per subcommand of `python -m bertjax.benchmark
<name>`: what fits a pod or a GPU (`plan`, compiled for abstract TPU devices or an
H200/H100 target: `gpu_target`), how fast a step is (`train`, with `--compare=hf`
against transformers through `hf_reference`; `profile`, its trace read by `trace` and
`xplane`), the input pipeline's speed and start-up at scale (`data`, `data --scale`:
`data_scale`), a long run's memory and checkpoints (`soak`), the attention kernels
(`kernels`), and the FLOPs and chips these share (`flops`).

Each module `bertjax.benchmarks.<name>` defines `main(argv)` (absl-style argv, flags
parsed by the module). Speed and memory goals are measured here, never in timed tests.

The reproductions of the documentation's side-by-sides (pretraining and fine-tuning
against transformers, retrieval against sentence-transformers, ELECTRA's claim, the
one-call GPU check and its levers) are not part of the package: they live in the
repository's top-level `benchmarks/`, run from a checkout as `python -m benchmarks
<name>`, and import bertjax; nothing here imports them.
"""
