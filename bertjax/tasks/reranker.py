"""A trained reranker in use: loaded from a rerank workdir or a published cross-encoder
folder (`load_reranker`), scoring (query, document) pairs as
`sentence_transformers.CrossEncoder.predict` does (`Reranker.predict`), and exported as
a folder `CrossEncoder(folder)` loads (`export`).

    reranker = load_reranker("/tmp/rerank")         # or a cross-encoder folder
    scores = reranker.predict([("what is a tuple?", "A tuple is immutable.")])  # [N]
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.checkpoint import workdir as workdir_lib
from bertjax.errors import CheckpointError
from bertjax.tasks import base, embedding, finetuned, rerank


@dataclasses.dataclass
class Reranker:
  """A cross-encoder: its encoder `config`, `params` {'encoder', 'head'}, tokenizer and
  `task` (a `rerank.Rerank`: num_labels, activation, max_seq_length)."""

  config: Any
  params: dict
  tokenizer: Any
  task: rerank.Rerank

  def __post_init__(self):
    self.model = base.FinetuneModel(self.config, self.task.head(self.config))
    self._apply = jax.jit(lambda p, b: self.model.apply({"params": p}, b)["logits"])

  @property
  def max_seq_length(self) -> int:
    return self.task.max_seq_length

  def logits(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> np.ndarray:
    """[N, K] float32 logits of the pairs: sorted by length, batches padded to a
    power-of-two bucket (`embedding.bucket`), each shape compiled once."""
    pairs = [(str(q), str(d)) for q, d in pairs]
    if not pairs:
      return np.zeros((0, self.task.cfg.num_labels), np.float32)
    rows = rerank.tokenized_pairs(self.tokenizer, [q for q, _ in pairs],
                                  [d for _, d in pairs], self.max_seq_length)
    lengths = rows["attention_mask"].sum(1)
    order = np.argsort(-lengths, kind="stable")
    out = np.zeros((len(pairs), self.task.cfg.num_labels), np.float32)
    for lo in range(0, len(pairs), batch_size):
      idx = order[lo:lo + batch_size]
      full = np.concatenate([idx, np.full(batch_size - len(idx), idx[0])])
      T = embedding.bucket(int(lengths[idx].max()), self.max_seq_length)
      batch = {k: jnp.asarray(v[full, None, :T]) for k, v in rows.items()}
      out[idx] = np.asarray(self._apply(self.params, batch))[:len(idx), 0]
    return out

  def predict(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> np.ndarray:
    """CrossEncoder.predict's scores: activation(logits), [N] for one label, else [N, K]."""
    return self.task.scores(self.logits(pairs, batch_size))


def _task(task_cfg, tokenizer) -> rerank.Rerank:
  return rerank.Rerank(task_cfg, tokenizer, task_cfg.max_seq_length)


def task_config(**overrides) -> ml_collections.ConfigDict:
  """configs/finetune/rerank.py's task section (bertjax imports no configs/: the
  fields a Reranker reads), with `overrides`."""
  t = ml_collections.ConfigDict(dict(
      name=rerank.NAME, max_seq_length=512, num_labels=1, activation="", loss="bce",
      loss_activation="", pos_weight=0.0, scale=10.0, num_negatives=4,
      lambda_scheme="ndcg2pp", lambda_k=0, sigma=1.0, mu=10.0, reduction_log="binary",
      list_order="input", adrmse_alpha=1.0, mini_batch_size=0, group_size=0, at_k=10,
      always_rerank_positives=True))
  t.update(overrides)
  return t


def start_head(config, pretrained):
  """The head a rerank run starts from: a kept bertjax head (`finetuned.start_head`),
  the classification head of a cross-encoder folder (`resolve`), or None (fresh)."""
  from bertjax.checkpoint.pretrained import TaskHead  # pylint: disable=g-import-not-at-top
  from bertjax.hf import convert, files  # pylint: disable=g-import-not-at-top
  if not config.init_keep_head or pretrained.head is not None:
    if pretrained.head is not None and pretrained.head.name == "classification":
      pretrained = dataclasses.replace(pretrained, head=TaskHead(
          rerank.NAME, pretrained.head.labels, pretrained.head.params))
    return finetuned.start_head(pretrained, config.init_from, config.init_keep_head,
                                rerank.NAME)
  with open(os.path.join(config.init_from, "config.json"), encoding="utf-8") as f:
    hf = json.load(f)
  state = files.read_state_dict(config.init_from)
  model, params, task = convert.table_of(hf).load(hf, state)
  head = params.get("head") if task == "classification" else None
  if head is None and model.family == "bert":  # BERT's reader leaves task heads out.
    from bertjax.hf import bert, table  # pylint: disable=g-import-not-at-top
    entries, _ = bert.task_head_table("classification", hf["model_type"], model)
    head = table.read(state, [e for e in entries if e.path[0] == "head"], model,
                      bert.lookup).get("head")
  if head is None:
    return None
  labels = [f"LABEL_{i}" for i in range(config.task.num_labels)]
  return TaskHead(rerank.NAME, labels, head)


