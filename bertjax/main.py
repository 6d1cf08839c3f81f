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
  if metrics and jax.process_index() == 0 and "rtd_accuracy" in metrics:
    print(f"held-out generator MLM accuracy {metrics['generator_accuracy']:.4f}; "
          f"replaced-token detection accuracy {metrics['rtd_accuracy']:.4f}, precision "
          f"{metrics['rtd_precision']:.4f}, recall {metrics['rtd_recall']:.4f} of the "
          f"{metrics['replaced_fraction']:.4f} replaced")
  elif metrics and jax.process_index() == 0:
    print(f"held-out MLM accuracy {metrics['mlm_accuracy']:.4f} vs "
          f"{metrics['mlm_accuracy_most_frequent_baseline']:.4f} for always predicting the "
          "most frequent token"
          + (f"; NSP accuracy {metrics['nsp_accuracy']:.4f}" if "nsp_accuracy" in metrics
             else ""))


if __name__ == "__main__":
  cli.run(main, flags_parser=program.parse_flags)
