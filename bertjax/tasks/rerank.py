"""The 'rerank' fine-tuning task: a reranker (cross-encoder) from any family's encoder,
as sentence-transformers 6's `CrossEncoder` is: a (query, document) pair read together
in the family's pair layout (the tokenizer's pair template: BERT's [CLS] q [SEP] d
[SEP], RoBERTa's <s> q </s></s> d </s>, ...), cut to `max_seq_length` tokens as its
tokenizer cuts (longest_first: the longer side first), the classification head of the
family (its Hugging Face *ForSequenceClassification) giving `num_labels` logits, and
the score = activation(logits): Sigmoid for one label, identity for several
(`CrossEncoder.get_default_activation_fn`), or the activation the init_from
cross-encoder folder names.

    python -m bertjax.finetune --config=configs/finetune/rerank.py \\
        --config.init_from=MODEL --config.data.train=labeled_pairs.jsonl \\
        --config.data.dev=rerank_dev.jsonl --workdir=/tmp/rerank

Training data (`read`), sentence-transformers' shapes, one example a row:
- labeled pairs: query, document, label (a float: 0/1 or graded; a class index with
  'cross_entropy');
- labeled lists: query, [documents], [labels] (`mine_hard_negatives(output_format=
  'labeled-list')`);
- tuples: anchor (query), positive, negative or negative_1..k (a triplet / n-tuple:
  labels 1, 0, ...), with a teacher's [scores] column for 'margin_mse'.
Every example is a group of G (query, document) pairs, `config.task.group_size` (0: the
longest list; 1 for pairs), shorter lists padded (pairs of weight 0): every step has
one shape and compiles once. With 'mnrl', a group is [positive, `num_negatives`
documents of other examples (drawn once, from the seed, uniformly without
replacement from every other example's documents: sentence-transformers draws them
from the other examples of the batch, each step), the hard negatives].

Dev data (`read(split='dev')`): sentence-transformers' `CrossEncoderRerankingEvaluator`
samples (JSON lines: query, positive [texts], and documents [a first stage's
candidates, in its order] or negative [texts]) or a BEIR directory with a first stage
(`rerank_eval`), scored by MAP, MRR@10 and nDCG@10 of the reranked lists, the first
stage's own beside them (base_*).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from absl import logging

from bertjax.data.tokenizer import truncate_longest_first
from bertjax.errors import ConfigError, DataError
from bertjax.tasks import base, contrastive, pairs as pairs_lib, rerank_eval, rerank_losses
from bertjax.model import family_of

NAME = "rerank"
QUERY_COLUMNS, DOCUMENT_COLUMNS = rerank_eval.QUERY_COLUMNS, rerank_eval.DOCUMENT_COLUMNS
LABEL_COLUMNS = ("label", "labels", "score", "scores")
# CrossEncoder's activation_fn paths (config_sentence_transformers.json).
ACTIVATION_PATHS = {"sigmoid": "torch.nn.modules.activation.Sigmoid",
                    "identity": "torch.nn.modules.linear.Identity"}


def activation_of(task_cfg) -> str:
  """The score's activation: the config's, else Sigmoid for one label, else identity."""
  if task_cfg.activation:
    return task_cfg.activation
  return "sigmoid" if task_cfg.num_labels == 1 else "identity"


class RerankHead(nn.Module):
  """The classification head (`ClassifierHead`'s layers and names: the family's
  *ForSequenceClassification) over each pair of [B, G, T] groups -> logits [B, G, K];
  of [B, T] pairs (or a packed batch's slots) -> logits [B, K]."""

  config: Any  # the model config (any family)
  num_outputs: int

  @nn.compact
  def __call__(self, out: dict, batch: dict, deterministic: bool) -> dict:
    family = family_of(self.config)
    x = family.task_features(self.config, out, deterministic, pooled=True)  # [B*G, E]
    logits = family.output_layer(self.config, self.num_outputs, "classifier")(x)
    logits = logits.astype(jnp.float32)
    if batch["input_ids"].ndim == 2:  # pairs, one a row or packed (`Rerank.packing`)
      return {"logits": logits}
    B, G = batch["input_ids"].shape[:2]
    return {"logits": logits.reshape(B, G, -1)}


@dataclasses.dataclass
class Group:
  """One example: a query, its G' <= G documents and their labels."""

  query: str
  documents: list[str]
  labels: list[float]


def _column(names: Sequence[str], configured: str, candidates: Sequence[str], what: str,
            path: str, field: str, required: bool = True) -> str:
  if configured:
    if configured not in names:
      raise DataError(f"{path} has no column {configured!r} (it has {', '.join(names)}): "
                      f"rename it or set config.task.{field}.")
    return configured
  found = next((c for c in candidates if c in names), "")
  if not found and required:
    raise DataError(f"{path} has no {what} column (one of {', '.join(candidates)}; it has "
                    f"{', '.join(names)}): name it with config.task.{field}.")
  return found


def _texts(values: list, path: str, column: str) -> list[str]:
  for i, v in enumerate(values):
    if not isinstance(v, str) or not v.strip():
      raise DataError(f"{path}, row {i + 1}: column {column!r} is "
                      f"{'empty' if isinstance(v, str) else repr(v)}; every query and "
                      "document must be a non-empty text.")
  return values


def read_groups(path: str, task_cfg) -> list[Group]:
  """The training examples of a JSON-lines, Parquet or CSV file (module docstring)."""
  table = pairs_lib.read_table(path)
  names = table.column_names
  if not table.num_rows:
    raise DataError(f"{path} holds no rows.")
  query = _column(names, task_cfg.query_column, QUERY_COLUMNS, "query", path, "query_column")
  document = _column(names, task_cfg.document_column,
                     [c for c in DOCUMENT_COLUMNS if c != query], "document", path,
                     "document_column")
  label = _column(names, task_cfg.label_column, LABEL_COLUMNS, "label", path,
                  "label_column", required=False)
  queries = _texts(table.column(query).to_pylist(), path, query)
  docs = table.column(document).to_pylist()
  labels = table.column(label).to_pylist() if label else None
  negatives = [c for c in pairs_lib.negative_columns(names, ()) if c not in (query, document)]
  if isinstance(docs[0], list):  # Labeled lists.
    if labels is None:
      raise DataError(f"{path}: a list of documents a row needs a list of labels beside "
                      f"it (a column of {', '.join(LABEL_COLUMNS)}, or "
                      "config.task.label_column); none found.")
    out = []
    for i, (q, ds, ls) in enumerate(zip(queries, docs, labels)):
      if not isinstance(ds, list) or not isinstance(ls, list) or len(ds) != len(ls) or not ds:
        raise DataError(f"{path}, row {i + 1}: {len(ds) if isinstance(ds, list) else ds!r} "
                        f"documents but {len(ls) if isinstance(ls, list) else ls!r} labels; "
                        "a labeled list gives one label per document.")
      out.append(Group(q, _texts(ds, path, document), [_number(x, path, i, label) for x in ls]))
    return out
  docs = _texts(docs, path, document)
  if negatives:  # Triplets / n-tuples: the positive, then the negatives.
    columns = [docs] + [_texts(table.column(c).to_pylist(), path, c) for c in negatives]
    out = []
    for i, q in enumerate(queries):
      ds = [col[i] for col in columns]
      if labels is not None:  # A teacher's scores (margin_mse) of [positive, negatives].
        row = labels[i] if isinstance(labels[i], list) else [labels[i]]
        if len(row) != len(ds):
          raise DataError(f"{path}, row {i + 1}: column {label!r} holds {len(row)} scores "
                          f"for {len(ds)} documents (positive and negatives); give one each.")
        ls = [_number(x, path, i, label) for x in row]
      else:
        ls = [1.0] + [0.0] * (len(ds) - 1)
      out.append(Group(q, ds, ls))
    return out
  if labels is None:
    raise DataError(f"{path}: (query, document) pairs need a label column (one of "
                    f"{', '.join(LABEL_COLUMNS)}, or config.task.label_column), or "
                    "negative columns (negative, negative_1..k) for triplets.")
  return [Group(q, [d], [_number(l, path, i, label)])
          for i, (q, d, l) in enumerate(zip(queries, docs, labels))]


def _number(value, path: str, row: int, column: str) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
    raise DataError(f"{path}, row {row + 1}: column {column!r} holds {value!r}, not a "
                    "number.")
  return float(value)


def with_in_batch_negatives(groups: list[Group], num_negatives: int, seed: int
                            ) -> list[Group]:
  """MNRL's groups: each [positive, `num_negatives` documents of other examples (drawn
  uniformly without replacement), its hard negatives], labels [1, 0, ...]."""
  if not num_negatives:
    return groups
  pool = [(i, d) for i, g in enumerate(groups) for d in g.documents]
  rng = np.random.default_rng([seed, 57])
  out = []
  for i, g in enumerate(groups):
    picked: list[str] = []
    for k in rng.permutation(len(pool)):
      j, d = pool[k]
      if j != i and d not in g.documents and d not in picked:
        picked.append(d)
        if len(picked) == num_negatives:
          break
    docs = g.documents[:1] + picked + g.documents[1:]
    out.append(Group(g.query, docs, [1.0] + [0.0] * (len(docs) - 1)))
  return out


def tokenized_pairs(tokenizer, queries: Sequence[str], documents: Sequence[str],
                    max_length: int) -> dict[str, np.ndarray]:
  """[N, max_length] rows of (query, document) pairs in the tokenizer's pair layout, cut
  longest-first (Hugging Face's `truncation='longest_first'`, as CrossEncoder's
  tokenizer call). Each distinct text is tokenized once."""
  uq, qi = np.unique(np.asarray(queries, dtype=object), return_inverse=True)
  ud, di = np.unique(np.asarray(documents, dtype=object), return_inverse=True)
  q_ids = tokenizer.tokenize_batch(list(uq))
  d_ids = tokenizer.tokenize_batch(list(ud))
  room = max_length - tokenizer.num_special(True)
  rows = [truncate_longest_first(q_ids[a], d_ids[b], room) for a, b in zip(qi, di)]
  return base.encode_rows(tokenizer, rows, max_length)


def batch_spec(config, batch_size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """Shapes and dtypes of a global training batch of `batch_size` groups of
  task.group_size (query, document) pairs at task.max_seq_length: what a pod's plan
  compiles for (a plan needs the group size set: 16 for a positive and 15 negatives)."""
  T, G = config.task.max_seq_length, config.task.group_size
  if G < 1:
    raise ConfigError("a rerank plan needs config.task.group_size, the pairs of a group "
                      "(e.g. 16: a positive and 15 negatives).")
  spec = {k: ((batch_size, G, T), np.int32) for k in base.TOKEN_KEYS}
  spec.update(labels=((batch_size, G), np.float32), pair_mask=((batch_size, G), np.float32),
              example_weights=((batch_size,), np.float32))
  return spec


def train_flops(config, model_cfg, batch_size: int) -> float:
  """Model FLOPs of a step of `batch_spec`'s batch: the encoder's forward and backward
  over every pair of every group (`stack.train_flops` without the MLM head; the
  one-logit head's are negligible)."""
  from bertjax.model import stack  # pylint: disable=g-import-not-at-top
  family = family_of(model_cfg)
  terms = stack.train_flops(dataclasses.replace(family, head_flops=None), model_cfg,
                            batch_size * config.task.group_size, config.task.max_seq_length,
                            0)
  return terms["total"] - terms["mlm_head"]


class Rerank(base.Task):
  name = NAME
  default_metric = "ndcg@10"

  def __init__(self, task_cfg, tokenizer, max_seq_length):
    super().__init__(task_cfg, tokenizer, max_seq_length)
    check_task(task_cfg)
    self.labels = [f"LABEL_{i}" for i in range(task_cfg.num_labels)]
    self.activation = activation_of(task_cfg)
    self.default_metric = f"ndcg@{task_cfg.at_k}"

  # Data.
  def read(self, path: str, split: str) -> list[dict]:
    if split == "train":
      groups = read_groups(path, self.cfg)
      if self.cfg.loss == "mnrl":
        groups = with_in_batch_negatives(groups, self.cfg.num_negatives, self.cfg.get(
            "seed", 0))
      G = self.group_size(groups)
      # Groups of one pair (labeled pairs, pointwise losses) are pairs: one a row, so
      # that fine-tuning's packing puts several short ones in a row of
      # max_seq_length, each isolated (`batching.packed`, 'cls' slots).
      self.packing = "cls" if G == 1 else ""
      long = next((i for i, g in enumerate(groups) if len(g.documents) > G), None)
      if long is not None:
        raise DataError(f"{path}, row {long + 1}: a list of {len(groups[long].documents)} "
                        f"documents, more than config.task.group_size={G}; raise it (or 0: "
                        "the longest list) or cut the lists.")
      return [dataclasses.asdict(g) for g in groups]
    return rerank_eval.read_dev(path, self.cfg)

  def group_size(self, groups: Sequence[Group]) -> int:
    return self.cfg.group_size or max(len(g.documents) for g in groups)

  def fit_labels(self, train):
    return self.labels

  def featurize(self, examples: Sequence[dict], train: bool) -> base.Features:
    """Train: input_ids ... [N, G, T], labels / pair_mask [N, G]. Dev: the pairs of the
    candidate lists, one a row ([N, 1, T])."""
    T = self.max_seq_length
    if self.packing:  # Pairs: [N, T] rows, labels [N] (`read`).
      pairs = [(e["query"], e["document"], e["label"]) if not train else
               (e["query"], e["documents"][0], e["labels"][0]) for e in examples]
      arrays = tokenized_pairs(self.tokenizer, [q for q, _, _ in pairs],
                               [d for _, d, _ in pairs], T)
      arrays["labels"] = np.asarray([l for _, _, l in pairs], np.float32)
      return base.Features(arrays, np.arange(len(pairs)), [None] * len(pairs))
    if not train:  # Pairs of the dev lists (rerank_eval.read_dev).
      arrays = tokenized_pairs(self.tokenizer, [e["query"] for e in examples],
                               [e["document"] for e in examples], T)
      arrays = {k: v[:, None] for k, v in arrays.items()}
      arrays["labels"] = np.asarray([[e["label"]] for e in examples], np.float32)
      arrays["pair_mask"] = np.ones((len(examples), 1), np.float32)
      return base.Features(arrays, np.arange(len(examples)), [None] * len(examples))
    G = self.cfg.group_size or max(len(e["documents"]) for e in examples)
    N = len(examples)
    queries, documents, slot = [], [], []
    labels = np.zeros((N, G), np.float32)
    mask = np.zeros((N, G), np.float32)
    for n, e in enumerate(examples):
      for g, (d, l) in enumerate(zip(e["documents"], e["labels"])):
        queries.append(e["query"])
        documents.append(d)
        slot.append(n * G + g)
        labels[n, g], mask[n, g] = l, 1
    rows = tokenized_pairs(self.tokenizer, queries, documents, T)
    arrays = {}
    for k, v in rows.items():
      full = np.full((N * G, T), self.tokenizer.pad_id if k == "input_ids" else 0, np.int32)
      full[slot] = v
      arrays[k] = full.reshape(N, G, T)
    arrays["labels"], arrays["pair_mask"] = labels, mask
    return base.Features(arrays, np.arange(N), [None] * N)

  # Model.
  def head(self, config) -> nn.Module:
    return RerankHead(config, self.cfg.num_labels)

  def train_outputs(self, model, params, batch, rng):
    """With `mini_batch_size` (sentence-transformers' mini_batch_size of
    CachedMultipleNegativesRankingLoss, for any loss here): the encoder reads that many
    rows at a time (a group's pairs one a row, or packed rows) under GradCache
    (`contrastive.embed_in_chunks`): the step holds one mini-batch's activations, and
    its loss and gradients are the whole batch's at once to rounding."""
    mini = self.cfg.mini_batch_size
    if not mini:
      return super().train_outputs(model, params, batch, rng)
    grouped = batch["input_ids"].ndim == 3  # [B, G, T] groups; else [B, T] rows
    lead = batch["input_ids"].shape[:-1]
    keys = ("input_ids", "attention_mask", "token_type_ids") + (
        () if grouped else tuple(k for k in ("position_ids", "segment_ids",
                                             "cls_positions") if k in batch))
    inputs = {k: batch[k].reshape(-1, batch[k].shape[-1]) if grouped else batch[k]
              for k in keys}
    n_rows = inputs["input_ids"].shape[0]
    if n_rows > mini and n_rows % mini:
      raise ConfigError(
          f"config.task.mini_batch_size={mini} does not divide the {n_rows} "
          f"{'pairs (groups x group_size)' if grouped else 'packed rows'} the encoder "
          "reads in a step; use a divisor of it.")

    def logits(chunk, key):
      out = model.apply({"params": params}, chunk, deterministic=key is None,
                        rngs=None if key is None else {"dropout": key})["logits"]
      return out.reshape(out.shape[0], -1)

    flat = contrastive.embed_in_chunks(logits, inputs, rng, mini)
    if "cls_positions" in batch:  # packed rows: [rows, K slots, labels]
      return {"logits": flat.reshape(n_rows, batch["cls_positions"].shape[1], -1)}
    return {"logits": flat.reshape(*lead, -1)}

  def loss(self, outputs, batch):
    logits, labels = outputs["logits"], batch["labels"]
    if "pair_mask" in batch:
      mask = batch["pair_mask"] * batch["example_weights"][:, None]
    else:  # pairs ([B] or packed [rows, K]): groups of one
      logits = logits.reshape(-1, 1, logits.shape[-1])
      labels, mask = labels.reshape(-1, 1), batch["example_weights"].reshape(-1, 1)
    if self.cfg.loss == "cross_entropy":
      labels = labels.astype(jnp.int32)
    total, count = rerank_losses.loss_of(self.cfg.loss, logits, labels, mask, self.cfg)
    if self.cfg.loss in ("lambda", "ranknet") and self.cfg.lambda_k:
      # NDCG@k's pairs depend on the model's order: the batch's mean, a term a batch.
      return total / jnp.maximum(count, 1.0), jnp.ones(())
    return total, count

  def predict_outputs(self, outputs):
    return {"logits": outputs["logits"]}

  # Host side.
  def scores(self, logits: np.ndarray) -> np.ndarray:
    """CrossEncoder.predict's scores of logits [..., K]: the activation, one label
    squeezed ([...]), several kept ([..., K])."""
    x = np.asarray(logits, np.float32)
    if self.activation == "sigmoid":
      x = 1.0 / (1.0 + np.exp(-x))
    return x[..., 0] if self.cfg.num_labels == 1 else x

  def decode(self, outputs, features, examples):
    """Each dev pair's score (CrossEncoder.predict's)."""
    logits = outputs["logits"]
    s = self.scores(logits[:, 0] if logits.ndim == 3 else logits)
    return [float(x) if np.ndim(x) == 0 else [float(v) for v in x] for x in s]

  def score(self, predictions, examples):
    return rerank_eval.score_pairs(predictions, examples, self.cfg.at_k)


def check_task(t) -> None:
  """The rerank settings of `config.task` in range (one ConfigError line each)."""
  rerank_losses.check_config(t)
  if t.activation not in ("", *rerank_losses.ACTIVATIONS):
    raise ConfigError(f"config.task.activation={t.activation!r}: use '' (Sigmoid for one "
                      f"label, else identity) or one of {rerank_losses.ACTIVATIONS}.")
  if t.group_size < 0 or t.at_k < 1 or t.mini_batch_size < 0:
    raise ConfigError("config.task.group_size and mini_batch_size must be >= 0 (0: the "
                      "longest list; at once) and config.task.at_k >= 1.")


def check_config(config) -> None:
  """`check_task`, and the batch settings a loss constrains."""
  check_task(config.task)
  t = config.task
  if (t.loss in ("lambda", "ranknet") and t.lambda_k
      and config.train.grad_accum_steps != 1):
    raise ConfigError(f"config.task.lambda_k={t.lambda_k} normalises LambdaLoss over the "
                      "whole batch by pairs the model's order picks; with "
                      "config.train.grad_accum_steps > 1 set lambda_k=0 (every pair).")


def exported_files(directory: str, task_cfg) -> None:
  """The sentence-transformers files of a CrossEncoder folder beside its transformers
  *ForSequenceClassification model: modules.json (the Transformer at the root),
  config_sentence_transformers.json (its activation_fn) and sentence_bert_config.json
  (the Transformer's task: sequence classification, its logits the scores). The
  length is the tokenizer's model_max_length, where CrossEncoder reads it."""
  def dump(name, value):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      json.dump(value, f, indent=2)
      f.write("\n")

  dump("modules.json", [{"idx": 0, "name": "0", "path": "", "type":
                         "sentence_transformers.base.modules.transformer.Transformer"}])
  dump("config_sentence_transformers.json", {
      "activation_fn": ACTIVATION_PATHS[activation_of(task_cfg)], "model_type": "CrossEncoder",
      "prompts": {}, "default_prompt_name": None})
  dump("sentence_bert_config.json", {  # sentence-transformers 6.2.0's CrossEncoder's.
      "transformer_task": "sequence-classification",
      "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
      "module_output_name": "scores"})


def folder_settings(directory: str) -> dict[str, Any]:
  """What a published cross-encoder folder says of its scores: {'num_labels',
  'activation' ('sigmoid' / 'identity' / '' when it names another), 'max_seq_length'
  (0: unset)}; {} when `directory` holds no *ForSequenceClassification model."""
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    hf = json.load(f)
  archs = hf.get("architectures") or []
  if not any(a.endswith("ForSequenceClassification") for a in archs):
    return {}
  num_labels = len(hf.get("id2label") or {}) or int(hf.get("num_labels", 1))
  named = (hf.get("sentence_transformers") or {}).get("activation_fn") or hf.get(
      "sbert_ce_default_activation_function")
  st_path = os.path.join(directory, "config_sentence_transformers.json")
  if os.path.isfile(st_path):
    with open(st_path, encoding="utf-8") as f:
      named = json.load(f).get("activation_fn") or named
  by_path = {v: k for k, v in ACTIVATION_PATHS.items()}
  by_path.update({"torch.nn.Sigmoid": "sigmoid", "torch.nn.Identity": "identity"})
  activation = by_path.get(named, "") if named else ("sigmoid" if num_labels == 1
                                                      else "identity")
  length = 0
  tok = os.path.join(directory, "tokenizer_config.json")
  if os.path.isfile(tok):
    with open(tok, encoding="utf-8") as f:
      value = json.load(f).get("model_max_length")
    if isinstance(value, (int, float)) and 0 < value < 1e9:
      length = int(value)
  positions = hf.get("max_position_embeddings")
  if isinstance(positions, int) and positions > 0:
    length = min(length or positions, positions)
  return {"num_labels": num_labels, "activation": activation, "max_seq_length": length}


def resolve(config):
  """A copy of `config` that starts from a published cross-encoder folder as it is:
  `config.init_from` holding a *ForSequenceClassification model keeps its head
  (init_keep_head) when its number of labels is the config's, and gives its activation
  where config.task.activation is ''; a bertjax rerank workdir keeps its own."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  c = ml_collections.ConfigDict(config.to_dict())
  folder = folder_settings(c.init_from) if c.init_from else {}
  if folder:
    if folder["num_labels"] == c.task.num_labels:
      c.init_keep_head = True
      c.task.activation = c.task.activation or folder["activation"]
    else:
      logging.info("config.init_from=%s scores %d labels, config.task.num_labels=%d: a "
                   "fresh head.", c.init_from, folder["num_labels"], c.task.num_labels)
  return c
