"""`python -m bertjax.plot --workdir=DIR [--out=PNG]`: the curves of a run's
metrics.jsonl as a PNG (`bertjax.train.curves`), by default WORKDIR/training.png — the
picture every run also leaves at its end."""

from __future__ import annotations

from absl import app, flags
from etils import epath

from bertjax.checkpoint import files
from bertjax.console import cli
from bertjax.train import curves


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  out = f.out or str(epath.Path(f.workdir) / files.PLOT_FILE)
  fig = curves.plot_training(f.workdir, out)
  print(f"wrote {out}: " + ", ".join(ax.get_title() for ax in fig.axes))


def define_flags() -> None:
  """Defined only when run as a program (importing `plot` defines no flags)."""
  flags.DEFINE_string("workdir", None, "The run's workdir (holds metrics.jsonl).",
                      required=True)
  flags.DEFINE_string("out", "", "PNG to write; default WORKDIR/training.png.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
