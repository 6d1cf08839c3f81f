"""Rerankers out to sentence-transformers (issue 57, item 5): a random reranker of each
family whose table has a sequence-classification class, exported
(`reranker.export`, what `convert --to=hf` writes for a rerank workdir), loads in
`sentence_transformers.CrossEncoder(folder)` with its labels, activation and length
and scores pairs as bertjax does (within 1e-5), long pairs cut alike; read back by
bertjax as a published cross-encoder folder, it scores the same again."""

from __future__ import annotations

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax.hf import convert
from bertjax.tasks import base, rerank, reranker as reranker_lib
from tests.test_retrieval_export import _family

sentence_transformers = pytest.importorskip("sentence_transformers")
from sentence_transformers.cross_encoder import CrossEncoder  # noqa: E402

PAIRS = [("what is a tuple", "A tuple is an immutable sequence; a list can change."),
         ("homework on monday", "Please turn your homework in on Monday, or else! " * 5),
         ("fox", "The quick brown fox jumps over the lazy dog.")]
FAMILIES = [f for f in sorted(model_lib.FAMILIES) + ["roberta", "xlmr"]
            if "classification" in convert.family_table(
                "bert" if f in ("roberta", "xlmr") else f).TASK_CLASSES]


def _reranker(family, directory, num_labels=1):
  section, tok, _, _ = _family(family, directory)
  config = model_lib.config_from(ml_collections.ConfigDict({**section, "dtype": "float32"}))
  task = rerank.Rerank(reranker_lib.task_config(
      max_seq_length=24, num_labels=num_labels,
      loss="bce" if num_labels == 1 else "cross_entropy"), tok, 24)
  model = base.FinetuneModel(config, task.head(config))
  batch = {k: np.ones((1, 1, 8), np.int32) for k in base.TOKEN_KEYS}
  params = jax.jit(model.init)(jax.random.key(1), batch)["params"]
  params = jax.tree.map(lambda x: x + 0.02 * jax.random.normal(  # Biases and norms too.
      jax.random.key(2), x.shape), nn.unbox(params))
  return reranker_lib.Reranker(config, params, tok, task)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_exported_folder_scores_as_bertjax(family, tmp_path):
  ours = _reranker(family, str(tmp_path / "tokenizer"))
  folder = str(tmp_path / "ce")
  reranker_lib.export(folder, ours)
  theirs = CrossEncoder(folder, device="cpu")
  assert (theirs.num_labels, theirs.max_seq_length) == (1, 24)
  assert type(theirs.activation_fn).__name__ == "Sigmoid"
  want = theirs.predict(PAIRS)
  np.testing.assert_allclose(ours.predict(PAIRS), want, atol=1e-5, err_msg=family)
  back = reranker_lib.load_reranker(folder)
  np.testing.assert_allclose(back.predict(PAIRS), want, atol=1e-5, err_msg=family)


def test_several_labels_export_identity(tmp_path):
  ours = _reranker("bert", str(tmp_path / "tokenizer"), num_labels=3)
  reranker_lib.export(str(tmp_path / "ce"), ours)
  theirs = CrossEncoder(str(tmp_path / "ce"), device="cpu")
  assert theirs.num_labels == 3 and type(theirs.activation_fn).__name__ == "Identity"
  np.testing.assert_allclose(ours.predict(PAIRS), theirs.predict(PAIRS), atol=1e-5)
