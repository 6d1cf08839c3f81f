"""A masking rate that changes with the step (`config.data.masked_lm_prob_phases`,
mmBERT's 30% -> 15% -> 5%): the rate and the predictions per row used at each step,
across length phases, the same masks after a restore at any step, and a resumed run
with ModernBERT's optimizer pieces equal bit for bit."""

import os
import shutil

import numpy as np
import pytest

from bertjax.data import pipeline
from bertjax.errors import ConfigError
from bertjax.train import pretrain
from configs import bert_tiny
from tests.helpers import tiny_config
from tests.test_loop import train_losses

pytestmark = pytest.mark.usefixtures("shared_trainers")  # reruns share one step
RATES = ((0.25, 0.3), (0.5, 0.15), (0.25, 0.05))


def _cfg(**kw):
  cfg = bert_tiny.get_config().data
  cfg.corpus = "embedded"
  cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.dupe_factor = 64, 10, 1
  cfg.masked_lm_prob, cfg.eval_fraction = 0.15, 0.1
  cfg.update(kw)
  return cfg


def test_masked_lm_prob_phases_parse():
  assert pipeline.masked_lm_prob_phases(_cfg(), 100) == [(0, 0.15)]
  assert pipeline.masked_lm_prob_phases(_cfg(masked_lm_prob_phases=RATES), 10) == [
      (0, 0.3), (2, 0.15), (8, 0.05)]  # round(0.25 * 10) = 2, round(0.75 * 10) = 8
  for bad, match in ((((0.5, 0.3), (0.4, 0.15)), "sum to"),
                     (((0.5, 0.0), (0.5, 0.15)), r"\[0\]"),
                     (((1.0, 1.5),), "masking rate"), (((1.0,),), "fraction")):
    with pytest.raises(ConfigError, match=match):
      pipeline.masked_lm_prob_phases(_cfg(masked_lm_prob_phases=bad), 100)
  with pytest.raises(ConfigError, match="num_steps >= 3"):
    pipeline.masked_lm_prob_phases(_cfg(masked_lm_prob_phases=RATES), 2)


@pytest.fixture(scope="module")
def data(tokenizer):
  """8 steps: lengths 32 then 64 (4 steps each), rates 30% (2 steps), 15% (4), 5% (2)."""
  cfg = _cfg(length_phases=((0.5, 32), (0.5, 64)), masked_lm_prob_phases=RATES)
  build = lambda: pipeline.build_pretraining_data(cfg, tokenizer, batch_size=8, seed=0,
                                                  nsp=False, num_steps=8)
  return build, build()


def _candidates(batch, tokenizer) -> np.ndarray:
  """[b] maskable tokens of each original row: the non-special tokens left, plus the
  chosen ones turned into the mask token."""
  ids = batch["input_ids"]
  special = np.isin(ids, list(tokenizer.special_ids) + [tokenizer.pad_id])
  return (~special).sum(1) + (ids == tokenizer.mask_id).sum(1)


def test_rate_and_predictions_follow_the_step(data, tokenizer):
  _, built = data
  # (first step, length, rate, P): P = 5 at 32 and 10 at 64 for 15%, scaled by rate / 15%.
  assert built.stats["masking_phases"] == [(0, 32, 0.3, 10), (2, 32, 0.15, 5),
                                           (4, 64, 0.15, 10), (6, 64, 0.05, 4)]
  assert built.stats["phases"] == [(4, 32, 10), (None, 64, 10)]
  it = iter(built.train)
  for step, (length, rate, p) in enumerate([(32, 0.3, 10)] * 2 + [(32, 0.15, 5)] * 2 +
                                           [(64, 0.15, 10)] * 2 + [(64, 0.05, 4)] * 2):
    batch = next(it)
    assert batch["input_ids"].shape == (8, length)
    assert batch["masked_lm_positions"].shape == (8, p), step
    n = _candidates(batch, tokenizer)
    want = np.minimum(p, np.maximum(1, np.round(n * rate)))
    np.testing.assert_array_equal(batch["masked_lm_weights"].sum(1), want,
                                  err_msg=f"step {step}")
  # Held-out batches: masked_lm_prob and max_predictions_per_seq at max_seq_length.
  held = built.eval_batches[0]
  assert held["masked_lm_positions"].shape == (8, 10)
  real = held["example_weights"] > 0
  want = np.minimum(10, np.maximum(1, np.round(_candidates(held, tokenizer) * 0.15)))
  np.testing.assert_array_equal(held["masked_lm_weights"].sum(1)[real], want[real])


def test_masks_are_identical_after_a_restore_at_any_step(data):
  build, built = data
  it = iter(built.train)
  batches = [next(it) for _ in range(9)]
  for stop in (1, 2, 3, 5, 6, 7):  # inside and at the start of each masking phase
    it = iter(built.train)
    for _ in range(stop):
      next(it)
    state = it.get_state()
    fresh = iter(build().train)
    fresh.set_state(state)
    for want in batches[stop:stop + 2]:
      got = next(fresh)
      assert got.keys() == want.keys()
      for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"restored at {stop}: {k}")


def _modern_loop_config():
  """ModernBERT's optimizer pieces at a tiny shape: StableAdamW without gradient
  clipping, fully decoupled decay, warm-up-stable-1-sqrt-decay, 30% then 15% masking
  across two length phases; 6 steps, a checkpoint at step 4."""
  c = tiny_config(num_steps=6, log_every=1, eval_every=6, checkpoint_every=4,
                  eval_batches=1, optimizer="stable_adamw", max_grad_norm=0.0,
                  weight_decay=1e-5, decouple_lr=True, b2=0.98, schedule="wsd",
                  decay_fraction=0.5)
  c.model.vocab_size = c.data.tokenizer.vocab_size = 512
  c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 4
  c.data.dupe_factor = 1
  c.data.length_phases = ((0.5, 16), (0.5, 32))
  c.data.masked_lm_prob_phases = ((0.34, 0.3), (0.66, 0.15))  # 30% for steps 1-2
  return c


@pytest.mark.slow
def test_loop_resume_with_stable_adamw_and_masking_phases_is_bit_exact(tmp_path):
  """A restart from the step-4 checkpoint (StableAdamW's state, the second length and
  masking phases) gives steps 5-6 bit for bit."""
  straight = str(tmp_path / "straight")
  pretrain.run(_modern_loop_config(), straight)
  expected = train_losses(straight)
  assert sorted(expected) == list(range(1, 7)) and all(map(np.isfinite, expected.values()))
  workdir = str(tmp_path / "resumed")
  shutil.copytree(straight, workdir)
  for step in os.listdir(os.path.join(workdir, "checkpoints")):
    if step != "4":
      shutil.rmtree(os.path.join(workdir, "checkpoints", step))
  os.remove(os.path.join(workdir, "metrics.jsonl"))
  pretrain.run(_modern_loop_config(), workdir)
  resumed = train_losses(workdir)
  assert sorted(resumed) == [5, 6]
  assert all(resumed[s] == expected[s] for s in resumed), (resumed, expected)
