"""Entry point: `python -m bertjax.main --config=configs/bert_tiny.py --workdir=DIR`.

Any config field can be overridden, e.g. `--config.train.batch_size=64`; a misspelt
field fails at start-up. Rerunning the same command resumes from the workdir. The
flags and the start-up are `bertjax.train.program`'s; the run is `bertjax.train.pretrain`.
"""

from absl import app

from bertjax.console import cli
from bertjax.train import program


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=g-import-not-at-top  (after flag parsing: fast --help)

  from bertjax.train import pretrain  # pylint: disable=g-import-not-at-top
  program.start()
  metrics = pretrain.run(program.CONFIG.value, program.WORKDIR.value)
  if metrics and jax.process_index() == 0:
    print(pretrain.summary(metrics))


if __name__ == "__main__":
  cli.run(main, flags_parser=program.parse_flags)
