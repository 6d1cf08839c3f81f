"""The 'bert' family's Hugging Face table: BERT / RoBERTa / XLM-R checkpoints <->
bertjax parameters (`load`, `export`); fine-tuned models out as Hugging Face's
*ForSequenceClassification / ForTokenClassification / ForQuestionAnswering /
ForMultipleChoice (`export_finetuned`). `bertjax.hf.convert` reads and writes the
directories.

One table, `param_table(config, ...)`, lists every parameter as an `Entry` (bertjax
path, Hugging Face key, kind) of the engine `bertjax.hf.table`, which moves the arrays
both ways (the kinds: query/key/value kernels [E, N, D] with biases [N, D], the
attention output [N, D, E], dense kernels transposed).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bertjax.errors import CheckpointError
from bertjax.hf import table as engine
from bertjax.hf.table import Entry
from bertjax.model.bert import ModelConfig

FAMILY = "bert"  # bertjax.model.FAMILIES
MODEL_TYPES = ("bert", "roberta", "xlm-roberta")  # config.json model_type
TOKENIZER_JSON = False  # vocab.txt, vocab.json + merges.txt or a SentencePiece model serve
_WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"


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


# bertjax field -> config.json key, both ways (absent keys: transformers' BertConfig
# defaults, which are ModelConfig's).
KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
        "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
        "intermediate_size": "intermediate_size",
        "max_position_embeddings": "max_position_embeddings",
        "type_vocab_size": "type_vocab_size", "layer_norm_eps": "layer_norm_eps",
        "dropout_rate": "hidden_dropout_prob",
        "attention_dropout_rate": "attention_probs_dropout_prob",
        "initializer_range": "initializer_range"}


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
  return ModelConfig(**engine.read_fields(hf_config, KEYS, ModelConfig), pad_token_id=pad,
                     position_offset=0 if model_type == "bert" else pad + 1,
                     pooler=pooler, nsp=nsp)


def encoder_prefix(state_dict: dict) -> str:
  """'bert.', 'roberta.' or '' (a bare BertModel): what precedes the encoder keys."""
  return engine.encoder_prefix(state_dict, _WORD_EMBEDDINGS, "BERT-family")


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


def lookup(state_dict: dict, key: str) -> np.ndarray:
  """`key`, or its name in older checkpoints (LayerNorm gamma / beta, RoBERTa's
  decoder bias)."""
  if key in state_dict:
    return state_dict[key]
  legacy = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
      "LayerNorm.bias", "LayerNorm.beta")
  if legacy in state_dict:
    return state_dict[legacy]
  if key.endswith("lm_head.bias") and "lm_head.decoder.bias" in state_dict:
    return state_dict["lm_head.decoder.bias"]
  return engine.exact_key(state_dict, key)


def params_from_hf(state_dict: dict[str, np.ndarray], config: ModelConfig) -> dict:
  """bertjax params (nested dict of float32 numpy arrays) of a Hugging Face state dict.

  The tree is the pretraining model's: 'encoder' (with 'pooler' when `config.pooler`),
  'mlm' when the checkpoint has an MLM head, 'nsp' when `config.nsp`.
  """
  prefix = encoder_prefix(state_dict)
  engine.check_tied(state_dict, ("cls.predictions.decoder.weight", "lm_head.decoder.weight"),
                    prefix + _WORD_EMBEDDINGS)
  return engine.read(state_dict, param_table(config, prefix, mlm_style(state_dict)), config,
                     lookup)


# ---- Export: bertjax -> Hugging Face ----------------------------------------------

def hf_config(config: ModelConfig, model_type: str, has_mlm: bool) -> dict[str, Any]:
  """config.json of the Hugging Face model holding `config`'s encoder and heads."""
  stem = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta"}[model_type]
  arch = ("BertForPreTraining" if model_type == "bert" and config.nsp and has_mlm
          else f"{stem}ForMaskedLM" if has_mlm else f"{stem}Model")
  return {"architectures": [arch], "model_type": model_type, "hidden_act": "gelu",
          **engine.write_fields(config, KEYS), "pad_token_id": config.pad_token_id,
          "position_embedding_type": "absolute", "tie_word_embeddings": True}


def params_to_hf(params: dict, config: ModelConfig, model_type: str) -> dict[str, np.ndarray]:
  """A Hugging Face state dict (float32 numpy) of bertjax `params` (unscanned): the
  encoder under 'bert.' / 'roberta.', the MLM head as `cls.predictions` (BERT) or
  `lm_head` (RoBERTa / XLM-R) when present, NSP as `cls.seq_relationship`."""
  params = engine.unscanned(params, config)
  prefix = "bert." if model_type == "bert" else "roberta."
  mlm = ("cls" if model_type == "bert" else "lm_head") if "mlm" in params else None
  config = config if "nsp" in params else dataclasses.replace(config, nsp=False)
  if "pooler" not in params["encoder"]:
    config = dataclasses.replace(config, pooler=False, nsp=False)
  return engine.write(params, param_table(config, prefix, mlm))


def _model_type(config: ModelConfig, tokenizer_kind: str) -> str:
  return ("bert" if config.position_offset == 0 else
          "xlm-roberta" if tokenizer_kind == "sentencepiece" else "roberta")


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
  return _dense(("head", "qa"), "qa_outputs"), False


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


def load(hf_cfg: dict[str, Any], state_dict: dict[str, np.ndarray]
         ) -> tuple[ModelConfig, dict, None]:
  """(ModelConfig, params, None) of a Hugging Face config.json and its weights (a task
  head the checkpoint may have is not read: the encoder, pooler, MLM and NSP heads
  are)."""
  check_supported(hf_cfg)
  config = model_config_from_hf(hf_cfg, state_dict)
  return config, params_from_hf(state_dict, config), None


def export_pretrained(params: dict, config: ModelConfig, tokenizer, tokenizer_kind: str
                      ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json, state dict) of the Hugging Face model holding `params`: BERT when
  positions start at 0, else XLM-R with a SentencePiece tokenizer, else RoBERTa."""
  del tokenizer
  model_type = _model_type(config, tokenizer_kind)
  return (hf_config(config, model_type, "mlm" in params),
          params_to_hf(params, config, model_type))


def export_finetuned(finetuned, tokenizer_kind: str
                     ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json, state dict) of the Hugging Face *For<Task> model of a fine-tuned
  model (`bertjax.tasks.finetuned.load_finetuned`)."""
  task, config = finetuned.task, finetuned.model
  model_type = _model_type(config, tokenizer_kind)
  head, keep_pooler = task_head_table(task.name, model_type, config)
  encoder = dataclasses.replace(config, pooler=config.pooler and keep_pooler, nsp=False)
  table = param_table(encoder, "bert." if model_type == "bert" else "roberta.", None) + head
  return (finetuned_hf_config(config, model_type, task, task.regression),
          engine.write(engine.unscanned(finetuned.params, config), table))


def pretraining_model(config: ModelConfig) -> tuple[dict[str, Any], ModelConfig]:
  """The Hugging Face model that pretrains `config` as bertjax does (`benchmark train
  --compare=hf`): its config.json (the class is `architectures[0]`: BertForPreTraining
  with NSP, else BertForMaskedLM; RobertaForMaskedLM when positions start past the
  padding id, RoBERTa / XLM-R) and `config` with the heads that class computes (pooler
  and NSP only in BertForPreTraining; the MLM logits at every position)."""
  model_type = "bert" if config.position_offset == 0 else "roberta"
  nsp = model_type == "bert" and config.nsp
  return (hf_config(config, model_type, has_mlm=True),
          dataclasses.replace(config, pooler=nsp, nsp=nsp))
