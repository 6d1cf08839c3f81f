"""A reranker's step on an 8-device mesh (issue 57, item 6): the loss and gradients of
a batch of groups sharded over 8 devices are one device's with the whole batch, for
a pointwise loss (BCE), an in-group one (MNRL) and the listwise ones whose count spans
the batch (LambdaLoss, its NDCG@k form, ListNet)."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from bertjax.errors import ConfigError
from bertjax.parallel import mesh as mesh_lib
from bertjax.tasks import base, finetune, rerank, reranker as reranker_lib
from tests.test_rerank_export import _reranker
from tests.test_retrieval import RULES, _assert_trees_close

B, G, T = 8, 4, 16


def _loss_and_grads(task, model, params, batch, devices):
  mesh = jax.make_mesh((len(devices), 1, 1), mesh_lib.AXES, devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  obj = finetune.objective(task, model, {k: v[:1] for k, v in batch.items()})
  loss = lambda p, b: obj.loss(obj.sums(p, b, None), obj.counts(b))
  shard = mesh_lib.batch_sharding(mesh, RULES)
  replicated = NamedSharding(mesh, PartitionSpec())
  with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
    f = jax.jit(jax.value_and_grad(loss), in_shardings=(replicated, shard))
    value, grads = f(jax.device_put(params, replicated), jax.device_put(batch, shard))
  return float(value), jax.device_get(grads)


def _batch(rng, vocab_size, B, G, T):  # pylint: disable=redefined-outer-name
  """B groups of G pairs of up to T tokens: random ids and lengths, lists of 2..G pairs,
  graded labels with a positive first, the last group of weight 0."""
  ids = rng.integers(5, vocab_size, (B, G, T)).astype(np.int32)
  lengths = rng.integers(4, T + 1, (B, G))
  mask = (np.arange(T) < lengths[..., None]).astype(np.int32)
  pair_mask = (np.arange(G) < rng.integers(2, G + 1, B)[:, None]).astype(np.float32)
  batch = {"input_ids": ids * mask, "attention_mask": mask,
           "token_type_ids": np.zeros_like(ids), "pair_mask": pair_mask,
           "labels": rng.integers(0, 3, (B, G)).astype(np.float32) * pair_mask,
           "example_weights": np.asarray([1] * (B - 1) + [0], np.float32)}
  batch["labels"][:, 0] = 2  # A positive first (MNRL).
  return batch


@pytest.mark.slow
def test_eight_devices_equal_one_with_the_whole_batch(tmp_path):
  ours = _reranker("bert", str(tmp_path / "tokenizer"))
  batch = _batch(np.random.default_rng(0), ours.config.vocab_size, B, G, T)
  model = base.FinetuneModel(ours.config, ours.task.head(ours.config))
  for loss, k in (("bce", 0), ("mnrl", 0), ("lambda", 0), ("lambda", 2), ("listnet", 0)):
    task = rerank.Rerank(reranker_lib.task_config(loss=loss, lambda_k=k,
                                                  max_seq_length=T), ours.tokenizer, T)
    if loss == "bce":
      task_batch = dict(batch, labels=(batch["labels"] > 1).astype(np.float32))
    else:
      task_batch = batch
    one = _loss_and_grads(task, model, ours.params, task_batch, jax.devices()[:1])
    eight = _loss_and_grads(task, model, ours.params, task_batch, jax.devices()[:8])
    assert eight[0] == pytest.approx(one[0], rel=1e-6), loss
    _assert_trees_close(eight[1], one[1], 1e-5)
    assert one[0] > 0, loss


@pytest.mark.slow
def test_mini_batches_give_the_whole_batch_in_less_memory(tmp_path):
  """`task.mini_batch_size` (GradCache; MNRL with it is sentence-transformers'
  CachedMultipleNegativesRankingLoss): the loss and gradients of 8 pairs at a time are
  the whole batch's at once, on one device and on 8; the compiled step's temporary
  memory shrinks with the mini-batch."""
  ours = _reranker("bert", str(tmp_path / "tokenizer"))
  batch = _batch(np.random.default_rng(1), ours.config.vocab_size, B, G, T)
  model = base.FinetuneModel(ours.config, ours.task.head(ours.config))
  whole, cached = (rerank.Rerank(reranker_lib.task_config(
      loss="mnrl", max_seq_length=T, mini_batch_size=m), ours.tokenizer, T) for m in (0, 8))
  one = _loss_and_grads(whole, model, ours.params, batch, jax.devices()[:1])
  for devices in (jax.devices()[:1], jax.devices()[:8]):
    got = _loss_and_grads(cached, model, ours.params, batch, devices)
    assert got[0] == pytest.approx(one[0], rel=1e-6)
    _assert_trees_close(got[1], one[1], 1e-5)
  big = _batch(np.random.default_rng(2), ours.config.vocab_size, 2, 32, 64)
  temp = {}
  for m in (0, 8):
    task = rerank.Rerank(reranker_lib.task_config(loss="mnrl", max_seq_length=64,
                                                  mini_batch_size=m), ours.tokenizer, 64)
    obj = finetune.objective(task, model, {k: v[:1] for k, v in big.items()})
    grad = jax.jit(jax.grad(lambda p, b: obj.loss(obj.sums(p, b, None), obj.counts(b))))
    temp[m] = grad.lower(ours.params, big).compile().memory_analysis().temp_size_in_bytes
  assert temp[8] < temp[0] / 3, temp
  with pytest.raises(ConfigError, match="mini_batch_size=5 does not divide the 64 pairs"):
    task = rerank.Rerank(reranker_lib.task_config(loss="mnrl", max_seq_length=64,
                                                  mini_batch_size=5), ours.tokenizer, 64)
    obj = finetune.objective(task, model, {k: v[:1] for k, v in big.items()})
    jax.eval_shape(lambda p, b: obj.sums(p, b, None), ours.params, big)
