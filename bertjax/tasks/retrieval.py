"""The 'retrieval' fine-tuning task: an embedding model (any family's encoder, pooled,
optionally normalised: `embedding.EmbeddingModel`) trained contrastively on pairs and
triplets (`pairs`), with in-batch negatives from the whole mesh and optional GradCache
(`contrastive`), evaluated by name during and after training (`evals`), on the one
trainer (`bertjax.train.trainer.Trainer`) with fine-tuning's start, workdir and
optimizer (`bertjax.tasks.finetune`).

    python -m bertjax.finetune --config=configs/finetune/retrieval.py \\
        --config.init_from=MODEL --config.data.train=pairs.jsonl \\
        --config.data.dev=BEIR_DIR --workdir=/tmp/retrieval
    python -m bertjax.convert --to=hf --src=/tmp/retrieval --dst=/tmp/st  # a
    # sentence-transformers folder: SentenceTransformer('/tmp/st')

Starting from a sentence-transformers folder, its pooling, normalisation and prompts
are the run's where the config leaves them empty, and its lower-casing where it says
true (`resolve`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Sequence

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from bertjax.checkpoint import files
from bertjax.errors import ConfigError
from bertjax.hf import sentence_transformers as st
from bertjax.parallel import mesh as mesh_lib
from bertjax.tasks import (colbert, contrastive, embedding, pairs as pairs_lib, pooling,
                           rerank_eval, retrieval_eval, sparse)
from bertjax.train import compilation, state as state_lib
from bertjax.train.step import Objective
from bertjax.train.trainer import Evaluator, Trainer

NAME = embedding.NAME
_TOKENIZE_CHUNK = 1 << 15  # Texts per tokenizer call: bounded host memory.


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `config` whose empty task settings (pooling, prompts) are those of the
  sentence-transformers folder `config.init_from` (else 'mean', none), lower-casing on
  where the folder's do_lower_case is true; a setting of the folder's that the config
  changes is logged. A sparse model's: `sparse.resolve`; a ColBERT model's:
  `colbert.resolve`."""
  c = ml_collections.ConfigDict(config.to_dict())
  if c.task.name == sparse.NAME:
    return sparse.resolve(c)
  if c.task.name == colbert.NAME:
    return colbert.resolve(c)
  folder = (st.read(config.init_from) if config.init_from and st.is_folder(config.init_from)
            else None)
  t = c.task
  if not t.pooling:
    t.pooling = folder.pooling if folder else "mean"
  if folder:
    t.query_prompt = t.query_prompt or embedding.prompt(folder, "query")
    t.document_prompt = t.document_prompt or embedding.prompt(folder, "document")
    t.do_lower_case = t.do_lower_case or folder.do_lower_case
    ours = embedding.settings_of(t)
    changed = [f"{k} {getattr(folder, k)!r} -> {getattr(ours, k)!r}" for k in (
        "pooling", "normalize", "max_seq_length", "similarity", "do_lower_case")
               if getattr(folder, k) != getattr(ours, k)]
    if changed:
      logging.info("config.init_from=%s: the config changes its sentence-transformers "
                   "settings: %s.", config.init_from, ", ".join(changed))
  return c


def check_config(config: ml_collections.ConfigDict) -> None:
  """The retrieval settings of `config` in range (one ConfigError line each)."""
  pooling.check(config.task.pooling or "mean")
  contrastive.check_config(config.task)
  if config.task.name == sparse.NAME:
    sparse.check_config(config.task)
  if config.task.name == colbert.NAME:
    colbert.check_config(config)
  if config.train.grad_accum_steps != 1:
    raise ConfigError(
        f"config.train.grad_accum_steps={config.train.grad_accum_steps} would split the "
        "batch into micro-batches, each with its own in-batch negatives; for a larger "
        "contrastive batch in the same memory set config.task.mini_batch_size (GradCache).")
  if config.train.eval_every < 0:
    raise ConfigError(f"config.train.eval_every={config.train.eval_every}: use 0 (at the "
                      "end only) or a number of steps.")