def load_reranker(path: str, max_seq_length: int = 0) -> Reranker:
  """The reranker of a rerank workdir (its settings from its config) or of a folder
  holding a *ForSequenceClassification model (a published cross-encoder: its labels,
  activation and length, `rerank.folder_settings`); with `max_seq_length`, pairs are
  cut there instead."""
  path = os.fspath(path)
  from bertjax.checkpoint.pretrained import load_pretrained  # pylint: disable=g-import-not-at-top
  if workdir_lib.is_finetuned(path):
    name = workdir_lib.task_info(path)["name"]
    if name != rerank.NAME:
      raise CheckpointError(f"{path} holds a fine-tuned {name!r} model, not a reranker: give "
                            f"a {rerank.NAME!r} workdir or a cross-encoder folder.")
    run = workdir_lib.open_finetuned(path)
    task_cfg = ml_collections.ConfigDict(run.config.task.to_dict())
    if max_seq_length:
      task_cfg.max_seq_length = max_seq_length
    return Reranker(run.model, run.params, run.tokenizer, _task(task_cfg, run.tokenizer))
  settings = rerank.folder_settings(path)
  if not settings:
    raise CheckpointError(f"{path} holds no *ForSequenceClassification model (its "
                          "config.json's architectures): not a cross-encoder; give one, or "
                          "a rerank workdir.")
  if not settings["activation"]:
    raise CheckpointError(f"{path} names an activation_fn bertjax does not compute "
                          "(only Sigmoid and Identity).")
  pretrained = load_pretrained(path)
  cfg = task_config(num_labels=settings["num_labels"], activation=settings["activation"],
                    max_seq_length=min(max_seq_length or settings["max_seq_length"] or 512,
                                       pretrained.config.max_length),
                    loss="bce" if settings["num_labels"] == 1 else "cross_entropy")
  head = start_head(ml_collections.ConfigDict(
      {"init_keep_head": True, "init_from": path, "task": cfg}),
      dataclasses.replace(pretrained, head=None))
  if head is None:
    raise CheckpointError(f"{path}: its classification head could not be read.")
  params = {"encoder": pretrained.params["encoder"],
            "head": jax.tree.map(jnp.asarray, head.params)}
  return Reranker(pretrained.config, params, pretrained.tokenizer,
                  _task(cfg, pretrained.tokenizer))


def export(directory: str, reranker: Reranker) -> str:
  """A folder `sentence_transformers.CrossEncoder(directory)` loads and scores as
  `reranker.predict`: the family's *ForSequenceClassification (config.json with
  num_labels, model.safetensors, the tokenizer with model_max_length = the reranker's
  max_seq_length) and `rerank.exported_files`. Returns the class name."""
  from bertjax.hf import convert, files  # pylint: disable=g-import-not-at-top
  config = reranker.config
  convert.check_exportable("classification", config.family)
  table = convert.family_table(config.family)
  kind = files.save_hf_tokenizer(directory, reranker.tokenizer, reranker.max_seq_length,
                                 table.TOKENIZER_JSON)
  n = reranker.task.cfg.num_labels
  standin = types.SimpleNamespace(
      task=types.SimpleNamespace(name="classification", regression=n == 1,
                                 labels=[f"LABEL_{i}" for i in range(n)]),
      params=jax.device_get(reranker.params), model=config, tokenizer=reranker.tokenizer)
  hf_config, state = table.export_finetuned(standin, kind)
  files.write(directory, hf_config, state)
  rerank.exported_files(directory, reranker.task.cfg)
  return hf_config["architectures"][0]


def write_scores(rows: Sequence[dict], path: str) -> None:
  """JSON lines, one object a pair."""
  with open(path, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
