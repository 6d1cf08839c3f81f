"""What every command-line program of bertjax shares: a `BertjaxError` (or any other
one-line message) is printed as `error: MESSAGE` on stderr and the program exits with
status 2, without a traceback.

  if __name__ == "__main__":
    cli.run(main)             # absl's app.run(main), with one-line errors
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, NoReturn

from absl import app, logging

from bertjax.errors import BertjaxError


def fail(message: str) -> NoReturn:
  """Prints `error: MESSAGE` on stderr and exits with status 2."""
  logging.flush()
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
  """A `BertjaxError` raised inside becomes `fail(its message)`."""
  try:
    yield
  except BertjaxError as e:
    fail(str(e))


def run(main: Callable[[list[str]], None], **kwargs) -> None:
  """`absl.app.run(main, **kwargs)` with `main` inside `one_line_errors`."""

  def guarded(argv):
    with one_line_errors():
      main(argv)

  app.run(guarded, **kwargs)