@dataclasses.dataclass
class Ragged:
  """Token rows of varying length: row i is flat[offsets[i]:offsets[i + 1]]."""

  flat: np.ndarray  # [total] int32
  offsets: np.ndarray  # [N + 1] int64

  def rows(self, index: Sequence[int]) -> list[np.ndarray]:
    return [self.flat[self.offsets[i]:self.offsets[i + 1]] for i in index]

  @property
  def lengths(self) -> np.ndarray:
    return np.diff(self.offsets)


def tokenized(texts: Sequence[str], embedder_tokenize: Callable[[Sequence[str]], list]
              ) -> Ragged:
  """`texts` tokenized a chunk at a time into a `Ragged` (host memory: int32 ids)."""
  flat, lengths = [], []
  for lo in range(0, len(texts), _TOKENIZE_CHUNK):
    for ids in embedder_tokenize(texts[lo:lo + _TOKENIZE_CHUNK]):
      flat.append(np.asarray(ids, np.int32))
      lengths.append(len(ids))
  return Ragged(np.concatenate(flat) if flat else np.zeros(0, np.int32),
                np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]))


@dataclasses.dataclass
class Source:
  """One source's examples, tokenized: queries [N] rows, documents [N * C] rows (example
  i's C documents at i * C ...), teacher [N, w] or None."""

  pairs: pairs_lib.Pairs
  queries: Ragged
  documents: Ragged
  candidates: int
  teacher: np.ndarray | None


def featurize(sources: Sequence[pairs_lib.Pairs], tokenizer, settings: st.Settings,
              query_length: int = 0, query_specials: bool = True) -> list[Source]:
  """Each source's texts tokenized as the model will see them (prompts, lower-casing,
  truncation: queries at `query_length` tokens where given, a ColBERT model's; without
  special tokens where not `query_specials`, an inference-free SPLADE model's)."""
  tokenizer = embedding.text_tokenizer(tokenizer, settings)
  query_length = query_length or settings.max_seq_length
  out = []
  for s in sources:
    c = len(s.documents[0])
    out.append(Source(
        s, tokenized(s.anchors, lambda t: embedding.tokenize(
            tokenizer, t, embedding.prompt(settings, "query"), query_length,
            query_specials)),
        tokenized([d for docs in s.documents for d in docs], lambda t: embedding.tokenize(
            tokenizer, t, embedding.prompt(settings, "document"), settings.max_seq_length)),
        c, s.teacher))
  return out


def batch_arrays(source: Source, index: np.ndarray, max_length: int, pad_id: int,
                 rows: slice, text_layout: colbert.Layout | None = None
                 ) -> dict[str, np.ndarray]:
  """The global batch of examples `index` [B] (-1: padding, weight 0, a copy of a real
  example) padded to the batch's `embedding.bucket` lengths, this process's `rows`:
  query_input_ids / query_attention_mask [b, Tq], doc_input_ids / doc_attention_mask
  [b, C, Td], example_weights [b] and, with a teacher, teacher [b, w]. With a ColBERT
  model's `text_layout`, its rows (queries expanded) and query_score_mask /
  doc_score_mask."""
  valid = index >= 0
  real = np.where(valid, index, index[valid][0] if valid.any() else 0)
  queries = source.queries.rows(real)
  c = source.candidates
  docs = source.documents.rows((real[:, None] * c + np.arange(c)).reshape(-1))
  widths = [embedding.bucket(max(map(len, r)), max_length) for r in (queries, docs)]
  if text_layout is None:
    q = dict(zip(("input_ids", "attention_mask"), embedding.pad(queries, widths[0], pad_id)))
    d = dict(zip(("input_ids", "attention_mask"), embedding.pad(docs, widths[1], pad_id)))
  else:
    q = text_layout.queries(queries, widths[0], pad_id)
    d = text_layout.documents(docs, widths[1], pad_id)
  out = {**{f"query_{k}": v for k, v in q.items()},
         **{f"doc_{k}": v.reshape(len(index), c, -1) for k, v in d.items()},
         "example_weights": valid.astype(np.float32)}
  if source.teacher is not None:
    out["teacher"] = source.teacher[real]
  return {k: v[rows] for k, v in out.items()}


