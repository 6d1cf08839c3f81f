"""The pure train step on an 8-device mesh with synthetic batches: compiles once, loss
falls, gradient accumulation is exact, bf16 compute keeps fp32 master weights; the
optimizer's schedule and decay mask follow BERT."""

import flax.linen as nn
import jax
import numpy as np
import pytest


from bertjax.errors import ConfigError
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import optimizer, state as state_lib
from tests.helpers import synthetic_batch, tiny_config


def _run(config, batches, max_traces=None):
  t = state_lib.build_trainer(config)
  state = t.init_state(config)
  with jax.set_mesh(t.mesh), nn.logical_axis_rules(t.rules):
    losses = []
    for b in batches:
      state, m = t.train_step(state, mesh_lib.put_batch(b, t.batch_sharding))
      losses.append(float(m["loss"]))
  if max_traces is not None:
    assert t.train_step.jitted._cache_size() <= max_traces  # compiled once for all the steps
  return state, losses


@pytest.mark.slow
def test_compiles_once_and_loss_falls():
  config = tiny_config()
  batch = synthetic_batch(config, 8)
  state, losses = _run(config, [batch] * 15, max_traces=1)
  assert int(state.step) == 15
  assert losses[-1] < losses[0] - 0.5, losses


def test_one_program_serves_every_seed():
  """The seed is the step's argument, not a constant: the programs of seeds 0 and 7
  are the same text (one compilation, shared through the persistent cache by a sweep's
  seeds), while the seeds draw different weights."""
  config = tiny_config()
  batch = synthetic_batch(config, 8)
  texts, params = [], []
  for seed in (0, 7):
    config.seed = seed
    t = state_lib.build_trainer(config)
    with jax.set_mesh(t.mesh), nn.logical_axis_rules(t.rules):
      texts.append(t.train_step.lower(t.abstract, mesh_lib.put_batch(
          batch, t.batch_sharding)).as_text())
    params.append(t.init_params(config))
  assert texts[0] == texts[1]
  kernel = lambda p: np.asarray(jax.tree.leaves(p)[-1])  # noqa: E731
  assert not np.array_equal(kernel(params[0]), kernel(params[1]))
  # A part alone (a fine-tuning head) is the whole draw's part, from a smaller program.
  part = t.init_params(config, "nsp")
  jax.tree.map(np.testing.assert_array_equal, part, params[1]["nsp"])
  config.seed = 2**31
  with pytest.raises(ConfigError, match=r"config.seed=2147483648 is not a 32-bit"):
    state_lib.build_trainer(config)


@pytest.mark.slow
def test_gradient_accumulation_equals_full_batch():
  config = tiny_config()
  config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
  batches = [synthetic_batch(config, 16, seed=s) for s in range(2)]
  config.train.batch_size = 16
  full, l1 = _run(config, batches)
  config.train.grad_accum_steps = 2
  accum, l2 = _run(config, batches)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(accum.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_bf16_compute_keeps_fp32_master_weights():
  config = tiny_config()
  batch = synthetic_batch(config, 8)
  _, fp32 = _run(config, [batch] * 3)
  config.model.dtype = "bfloat16"
  state, bf16 = _run(config, [batch] * 3)
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(state.params))
  np.testing.assert_allclose(bf16, fp32, rtol=2e-2)


def test_bert_learning_rate_schedule():
  config = tiny_config(num_steps=100, warmup_steps=10, learning_rate=1e-3)
  sched = optimizer.learning_rate_schedule(config.train)
  assert float(sched(0)) == 0.0
  np.testing.assert_allclose(float(sched(5)), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(float(sched(10)), 1e-3 * 0.9, rtol=1e-6)
  np.testing.assert_allclose(float(sched(40)), 1e-3 * (1 - 40 / 100), rtol=1e-6)
  np.testing.assert_allclose(float(sched(100)), 0.0, atol=1e-12)


def test_no_weight_decay_on_layernorm_and_biases():
  config = tiny_config()
  abstract, _ = state_lib.abstract_state(config)
  mask = optimizer.decay_mask(abstract.params)
  enc = mask["encoder"]
  assert enc["layer_0"]["intermediate"]["kernel"] and enc["embeddings"]["word_embeddings"]["embedding"]
  assert not enc["layer_0"]["intermediate"]["bias"]
  assert not enc["layer_0"]["output_norm"]["scale"] and not enc["embeddings"]["LayerNorm"]["bias"]
  assert not mask["mlm"]["bias"]


def test_batch_not_divisible_by_data_parallel_devices(tmp_path):
  from bertjax.train import pretrain
  config = tiny_config(batch_size=12)  # 8 data-parallel devices
  with pytest.raises(ConfigError, match="batch_size=12 is not divisible by the 8 data-parallel"):
    pretrain.run(config, str(tmp_path))


def test_out_of_range_values_name_the_field(tmp_path):
  from bertjax.train import pretrain
  config = tiny_config()
  config.data.masked_lm_prob = 1.5
  with pytest.raises(ConfigError, match="config.data.masked_lm_prob"):
    pretrain.run(config, str(tmp_path))
  config = tiny_config(num_steps=-1)
  with pytest.raises(ConfigError, match="config.train.num_steps"):
    pretrain.run(config, str(tmp_path))
