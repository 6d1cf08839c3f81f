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
