"""`python -m benchmarks continued_hf --workdir=RUN --output=DIR`: the continued
pretraining a bertjax run did (`config.init_from`, `bertjax/train/continued.py`), done
again by a plain Hugging Face PyTorch loop, and the two side by side.

From RUN (config.json, init_from.json, tokenizer/, metrics.jsonl) it rebuilds what the
run started from, as the run did: the initial parameters (the checkpoint's, the
vocabulary rows on the run's tokenizer, its fresh heads from the run's seed;
`continued.Start`) and the data (`pipeline.build_pretraining_data`: the same
training batches and masks, the same held-out batches per source). The start is
exported to DIR/start (`bertjax.hf.convert.save_hf`) and transformers'
`AutoModelForMaskedLM` trains from it with the run's recipe:
- torch AdamW (b1, b2, eps), weight decay on the weight matrices and embedding tables
  (bertjax's `decay_mask`), `clip_grad_norm_` at `max_grad_norm`, and the run's own
  learning-rate schedule (`optimizer.learning_rate_schedule`, through LambdaLR);
- a step: the model's MLM loss on the run's batch (labels at its masked positions),
  backward, clipping, the optimizer's and the schedule's step; dropout as the model
  config has it (torch's random numbers, not the run's);
- held-out MLM loss and accuracy per source before the first step and after the last,
  on the run's held-out batches (`train.eval_batches` of each), in eval mode.
The trained model is saved to DIR/trained. Printed: the held-out figures of both at
the start (equal up to float32 rounding: the same start on the same batches) and at
the end, the last train-loss window of each, and seconds per step of the Hugging Face
loop (bertjax's are in RUN's log; on a shared machine compare them only side by side).
AdamW runs of the BERT family (BertForMaskedLM, RobertaForMaskedLM,
XLMRobertaForMaskedLM) without isolated documents; anything else is a one-line error.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import jax
import ml_collections
import numpy as np
from absl import flags
from etils import epath

from bertjax import objectives as objectives_lib
from bertjax.checkpoint import files, workdir as workdir_lib
from bertjax.data import phases, pipeline, held_out as held_out_lib
from bertjax.errors import ConfigError
from bertjax.hf import convert
from bertjax.train import continued, optimizer, pretrain, state as state_lib

_WORKDIR = flags.DEFINE_string("workdir", None, "A bertjax continued-pretraining workdir.")
_OUTPUT = flags.DEFINE_string("output", None, "Where the Hugging Face start and trained "
                              "model go (DIR/start, DIR/trained).")


def rebuild(run: str):
  """(config, tokenizer, initial parameters, model config) of the continued run in
  `run`, as it started (`continued.Start` on the run's saved tokenizer)."""
  config = workdir_lib.load_config(run)
  record = json.loads((epath.Path(run) / files.INIT_FROM_FILE).read_text())
  tokenizer = workdir_lib.load_tokenizer(run)
  given = ml_collections.ConfigDict(config.to_dict())
  given.model.vocab_size = record["checkpoint_model"]["vocab_size"]
  given.data.tokenizer.path = os.path.join(run, files.TOKENIZER_DIR)
  given.vocab_extension.tokens_file, given.vocab_extension.num_new_tokens = "", 0
  with tempfile.TemporaryDirectory() as tmp:
    start = continued.open_run(given, tmp)
    config = start.finish(tokenizer, tmp)
  if config.model.vocab_size != record["rows"]:
    raise ConfigError(f"{run} trained {record['rows']} vocabulary rows, rebuilt "
                      f"{config.model.vocab_size}: was its tokenizer/ changed?")
  setup = state_lib.build_trainer(config)
  params = jax.device_get(start.initial_params(setup, tokenizer))
  return config, tokenizer, params, setup.model.config


def _check(config) -> None:
  t, d = config.train, config.data
  if (config.model.get("family", "bert") != "bert" or t.optimizer != "adamw"
      or d.isolate_documents or objectives_lib.names_of(config) != ("mlm",)
      or t.grad_accum_steps != 1 or t.batch_by_tokens or d.length_phases):
    raise ConfigError("continued_hf compares AdamW runs of the BERT family with MLM "
                      "alone, one length, no isolated documents, no accumulation: this "
                      "run is not one.")


def _torch_batch(batch: dict, torch):
  """The run's batch as transformers' inputs, labels at the weighted masked positions."""
  ids = np.asarray(batch["input_ids"], np.int64)
  labels = np.full_like(ids, -100)
  rows, slots = np.nonzero(np.asarray(batch["masked_lm_weights"]) > 0)
  labels[rows, np.asarray(batch["masked_lm_positions"])[rows, slots]] = (
      np.asarray(batch["masked_lm_ids"])[rows, slots])
  out = {"input_ids": ids, "attention_mask": np.asarray(batch["attention_mask"], np.int64),
         "labels": labels}
  if "token_type_ids" in batch:
    out["token_type_ids"] = np.asarray(batch["token_type_ids"], np.int64)
  return {k: torch.from_numpy(v) for k, v in out.items()}


def evaluate(model, held: held_out_lib.HeldOut, batches: int, torch) -> dict[str, float]:
  """Held-out MLM loss and accuracy per source ('SOURCE/mlm_loss', ...; all sources
  together as 'mlm_loss', ...), as bertjax's evaluator sums them."""
  model.eval()
  out, total = {}, np.zeros(3)
  with torch.no_grad():
    for name, source in held.sources.items():
      sums = np.zeros(3)  # loss, correct, count
      for batch in source[:batches or None]:
        inputs = _torch_batch(batch, torch)
        labels = inputs.pop("labels")
        logits = model(**inputs).logits.float()
        chosen = labels >= 0
        ce = torch.nn.functional.cross_entropy(logits[chosen], labels[chosen],
                                               reduction="sum")
        right = (logits[chosen].argmax(-1) == labels[chosen]).sum()
        sums += [float(ce), float(right), float(chosen.sum())]
      total += sums
      if name:
        out[f"{name}/mlm_loss"], out[f"{name}/mlm_accuracy"] = sums[0] / sums[2], sums[1] / sums[2]
  out["mlm_loss"], out["mlm_accuracy"] = total[0] / total[2], total[1] / total[2]
  model.train()
  return out


def train_hf(config, start_dir: str, data, torch) -> tuple[object, dict]:
  """The Hugging Face loop (module docstring) from `start_dir` on `data`: the trained
  model and {'start': eval, 'end': eval, 'last_window_loss', 'seconds_per_step'}."""
  import transformers  # pylint: disable=g-import-not-at-top
  t = config.train
  model = transformers.AutoModelForMaskedLM.from_pretrained(start_dir).train()
  decay = [p for p in model.parameters() if p.dim() >= 2]
  rest = [p for p in model.parameters() if p.dim() < 2]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                           {"params": rest, "weight_decay": 0.0}],
                          lr=t.learning_rate, betas=(t.b1, t.b2), eps=t.eps)
  schedule = optimizer.learning_rate_schedule(t)
  lr = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: float(schedule(s)) / t.learning_rate)
  results = {"start": evaluate(model, held_out_lib.phase_of(data.held_out, 0),
                               t.eval_batches, torch)}
  window, stream, t0 = [], iter(data.train), time.perf_counter()
  for step in range(1, t.num_steps + 1):
    loss = model(**_torch_batch(next(stream), torch)).loss
    loss.backward()
    if t.max_grad_norm > 0:
      torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm)
    opt.step()
    lr.step()
    opt.zero_grad(set_to_none=True)
    window.append(float(loss.detach()))
    if step % t.log_every == 0 or step == t.num_steps:
      results["last_window_loss"] = float(np.mean(window))
      print(f"hf step {step}/{t.num_steps} | loss {results['last_window_loss']:.4f} | "
            f"lr {float(schedule(step - 1)):.3g}", flush=True)
      window = []
  results["seconds_per_step"] = (time.perf_counter() - t0) / t.num_steps
  results["end"] = evaluate(model, held_out_lib.phase_of(data.held_out, t.num_steps),
                            t.eval_batches, torch)
  return model, results


