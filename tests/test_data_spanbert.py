"""SpanBERT end to end on the train step: span-masked batches feed the SBO head, whose
loss joins the MLM loss and falls; the recipe config builds."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax.data import masking
from bertjax.parallel import mesh as mesh_lib
from bertjax.train import state as state_lib
from configs import spanbert_base
from tests.helpers import tiny_config


class _Tok:
  """The slice of the tokenizer interface the masker reads: ids 0-4 special."""
  vocab_size, pad_id, mask_id, special_ids = 97, 0, 4, frozenset(range(5))

  def word_starts(self):
    return np.arange(self.vocab_size) % 3 != 1  # a third of the ids continue a word


def _span_batches(config, n):
  cfg = config.data
  cfg.masking = "span"
  mask_cfg = masking.MaskingConfig.create(cfg, _Tok())
  rng = np.random.default_rng(0)
  t = cfg.max_seq_length
  batches = []
  for _ in range(n):
    ids = rng.integers(5, 97, (8, t)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 2, 3
    out = masking.mask_tokens(ids, rng, mask_cfg)
    out["attention_mask"] = np.ones((8, t), np.int32)
    out["token_type_ids"] = np.zeros((8, t), np.int32)
    batches.append(out)
  return batches


@pytest.mark.slow
def test_sbo_loss_is_added_and_falls():
  config = tiny_config()
  config.objectives = ("mlm", "sbo")
  config.model.sbo_max_positions = 8
  config.train.learning_rate, config.train.num_steps = 5e-3, 100
  config.data.max_predictions_per_seq = 4
  batches = _span_batches(config, 2)
  assert {"span_left_positions", "span_relative_positions"} <= batches[0].keys()
  t = state_lib.build_trainer(config)
  assert "sbo" in t.abstract.params
  state = t.init_state(config)
  with jax.set_mesh(t.mesh), nn.logical_axis_rules(t.rules):
    history = []
    for k in range(16):
      state, m = t.train_step(state, mesh_lib.put_batch(batches[k % 2], t.batch_sharding))
      history.append(jax.device_get(m))
  first, last = history[0], history[-1]
  np.testing.assert_allclose(first["loss"], first["mlm_loss"] + first["sbo_loss"], rtol=1e-5)
  assert last["sbo_loss"] < first["sbo_loss"] - 0.5, (first, last)


def test_spanbert_recipe_builds():
  config = spanbert_base.get_config()
  assert config.data.masking == "span" and config.objectives == ("mlm", "sbo")
  abstract, _ = state_lib.abstract_state(config)
  sbo = abstract.params["sbo"]
  assert sbo["dense_0"]["kernel"].shape == (3 * 768, 768)
  assert sbo["bias"].shape == (config.model.vocab_size,)
