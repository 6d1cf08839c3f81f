"""The random streams drawn from the one config seed, so that each use gets independent
numbers: the held-out split, the examples of each split, the shuffle and the masks
(the pipeline and `prepare` draw from the same ones)."""

from __future__ import annotations

import numpy as np

SPLIT, TRAIN_EXAMPLES, EVAL_EXAMPLES, SHUFFLE, TRAIN_MASKS, EVAL_MASKS = range(6)


def stream_seed(seed: int, stream: int, *extra: int) -> int:
  """A 32-bit seed for one use of the config seed (grain wants [0, 2**32))."""
  return int(np.random.SeedSequence([seed, stream, *extra]).generate_state(1)[0])
