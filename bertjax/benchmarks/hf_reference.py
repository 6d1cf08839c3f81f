"""The Hugging Face reference: the plain PyTorch fine-tuning loop of transformers'
examples, the one loop every comparison of bertjax with Hugging Face runs
(`benchmarks fidelity`, `benchmarks finetune --compare=hf`), and the one
`tests/test_finetune_lockstep.py` checks against bertjax's train step, step by step.
Pretraining runs the same `train_step` with `pretraining_optimizer` (AdamW as above,
or torch-optimi's StableAdamW with the ModernBERT authors' schedules, `composer_lr`):
`tests/test_pretrain_lockstep.py` and `benchmarks pretrain_fidelity`; replaced-token
detection trains `rtd_pair` (transformers' ELECTRA generator and discriminator as one
module) the same way (`benchmark train --compare=hf`, the lockstep test).

  python -m bertjax.benchmark hf_reference --model=DIR --train=train.jsonl \
      --dev=dev.jsonl --labels=a,b,c --seed=0
  # One classification run ({'sentence', 'label'} JSON lines); prints {"accuracy": ...}.

The recipe (`Recipe`; its fields are those of bertjax's `configs/finetune/base.py`):
- the model: transformers' `AutoModelFor<Task>` from the checkpoint, its new head
  drawn by transformers (normal(0.02) weights, zero bias);
- torch AdamW (b1, b2, eps) with weight decay on every parameter but biases and
  LayerNorm (the Trainer's grouping), `get_linear_schedule_with_warmup` with
  int(warmup_fraction x steps) warm-up steps, `clip_grad_norm_`;
- a step: the model's own loss (the mean over the batch's labelled rows or tokens),
  backward, clipping, the optimizer's and the schedule's step;
- batches: a new order every epoch (`torch.randperm` from a generator seeded with the
  run's seed; the last batch of an epoch smaller), each padded to its longest row
  (transformers' `DataCollatorWithPadding`); dev batches of 64, the argmax of the logits.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any, Callable, NamedTuple, Sequence

from absl import flags

# bertjax task name -> transformers' Auto class of its head.
MODEL_CLASSES = {"classification": "AutoModelForSequenceClassification",
                 "tagging": "AutoModelForTokenClassification",
                 "squad": "AutoModelForQuestionAnswering"}


@dataclasses.dataclass(frozen=True)
class Recipe:
  """The fine-tuning recipe (the paper's; bertjax's config fields of the same names)."""

  batch_size: int = 32
  learning_rate: float = 5e-5
  num_epochs: int = 3
  warmup_fraction: float = 0.1
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  max_grad_norm: float = 1.0
  max_seq_length: int = 128


def load_model(task: str, path: str, num_labels: int = 2, **config_overrides):
  """transformers' model of `task` (a key of MODEL_CLASSES) from the checkpoint `path`,
  its head new; `config_overrides` (e.g. hidden_dropout_prob=0.0) change its config."""
  import transformers  # pylint: disable=g-import-not-at-top
  cls = getattr(transformers, MODEL_CLASSES[task])
  kwargs = {} if task == "squad" else {"num_labels": num_labels}
  return cls.from_pretrained(path, **kwargs, **config_overrides)


def make_optimizer(model, recipe: Recipe, num_steps: int):
  """(torch AdamW with the Trainer's decay grouping, its linear warm-up + decay
  schedule) over `num_steps` steps."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
  named = list(model.named_parameters())
  groups = [{"params": [p for n, p in named if n in decay],
             "weight_decay": recipe.weight_decay},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
  opt = torch.optim.AdamW(groups, lr=recipe.learning_rate, betas=(recipe.b1, recipe.b2),
                          eps=recipe.eps)
  warmup = int(recipe.warmup_fraction * num_steps)
  return opt, transformers.get_linear_schedule_with_warmup(opt, warmup, num_steps)


def composer_lr(step: int, peak: float, warmup: int, num_steps: int, decay: int,
                final_fraction: float, levels: Sequence[tuple[int, float]] = ()) -> float:
  """The learning rate of 0-based step `step` of the ModernBERT authors' runs, counted
  in steps (their main.py and src/scheduler.py, Composer evaluating a schedule at the
  step before the batch): `warmup_stable_decay` with t_decay 0 (LinearScheduler from
  1e-10 to 1 over `warmup` steps, then 1) x `peak`; from each (first step, level) of
  `levels` on (a run restarted with `restart_override`, `constant_with_warmup` at
  t_warmup 0) `level`; over the last `decay` steps `one_minus_sqrt` from the level
  held, L: L x (alpha_f + (1 - alpha_f)(1 - sqrt(n / decay))), n steps into the decay,
  alpha_f = `final_fraction`."""
  held = peak
  for first, level in levels:
    if step >= first:
      held = level
  if step < warmup:
    return peak * (1e-10 + (1.0 - 1e-10) * step / warmup)
  n = step - (num_steps - decay)
  if decay <= 0 or n <= 0:
    return held
  scale = final_fraction + (1 - final_fraction) * (1 - math.sqrt(n / decay))
  return held * max(final_fraction, scale)


class Pretraining(NamedTuple):
  """The PyTorch optimizer and learning-rate schedule of a pretraining config, and the
  clipping norm (0: none): what `train_step` takes."""

  opt: Any
  schedule: Any
  max_grad_norm: float


def rtd_pair(config, discriminator, attn_implementation: str):
  """transformers' ELECTRA pair of a replaced-token-detection `config` (bertjax's)
  around `discriminator` (an `ElectraForPreTraining`, its weights its own) as one
  torch module: the generator, an `ElectraForMaskedLM` at `config.generator`'s sizes
  built on the discriminator's device with `attn_implementation` ('eager', 'sdpa'),
  reads the discriminator's word, position and type embeddings and their LayerNorm
  (google-research/electra's tying; its decoder tied to the shared word embeddings).
  Its parameters are `discriminator.*` and `generator.*` (the shared ones once, under
  `discriminator.`).

  `pair(input_ids, attention_mask, labels, token_type_ids=None, gumbel=None)` returns
  the outputs as a namespace: `loss` = the generator's MLM loss on the masked rows
  (`labels` -100 but at the masked positions) + lambda x the discriminator's BCE on
  the corrupted rows (`discriminator_weight`), `generator_loss`, `discriminator_loss`,
  `replaced` [B, T]. Each masked position holds a token sampled from the generator's
  logits by Gumbel-max (temperature 1, no gradient through it): argmax of the logits
  plus `gumbel`, [M, V] noise for the M masked positions in row-major order (given: the
  samples of another implementation's noise), else noise drawn from torch's generator;
  a sample equal to the original token is not replaced."""
  import types  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bertjax import objectives as objectives_lib  # pylint: disable=g-import-not-at-top
  from bertjax.hf import electra as electra_table  # pylint: disable=g-import-not-at-top
  from bertjax.objectives import rtd  # pylint: disable=g-import-not-at-top

  model = objectives_lib.from_config(config).model
  gen_json = electra_table.hf_config(rtd.generator_config(config, model),
                                     electra_table.MASKED_LM)
  device = next(discriminator.parameters()).device
  generator = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
      **gen_json, attn_implementation=attn_implementation)).to(device)
  for name in rtd.TIED:  # transformers' module names are the tied tables' own.
    setattr(generator.electra.embeddings, name,
            getattr(discriminator.electra.embeddings, name))
  generator.tie_weights()  # Its decoder reads the shared word embeddings.
  weight = rtd.discriminator_weight(config)

  class Pair(torch.nn.Module):

    def __init__(self):
      super().__init__()
      self.discriminator, self.generator = discriminator, generator

    def forward(self, input_ids, attention_mask, labels, token_type_ids=None, gumbel=None):
      common = {"attention_mask": attention_mask}
      if token_type_ids is not None:
        common["token_type_ids"] = token_type_ids
      masked = labels != -100
      original = torch.where(masked, labels, input_ids)
      out = self.generator(input_ids=input_ids, labels=labels, **common)
      with torch.no_grad():
        logits = out.logits[masked].float()
        if gumbel is None:
          gumbel = -torch.log(-torch.log(torch.rand_like(logits).clamp_(1e-9, 1.0)))
        corrupted = original.clone()
        corrupted[masked] = (logits + gumbel).argmax(-1)
      replaced = (corrupted != original).float()
      d = self.discriminator(input_ids=corrupted, labels=replaced, **common)
      return types.SimpleNamespace(loss=out.loss + weight * d.loss, generator_loss=out.loss,
                                   discriminator_loss=d.loss, replaced=replaced)

  return Pair()