def objective(model, task_cfg, sample: dict, scoring=None) -> Objective:
  """The contrastive objective (`contrastive.loss_sums` over the global batch) of
  `model`'s query and document embeddings (`contrastive.embed_columns`: GradCache when
  `task_cfg.mini_batch_size`). With `scoring` (a ColBERT model's MaxSim,
  `colbert.SCORING`), each text's token vectors are paired with its batch's scoring
  mask. Metrics: the in-batch accuracy (queries whose positive scores highest)."""
  ids = jnp.asarray(sample["query_input_ids"])
  init = lambda rng: model.init(rng, ids, jnp.ones_like(ids))["params"]

  def sums(params, batch, rng):
    queries, documents = contrastive.embed_columns(model, params, batch, rng,
                                                   task_cfg.mini_batch_size)
    if scoring:
      queries = (queries, batch["query_score_mask"])
      documents = (documents, batch["doc_score_mask"])
    return contrastive.loss_sums(queries, documents, batch, task_cfg, scoring)

  def counts(batch):
    return {"loss": contrastive.loss_count(batch, task_cfg),
            "correct": jnp.sum(batch["example_weights"].astype(jnp.float32))}

  names = ("in_batch_accuracy",) if task_cfg.loss == "mnrl" else ()
  return Objective(
      init=init, sums=sums, counts=counts,
      loss=lambda s, c: s["loss"] / jnp.maximum(c["loss"], 1.0),
      metrics=lambda s, c: ({"in_batch_accuracy": s["correct"] / jnp.maximum(
          c["correct"], 1.0)} if names else {}),
      metric_names=names)


class Plan:
  """Every step's batch: epoch after epoch of `pairs.epoch_batches` (one source per
  batch, no text twice in a batch), planned at start so that the step count (the
  schedule's) is known and batch k is a pure function of (seed, k) on every process."""

  def __init__(self, sources: Sequence[Source], batch_size: int, seed: int, epochs: int):
    texts = [pairs_lib.example_texts(s.pairs) for s in sources]
    self.epochs = [pairs_lib.epoch_batches([s.pairs for s in sources], texts, batch_size,
                                           seed, e) for e in range(epochs)]
    self.starts = np.cumsum([0] + [len(e) for e in self.epochs])
    self.short = sum(int((b < 0).any()) for e in self.epochs for _, b in e)

  def __len__(self) -> int:
    return int(self.starts[-1])

  def __getitem__(self, step: int) -> tuple[int, np.ndarray]:
    epoch = int(np.searchsorted(self.starts, step, side="right")) - 1
    return self.epochs[epoch][step - self.starts[epoch]]


def train_stream(sources: Sequence[Source], plan: Plan, max_length: int, pad_id: int,
                 text_layout: colbert.Layout | None = None) -> grain.DatasetIterator:
  """The plan's batches (`batch_arrays`), this process's contiguous share of each; a
  grain iterator (its position is checkpointed with the train state)."""
  batch_size = len(plan[0][1])
  share = batch_size // jax.process_count()
  mine = slice(jax.process_index() * share, (jax.process_index() + 1) * share)

  def batch(step: int) -> dict[str, np.ndarray]:
    s, index = plan[step]
    return batch_arrays(sources[s], index, max_length, pad_id, mine, text_layout)

  return iter(grain.MapDataset.range(len(plan)).map(batch).to_iter_dataset(
      grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)))


def default_metric(config) -> str:
  """What selects the best run of a sweep: nDCG@10 on a BEIR directory, the Spearman
  correlation on scored pairs."""
  return "ndcg@10" if os.path.isdir(config.data.dev) else "spearman"


def dev_data(config) -> Any:
  """`config.data.dev` read before the run writes anything: a BEIR split
  (`retrieval_eval.read_beir`, a directory), scored pairs (`retrieval_eval.read_sts`,
  a file) or None (no dev set)."""
  path = config.data.dev
  if not path:
    return None
  if os.path.isdir(path):
    return retrieval_eval.read_beir(path, config.task.qrels_split)
  return retrieval_eval.read_sts(path)


