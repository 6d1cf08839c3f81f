"""python -m bertjax.merge: averaging and TIES-merging checkpoints of one architecture
(bertjax/checkpoint/merging.py), on arrays whose merge is worked out by hand and on
Hugging Face folders read back."""

import os
import shutil

import numpy as np
import pytest

from bertjax import merge
from bertjax.checkpoint import merging, pretrained as pretrained_lib
from bertjax.errors import CheckpointError, ConfigError


def test_average_is_the_weighted_mean_leaf_by_leaf():
  a = {"x": np.array([1.0, 2.0], np.float32), "y": {"z": np.array([[0.0]], np.float32)}}
  b = {"x": np.array([3.0, 6.0], np.float32), "y": {"z": np.array([[4.0]], np.float32)}}
  out = merging.average([a, b], [1, 3])
  np.testing.assert_array_equal(out["x"], [2.5, 5.0])
  np.testing.assert_array_equal(out["y"]["z"], [[3.0]])
  assert out["x"].dtype == np.float32
  np.testing.assert_array_equal(merging.average([a, b])["x"], [2.0, 4.0])


def test_ties_trims_elects_signs_and_averages_the_agreeing_entries():
  """Worked by hand. Base 1 everywhere; differences tau1 = [3, -2, 1, 0.5, 0] and
  tau2 = [-1, -4, 2, -0.5, 0]; density 0.6 keeps 3 of 5 entries of each:
  [3, -2, 1, 0, 0] and [-1, -4, 2, 0, 0]; their sum [2, -6, 3, 0, 0] elects
  [+, -, +, +, +]; the agreeing entries' means: [3, -3, 1.5, 0, 0] (no entry agrees
  in the last two: 0)."""
  base = {"w": np.ones(5, np.float32)}
  t1 = {"w": base["w"] + np.array([3, -2, 1, 0.5, 0], np.float32)}
  t2 = {"w": base["w"] + np.array([-1, -4, 2, -0.5, 0], np.float32)}
  out = merging.ties(base, [t1, t2], density=0.6)
  np.testing.assert_allclose(out["w"], 1 + np.array([3, -3, 1.5, 0, 0]))
  half = merging.ties(base, [t1, t2], density=0.6, scale=0.5)
  np.testing.assert_allclose(half["w"], 1 + 0.5 * np.array([3, -3, 1.5, 0, 0]))
  # Weights 3 and 1: the weighted [9, -6, 3, 0, 0] and [-1, -4, 2, 0, 0] sum to
  # [8, -10, 5, 0, 0], the same signs; the agreeing entries' sums over their weights.
  weighted = merging.ties(base, [t1, t2], [3, 1], density=0.6)
  np.testing.assert_allclose(weighted["w"], 1 + np.array([3, (-6 - 4) / 4, (3 + 2) / 4, 0, 0]))
  # Density 1 keeps everything: [2, -6, 3, 0, 0] elects [+, -, +, +, +]; entry 4's
  # agreeing one is tau1's 0.5 alone.
  full = merging.ties(base, [t1, t2])
  np.testing.assert_allclose(full["w"], 1 + np.array([3, -3, 1.5, 0.5, 0]))
  np.testing.assert_array_equal(merging.trim(np.array([1.0, -1.0, 0.5]), 0.4), [1, 0, 0])


@pytest.fixture(scope="module")
def bert_folders(tmp_path_factory, minilm_dir):
  """Three random 1-layer BERTs of one config and MiniLM's vocabulary, and one wider."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  root = tmp_path_factory.mktemp("merge")
  out = {}
  for name, seed, hidden in (("a", 0, 32), ("b", 1, 32), ("base", 2, 32), ("wide", 3, 64)):
    torch.manual_seed(seed)
    transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=30522, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64)).save_pretrained(str(root / name))
    shutil.copy(os.path.join(minilm_dir, "vocab.txt"), root / name / "vocab.txt")
    out[name] = str(root / name)
  return out


def _params(path):
  return pretrained_lib.load_pretrained(path).params


def test_merged_folders_read_back_as_the_merge_of_their_parameters(bert_folders, tmp_path):
  """`merge_checkpoints` writes a Hugging Face folder whose parameters, read back, are
  the average (weights 1:3) or the TIES merge onto --base of the sources'; --to=bertjax
  writes a workdir that reads back the same."""
  import jax  # pylint: disable=g-import-not-at-top
  a, b, base = (_params(bert_folders[k]) for k in ("a", "b", "base"))
  dst = str(tmp_path / "avg")
  assert merge.merge_checkpoints([bert_folders["a"], bert_folders["b"]], dst,
                                 weights=[1, 3]) == "bert"
  for got, want in zip(jax.tree.leaves(_params(dst)),
                       jax.tree.leaves(merging.average([a, b], [1, 3]))):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  dst = str(tmp_path / "ties")
  merge.merge_checkpoints([bert_folders["a"], bert_folders["b"]], dst, "ties",
                          base=bert_folders["base"], density=0.3, to="bertjax")
  want = merging.ties(base, [a, b], density=0.3)
  for x, y in zip(jax.tree.leaves(_params(dst)["encoder"]), jax.tree.leaves(want["encoder"])):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_merge_refuses_in_one_line(bert_folders, tmp_path):
  a, b = bert_folders["a"], bert_folders["b"]
  cases = [
      (lambda: merge.merge_checkpoints([a, bert_folders["wide"]], str(tmp_path / "x")),
       CheckpointError, "hidden_size=64 where"),
      (lambda: merge.merge_checkpoints([a, b], a), CheckpointError,
       "an export never writes where it reads"),
      (lambda: merge.merge_checkpoints([a, b], str(tmp_path / "y"), "ties"), ConfigError,
       "give --base"),
      (lambda: merge.merge_checkpoints([a], str(tmp_path / "z")), ConfigError,
       "merge two or more"),
      (lambda: merge.merge_checkpoints([a, b], str(tmp_path / "w"), weights=[1]),
       ConfigError, "2 checkpoints"),
  ]
  for fn, error, message in cases:
    with pytest.raises(error, match=message) as e:
      fn()
    assert "\n" not in str(e.value)
  assert not os.listdir(tmp_path)  # nothing written