def bertjax_results(run: str) -> dict:
  """{'start', 'end': the run's eval records at its first and last step,
  'last_window_loss'} from RUN/metrics.jsonl."""
  rows = [json.loads(line) for line in (epath.Path(run) / files.METRICS_FILE).open()]
  evals = [r for r in rows if r["split"] == "eval"]
  train = [r for r in rows if r["split"] == "train"]
  if not evals or evals[0]["step"] != 0:
    raise ConfigError(f"{run} has no evaluation of its start: run it with "
                      "--config.evals.eval.at_start=True (configs/continued.py does).")
  return {"start": evals[0], "end": evals[-1], "last_window_loss": train[-1]["loss"]}


def main(argv):
  del argv
  import torch  # pylint: disable=g-import-not-at-top
  run, output = _WORKDIR.value, _OUTPUT.value
  if not run or not output:
    raise ConfigError("give --workdir (a continued run) and --output (a new directory).")
  config, tokenizer, params, model = rebuild(run)
  _check(config)
  torch.manual_seed(config.seed)
  start_dir = os.path.join(output, "start")
  convert.save_hf(start_dir, params, model, tokenizer)
  data = pipeline.build_pretraining_data(
      config.data, tokenizer, batch_size=config.train.batch_size, seed=config.seed,
      nsp=False, position_offset=model.position_offset, num_steps=config.train.num_steps,
      batch_schedule=phases.BatchSchedule.from_config(config.train),
      phase_inputs=pretrain.phase_inputs(config))
  trained, hf = train_hf(config, start_dir, data, torch)
  trained.save_pretrained(os.path.join(output, "trained"))
  ours = bertjax_results(run)
  keys = [k for k in hf["start"] if k in ours["start"]]
  print(f"{'held-out':28s} {'bertjax start':>14s} {'HF start':>10s} "
        f"{'bertjax end':>12s} {'HF end':>10s}")
  for k in keys:
    print(f"{k:28s} {ours['start'][k]:14.4f} {hf['start'][k]:10.4f} "
          f"{ours['end'][k]:12.4f} {hf['end'][k]:10.4f}")
  print(f"{'train loss, last window':28s} {'':14s} {'':10s} "
        f"{ours['last_window_loss']:12.4f} {hf['last_window_loss']:10.4f}")
  print(f"Hugging Face: {hf['seconds_per_step']:.2f} s/step (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads).")
  print(json.dumps({"bertjax": {k: ours[k] for k in ("start", "end", "last_window_loss")},
                    "hf": hf}))