def evaluators(config, dev: Any, embedder: embedding.Embedder, workdir: str
               ) -> list[Evaluator]:
  """The run's evaluation of `config.data.dev` (`dev`: read by `dev_data`): a directory
  in BEIR's layout (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv;
  `config.task.qrels_split`) scored by nDCG@10, MRR@10, Recall@100
  (`retrieval_eval.RetrievalEvaluator`), or a file of scored pairs (sentence1, sentence2, score) scored by the Spearman correlation of
  their similarities; both by the model's `config.task.similarity` (cosine whether or
  not the embeddings are normalised); every `config.train.eval_every` steps (0: at the
  end), at the start too with `config.task.eval_at_start`. A sparse model's vectors
  are cut to `config.task.max_active_dims` entries (0: all) and its BEIR scores add
  their active dimensions (`sparse.Sparsity`); a ColBERT model's token matrices are
  searched by exact MaxSim (`colbert.MaxSimEvaluator`), or with
  `config.task.first_stage` its top first_stage_k candidates are reranked
  (`colbert.MaxSimReranker`). Process 0 writes the last one to dev_results.json."""
  batch, similarity = config.train.eval_batch_size, config.task.similarity
  if dev is None:
    return []

  def encoder(params, kind: str):
    return lambda texts: embedder.encode(params, texts, kind, batch, show=f"eval {kind}s")

  if config.task.name == colbert.NAME and config.task.first_stage:
    candidates = rerank_eval.first_stage(dev, config.task.first_stage,
                                         config.task.first_stage_k, config.data.dev)

    def score(params) -> dict[str, float]:
      return colbert.MaxSimReranker(dev, candidates, encoder(params, "query"),
                                    encoder(params, "document")).evaluate()
  elif config.task.name == colbert.NAME:
    def score(params) -> dict[str, float]:
      return colbert.MaxSimEvaluator(dev, encoder(params, "query"),
                                     encoder(params, "document")).evaluate()
  elif os.path.isdir(config.data.dev) and config.task.name == sparse.NAME:
    def score(params) -> dict[str, float]:
      tally, cut = sparse.Sparsity(), config.task.max_active_dims
      kinds = {"query": "query", "document": "corpus"}
      encode = {k: tally.counting(lambda texts, k=k: sparse.top_active(
          encoder(params, k)(texts), cut), name) for k, name in kinds.items()}
      results = retrieval_eval.RetrievalEvaluator(
          dev, encode["query"], encode["document"], similarity=similarity,
          corpus_chunk_size=sparse.CORPUS_CHUNK).evaluate()
      return {**results, **tally.results()}
  elif os.path.isdir(config.data.dev):
    def score(params) -> dict[str, float]:
      return retrieval_eval.RetrievalEvaluator(
          dev, encoder(params, "query"), encoder(params, "document"),
          similarity=similarity).evaluate()
  else:
    first, second, gold = dev

    def score(params) -> dict[str, float]:
      a, b = (encoder(params, "document")(texts) for texts in (first, second))
      return {"spearman": retrieval_eval.sts_spearman(a, b, gold, similarity)}

  def run(params, step: int) -> dict[str, float]:
    del step
    results = score(params)
    if jax.process_index() == 0:
      with open(os.path.join(workdir, files.DEV_RESULTS_FILE), "w") as f:
        json.dump(results, f, indent=2)
    return results

  return [Evaluator("dev", run, every=config.train.eval_every,
                    at_start=config.task.eval_at_start)]


def build(config, model_cfg, sample: dict, optimizer: tuple, mesh=None
          ) -> tuple[embedding.EmbeddingModel, state_lib.Setup]:
  """The embedding model of `model_cfg` (a `sparse.SpladeModel` for task 'sparse', a
  `colbert.ColbertModel` for 'colbert') and its `Setup` (the contrastive `objective`,
  `sparse.objective`, `objective` with MaxSim,
  `optimizer` = (optimizer, schedule), shardings, the jitted step) on `mesh` (default
  `config.mesh`'s); `sample` a one-row batch (shapes)."""
  t = config.task
  if t.name == sparse.NAME:
    model = sparse.SpladeModel(model_cfg, t.splade_pooling, t.activation, t.chunk_size,
                               t.query_encoder)
    loss = sparse.objective(model, t, sample)
  elif t.name == colbert.NAME:
    model = colbert.ColbertModel(model_cfg, t.dim)
    loss = objective(model, t, sample, colbert.SCORING)
  else:
    model = embedding.EmbeddingModel(model_cfg, t.pooling or "mean", t.normalize)
    loss = objective(model, t, sample)
  setup = state_lib.setup(config, model, loss, *optimizer, mesh)
  check_mini_batch(config, setup)
  return model, setup


