"""User-facing errors: each one is printed as a single line naming the problem and the fix."""


class BertjaxError(Exception):
  """Base class: `bertjax.main` prints `error: <message>` and exits with status 2."""


class ConfigError(BertjaxError, ValueError):
  """A config field is out of range or inconsistent (the message names the field)."""


class DataError(BertjaxError, ValueError):
  """A corpus, tokenizer or data file is missing, empty, binary or malformed."""


class CheckpointError(BertjaxError):
  """A checkpoint is missing, corrupt, or does not match the model / tokenizer."""


class TrainingError(BertjaxError):
  """Training cannot go on (for example a non-finite loss); the message names the last
  good checkpoint."""


# Range checks of config values, for the module that owns each config section: each
# failure is one ConfigError line naming the field, its value and what is allowed.


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def at_least(field: str, value, lo) -> None:
  """`config.field` >= `lo` (NaN fails)."""
  if not (_number(value) and value >= lo):
    raise ConfigError(f"config.{field}={value!r} must be >= {lo}.")


def positive(field: str, value, why: str = "") -> None:
  """`config.field` finite and > 0."""
  if not (_number(value) and 0 < value < float("inf")):
    raise ConfigError(f"config.{field}={value!r} must be positive{why}.")


def within(field: str, value, lo, hi, interval: str = "[]") -> None:
  """`config.field` in the interval from `lo` to `hi`, closed or open at each end as
  written in `interval` ('[]', '[)', '(]' or '()'); NaN fails."""
  ok = _number(value) and value == value and abs(value) != float("inf") and (
      (value >= lo if interval[0] == "[" else value > lo)
      and (value <= hi if interval[1] == "]" else value < hi))
  if not ok:
    raise ConfigError(f"config.{field}={value!r} must lie in {interval[0]}{lo}, {hi}"
                      f"{interval[1]}.")


def one_of(field: str, value, choices) -> None:
  """`config.field` is one of `choices`."""
  if value not in choices:
    raise ConfigError(f"config.{field}={value!r}: use one of {tuple(choices)}.")


def seed(field: str, value) -> None:
  """A seed numpy's generators take: a non-negative integer."""
  if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
    raise ConfigError(f"config.{field}={value!r} must be a non-negative integer "
                      "(numpy's generators refuse negative seeds).")
