"""ELECTRA's claim at a CPU's size (Clark et al. 2020, Table 1: at equal pretraining
compute the replaced-token-detection discriminator fine-tunes better than the MLM):

  python -m benchmarks electra_claim --out=/tmp/electra_claim --mlm_steps=600
  python -m benchmarks electra_claim --out=/tmp/electra_claim_doc --corpus=docstrings

1. Pretrains `configs/bert_tiny.py` with masked-LM alone (objectives ('mlm',): BERT's
   80/10/10 masking, no NSP) for `--mlm_steps` steps, training the WordPiece
   tokenizer both runs then share.
2. Pretrains `configs/electra_tiny.py` (the same discriminator shape, L=2 H=128 A=2;
   a generator of 1/4 its width; 'rtd' with lambda 50, ELECTRA's 85% [MASK] / 15% kept
   masking) on the same corpus, rows, tokenizer, batch and schedule shape, for the
   steps that spend the MLM run's training FLOPs (generator included):
   round(mlm_steps x F_mlm / F_rtd), the FLOPs of a step by the project's counter
   (`Objectives.train_flops(B, T, P)`, `bertjax.benchmarks.flops`' terms); with
   `--generator_widths=64,128` also the same discriminator with a generator of each
   width (arms electra_g64, electra_g128; Figure 3 of the paper varies it), and with
   `--learning_rates=1e-3` the recipe pretrained at that peak rate (electra_lr0.001),
   with `--discriminator_weights=10` at that lambda (electra_lambda10), with
   `--mask_probs=0.25` masking that share of tokens (electra_mask0.25; ELECTRA-Large's,
   its gathered positions int((p + 0.005) x T) as ELECTRA's), each at its own
   equal-FLOPs steps; with `--pretraining_seeds=1,2` both recipes again with each
   config.seed (arms mlm_s1, electra_s1, ...), the table then closing with each
   recipe's spread between pretraining runs and MLM's lead with its standard error.
3. Fine-tunes each pretrained encoder (the MLM model's; ELECTRA's discriminator) on the
   real-text tasks of `benchmarks.text_tasks` (default debian_sections,
   stdlib_few, stdlib_next: each task's batch, epochs and length; `--lr` for both,
   3e-4 being ELECTRA-Small's fine-tuning rate, Table 7) with each of `--seeds`, and
   reports dev accuracy (mean, spread) per task and model as a markdown table, with
   each run's last held-out score (`held_out`), in --out/results_lrLR.json and
   --out/table_lrLR.md (LR: `--lr`, so that one --out holds several); each run's
   pretraining curves are its metrics.jsonl (`python -m bertjax.plot`; `--eval_every`
   adds held-out points to them).

`--corpus` is the pretraining text of both runs: the embedded corpus by default (66k
tokens: 1,000 steps of 32 x 128 are 60 epochs of it), or `docstrings` (`corpus_path`:
2.2M tokens: 1,000 steps are under two epochs of it), or any corpus a config takes.

Everything runs in this one process, one run after another (`--out` keeps each run's
workdir: rerunning resumes finished pretraining and skips fine-tuning finished at the
same `--lr`).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import time
from typing import Any, Callable

import jax
import ml_collections
from absl import flags

from benchmarks import docstrings, recipe, text_tasks
from bertjax import objectives as objectives_lib
from bertjax.checkpoint import files

DEFAULT_TASKS = ("debian_sections", "stdlib_few", "stdlib_next")
DOCSTRINGS = "docstrings"  # --corpus: Python's docstrings (corpus_path)
def define_flags() -> None:
  flags.DEFINE_string("out", "/tmp/electra_claim", "Directory of the runs and results.")
  flags.DEFINE_integer("mlm_steps", 1500, "Pretraining steps of the MLM run; ELECTRA's "
                       "follow from equal FLOPs.")
  flags.DEFINE_list("tasks", list(DEFAULT_TASKS), f"Any of {list(text_tasks.TASKS)}.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Fine-tuning seeds.")
  flags.DEFINE_float("lr", 3e-4, "Fine-tuning peak learning rate (both models).")
  flags.DEFINE_list("generator_widths", [], "Hidden sizes of further RTD arms' generators "
                    "(arm electra_gW: heads W // 64, at least 1, FFN 4W, as Table 6 scales "
                    "them), beside the recipe's 1/4-width 'electra'.")
  flags.DEFINE_list("learning_rates", [], "Peak pretraining rates of further RTD arms "
                    "(arm electra_lrR), beside the recipe's 5e-4 (ELECTRA-Small's).")
  flags.DEFINE_list("discriminator_weights", [], "Lambdas of further RTD arms (arm "
                    "electra_lambdaL), beside the recipe's 50 (the paper searched 1-100).")
  flags.DEFINE_list("mask_probs", [], "Masking rates of further RTD arms (arm "
                    "electra_maskP), beside the recipe's 0.15 (ELECTRA-Large's: 0.25).")
  flags.DEFINE_list("pretraining_seeds", [], "config.seed of further pretraining runs of "
                    "both recipes (arms mlm_sS, electra_sS), beside seed 0: the spread "
                    "between pretraining runs, against which a gap between arms counts.")
  flags.DEFINE_integer("eval_every", 0, "Held-out evaluation every this many pretraining "
                       "steps (the curves in each run's metrics.jsonl); 0: at the end only.")
  flags.DEFINE_string("corpus", "embedded", "The pretraining corpus of both runs: "
                      f"'{DOCSTRINGS}' (written under --out, see corpus_path) or what "
                      "config.data.corpus takes (a text file, .jsonl, Parquet, ...).")


def corpus_path(spec: str, out: str) -> str:
  """`spec`, or for 'docstrings' OUT/docstrings/train.txt: the docstrings of Python's
  standard library, numpy and scipy as `benchmarks pretrain_fidelity` writes them (its
  95% training share; 7.5 MB, 2.2M WordPiece tokens with Python 3.11), written once."""
  if spec != DOCSTRINGS:
    return spec
  from benchmarks import pretrain_fidelity as pf  # pylint: disable=g-import-not-at-top
  directory = os.path.join(out, DOCSTRINGS)
  path = os.path.join(directory, "train.txt")
  if not os.path.exists(path):
    os.makedirs(directory, exist_ok=True)
    pf.write_corpus(directory, docstrings.documents(docstrings.roots(
        list(docstrings.PACKAGES))), held_out=0.05)
  return path


def pretraining_configs(mlm_steps: int, corpus: str = "embedded",
                        generator_widths: tuple[int, ...] = (),
                        learning_rates: tuple[float, ...] = (),
                        discriminator_weights: tuple[float, ...] = (),
                        mask_probs: tuple[float, ...] = (),
                        pretraining_seeds: tuple[int, ...] = ()
                        ) -> dict[str, ml_collections.ConfigDict]:
  """{'mlm': bert_tiny with MLM alone, 'electra': electra_tiny with 'rtd'} on the same
  data section (`corpus`) but each recipe's masking, 'electra_gW' for each W of
  `generator_widths`: electra_tiny with a generator of hidden size W (heads W // 64, at
  least 1; FFN 4W), 'electra_lrR' for each R of `learning_rates`: electra_tiny
  pretrained at peak rate R, 'electra_lambdaL' for each L of `discriminator_weights`:
  at lambda L, and 'electra_maskP' for each P of `mask_probs`: masking P of the tokens
  (gathering int((P + 0.005) x T) positions, ELECTRA's rule), and 'mlm_sS' and
  'electra_sS' for each S of `pretraining_seeds`: both recipes pretrained with
  config.seed S (initialisation, masking, order and which 5% of the documents are held
  out, so held-out scores of two seeds are on different documents; 'mlm' and 'electra'
  have seed 0); the RTD arms at `mlm_steps`, `equal_flops` sets their steps."""
  mlm, electra = recipe("bert_tiny"), recipe("electra_tiny")
  mlm.objectives = ("mlm",)
  mlm.data.corpus = corpus
  masking = {k: electra.data[k] for k in ("mask_token_prob", "random_token_prob",
                                          "max_predictions_per_seq")}
  electra.data = ml_collections.ConfigDict(mlm.data.to_dict())
  electra.data.update(masking)
  configs = {"mlm": mlm, "electra": electra}

  def arm(name: str, base: ml_collections.ConfigDict = electra, **fields: Any) -> None:
    """configs[name]: `base` with `fields`' values ({section: {key: value}}, or a
    top-level field's value)."""
    c = configs[name] = base.copy_and_resolve_references()
    for field, value in fields.items():
      if isinstance(value, dict):
        c[field].update(value)
      else:
        c[field] = value

  for w in generator_widths:
    arm(f"electra_g{w}",
        generator=dict(hidden_size=w, intermediate_size=4 * w, num_heads=max(1, w // 64)))
  for rate in learning_rates:
    arm(f"electra_lr{rate:g}", train=dict(learning_rate=rate))
  for weight in discriminator_weights:
    arm(f"electra_lambda{weight:g}", rtd=dict(discriminator_weight=weight))
  for p in mask_probs:
    arm(f"electra_mask{p:g}", data=dict(
        masked_lm_prob=p, max_predictions_per_seq=int((p + 0.005) * mlm.data.max_seq_length)))
  for seed in pretraining_seeds:
    arm(f"mlm_s{seed}", mlm, seed=seed)
    arm(f"electra_s{seed}", seed=seed)
  for c in configs.values():
    c.train.num_steps, c.train.warmup_steps = mlm_steps, max(1, mlm_steps // 10)
  return configs


def step_flops(config) -> float:
  """Training FLOPs of one step of `config` (both networks of an RTD pair)."""
  d, t = config.data, config.train
  return objectives_lib.from_config(config).train_flops(
      t.batch_size, d.max_seq_length, d.max_predictions_per_seq)["total"]


def equal_flops(configs: dict[str, ml_collections.ConfigDict]) -> dict[str, dict]:
  """Sets config.train.num_steps of every config but 'mlm' so that each spends the MLM
  run's training FLOPs (warm-up scaled alike; evaluation and checkpoints at the end);
  returns {name: {'steps', 'step_flops', 'total_flops'}}."""
  budget = configs["mlm"].train.num_steps * step_flops(configs["mlm"])
  out = {}
  for name, c in configs.items():
    per_step = step_flops(c)
    steps = max(1, round(budget / per_step))
    c.train.warmup_steps = min(round(c.train.warmup_steps * steps / c.train.num_steps),
                               steps - 1)
    c.train.num_steps = c.train.eval_every = c.train.checkpoint_every = steps
    out[name] = {"steps": steps, "step_flops": per_step, "total_flops": steps * per_step}
  return out


def finetune_config(task: text_tasks.TextTask, paths: dict, init_from: str, seed: int,
                    lr: float) -> ml_collections.ConfigDict:
  """The task's classification run from `init_from` (its recipe's batch, epochs and
  length; `lr`)."""
  c = recipe("finetune/glue", "sst2")
  c.init_from, c.seed = init_from, seed
  c.data.train, c.data.dev = paths["train"], paths["dev"]
  c.task.text_a = task.fields[0]
  c.task.text_b = task.fields[1] if len(task.fields) > 2 else ""
  c.task.label = "label"
  c.task.labels = tuple(task.labels)
  c.task.max_seq_length = task.recipe.get("max_seq_length", 128)
  c.train.batch_size = task.recipe.get("batch_size", 32)
  c.train.num_epochs = task.recipe.get("num_epochs", 3)
  c.train.learning_rate = lr
  return c


def _spread(xs: list[float]) -> dict[str, float]:
  return {"mean": statistics.fmean(xs), "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
          "min": min(xs), "max": max(xs), "runs": xs}


def held_out(metrics: dict[str, float]) -> str:
  """A pretraining run's last held-out evaluation in a few words: the MLM's accuracy;
  the discriminator's BCE against the entropy of the replaced fraction (what a detector
  that learned nothing but that fraction scores) and the generator's accuracy."""
  if "rtd_loss" in metrics:
    p = metrics["replaced_fraction"]
    entropy = -p * math.log(p) - (1 - p) * math.log(1 - p) if 0 < p < 1 else 0.0
    return (f"BCE {metrics['rtd_loss']:.4f} (entropy {entropy:.4f}), generator "
            f"{100 * metrics['generator_accuracy']:.1f}%")
  return f"MLM accuracy {100 * metrics['mlm_accuracy']:.1f}%"


def table(results: dict) -> str:
  """The markdown table: dev accuracy (mean +- stdev over the seeds) per task and
  model, their average, the pretraining each model had and its held-out score."""
  tasks = list(next(iter(results["finetune"].values())))
  lines = ["| pretraining | steps | training FLOPs | " + " | ".join(tasks)
           + " | average | held-out at the end |",
           "|---|---|---|" + "---|" * (len(tasks) + 2)]
  for name, per_task in results["finetune"].items():
    p = results["pretraining"][name]
    cells = [f"{100 * per_task[t]['mean']:.1f} +- {100 * per_task[t]['stdev']:.1f}"
             for t in tasks]
    avg = statistics.fmean(per_task[t]["mean"] for t in tasks)
    lines.append(f"| {name} | {p['steps']} | {p['total_flops']:.3g} | "
                 + " | ".join(cells) + f" | {100 * avg:.1f} | {held_out(p['eval'])} |")
  return "\n".join(lines + seed_spread(results))


def seed_spread(results: dict) -> list[str]:
  """With pretraining seeds (arms mlm_sS, electra_sS): each recipe's task average per
  pretraining run, their mean and stdev, and MLM's lead over RTD with its standard
  error from the runs' spread; nothing with one run per recipe."""
  runs: dict[str, list[float]] = {}
  for name, per_task in results["finetune"].items():
    match = re.fullmatch(r"(mlm|electra)(_s\d+)?", name)
    if match:
      runs.setdefault(match.group(1), []).append(
          statistics.fmean(per_task[t]["mean"] for t in per_task))
  if len(runs) < 2 or min(len(r) for r in runs.values()) < 2:
    return []
  lines = [""]
  for name, averages in runs.items():
    lines.append(f"{name}, {len(averages)} pretraining runs: task averages "
                 + ", ".join(f"{100 * a:.1f}" for a in averages)
                 + f"; mean {100 * statistics.fmean(averages):.1f} +- "
                 f"{100 * statistics.stdev(averages):.1f}")
  lead = statistics.fmean(runs["mlm"]) - statistics.fmean(runs["electra"])
  error = math.sqrt(sum(statistics.variance(r) / len(r) for r in runs.values()))
  lines.append(f"MLM's lead over RTD: {100 * lead:.1f} points, standard error "
               f"{100 * error:.1f} (from the pretraining runs' spread)")
  return lines


def run(out: str, configs: dict[str, ml_collections.ConfigDict],
        tasks: dict[str, text_tasks.TextTask], seeds: list[int], lr: float,
        edit_finetune: Callable[[ml_collections.ConfigDict], None] | None = None,
        log: Callable[[str], None] = print, eval_every: int = 0) -> dict[str, Any]:
  """The benchmark (module docstring) on `configs` ('mlm' first: its tokenizer is
  shared), writing under `out`; `edit_finetune` changes each fine-tuning config
  (tests shrink them); `eval_every` > 0 evaluates each pretraining run's held-out rows
  that often too."""
  from bertjax.tasks import finetune  # pylint: disable=g-import-not-at-top
  from bertjax.train import curves, pretrain  # pylint: disable=g-import-not-at-top
  os.makedirs(out, exist_ok=True)
  results: dict[str, Any] = {"pretraining": equal_flops(configs), "finetune": {},
                             "lr": lr, "seeds": seeds,
                             "corpus": configs["mlm"].data.corpus}
  workdirs = {name: os.path.join(out, name) for name in configs}
  for name, c in configs.items():
    if name != "mlm":
      c.data.tokenizer.path = os.path.join(workdirs["mlm"], "tokenizer")
    if eval_every:
      c.train.eval_every = min(eval_every, c.train.num_steps)
    t0 = time.perf_counter()
    metrics = pretrain.run(c, workdirs[name])
    if not metrics:  # Finished before: its last held-out evaluation is on record.
      evals = curves.read_metrics(workdirs[name])["eval"]
      metrics = evals[max(evals)]
    results["pretraining"][name].update(
        wall_s=time.perf_counter() - t0, eval=metrics,
        curves=os.path.join(workdirs[name], files.METRICS_FILE))
    log(f"pretrained {name}: {json.dumps(results['pretraining'][name])}")
  for task_name, task in tasks.items():
    paths = task.write(os.path.join(out, "tasks", task_name))
    for name in configs:
      scores = []
      for seed in seeds:
        c = finetune_config(task, paths, workdirs[name], seed, lr)
        if edit_finetune:
          edit_finetune(c)
        workdir = os.path.join(out, "finetune", f"lr{lr:g}", f"{name}_{task_name}_{seed}")
        done = os.path.join(workdir, "dev_results.json")
        if not os.path.exists(done):
          finetune.run(c, workdir)
        with open(done) as f:
          scores.append(json.load(f)["accuracy"])
        log(f"{name} {task_name} seed {seed}: dev accuracy {scores[-1]:.4f}")
      results["finetune"].setdefault(name, {})[task_name] = _spread(scores)
  results["table"] = table(results)
  with open(os.path.join(out, f"results_lr{lr:g}.json"), "w") as f:
    json.dump(results, f, indent=1, default=str)
  with open(os.path.join(out, f"table_lr{lr:g}.md"), "w") as f:
    f.write(results["table"] + "\n")
  return results


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  unknown = sorted(set(f.tasks) - set(text_tasks.TASKS))
  if unknown:
    raise SystemExit(f"--tasks: unknown {unknown}; use {list(text_tasks.TASKS)}.")
  jax.config.update("jax_compilation_cache_dir", os.path.join(f.out, "xla_cache"))
  configs = pretraining_configs(f.mlm_steps, corpus_path(f.corpus, f.out),
                                tuple(int(w) for w in f.generator_widths),
                                tuple(float(r) for r in f.learning_rates),
                                tuple(float(w) for w in f.discriminator_weights),
                                tuple(float(p) for p in f.mask_probs),
                                tuple(int(s) for s in f.pretraining_seeds))
  results = run(f.out, configs, {name: text_tasks.TASKS[name]() for name in f.tasks},
                [int(s) for s in f.seeds], f.lr, eval_every=f.eval_every)
  print(results["table"])
  print(f"wrote {os.path.join(f.out, f'results_lr{f.lr:g}.json')} and table_lr{f.lr:g}.md; "
        "curves: python -m bertjax.plot on "
        + " and ".join(os.path.join(f.out, name) for name in configs))
