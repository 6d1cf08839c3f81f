"""A checkpoint's vocabulary-indexed parameters moved onto another tokenizer's ids, for
every family alike: the leaves are found by shape (`vocab_axes`: the token embedding,
the MLM decoder bias, any head's vocabulary bias), each new row is the mean of the old
rows its token comes from (`remap`; `bertjax.data.vocab_extension.row_sources`: a
token the old tokenizer has keeps its row, a new one starts from the mean of the
pieces the old tokenizer split it into), and rows past the tokenizer (the vocabulary
padded to a multiple the hardware likes) start far below every token (`pad_rows`).

Shapes: V the vocabulary's rows, E hidden.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from bertjax import model as model_lib

# A padding row's vocabulary bias sits this far below the lowest real row's: with its
# embedding row 0, its logit starts e^10 (22,000x) less likely than the least likely
# token's at a zero input. It is never a target (nor an input: masking draws random
# tokens from the tokenizer's ids), so every gradient step pushes it further down
# (d loss / d logit = its probability > 0); fill_mask cuts at the tokenizer's size.
PAD_MARGIN = 10.0

Path = tuple[str, ...]


def vocab_axes(config: Any) -> dict[Path, int]:
  """{path: the vocabulary axis} of every parameter of the pretraining model of
  `config` (its heads, its layout) whose shape follows `config.vocab_size`."""
  family = model_lib.family_of(config)

  def shapes(vocab: int) -> dict[Path, tuple[int, ...]]:
    model = family.pretraining(dataclasses.replace(config, vocab_size=vocab))
    tree = jax.eval_shape(lambda: model.init_params(jax.random.key(0)))
    return {tuple(k.key for k in path): getattr(leaf, "value", leaf).shape
            for path, leaf in jax.tree_util.tree_leaves_with_path(
                tree, is_leaf=lambda x: hasattr(x, "value"))}

  a, b = shapes(config.vocab_size), shapes(config.vocab_size + 1)
  return {path: next(k for k, (x, y) in enumerate(zip(a[path], b[path])) if x != y)
          for path in a if a[path] != b[path]}


def _get(tree: dict, path: Path):
  for k in path:
    if not isinstance(tree, dict) or k not in tree:
      return None
    tree = tree[k]
  return tree


def remap(params: dict, axes: dict[Path, int], sources: Sequence[tuple[int, ...]],
          rows: int) -> dict:
  """A copy of `params` (nested dicts of numpy arrays) whose leaves in `axes` have
  `rows` entries along their vocabulary axis: entry i the mean of the old entries
  `sources[i]` (one: a copy), zero where it has none or i >= len(sources) (then
  `pad_rows` them)."""
  out = jax.tree.map(lambda x: x, params)  # a new tree; leaves shared until replaced
  for path, axis in axes.items():
    old = _get(params, path)
    if old is None:  # a head the checkpoint lacks
      continue
    w = np.moveaxis(np.asarray(old, np.float32), axis, 0)
    new = np.zeros((rows, *w.shape[1:]), np.float32)
    for i, src in enumerate(sources[:rows]):
      if src:
        new[i] = w[list(src)].mean(0)
    node = out
    for k in path[:-1]:
      node = node[k]
    node[path[-1]] = np.moveaxis(new, 0, axis)
  return out


def pad_rows(leaf: np.ndarray, axis: int, rows: Sequence[int]) -> np.ndarray:
  """`leaf` with the vocabulary entries `rows` made padding: a 1-D leaf (a vocabulary
  bias) `PAD_MARGIN` below its lowest other entry, any other (an embedding) 0."""
  leaf = np.array(leaf, np.float32)
  index = [slice(None)] * leaf.ndim
  index[axis] = np.asarray(rows, np.int64)
  if leaf.ndim == 1:
    leaf[tuple(index)] = np.delete(leaf, rows).min() - PAD_MARGIN
  else:
    leaf[tuple(index)] = 0.0
  return leaf