def pretraining_optimizer(model, train_cfg) -> Pretraining:
  """PyTorch's counterpart of bertjax's pretraining optimizer for `train_cfg`
  (bertjax's `config.train`; its numbers, none of its code):
  - 'adamw': torch AdamW (b1, b2, eps) with weight decay on every parameter but biases
    and LayerNorm (the Trainer's grouping); `decay_start` 'warmup_end':
    `get_linear_schedule_with_warmup`, 'step0': BERT's TF `optimization.py`
    (peak x (1 - t / num_steps), warm-up peak x t / warmup before); `clip_grad_norm_`
    at max_grad_norm;
  - 'stable_adamw': torch-optimi's StableAdamW as the ModernBERT authors build it
    (`decoupled_stableadamw` with `filter_bias_norm_wd`: no decay on biases and
    tensors of one dimension, `decouple_lr=True`, max_lr the peak), the `composer_lr`
    schedule, and at each of `learning_rate_restarts` (first step round(fraction x
    num_steps)) its peak and weight decay set as `restart_override` does (the decayed
    group's weight decay replaced, max_lr and the optimizer state kept)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  t = train_cfg
  named = list(model.named_parameters())
  if t.optimizer == "adamw":
    decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": t.weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=t.learning_rate, betas=(t.b1, t.b2), eps=t.eps)
    if t.decay_start == "warmup_end":
      schedule = transformers.get_linear_schedule_with_warmup(opt, t.warmup_steps,
                                                              t.num_steps)
    else:
      schedule = torch.optim.lr_scheduler.LambdaLR(
          opt, lambda s: s / t.warmup_steps if s < t.warmup_steps else 1 - s / t.num_steps)
    return Pretraining(opt, schedule, t.max_grad_norm)
  if t.optimizer != "stable_adamw":
    raise ValueError(f"no PyTorch reference for config.train.optimizer={t.optimizer!r}")
  import optimi  # pylint: disable=g-import-not-at-top
  opt = optimi.StableAdamW(optimi.param_groups_weight_decay(model, t.weight_decay),
                           lr=t.learning_rate, betas=(t.b1, t.b2), eps=t.eps,
                           weight_decay=t.weight_decay, decouple_lr=True)
  restarts = [(int(round(f * t.num_steps)), peak, wd)
              for f, peak, wd in t.learning_rate_restarts]
  decay = int(round(t.decay_fraction * t.num_steps))
  levels = [(first, peak) for first, peak, _ in restarts]
  peak = t.learning_rate

  def factor(step: int) -> float:
    for first, _, wd in restarts:  # restart_override: the new weight decay.
      if step == first:
        for group in opt.param_groups:
          group["weight_decay"] = wd if group["weight_decay"] > 0 else 0.0
    return composer_lr(step, peak, t.warmup_steps, t.num_steps, decay,
                       t.final_lr_fraction, levels) / peak

  return Pretraining(opt, torch.optim.lr_scheduler.LambdaLR(opt, factor), 0.0)


def train_step(model, batch: dict, opt, schedule, max_grad_norm: float,
               loss_fn: Callable[[Any, dict], Any] | None = None) -> float:
  """One step on `batch` (torch tensors, `labels` or start/end positions included):
  the loss (the model's own, or `loss_fn(outputs, batch)`), backward, clipping, the
  optimizer's and the schedule's step. Returns the loss."""
  import torch  # pylint: disable=g-import-not-at-top
  model.train()
  outputs = model(**batch)
  loss = outputs.loss if loss_fn is None else loss_fn(outputs, batch)
  loss.backward()
  if max_grad_norm > 0:
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
  opt.step()
  schedule.step()
  opt.zero_grad()
  return float(loss.detach())


def classify(model_dir: str, train: Sequence[tuple], dev: Sequence[tuple],
             labels: Sequence[str], seed: int, recipe: Recipe = Recipe()) -> dict:
  """Fine-tunes `model_dir` on (text, label) or (text_a, text_b, label) rows and
  scores dev. Returns {'accuracy', 'predictions' (dev labels), 'steps', 'train_s'}."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)  # The head's initialisation and dropout.
  tok = transformers.AutoTokenizer.from_pretrained(model_dir)
  model = load_model("classification", model_dir, len(labels))
  collate = transformers.DataCollatorWithPadding(tok)
  index = {y: i for i, y in enumerate(labels)}

  def encode(rows):
    texts = [r[:-1] for r in rows]
    enc = tok([t[0] for t in texts], [t[1] for t in texts] if len(texts[0]) > 1 else None,
              truncation=True, max_length=recipe.max_seq_length)
    return [dict({k: v[i] for k, v in enc.items()}, labels=index.get(r[-1], -1))
            for i, r in enumerate(rows)]

  train_items, dev_items = encode(train), encode(dev)
  per_epoch = -(-len(train_items) // recipe.batch_size)
  steps = per_epoch * recipe.num_epochs
  opt, schedule = make_optimizer(model, recipe, steps)
  order = torch.Generator().manual_seed(seed)
  t0 = time.perf_counter()
  for _ in range(recipe.num_epochs):
    perm = torch.randperm(len(train_items), generator=order).tolist()
    for i in range(0, len(perm), recipe.batch_size):
      batch = collate([train_items[j] for j in perm[i:i + recipe.batch_size]])
      train_step(model, batch, opt, schedule, recipe.max_grad_norm)
  train_s = time.perf_counter() - t0
  model.eval()
  predicted = []
  with torch.no_grad():
    for i in range(0, len(dev_items), 64):
      batch = collate(dev_items[i:i + 64])
      batch.pop("labels")
      predicted += model(**batch).logits.argmax(-1).tolist()
  gold = [index.get(r[-1], -1) for r in dev]
  return {"accuracy": sum(p == g for p, g in zip(predicted, gold)) / len(dev),
          "predictions": [labels[p] for p in predicted], "steps": steps, "train_s": train_s}


def read_jsonl(path: str, fields: Sequence[str]) -> list[tuple]:
  """The `fields` of each JSON line of `path`, as tuples."""
  with open(path) as f:
    return [tuple(str(row[k]) for k in fields) for row in map(json.loads, f) if row]


def define_flags() -> None:
  flags.DEFINE_string("model", "", "Pretrained Hugging Face BERT directory.")
  flags.DEFINE_string("train", "", "Training JSON lines.")
  flags.DEFINE_string("dev", "", "Dev JSON lines.")
  flags.DEFINE_list("fields", ["sentence", "label"], "The text field(s), then the label's.")
  flags.DEFINE_list("labels", [], "Label names in order (default: the sorted training "
                    "labels).")
  flags.DEFINE_integer("seed", 0, "Seed (head init, dropout, data order).")
  flags.DEFINE_integer("torch_threads", 0, "torch's intra-op threads (0: its default).")
  for field in dataclasses.fields(Recipe):
    define = flags.DEFINE_float if field.type == "float" else flags.DEFINE_integer
    define(field.name, field.default, f"Recipe.{field.name}.")


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  if not (f.model and f.train and f.dev):
    raise SystemExit("--model, --train and --dev are required.")
  train, dev = read_jsonl(f.train, f.fields), read_jsonl(f.dev, f.fields)
  labels = list(f.labels) or sorted({r[-1] for r in train})
  recipe = Recipe(**{x.name: getattr(f, x.name) for x in dataclasses.fields(Recipe)})
  if f.torch_threads:
    import torch  # pylint: disable=g-import-not-at-top
    torch.set_num_threads(f.torch_threads)
  result = classify(f.model, train, dev, labels, f.seed, recipe)
  print(json.dumps({k: v for k, v in result.items() if k != "predictions"}))
