"""Hugging Face BERT / RoBERTa / XLM-R checkpoints <-> bertjax parameters; fine-tuned
models out as Hugging Face's *ForSequenceClassification / ForTokenClassification /
ForQuestionAnswering / ForMultipleChoice.

One table, `param_table(config, ...)`, lists every parameter as (bertjax path, Hugging
Face key, kind); `kind` names the layout change between the two (`_to_bertjax` applies
it, and an exporter applies its inverse). Hugging Face stores dense weights as
[out, in]; bertjax stores kernels as [in, out], with attention kernels split per head:
query/key/value [E, N, D] (bias [N, D]) and the attention output [N, D, E].
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, NamedTuple

import numpy as np

from bertjax.errors import CheckpointError
from bertjax.model.config import ModelConfig

MODEL_TYPES = ("bert", "roberta", "xlm-roberta")
_WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"


class Entry(NamedTuple):
  path: tuple[str, ...]  # into the bertjax params tree
  key: str  # Hugging Face state-dict key, without the encoder prefix for encoder entries
  kind: str  # 'copy' | 'dense' (transpose) | 'qkv' | 'qkv_bias' | 'attn_out'


def check_supported(hf_config: dict[str, Any]) -> None:
  """Raises CheckpointError unless bertjax can represent the Hugging Face model."""
  model_type = hf_config.get("model_type")
  if model_type not in MODEL_TYPES:
    raise CheckpointError(f"config.json model_type={model_type!r} is not supported; "
                          f"bertjax converts {list(MODEL_TYPES)}.")
  if hf_config.get("hidden_act", "gelu") != "gelu":
    raise CheckpointError(f"hidden_act={hf_config['hidden_act']!r} is not supported "
                          "(bertjax uses the exact GELU, 'gelu').")
  if hf_config.get("position_embedding_type", "absolute") != "absolute":
    raise CheckpointError("only absolute position embeddings are supported, got "
                          f"{hf_config['position_embedding_type']!r}.")


def model_config_from_hf(hf_config: dict[str, Any], state_dict: dict | None = None
                         ) -> ModelConfig:
  """ModelConfig of a Hugging Face config.json (a dict). With the checkpoint's
  `state_dict`, pooler and NSP follow what it holds; without, BERT has both."""
  check_supported(hf_config)
  model_type = hf_config["model_type"]
  pad = hf_config.get("pad_token_id", 0 if model_type == "bert" else 1)
  if state_dict is None:
    pooler = nsp = model_type == "bert"
  else:
    prefix = encoder_prefix(state_dict)
    pooler = f"{prefix}pooler.dense.weight" in state_dict
    nsp = "cls.seq_relationship.weight" in state_dict
  return ModelConfig(
      vocab_size=hf_config["vocab_size"],
      hidden_size=hf_config["hidden_size"],
      num_layers=hf_config["num_hidden_layers"],
      num_heads=hf_config["num_attention_heads"],
      intermediate_size=hf_config["intermediate_size"],
      max_position_embeddings=hf_config["max_position_embeddings"],
      type_vocab_size=hf_config.get("type_vocab_size", 2),
      pad_token_id=pad,
      position_offset=0 if model_type == "bert" else pad + 1,
      layer_norm_eps=hf_config.get("layer_norm_eps", 1e-12),
      dropout_rate=hf_config.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=hf_config.get("attention_probs_dropout_prob", 0.1),
      initializer_range=hf_config.get("initializer_range", 0.02),
      pooler=pooler, nsp=nsp)


def encoder_prefix(state_dict: dict) -> str:
  """'bert.', 'roberta.' or '' (a bare BertModel): what precedes the encoder keys."""
  for key in state_dict:
    if key.endswith(_WORD_EMBEDDINGS):
      return key[:-len(_WORD_EMBEDDINGS)]
  raise CheckpointError(f"the checkpoint has no '*{_WORD_EMBEDDINGS}': not a BERT-family "
                        "encoder.")


def mlm_style(state_dict: dict) -> str | None:
  """'cls' (BERT's cls.predictions.*), 'lm_head' (RoBERTa's) or None (no MLM head)."""
  if "cls.predictions.transform.dense.weight" in state_dict:
    return "cls"
  if "lm_head.dense.weight" in state_dict:
    return "lm_head"
  return None


def _layer_norm(path, key):
  return [Entry(path + ("scale",), f"{key}.weight", "copy"),
          Entry(path + ("bias",), f"{key}.bias", "copy")]


def _dense(path, key, kind="dense", bias_kind="copy"):
  return [Entry(path + ("kernel",), f"{key}.weight", kind),
          Entry(path + ("bias",), f"{key}.bias", bias_kind)]


def param_table(config: ModelConfig, prefix: str, mlm: str | None) -> list[Entry]:
  """Every bertjax parameter of `config` with its Hugging Face key (`prefix` before the
  encoder's keys; `mlm` the head style of `mlm_style`, None for no MLM head)."""
  emb = ("encoder", "embeddings")
  p = prefix
  table = [Entry(emb + ("word_embeddings", "embedding"), f"{p}{_WORD_EMBEDDINGS}", "copy"),
           Entry(emb + ("position_embeddings", "embedding"),
                 f"{p}embeddings.position_embeddings.weight", "copy")]
  if config.type_vocab_size > 0:
    table.append(Entry(emb + ("token_type_embeddings", "embedding"),
                       f"{p}embeddings.token_type_embeddings.weight", "copy"))
  table += _layer_norm(emb + ("LayerNorm",), f"{p}embeddings.LayerNorm")
  for i in range(config.num_layers):
    ours, hf = ("encoder", f"layer_{i}"), f"{p}encoder.layer.{i}"
    for name in ("query", "key", "value"):
      table += _dense(ours + ("attention", name), f"{hf}.attention.self.{name}", "qkv",
                      "qkv_bias")
    table += _dense(ours + ("attention", "output"), f"{hf}.attention.output.dense",
                    "attn_out")
    table += _layer_norm(ours + ("attention_norm",), f"{hf}.attention.output.LayerNorm")
    table += _dense(ours + ("intermediate",), f"{hf}.intermediate.dense")
    table += _dense(ours + ("output",), f"{hf}.output.dense")
    table += _layer_norm(ours + ("output_norm",), f"{hf}.output.LayerNorm")
  if config.pooler:
    table += _dense(("encoder", "pooler"), f"{p}pooler.dense")
  if mlm == "cls":
    table += _dense(("mlm", "transform"), "cls.predictions.transform.dense")
    table += _layer_norm(("mlm", "transform_norm"), "cls.predictions.transform.LayerNorm")
    table.append(Entry(("mlm", "bias"), "cls.predictions.bias", "copy"))
  elif mlm == "lm_head":
    table += _dense(("mlm", "transform"), "lm_head.dense")
    table += _layer_norm(("mlm", "transform_norm"), "lm_head.layer_norm")
    table.append(Entry(("mlm", "bias"), "lm_head.bias", "copy"))
  if config.nsp:
    table += _dense(("nsp",), "cls.seq_relationship")
  return table


def _to_bertjax(kind: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
  n, d = config.num_heads, config.head_dim
  if kind == "copy":
    return w
  if kind == "dense":  # [out, in] -> [in, out]
    return w.T
  if kind == "qkv":  # [N*D, E] -> [E, N, D]
    return w.T.reshape(w.shape[1], n, d)
  if kind == "qkv_bias":  # [N*D] -> [N, D]
    return w.reshape(n, d)
  if kind == "attn_out":  # [E, N*D] -> [N, D, E]
    return w.T.reshape(n, d, w.shape[0])
  raise ValueError(f"unknown parameter kind {kind!r}")


def _lookup(state_dict: dict, key: str) -> np.ndarray:
  if key in state_dict:
    return state_dict[key]
  legacy = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
      "LayerNorm.bias", "LayerNorm.beta")
  if legacy in state_dict:
    return state_dict[legacy]
  if key.endswith("lm_head.bias") and "lm_head.decoder.bias" in state_dict:
    return state_dict["lm_head.decoder.bias"]
  raise CheckpointError(f"the checkpoint lacks {key!r}; it does not match its config.json.")


def _check_tied_decoder(state_dict: dict, prefix: str) -> None:
  """The MLM decoder is tied to the word embeddings; a checkpoint whose decoder differs
  cannot be represented."""
  for key in ("cls.predictions.decoder.weight", "lm_head.decoder.weight"):
    if key in state_dict and not np.array_equal(state_dict[key],
                                                state_dict[prefix + _WORD_EMBEDDINGS]):
      raise CheckpointError(f"{key} differs from the word embeddings; bertjax ties them.")


def params_from_hf(state_dict: dict[str, np.ndarray], config: ModelConfig) -> dict:
  """bertjax params (nested dict of float32 numpy arrays) of a Hugging Face state dict.

  The tree is BertForPreTraining's: 'encoder' (with 'pooler' when `config.pooler`),
  'mlm' when the checkpoint has an MLM head, 'nsp' when `config.nsp`.
  """
  prefix = encoder_prefix(state_dict)
  _check_tied_decoder(state_dict, prefix)
  params: dict = {}
  for entry in param_table(config, prefix, mlm_style(state_dict)):
    w = np.asarray(_lookup(state_dict, entry.key), dtype=np.float32)
    node = params
    for name in entry.path[:-1]:
      node = node.setdefault(name, {})
    node[entry.path[-1]] = _to_bertjax(entry.kind, w, config)
  _check_shapes(params, config)
  return params


def _check_shapes(params: dict, config: ModelConfig) -> None:
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top

  model = BertForPreTraining(config)
  expected = jax.eval_shape(lambda: nn.unbox(model.init(
      jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"]))
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    want = expected
    for k in path:
      want = want[k.key]
    if tuple(leaf.shape) != tuple(want.shape):
      name = "/".join(k.key for k in path)
      raise CheckpointError(f"parameter {name} has shape {leaf.shape}, the config implies "
                            f"{want.shape}.")


def read_state_dict(directory: str) -> dict[str, np.ndarray]:
  """Weights of a Hugging Face model dir: model.safetensors (or its shards), else
  pytorch_model.bin (read with torch, imported only then)."""
  join = lambda name: os.path.join(directory, name)
  if os.path.isfile(join("model.safetensors")):
    shards = ["model.safetensors"]
  elif os.path.isfile(join("model.safetensors.index.json")):
    with open(join("model.safetensors.index.json")) as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
  elif os.path.isfile(join("pytorch_model.bin")):
    import torch  # pylint: disable=g-import-not-at-top
    state = torch.load(join("pytorch_model.bin"), map_location="cpu", weights_only=True)
    return {k: v.float().numpy() if v.is_floating_point() else v.numpy()
            for k, v in state.items()}
  else:
    raise CheckpointError(f"{directory} has no model.safetensors or pytorch_model.bin.")
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  state = {}
  for shard in shards:
    state.update(load_file(join(shard)))
  return state


def load_hf(directory: str) -> tuple[ModelConfig, dict]:
  """(ModelConfig, params) of a Hugging Face model dir (config.json + weights)."""
  with open(os.path.join(directory, "config.json")) as f:
    hf_config = json.load(f)
  check_supported(hf_config)
  state_dict = read_state_dict(directory)
  config = model_config_from_hf(hf_config, state_dict)
  return config, params_from_hf(state_dict, config)



# ---- Export: bertjax -> Hugging Face ----------------------------------------------

def _to_hf(kind: str, w: np.ndarray) -> np.ndarray:
  """The inverse of `_to_bertjax`."""
  if kind == "copy":
    return w
  if kind == "dense":  # [in, out] -> [out, in]
    return w.T
  if kind == "qkv":  # [E, N, D] -> [N*D, E]
    return w.reshape(w.shape[0], -1).T
  if kind == "qkv_bias":  # [N, D] -> [N*D]
    return w.reshape(-1)
  if kind == "attn_out":  # [N, D, E] -> [E, N*D]
    return w.reshape(-1, w.shape[-1]).T
  raise ValueError(f"unknown parameter kind {kind!r}")


def _json(path: str) -> Any:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _save_byte_level_bpe(directory: str, state: dict) -> None:
  """RoBERTa's files of a byte-level BPE tokenizer.json `state`: vocab.json (the model's
  vocabulary and the added tokens, <mask> included) and merges.txt."""
  vocab = dict(state["model"]["vocab"])
  vocab.update({t["content"]: t["id"] for t in state.get("added_tokens", [])})
  with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
    json.dump(vocab, f, ensure_ascii=False)
  merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
  with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as f:
    f.write("#version: 0.2\n" + "".join(m + "\n" for m in merges))


def save_hf_tokenizer(directory: str, tokenizer) -> str:
  """Writes the tokenizer as Hugging Face reads it: a WordPiece vocabulary as vocab.txt
  (+ do_lower_case), a SentencePiece model as sentencepiece.bpe.model (XLM-R), a
  byte-level BPE as vocab.json + merges.txt (RoBERTa), any other `tokenizers` model as
  tokenizer.json. Returns 'wordpiece', 'sentencepiece', 'byte_level_bpe' or 'json'."""
  from bertjax.data.tokenizer import SENTENCEPIECE_FILE  # pylint: disable=g-import-not-at-top
  tokenizer.save(directory)
  json_path = os.path.join(directory, "tokenizer.json")
  state = None if os.path.isfile(os.path.join(directory, SENTENCEPIECE_FILE)) else _json(
      json_path)
  if state is None:
    kind, settings = "sentencepiece", {"tokenizer_class": "XLMRobertaTokenizer"}
  elif (tokenizer.style == "roberta" and state["model"]["type"] == "BPE"
        and (state.get("pre_tokenizer") or {}).get("type") == "ByteLevel"
        and not state.get("normalizer")):
    # vocab.json + merges.txt rebuild RoBERTa's whole pipeline (<s> a </s></s> b </s>).
    os.remove(json_path)
    _save_byte_level_bpe(directory, state)
    # RoBERTa's <mask> swallows the space before it (lstrip), as bertjax's does.
    kind, settings = "byte_level_bpe", {"tokenizer_class": "RobertaTokenizer", "mask_token": {
        "__type": "AddedToken", "content": tokenizer.id_to_token(tokenizer.mask_id),
        "lstrip": True, "rstrip": False, "normalized": False, "single_word": False,
        "special": True}}
  elif tokenizer.style == "bert" and state["model"]["type"] == "WordPiece":
    # vocab.txt + do_lower_case rebuild BERT's full pipeline (with [CLS]/[SEP]) on
    # both sides; the bare tokenizer.json would lack the post-processor.
    os.remove(json_path)
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
      f.write("".join(tokenizer.id_to_token(i) + "\n" for i in range(tokenizer.vocab_size)))
    lower = tokenizer.tokenize("Hello World") == tokenizer.tokenize("hello world")
    kind, settings = "wordpiece", {"tokenizer_class": "BertTokenizer", "do_lower_case": lower}
  else:
    kind, settings = "json", {}
  pad, mask = tokenizer.id_to_token(tokenizer.pad_id), tokenizer.id_to_token(tokenizer.mask_id)
  settings.setdefault("mask_token", mask)
  settings.update(pad_token=pad, model_max_length=512)
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(settings, f, indent=2)
  return kind


def hf_config(config: ModelConfig, model_type: str, has_mlm: bool) -> dict[str, Any]:
  """config.json of the Hugging Face model holding `config`'s encoder and heads."""
  stem = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta"}[model_type]
  arch = ("BertForPreTraining" if model_type == "bert" and config.nsp and has_mlm
          else f"{stem}ForMaskedLM" if has_mlm else f"{stem}Model")
  return {"architectures": [arch], "model_type": model_type,
          "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
          "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
          "intermediate_size": config.intermediate_size, "hidden_act": "gelu",
          "max_position_embeddings": config.max_position_embeddings,
          "type_vocab_size": config.type_vocab_size, "pad_token_id": config.pad_token_id,
          "layer_norm_eps": config.layer_norm_eps,
          "hidden_dropout_prob": config.dropout_rate,
          "attention_probs_dropout_prob": config.attention_dropout_rate,
          "initializer_range": config.initializer_range,
          "position_embedding_type": "absolute", "tie_word_embeddings": True}


def params_to_hf(params: dict, config: ModelConfig, model_type: str) -> dict[str, np.ndarray]:
  """A Hugging Face state dict (float32 numpy) of bertjax `params` (unscanned): the
  encoder under 'bert.' / 'roberta.', the MLM head as `cls.predictions` (BERT) or
  `lm_head` (RoBERTa / XLM-R) when present, NSP as `cls.seq_relationship`."""
  from bertjax.model import layout  # pylint: disable=g-import-not-at-top
  params = layout.to_layout(params, False)
  prefix = "bert." if model_type == "bert" else "roberta."
  mlm = ("cls" if model_type == "bert" else "lm_head") if "mlm" in params else None
  config = config if "nsp" in params else dataclasses.replace(config, nsp=False)
  if "pooler" not in params["encoder"]:
    config = dataclasses.replace(config, pooler=False, nsp=False)
  state = {}
  for entry in param_table(config, prefix, mlm):
    node = params
    for name in entry.path:
      node = node[name]
    state[entry.key] = np.ascontiguousarray(_to_hf(entry.kind, np.asarray(node, np.float32)))
  return state


def _model_type(config: ModelConfig, tokenizer_kind: str) -> str:
  return ("bert" if config.position_offset == 0 else
          "xlm-roberta" if tokenizer_kind == "sentencepiece" else "roberta")


def save_hf(directory: str, params: dict, config: ModelConfig, tokenizer) -> str:
  """Writes config.json, model.safetensors and the tokenizer files of a Hugging Face
  model dir that `transformers.AutoModel*.from_pretrained` loads. Returns the type."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  os.makedirs(directory, exist_ok=True)
  model_type = _model_type(config, save_hf_tokenizer(directory, tokenizer))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config(config, model_type, "mlm" in params), f, indent=2)
  save_file(params_to_hf(params, config, model_type),
            os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  return model_type


# ---- Export of fine-tuned models: a task head -> *For<Task> -------------------------

# bertjax task -> the Hugging Face class suffix of its head.
TASK_CLASSES = {"classification": "ForSequenceClassification",
                "tagging": "ForTokenClassification", "squad": "ForQuestionAnswering",
                "multiple_choice": "ForMultipleChoice"}


def task_head_table(task: str, model_type: str, config: ModelConfig
                    ) -> tuple[list[Entry], bool]:
  """The head's entries (bertjax path under 'encoder' / 'head', Hugging Face key) of a
  fine-tuned `task` model, and whether the encoder keeps its pooler in the export.

  The dense + tanh on [CLS] is the encoder's pooler, or the head's own 'pooler' when
  the encoder has none; Hugging Face holds it as the model's pooler (BERT's sequence
  classification, multiple choice) or as RoBERTa's `classifier.dense`."""
  p = "bert." if model_type == "bert" else "roberta."
  pooler = ("encoder", "pooler") if config.pooler else ("head", "pooler")
  if task == "classification" and model_type != "bert":  # RobertaClassificationHead
    return (_dense(pooler, "classifier.dense")
            + _dense(("head", "classifier"), "classifier.out_proj"), False)
  if task in ("classification", "multiple_choice"):
    name = "classifier" if task == "classification" else "scorer"
    table = [] if config.pooler else _dense(pooler, f"{p}pooler.dense")
    return table + _dense(("head", name), "classifier"), True
  if task == "tagging":
    return _dense(("head", "tagger"), "classifier"), False
  check_exportable(task)
  return _dense(("head", "qa"), "qa_outputs"), False


def check_exportable(task: str) -> None:
  """CheckpointError unless a fine-tuned `task` model has a Hugging Face class."""
  if task not in TASK_CLASSES:
    raise CheckpointError(
        f"a {task!r} model has no Hugging Face class" + (
            " (span-based NER classifies spans; transformers has no such head): use "
            "python -m bertjax.predict on it" if task == "span_ner" else "") + ".")


def finetuned_hf_config(config: ModelConfig, model_type: str, task, regression: bool
                        ) -> dict[str, Any]:
  """config.json of the Hugging Face *For<Task> model of a fine-tuned `task` (its
  name and labels): the class, and the labels (id2label / label2id; one output and
  problem_type 'regression' for regression)."""
  stem = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta"}[model_type]
  out = dict(hf_config(config, model_type, False),
             architectures=[stem + TASK_CLASSES[task.name]])
  if regression:
    out.update(num_labels=1, problem_type="regression")
  elif task.labels:
    out.update(id2label={str(i): l for i, l in enumerate(task.labels)},
               label2id={l: i for i, l in enumerate(task.labels)})
    if task.name == "classification":
      out["problem_type"] = "single_label_classification"
  return out


def save_hf_finetuned(directory: str, finetuned) -> str:
  """Writes the Hugging Face *For<Task> dir (config.json with the labels,
  model.safetensors, tokenizer files) of a fine-tuned model (`api.load_finetuned`).
  Returns its class name."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  from bertjax.model import layout  # pylint: disable=g-import-not-at-top

  task, config = finetuned.task, finetuned.model
  check_exportable(task.name)
  if getattr(task, "feature_based", False):
    raise CheckpointError("a feature-based tagger (config.task.features) has no Hugging "
                          "Face class: use python -m bertjax.predict on it.")
  os.makedirs(directory, exist_ok=True)
  model_type = _model_type(config, save_hf_tokenizer(directory, finetuned.tokenizer))
  head, keep_pooler = task_head_table(task.name, model_type, config)
  params = layout.to_layout(finetuned.params, False)
  encoder = dataclasses.replace(config, pooler=config.pooler and keep_pooler, nsp=False)
  state = {}
  for entry in param_table(encoder, "bert." if model_type == "bert" else "roberta.",
                           None) + head:
    node = params
    for name in entry.path:
      node = node[name]
    state[entry.key] = np.ascontiguousarray(_to_hf(entry.kind, np.asarray(node, np.float32)))
  hf = finetuned_hf_config(config, model_type, task, getattr(task, "regression", False))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
  save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  return hf["architectures"][0]