def batch_spec(config, batch_size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """Shapes and dtypes of a global batch of `batch_size` examples at the longest rows
  (task.max_seq_length), each with a positive and one document per
  `task.negative_columns` (pairs without): what a pod's plan compiles for. A ColBERT
  model's queries are task.query_length long, and its rows have scoring masks."""
  T, C = config.task.max_seq_length, 1 + len(config.task.negative_columns)
  keys = ("input_ids", "attention_mask")
  Tq = T
  if config.task.name == colbert.NAME:
    keys, Tq = keys + ("score_mask",), config.task.query_length
  spec = {**{f"query_{k}": ((batch_size, Tq), np.int32) for k in keys},
          **{f"doc_{k}": ((batch_size, C, T), np.int32) for k in keys},
          "example_weights": ((batch_size,), np.float32)}
  if config.task.teacher_column:
    spec["teacher"] = ((batch_size, C), np.float32)
  return spec


def train_flops(config, model_cfg, batch_size: int) -> float:
  """Model FLOPs of a step of `batch_spec`'s batch: the encoder's forward and backward
  over every query and document (`stack.train_flops` without heads; a sparse model's
  MLM head at every token, its forward again when chunked; a ColBERT model's queries
  at task.query_length, its projection and MaxSim of every query against every
  document with its blocks' forward again: a pod batch's, blocked; a small one, done at
  once, does 3/4 of that), and with GradCache the embedding's forward again (the
  re-run; MaxSim is not re-run)."""
  from bertjax.model import family_of, stack  # pylint: disable=g-import-not-at-top
  family, T, t = family_of(model_cfg), config.task.max_seq_length, config.task
  C = 1 + len(t.negative_columns)
  splade, late = t.name == sparse.NAME, t.name == colbert.NAME
  bare = dataclasses.replace(family, head_flops=None)
  if late:
    Tq = t.query_length
    encoder = (stack.train_flops(bare, model_cfg, batch_size, Tq, 0)["total"]
               + stack.train_flops(bare, model_cfg, batch_size * C, T, 0)["total"])
    embed = encoder + 6 * batch_size * (Tq + C * T) * model_cfg.hidden_size * t.dim
    scores = 8 * batch_size * batch_size * C * Tq * T * t.dim
  else:  # An inference-free model's queries: a table lookup, no FLOPs counted.
    texts = batch_size * (C if splade and t.query_encoder == "static" else 1 + C)
    terms = stack.train_flops(bare, model_cfg, texts, T, T if splade else 0)
    head = terms["mlm_head"] * (4 / 3 if t.get("chunk_size") else 1.0)
    embed, scores = terms["total"] - terms["mlm_head"] + (head if splade else 0.0), 0.0
  return embed * (4 / 3 if t.mini_batch_size else 1.0) + scores


def train(config: ml_collections.ConfigDict, workdir: str, start, resuming: bool,
          restart: Callable[[], Any], make_optimizer: Callable[[Any, int], tuple],
          begin: Callable[[dict], None]) -> dict[str, float]:
  """Trains (or resumes) an embedding model in `workdir` (module docstring), as
  `bertjax.tasks.finetune.train` starts it: `config` `resolve`d and checked, the run
  opened (`start`: its encoder config, tokenizer and pretrained weights; `resuming`),
  `restart()` the start again (a run resumed before its first checkpoint),
  `make_optimizer(model config, steps)` -> (optimizer, schedule) and `begin(task
  record)` writing the run's files once the training and dev data are read. Returns
  the last dev metrics ({} without config.data.dev or when stopped by SIGTERM)."""
  check_config_with_model(config, start.model)
  settings = embedding.settings_of(config.task)
  t = config.task
  late = t.name == colbert.NAME
  text_layout = colbert.task_layout(t, start.tokenizer) if late else None
  static = t.name == sparse.NAME and t.query_encoder == "static"
  sources = featurize(pairs_lib.read_sources(config.data.train, t), start.tokenizer,
                      settings, t.query_length if late else 0, not static)
  plan = Plan(sources, config.train.batch_size, config.seed, config.train.num_epochs)
  num_steps = len(plan)
  dev = dev_data(config)
  begin({"name": config.task.name, "labels": [], "num_steps": num_steps})
  sample = batch_arrays(sources[0], plan[0][1][:1], settings.max_seq_length,
                        start.tokenizer.pad_id, slice(None), text_layout)
  model, setup = build(config, start.model, sample,
                       make_optimizer(start.model, num_steps))
  trainer = Trainer(setup, config, workdir, num_steps)
  if t.name == sparse.NAME:
    vectors = (f"SPLADE {t.splade_pooling} pooling of {t.activation}, FLOPS weights "
               f"{t.query_regularizer_weight:g} / {t.document_regularizer_weight:g}" + (
                   ", inference-free queries (a weight per token" + (
                       ", frozen)" if t.query_weights_frozen else
                       f" at lr {t.query_learning_rate or config.train.learning_rate:g})")
                   if static else ""))
  elif late:
    vectors = (f"{t.dim}-dimensional token vectors scored by MaxSim, queries of "
               f"{t.query_length} tokens{' expanded' if t.query_expansion else ''}, "
               f"{len(text_layout.skip_ids)} document tokens skipped")
  else:
    vectors = f"{t.pooling} pooling{', normalised' if t.normalize else ''}"
  trainer.info("Task %s: %s; %d steps of %d examples (%d batches padded: an epoch's "
               "last, or short of distinct texts), %s, loss %s%s.", t.name, ", ".join(
                   f"{s.pairs.name or 'train'} {len(s.pairs)} examples (a positive and "
                   f"{s.candidates - 1} negatives each)" for s in sources), num_steps,
               config.train.batch_size, plan.short, vectors, t.loss,
               f", GradCache mini-batches of {t.mini_batch_size}" if t.mini_batch_size else "")
  if late:
    embedder = colbert.TokenEmbedder(model, start.tokenizer, settings, setup.mesh,
                                     setup.rules, setup.shardings.params, text_layout)
  else:
    embedder = (sparse.SparseEmbedder if t.name == sparse.NAME else embedding.Embedder)(
        model, start.tokenizer, settings, setup.mesh, setup.rules, setup.shardings.params)

  def init_params():
    first = restart() if resuming else start
    if first.encoder_params is None:
      return setup.init_params(config)
    given = {"encoder": first.encoder_params, **first.kept_params}
    # What the start lacks (a ColBERT projection of a bare encoder) is drawn alone.
    return {k: setup.init_params(config, k) if k not in given else jax.device_put(
        jax.tree.map(lambda x, a: jnp.asarray(x, a.dtype), given[k], setup.abstract.params[k]),
        setup.shardings.params[k], may_alias=False) for k in setup.abstract.params}

  data = train_stream(sources, plan, settings.max_seq_length, start.tokenizer.pad_id,
                      text_layout)
  with compilation.logged(trainer.info):
    return trainer.fit(data, evaluators(config, dev, embedder, workdir),
                       init_params).get("dev", {})


def check_config_with_model(config, model) -> None:
  """The checks that need the encoder's config: Matryoshka dimensions within its width,
  the mini-batch dividing the batch."""
  contrastive.check_config(config.task, model.hidden_size)
  mini = config.task.mini_batch_size
  if mini and config.train.batch_size % mini:
    raise ConfigError(f"config.task.mini_batch_size={mini} does not divide config.train."
                      f"batch_size={config.train.batch_size}; use a divisor of it.")


def check_mini_batch(config, setup: state_lib.Setup) -> None:
  """A GradCache mini-batch spread evenly over the data-parallel devices."""
  mini, dp = config.task.mini_batch_size, mesh_lib.data_parallel_size(setup.mesh, setup.rules)
  if mini and mini < config.train.batch_size and mini % dp:
    raise ConfigError(f"config.task.mini_batch_size={mini} is not a multiple of the {dp} "
                      "data-parallel devices (each embeds its share of a mini-batch); use "
                      "a multiple of them.")
