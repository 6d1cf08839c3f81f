"""ModernBERT's whole recipe in one run (configs/modernbert_{base,large,tiny}.py): the
phases' steps, shapes and thetas follow from the authors' token counts; the learning
rate and weight decay at the phase knots; the batch-size warm-up's sizes re-batch one
stream (same rows, same masks) and each shape compiles once; a run resumes bit for bit
across a size change and a phase change; attention-output dropout; the full-size
parameter counts equal Hugging Face's."""

import dataclasses
import os
import shutil
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import model as model_lib
from bertjax.data import phases, pipeline, tokenizer as tok_lib
from bertjax.errors import ConfigError
from bertjax.hf import modernbert as hf_modernbert
from bertjax.model import attention as attention_lib, modernbert as mb
from bertjax.train import optimizer, pretrain, state as state_lib
from configs import modernbert_base, modernbert_large, modernbert_tiny
from tests.test_loop import train_losses

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BPE = os.path.join(REPO, "tests", "fixtures", "bpe")  # 600 tokens, <pad> = 1


def _schedule(config) -> tuple[phases.Stage, ...]:
  return pretrain.check_config(config).stages


def _stage_at(schedule, step):
  return [s for s in schedule if s.first_step <= step][-1]


# ---- The full-size recipes: steps, shapes, thetas, learning rates -----------------

# (module, rows at 1,024, warm-up tokens and sizes, phase 1's tokens, the lr warm-up's
# tokens, the restart's tokens (None: at the context phase)): the authors' yamls.
YAMLS = [(modernbert_base, 4608, 50e9, 5, 1.719e12, 3e9, None),
         (modernbert_large, 4928, 10e9, 10, 1.719e12, 2e9, 900e9)]


@pytest.mark.parametrize("recipe,rows,ramp_tokens,n,tokens1,warmup_tokens,restart",
                         YAMLS, ids=["base", "large"])
