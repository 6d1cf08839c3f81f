"""`python -m bertjax.plot --workdir=DIR [--out=PNG]`: the curves of a run's
metrics.jsonl as a PNG (`bertjax.train.curves`), by default WORKDIR/training.png — the
picture every run also leaves at its end."""

from __future__ import annotations

from absl import app, flags
from etils import epath

from bertjax import writes
from bertjax.checkpoint import files
from bertjax.console import cli
from bertjax.train import curves


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  print(f"wrote {draw(f.workdir, f.out, f.overwrite)}")


def draw(workdir: str, out: str = "", overwrite: bool = False) -> str:
  """The command: the run's picture redrawn (WORKDIR/training.png, the run's own file),
  or `out` (`bertjax.writes.output_file`: not metrics.jsonl, an existing file replaced
  only with `overwrite`). Returns what it wrote and the panels."""
  if not out:
    out = str(epath.Path(workdir) / files.PLOT_FILE)
    fig = curves.plot_training(workdir, out)
  else:
    metrics = str(epath.Path(workdir) / files.METRICS_FILE)
    with writes.output_file(out, overwrite, {"--workdir's metrics": metrics}) as tmp:
      fig = curves.plot_training(workdir, tmp)
  return f"{out}: " + ", ".join(ax.get_title() for ax in fig.axes)


def define_flags() -> None:
  """Defined only when run as a program (importing `plot` defines no flags)."""
  flags.DEFINE_string("workdir", None, "The run's workdir (holds metrics.jsonl).",
                      required=True)
  flags.DEFINE_string("out", "", "PNG to write; default WORKDIR/training.png.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing --out file.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
