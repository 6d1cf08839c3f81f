"""Fine-tuning's optimizer against Hugging Face's standard recipe (transformers'
Trainer / run_glue on torch): the schedule step by step, the weight-decay grouping on a
real BertForSequenceClassification's parameter names, and whole AdamW steps (clipping,
decay mask, bias correction, epsilon) against torch.optim.AdamW."""

import dataclasses

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax
import pytest

from bertjax.hf import bert as hf_bert
from bertjax.model import ModelConfig
from bertjax.tasks import base, finetune
from bertjax.tasks.classification import ClassifierHead
from bertjax.train import optimizer
from configs.finetune import glue

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _train_cfg(num_steps, warmup_fraction=0.1, **kw):
  """The fine-tuning recipe's optimizer fields as `finetune.make_optimizer` passes them."""
  t = ml_collections.ConfigDict(glue.get_config("mrpc").train.to_dict())
  t.update(kw)
  t.num_steps = num_steps
  t.warmup_steps = int(warmup_fraction * num_steps)
  return t


@pytest.mark.parametrize("num_steps,warmup_fraction", [(113, 0.1), (40, 0.0), (7, 0.5)])
def test_schedule_is_hugging_faces_linear_schedule_at_every_step(num_steps, warmup_fraction):
  t = _train_cfg(num_steps, warmup_fraction, learning_rate=5e-5)
  ours = optimizer.learning_rate_schedule(t)
  opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=t.learning_rate)
  hf = transformers.get_linear_schedule_with_warmup(opt, t.warmup_steps, num_steps)
  for step in range(num_steps + 2):  # The lr the optimizer uses at `step` (0-based).
    np.testing.assert_allclose(float(ours(step)), hf.get_last_lr()[0], rtol=1e-5,
                               atol=1e-12, err_msg=f"step {step}")
    opt.step()
    hf.step()
  # BERT's TF code ('step0') differs right after warm-up: it resumes below the peak.
  if t.warmup_steps:
    tf = optimizer.learning_rate_schedule(_train_cfg(num_steps, warmup_fraction,
                                                     learning_rate=5e-5, decay_start="step0"))
    w = t.warmup_steps
    assert float(tf(w)) == pytest.approx(5e-5 * (1 - w / num_steps))
    assert float(ours(w)) == pytest.approx(5e-5)


def _hf_model(num_labels=3):
  config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=32,
                                   max_position_embeddings=24, num_labels=num_labels)
  torch.manual_seed(0)
  return transformers.BertForSequenceClassification(config)


def test_decay_mask_is_hugging_faces_grouping_on_bert_parameter_names():
  hf = _hf_model()
  decayed = set(transformers.Trainer.get_decay_parameter_names(None, hf))
  names = {n for n, _ in hf.named_parameters()}
  assert decayed and decayed < names  # Some excluded (biases, LayerNorm), some not.
  model_cfg = dataclasses.replace(hf_bert.model_config_from_hf(hf.config.to_dict()), nsp=False)
  model = base.FinetuneModel(model_cfg, ClassifierHead(model_cfg, 3))
  batch = {k: np.zeros((1, 8), np.int32) for k in base.TOKEN_KEYS}
  params = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), batch)["params"]))
  mask = optimizer.decay_mask(params)
  head, _ = hf_bert.task_head_table("classification", "bert", model_cfg)
  table = hf_bert.param_table(model_cfg, "bert.", None) + head
  assert len(table) == len(jax.tree.leaves(params)) == len(names)
  for entry in table:
    node = mask
    for key in entry.path:
      node = node[key]
    assert node == (entry.key in decayed), entry


def test_adamw_steps_equal_torch_adamw_with_hugging_faces_groups_and_clipping():
  """Five steps of the fine-tuning optimizer (clip 1.0, AdamW eps 1e-8, decay 0.01 off
  biases and LayerNorm, warm-up + linear decay) against torch's, as the Trainer
  builds it; the 4th and 5th gradients are large enough to be clipped."""
  t = _train_cfg(8, 0.25, learning_rate=1e-2)
  rng = np.random.default_rng(0)
  shapes = {"dense": {"kernel": (4, 3), "bias": (3,)},
            "LayerNorm": {"scale": (3,), "bias": (3,)}}
  params = {m: {n: rng.standard_normal(s).astype(np.float32) for n, s in d.items()}
            for m, d in shapes.items()}
  grads = [{m: {n: (0.1 * (1 + 3 * i) * rng.standard_normal(s)).astype(np.float32)
                for n, s in d.items()} for m, d in shapes.items()} for i in range(5)]
  tx = optimizer.create_optimizer(t)
  state = tx.init(params)
  ours = params
  torch_params = {(m, n): torch.nn.Parameter(torch.tensor(v)) for m, d in params.items()
                  for n, v in d.items()}
  groups = [{"params": [p for (m, n), p in torch_params.items() if n == "kernel"],
             "weight_decay": t.weight_decay},
            {"params": [p for (m, n), p in torch_params.items() if n != "kernel"],
             "weight_decay": 0.0}]
  opt = torch.optim.AdamW(groups, lr=t.learning_rate, betas=(t.b1, t.b2), eps=t.eps)
  sched = transformers.get_linear_schedule_with_warmup(opt, t.warmup_steps, t.num_steps)
  clipped = 0
  for g in grads:
    updates, state = tx.update(g, state, ours)
    ours = optax.apply_updates(ours, updates)
    for key, p in torch_params.items():
      p.grad = torch.tensor(g[key[0]][key[1]])
    norm = torch.nn.utils.clip_grad_norm_(list(torch_params.values()), t.max_grad_norm)
    clipped += float(norm) > t.max_grad_norm
    opt.step()
    sched.step()
    for (m, n), p in torch_params.items():
      np.testing.assert_allclose(np.asarray(ours[m][n]), p.detach().numpy(), rtol=1e-5,
                                 atol=1e-6, err_msg=f"{m}/{n}")
  assert clipped >= 2
  assert t.eps == 1e-8 and t.max_grad_norm == 1.0 and t.decay_start == "warmup_end"


def test_fine_tuning_defaults_are_the_documented_recipe():
  """The loop's optimizer is built from these fields: the recipe of docs/finetuning.md."""
  t = glue.get_config("mrpc").train
  assert (t.b1, t.b2, t.eps, t.weight_decay, t.max_grad_norm, t.warmup_fraction) == (
      0.9, 0.999, 1e-8, 0.01, 1.0, 0.1)
  assert t.optimizer == "adamw" and t.decay_start == "warmup_end"
  c = glue.get_config("mrpc")
  tx, schedule = finetune.make_optimizer(c, ModelConfig(), 100)
  assert float(schedule(10)) == pytest.approx(c.train.learning_rate)  # peak at warm-up end
  assert float(schedule(55)) == pytest.approx(c.train.learning_rate * 0.5)