def test_phase_steps_follow_from_the_authors_tokens(recipe, rows, ramp_tokens, n, tokens1,
                                                    warmup_tokens, restart):
  config = recipe.get_config()
  per_step = rows * 1024
  assert config.train.batch_size * 8192 == per_step  # 576 / 616 rows of 8,192
  schedule = _schedule(config)
  ramp = schedule[:n]
  assert [s.rows for s in ramp] == [rows * k // (n + 1) for k in range(1, n + 1)]
  each = ramp[0].steps
  assert all(s.steps == each and s.length == 1024 for s in ramp)
  ramp_steps, ramp_done = n * each, sum(s.rows for s in ramp) * each * 1024
  assert abs(ramp_done - ramp_tokens) < sum(s.rows for s in ramp) * 1024  # round(steps)
  steps1 = ramp_steps + round((tokens1 - ramp_done) / per_step)
  assert [(s.first_step, s.length, s.rows) for s in schedule[n:]] == [
      (ramp_steps, 1024, rows), (steps1, 8192, rows // 8),
      (steps1 + round(250e9 / per_step), 8192, rows // 8)]
  assert config.train.num_steps == steps1 + round(250e9 / per_step) + round(50e9 / per_step)
  # The learning rate's warm-up: its tokens, through the warm-up's batch sizes.
  done, step = 0, 0
  while done < warmup_tokens:
    done += _stage_at(schedule, step).rows * 1024
    step += 1
  assert config.train.warmup_steps == step
  # Rows, predictions and the global theta at the knots.
  thetas = pretrain.phase_inputs(config)
  at = lambda step: (_stage_at(schedule, step).rows, _stage_at(schedule, step).predictions,
                     thetas[_stage_at(schedule, step).phase]["global_rope_theta"])
  assert at(0) == (rows // (n + 1), 154, 10_000.0)
  assert at(steps1 - 1) == (rows, 154, 10_000.0)
  assert at(steps1) == (rows // 8, 1232, 160_000.0)
  assert at(config.train.num_steps - 1) == (rows // 8, 1232, 160_000.0)
  assert model_lib.config_from(config.model).global_rope_theta == 160_000.0  # inference
  # Learning rates and the decoupled decay at the knots.
  t = config.train
  lr, wd = optimizer.learning_rate_schedule(t), optimizer.weight_decay_schedule(t)
  (restart_step, low, low_wd), = optimizer.restarts(t)
  if restart is None:
    assert restart_step == steps1
  else:  # large: 900B tokens into phase 1
    assert restart_step == ramp_steps + round((restart - ramp_done) / per_step)
  decay_start = t.num_steps - optimizer.decay_steps(t)
  assert decay_start == steps1 + round(250e9 / per_step)
  peak, end = t.learning_rate, low * t.final_lr_fraction
  mid = (decay_start + t.num_steps) // 2
  x = (mid - decay_start) / (t.num_steps - decay_start)
  for step, want, decay in [
      (0, 0.0, t.weight_decay), (t.warmup_steps, peak, t.weight_decay),
      (restart_step - 1, peak, t.weight_decay), (restart_step, low, low_wd),
      (decay_start, low, low_wd), (mid, end + (low - end) * (1 - np.sqrt(x)), low_wd),
      (t.num_steps, end, low_wd)]:
    np.testing.assert_allclose(float(lr(step)), want, rtol=1e-5, err_msg=str(step))
    np.testing.assert_allclose(float(wd(step)), decay / peak, rtol=1e-6, err_msg=str(step))


@pytest.mark.parametrize("recipe", [modernbert_base, modernbert_large, modernbert_tiny])
def test_recipes_pass_their_checks(recipe):
  c = recipe.get_config()
  pretrain.check_config(c)
  # Documents isolated (the authors'), packed without separators (docs/pretraining.md:
  # it learned more than FULL-SENTENCES on every seed).
  assert c.data.isolate_documents and c.data.packing == "stream"


@pytest.mark.parametrize("recipe,count", [(modernbert_base, 149_655_232),
                                          (modernbert_large, 395_881_664)])
def test_full_size_parameter_counts_equal_hugging_faces(recipe, count):
  """Hugging Face's ModernBertForMaskedLM counts (the decoder tied: counted once)."""
  model = state_lib.build_model(recipe.get_config())
  params = jax.eval_shape(model.init_params, jax.random.key(0))
  assert sum(x.size for x in jax.tree.leaves(params)) == count


# ---- The batch-size warm-up ---------------------------------------------------------

def _tiny_config(**train):
  """modernbert_tiny at a test's size: 3 blocks (global, local, local), the fixture's
  600-token BPE; rows of 16 then 32 tokens, 16 rows of 16 (8 during a 2-step warm-up)
  then 8 rows of 32; 8 steps, a checkpoint every 2."""
  c = modernbert_tiny.get_config()
  c.model.update(vocab_size=600, hidden_size=32, num_layers=3, num_heads=2,
                 intermediate_size=48, max_position_embeddings=32, local_attention=8,
                 global_rope_theta_phases=(10_000.0, 160_000.0), dtype="float32")
  c.data.update(max_seq_length=32, max_predictions_per_seq=4, eval_fraction=0.1,
                length_phases=((0.5, 16), (0.5, 32)))
  c.data.tokenizer.path = BPE
  c.train.update(batch_size=8, batch_warmup_tokens=256, batch_warmup_sizes=1,
                 num_steps=8, warmup_steps=1, learning_rate_restarts=((0.5, 1e-3, 1e-5),),
                 decay_fraction=0.25, log_every=1, eval_every=8, eval_batches=1,
                 checkpoint_every=2, max_to_keep=10)
  c.train.update(train)
  return c


def test_warm_up_sizes_and_their_errors():
  c = _tiny_config()
  assert [(s.first_step, s.steps, s.length, s.rows, s.first_element)
          for s in _schedule(c)] == [(0, 2, 16, 8, 0), (2, 2, 16, 16, 16),
                                     (4, None, 32, 8, 0)]
  c.train.batch_warmup_sizes = 3  # 16 rows: 4, 8, 12
  c.train.batch_warmup_tokens = 16 * 24
  c.train.num_steps = 16
  assert [(s.steps, s.rows) for s in _schedule(c)][:4] == [(1, 4), (1, 8), (1, 12), (5, 16)]
  for field, value, message in [
      ("batch_warmup_sizes", 4, "do not split into 5 equal parts"),
      ("batch_warmup_tokens", 10**5, "not fewer than the first length phase's 4"),
      ("batch_size", 7, "do not make whole rows")]:
    bad = _tiny_config(**{field: value})
    if field == "batch_size":
      bad.data.length_phases = ((0.5, 24), (0.5, 32))  # 7 x 32 tokens, rows of 24
    with pytest.raises(ConfigError, match=message) as e:
      pretrain.check_config(bad)
    assert "\n" not in str(e.value)
  with pytest.raises(ConfigError, match="not divisible by the 8 data-parallel devices x 1 "
                     "grad_accum_steps; make every size a multiple of 8") as e:
    phases.check_divisible(_schedule(_tiny_config(batch_warmup_sizes=3, num_steps=16)), 8, 1)


@pytest.fixture(scope="module")
def bpe():
  return tok_lib.load_tokenizer(BPE)


def test_warm_up_re_batches_one_stream_and_restores(bpe):
  """The warm-up's smaller batches are consecutive blocks of the first phase's stream,
  masks included (rows and masks keyed by their index in it): the rows of steps 1-4 are
  those of a run without warm-up's first 3 batches. Batches carry their phase's theta;
  a restore inside the warm-up replays."""
  c = _tiny_config()
  build = lambda cfg: pipeline.build_pretraining_data(
      cfg.data, bpe, batch_size=cfg.train.batch_size, seed=0, nsp=False,
      num_steps=cfg.train.num_steps,
      batch_schedule=phases.BatchSchedule.from_config(cfg.train),
      phase_inputs=pretrain.phase_inputs(cfg))
  data = build(c)
  assert data.stats["batches"] == [(0, 16, 8), (2, 16, 16), (4, 32, 8)]
  it = iter(data.train)
  batches = [next(it) for _ in range(6)]
  assert [b["input_ids"].shape for b in batches] == [(8, 16)] * 2 + [(16, 16)] * 2 + [
      (8, 32)] * 2
  assert [float(b["global_rope_theta"][0]) for b in batches] == [1e4] * 4 + [1.6e5] * 2
  assert all(np.all(b["global_rope_theta"] == b["global_rope_theta"][0]) for b in batches)
  # Every field as `pipeline.batch_spec` says (P: the stage's at the step's masking rate).
  stages = _schedule(c)
  for step, b in enumerate(batches):
    s = _stage_at(stages, step)
    assert {k: (v.shape, v.dtype) for k, v in b.items()} == pipeline.batch_spec(
        c.data, False, s.rows, s.length, b["masked_lm_positions"].shape[1],
        ["global_rope_theta"])
  flat = c.copy_and_resolve_references()
  flat.train.batch_warmup_tokens = 0
  plain = iter(build(flat).train)
  plain = [next(plain) for _ in range(3)]
  for k in ("input_ids", "masked_lm_positions", "masked_lm_ids", "segment_ids"):
    np.testing.assert_array_equal(np.concatenate([b[k] for b in batches[:4]]),
                                  np.concatenate([b[k] for b in plain]), err_msg=k)
  it = iter(data.train)
  next(it)
  state = it.get_state()
  again = iter(build(c).train)
  again.set_state(state)
  for want in batches[1:5]:
    got = next(again)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  """One uninterrupted 8-step run of the tiny recipe, counting the train step's traces."""
  workdir = str(tmp_path_factory.mktemp("straight"))
  shapes, make = [], state_lib.make_train_step

  def counting(*args, **kwargs):
    step = make(*args, **kwargs)

    def traced(state, batch, seed):
      shapes.append(batch["input_ids"].shape)  # runs once per trace
      return step(state, batch, seed)

    return traced

  with mock.patch.object(state_lib, "make_train_step", counting):
    pretrain.run(_tiny_config(), workdir)
  return workdir, shapes


@pytest.mark.slow
def test_each_batch_shape_compiles_once(straight):
  _, shapes = straight
  assert shapes == [(8, 16), (16, 16), (8, 32)]


@pytest.mark.slow
@pytest.mark.parametrize("stop", [2, 4], ids=["across_a_size_change",
                                                "across_a_phase_change"])
def test_resume_is_bit_exact(straight, tmp_path, stop):
  """Restarted from the checkpoint before a batch-size change (step 2: 8 -> 16 rows)
  or a phase change (step 4: 16 -> 32 tokens, theta 10k -> 160k, lr 1e-3 restart), the
  remaining steps' losses equal the uninterrupted run's bit for bit."""
  reference, _ = straight
  expected = train_losses(reference)
  assert sorted(expected) == list(range(1, 9)) and all(map(np.isfinite, expected.values()))
  workdir = str(tmp_path / "resumed")
  shutil.copytree(reference, workdir)
  for step in os.listdir(os.path.join(workdir, "checkpoints")):
    if step != str(stop):
      shutil.rmtree(os.path.join(workdir, "checkpoints", step))
  os.remove(os.path.join(workdir, "metrics.jsonl"))
  pretrain.run(_tiny_config(), workdir)
  resumed = train_losses(workdir)
  assert sorted(resumed) == list(range(stop + 1, 9))
  assert all(resumed[s] == expected[s] for s in resumed), (resumed, expected)


# ---- The model's recipe fields ------------------------------------------------------

SMALL = dict(vocab_size=64, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=48,
             pad_token_id=0, local_attention=8)


@pytest.mark.slow
def test_attention_output_dropout_drops_the_output_only():
  """Only Wo's output is dropped (the probabilities keep rate 0, so the fast kernels
  stay allowed); exclusive with Hugging Face's attention_dropout; left out of
  config.json with a warning."""
  cfg = mb.ModernBertConfig(**SMALL, attention_output_dropout=0.5)
  model = mb.FAMILY.pretraining(cfg)
  params = model.init_params(jax.random.key(0))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, (2, 12)), jnp.int32)
  rates, attend = [], attention_lib.attention

  def recording(*args, **kwargs):
    rates.append(kwargs["dropout_rate"])
    return attend(*args, **kwargs)

  with mock.patch.object(attention_lib, "attention", recording):
    dropped = jax.jit(lambda p: model.apply({"params": p}, ids, deterministic=False,
                                            rngs={"dropout": jax.random.key(1)}))(params)
  kept = jax.jit(lambda p: model.apply({"params": p}, ids))(params)
  assert rates == [0.0] * 3
  assert not np.allclose(dropped["mlm_logits"], kept["mlm_logits"])
  with pytest.raises(ConfigError, match="set one") as e:
    mb.ModernBertConfig(**SMALL, attention_dropout=0.1, attention_output_dropout=0.1)
  assert "\n" not in str(e.value)
  with mock.patch.object(hf_modernbert.logging, "warning") as warning:
    written = hf_modernbert.hf_config(cfg)
  assert "attention_output_dropout" not in written and written["attention_dropout"] == 0.0
  assert "attention_output_dropout" in warning.call_args.args[0]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["global", "local"])
def test_per_row_theta_is_the_configs_theta(kind):
  """`global_rope_theta` (or `local_rope_theta`, mmBERT's) [B] per row computes what a
  config with that theta computes (two rows at two thetas), and the length phases'
  checks are one line each."""
  cfg = mb.ModernBertConfig(**SMALL, global_rope_theta=160_000.0)
  model = mb.FAMILY.pretraining(cfg)
  params = model.init_params(jax.random.key(0))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, (2, 20)), jnp.int32)
  mixed = jax.jit(lambda p: model.apply(
      {"params": p}, ids, **{f"{kind}_rope_theta": jnp.asarray([10_000.0, 160_000.0])}))(
          params)
  mixed = mixed["mlm_logits"]
  for row, theta in enumerate((10_000.0, 160_000.0)):
    alone = mb.FAMILY.pretraining(dataclasses.replace(cfg, **{f"{kind}_rope_theta": theta}))
    want = jax.jit(lambda p, a=alone, r=row: a.apply({"params": p}, ids[r:r + 1]))(params)
    want = want["mlm_logits"]
    np.testing.assert_allclose(mixed[row:row + 1], want, atol=2e-6)
  phased = mb.ModernBertConfig(**SMALL, global_rope_theta_phases=(10_000.0, 160_000.0))
  assert mb.phase_inputs(phased, [16, 32]) == [{"global_rope_theta": 10_000.0},
                                               {"global_rope_theta": 160_000.0}]
  both = dataclasses.replace(phased, local_rope_theta=160_000.0,
                             local_rope_theta_phases=(10_000.0, 160_000.0))
  assert mb.phase_inputs(both, [16, 32]) == [
      {"global_rope_theta": 10_000.0, "local_rope_theta": 10_000.0},
      {"global_rope_theta": 160_000.0, "local_rope_theta": 160_000.0}]
  assert mb.phase_inputs(cfg, [16, 32]) == [{}, {}]
  for call, message in [
      (lambda: mb.phase_inputs(phased, [16, 32, 32]), "2 thetas for 3 length phases"),
      (lambda: mb.phase_inputs(cfg, [16, 4]), r"local_attention=8 exceeds "
       r"config.data.length_phases\[1\]'s length=4"),
      (lambda: mb.ModernBertConfig(**SMALL, global_rope_theta_phases=(1e4, 1e4)),
       "the last equal to config.model.global_rope_theta=160000.0")]:
    with pytest.raises(ConfigError, match=message) as e:
      call()
    assert "\n" not in str(e.value)
