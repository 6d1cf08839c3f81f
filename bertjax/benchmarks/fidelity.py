"""Fine-tuning fidelity: dev accuracy of `bertjax.finetune` against a plain Hugging
Face PyTorch loop with the same recipe, over seeds.

  python -m bertjax.benchmark fidelity --init_from=PATH_TO_BERT_DIR --seeds=0,1,2
  # (--config: bertjax's recipe file, default configs/finetune/glue.py:sst2)

The task is generated (deterministic, `--num_train` / `--num_dev` short texts of 8
topics: each text has two words of its topic and one of another among shared filler
words, and 10% of the training labels are flipped), so no data is needed. Every
variant trains from the same checkpoint with batch 32, lr 5e-5, 3 epochs, 10% warm-up,
weight decay 0.01 (not on biases and LayerNorm), clipping 1.0, dropout 0.1:
- `bertjax`: `bertjax.tasks.finetune.run` with the default recipe
  (`configs/finetune/base.py`: Hugging Face's schedule, AdamW eps 1e-8);
- `bertjax_tf`: the same with BERT's TF code's schedule (`decay_start='step0'`) and eps
  1e-6 (bertjax's defaults before this comparison);
- `hf`: `BertForSequenceClassification` (classifier normal(0.02), bias 0), torch AdamW
  with the Trainer's decay grouping (`Trainer.get_decay_parameter_names`),
  `get_linear_schedule_with_warmup`, `clip_grad_norm_`, shuffled batches padded to
  their longest row; the mean loss over the batch.
Prints each run's dev accuracy and each variant's mean and standard deviation;
results go to --json.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import tempfile

import ml_collections
import numpy as np
from absl import flags
from ml_collections import config_flags

VARIANTS = ("bertjax", "bertjax_tf", "hf")
TOPICS = {
    "sports": "match goal team coach league striker season referee stadium tournament",
    "politics": "election senate minister vote parliament campaign policy governor party law",
    "tech": "software chip startup laptop algorithm cloud server smartphone robot code",
    "health": "doctor vaccine hospital disease patient therapy nurse diet symptom clinic",
    "finance": "stock bank market investor loan inflation profit bond currency dividend",
    "travel": "flight hotel beach passport airport tourist cruise luggage resort island",
    "food": "recipe chef bakery pasta flavor dessert kitchen spice restaurant soup",
    "science": "telescope physics molecule experiment laboratory planet fossil genome atom theory",
}
FILLER = ("the a this that our their new old big small report says people week today "
          "local many some after before about with from into during again still very "
          "really quite latest").split()


def define_flags() -> None:
  config_flags.DEFINE_config_file(
      "config", "configs/finetune/glue.py:sst2",
      "bertjax's recipe (its fields as they are, except those the flags below set).",
      lock_config=True)
  flags.DEFINE_string("init_from", "", "Pretrained BERT directory (Hugging Face format).")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (head init, dropout, data order).")
  flags.DEFINE_list("variants", list(VARIANTS), f"Any of {VARIANTS}.")
  flags.DEFINE_integer("num_train", 800, "Generated training texts.")
  flags.DEFINE_integer("num_dev", 400, "Generated dev texts.")
  flags.DEFINE_integer("max_seq_length", 48, "bertjax's row length (texts fit).")
  flags.DEFINE_integer("num_epochs", 3, "Epochs.")
  flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate.")
  flags.DEFINE_string("json", "", "Results file (default: a name in /tmp).")


def topic_task(n: int, seed: int, label_noise: float) -> list[tuple[str, str]]:
  """`n` (text, topic) pairs: two words of the topic, one of another, 9 fillers,
  shuffled; a `label_noise` fraction of the labels replaced by a random topic."""
  rng = np.random.default_rng(seed)
  names = sorted(TOPICS)
  words = {t: TOPICS[t].split() for t in names}
  out = []
  for _ in range(n):
    label = names[rng.integers(len(names))]
    other = names[rng.integers(len(names))]
    tokens = (list(rng.choice(words[label], 2, replace=False)) + [rng.choice(words[other])]
              + list(rng.choice(FILLER, 9)))
    rng.shuffle(tokens)
    if rng.random() < label_noise:
      label = names[rng.integers(len(names))]
    out.append((" ".join(tokens), label))
  return out


def _write_tsv(path: str, rows) -> None:
  with open(path, "w", newline="") as f:
    w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\")
    w.writerow(["sentence", "label"])
    w.writerows(rows)


def run_bertjax(init_from, train_tsv, dev_tsv, seed, workdir, settings, tf_recipe):
  from bertjax.tasks import finetune  # pylint: disable=g-import-not-at-top
  c = ml_collections.ConfigDict(flags.FLAGS.config.to_dict())
  c.init_from, c.seed = init_from, seed
  c.data.train, c.data.dev = train_tsv, dev_tsv
  c.task.labels = ()  # The sorted training labels (the 8 topics).
  c.task.max_seq_length = settings["max_seq_length"]
  c.train.learning_rate = settings["learning_rate"]
  c.train.num_epochs = settings["num_epochs"]
  c.train.log_every = 1000
  if tf_recipe:
    c.train.decay_start, c.train.eps = "step0", 1e-6
  return finetune.run(c, workdir)["accuracy"]


def run_hf(init_from, train, dev, seed, settings):
  """The plain PyTorch loop of Hugging Face's fine-tuning examples."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  labels = sorted({y for _, y in train})
  tok = transformers.BertTokenizerFast.from_pretrained(init_from)
  model = transformers.BertForSequenceClassification.from_pretrained(
      init_from, num_labels=len(labels))
  decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
  groups = [{"params": [p for n, p in model.named_parameters() if n in decay],
             "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if n not in decay],
             "weight_decay": 0.0}]
  batch_size = 32
  steps = -(-len(train) // batch_size) * settings["num_epochs"]
  opt = torch.optim.AdamW(groups, lr=settings["learning_rate"], eps=1e-8)
  sched = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
  gen = torch.Generator().manual_seed(seed)

  def encode(rows):
    enc = tok([t for t, _ in rows], padding=True, truncation=True,
              max_length=settings["max_seq_length"], return_tensors="pt")
    enc["labels"] = torch.tensor([labels.index(y) for _, y in rows])
    return enc

  model.train()
  for _ in range(settings["num_epochs"]):
    order = torch.randperm(len(train), generator=gen).tolist()
    for i in range(0, len(train), batch_size):
      loss = model(**encode([train[j] for j in order[i:i + batch_size]])).loss
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      opt.step()
      sched.step()
      opt.zero_grad()
  model.eval()
  correct = 0
  with torch.no_grad():
    for i in range(0, len(dev), 64):
      batch = encode(dev[i:i + 64])
      pred = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.argmax(-1)
      correct += int((pred == batch["labels"]).sum())
  return correct / len(dev)


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  if not f.init_from:
    raise SystemExit("--init_from: a pretrained BERT directory (Hugging Face format).")
  unknown = sorted(set(f.variants) - set(VARIANTS))
  if unknown:
    raise SystemExit(f"--variants: unknown {unknown}; use {VARIANTS}.")
  settings = dict(max_seq_length=f.max_seq_length, learning_rate=f.learning_rate,
                  num_epochs=f.num_epochs)
  train = topic_task(f.num_train, 1, 0.1)
  dev = topic_task(f.num_dev, 2, 0.0)
  tmp = tempfile.mkdtemp(prefix="fidelity_")
  train_tsv, dev_tsv = os.path.join(tmp, "train.tsv"), os.path.join(tmp, "dev.tsv")
  _write_tsv(train_tsv, train)
  _write_tsv(dev_tsv, dev)
  results = {v: {} for v in f.variants}
  for seed in map(int, f.seeds):
    for v in f.variants:
      if v == "hf":
        acc = run_hf(f.init_from, train, dev, seed, settings)
      else:
        acc = run_bertjax(f.init_from, train_tsv, dev_tsv, seed,
                          os.path.join(tmp, f"{v}_seed{seed}"), settings, v == "bertjax_tf")
      results[v][seed] = acc
      print(f"{v} seed {seed}: dev accuracy {100 * acc:.2f}", flush=True)
  summary = {}
  for v, accs in results.items():
    xs = [100 * a for a in accs.values()]
    summary[v] = {"mean": statistics.mean(xs),
                  "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                  "min": min(xs), "max": max(xs), "runs": accs}
    print(f"{v}: dev accuracy {summary[v]['mean']:.2f} +- {summary[v]['std']:.2f} "
          f"(min {summary[v]['min']:.2f}, max {summary[v]['max']:.2f}, {len(xs)} seeds)")
  path = f.json or os.path.join(tmp, "fidelity.json")
  with open(path, "w") as out:
    json.dump(dict(settings, num_train=f.num_train, num_dev=f.num_dev, results=summary),
              out, indent=2)
  print(f"results: {path}")
