"""Hugging Face ModernBERT checkpoints <-> bertjax `ModernBertConfig` and parameters.

Covers `ModernBertModel`, `ModernBertForMaskedLM` and the fine-tuned
`ModernBertForSequenceClassification / ForTokenClassification / ForQuestionAnswering /
ForMultipleChoice`, and the config.json variants of the checkpoints that share the
architecture (ModernBERT, Ettin, mmBERT): transformers 5's `layer_types` and
`rope_parameters` ({'full_attention': {'rope_theta': ..}, 'sliding_attention': ..}),
and the 4.x keys `global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`,
`local_attention` (or `sliding_window`, its half, which wins as in transformers).

One table, `param_table`, lists every parameter as an `Entry` (bertjax path, Hugging
Face key, kind) of the engine `bertjax.hf.table`, which moves the arrays both ways:
Wqkv [3*N*D, E] is 'wqkv' ([E, 3, N, D], rows ordered q|k|v, head, dim), the attention
Wo 'attn_out' ([N, D, E]), GeGLU's Wi 'wi' ([E, 2, M]: the input half, then the gate).

Task heads (bertjax paths the lead's task modules must use; Hugging Face keys):

  head/transform/dense/{kernel[E, E], bias}  head.dense      (bias iff classifier_bias)
  head/transform/norm/{scale, bias}          head.norm       (bias iff norm_bias)
  head/classifier/{kernel[E, K], bias[K]}    classifier      ForSequenceClassification
  head/tagger/{kernel[E, K], bias[K]}        classifier      ForTokenClassification
  head/qa/{kernel[E, 2], bias[2]}            classifier      ForQuestionAnswering
  head/scorer/{kernel[E, 1], bias[1]}        classifier      ForMultipleChoice

(`bertjax.model.modernbert.task_features` builds head/transform, `classifier` the
output layer.) The MLM decoder is tied to the token embedding: its weight is not a
bertjax parameter and is written as a copy of the embedding.
"""

from __future__ import annotations

from typing import Any, Sequence

from absl import logging
import numpy as np

from bertjax.errors import CheckpointError
from bertjax.hf import table as engine
from bertjax.hf.table import Entry
from bertjax.model.modernbert import ACTIVATIONS, ModernBertConfig

FAMILY = "modernbert"  # bertjax.model.FAMILIES
MODEL_TYPE = "modernbert"
MODEL_TYPES = (MODEL_TYPE,)  # config.json model_type
# transformers 5's AutoTokenizer gives model_type 'modernbert' its TokenizersBackend,
# whatever tokenizer_class says: the tokenizer is written as tokenizer.json.
TOKENIZER_JSON = True
_EMBEDDINGS = "embeddings.tok_embeddings.weight"
# bertjax task -> (Hugging Face class, bertjax head name).
TASK_CLASSES = {
    "classification": ("ModernBertForSequenceClassification", "classifier"),
    "tagging": ("ModernBertForTokenClassification", "tagger"),
    "squad": ("ModernBertForQuestionAnswering", "qa"),
    "multiple_choice": ("ModernBertForMultipleChoice", "scorer"),
}


# ---- config.json <-> ModernBertConfig ---------------------------------------------

def _every_n(hf: dict, num_layers: int) -> int:
  """global_attn_every_n_layers of `layer_types` (or the legacy key, default 3)."""
  n = hf.get("global_attn_every_n_layers") or 3
  types = hf.get("layer_types")
  if types is None:
    return n
  pattern = lambda n: ["sliding_attention" if i % n else "full_attention"
                       for i in range(num_layers)]
  if list(types) == pattern(n):
    return n
  globals_ = [i for i, t in enumerate(types) if t == "full_attention"]
  n = globals_[1] if len(globals_) > 1 else max(num_layers, 1)
  if list(types) != pattern(n):
    raise CheckpointError(f"config.json layer_types={list(types)} is not a global layer "
                          "every n layers from layer 0; bertjax supports that pattern only.")
  return n


def _thetas(hf: dict) -> tuple[float, float]:
  """(global, local) rotary thetas: `rope_parameters` per layer type, else the legacy
  `global_rope_theta` / `local_rope_theta`, else transformers' defaults."""
  if hf.get("rope_scaling"):
    raise CheckpointError(f"config.json rope_scaling={hf['rope_scaling']} is not "
                          "supported; bertjax's rotary positions are the default type.")
  rope = hf.get("rope_parameters") or {}
  if "rope_theta" in rope:  # One set of parameters for both layer types.
    rope = {"full_attention": rope, "sliding_attention": rope}
  out = []
  for kind, legacy, default in (("full_attention", "global_rope_theta", 160_000.0),
                                ("sliding_attention", "local_rope_theta", 10_000.0)):
    params = rope.get(kind) or {}
    if params.get("rope_type", "default") != "default":
      raise CheckpointError(f"config.json rope_parameters[{kind!r}] rope_type="
                            f"{params['rope_type']!r} is not supported; only 'default'.")
    out.append(float(params.get("rope_theta", hf.get(legacy, default))))
  return out[0], out[1]


# bertjax field -> config.json key, both ways (absent keys: transformers'
# ModernBertConfig defaults, which are ModernBertConfig's).
KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
        "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
        "intermediate_size": "intermediate_size",
        "max_position_embeddings": "max_position_embeddings",
        "pad_token_id": "pad_token_id", "norm_eps": "norm_eps", "norm_bias": "norm_bias",
        "attention_bias": "attention_bias", "mlp_bias": "mlp_bias",
        "classifier_bias": "classifier_bias", "decoder_bias": "decoder_bias",
        "embedding_dropout": "embedding_dropout", "attention_dropout": "attention_dropout",
        "mlp_dropout": "mlp_dropout", "classifier_dropout": "classifier_dropout",
        "hidden_activation": "hidden_activation",
        "classifier_activation": "classifier_activation",
        "classifier_pooling": "classifier_pooling", "initializer_range": "initializer_range"}


def model_config_from_hf(hf: dict[str, Any], **overrides) -> ModernBertConfig:
  """ModernBertConfig of a Hugging Face config.json (a dict); `overrides` set bertjax's
  own fields (attention_impl, scan_layers, remat_policy, dtype, param_dtype)."""
  if hf.get("model_type") != MODEL_TYPE:
    raise CheckpointError(f"config.json model_type={hf.get('model_type')!r} is not "
                          "'modernbert'; convert it with the BERT family's converter.")
  for key in ("hidden_activation", "classifier_activation"):
    if hf.get(key, "gelu") not in ACTIVATIONS:
      raise CheckpointError(f"config.json {key}={hf[key]!r} is not supported; bertjax "
                            f"has {sorted(ACTIVATIONS)}.")
  num_layers = hf.get("num_hidden_layers", ModernBertConfig.num_layers)
  window = (2 * hf["sliding_window"] if hf.get("sliding_window") is not None
            else hf.get("local_attention", ModernBertConfig.local_attention))
  global_theta, local_theta = _thetas(hf)
  fields = dict(
      engine.read_fields(hf, KEYS, ModernBertConfig),
      global_attn_every_n_layers=_every_n(hf, num_layers), local_attention=window,
      global_rope_theta=global_theta, local_rope_theta=local_theta,
      # transformers cuts at 3 std when the key is null, at its default 2 when absent.
      initializer_cutoff_factor=hf.get("initializer_cutoff_factor", 2.0) or 3.0)
  return ModernBertConfig(**{**fields, **overrides})


def hf_config(config: ModernBertConfig, architecture: str = "ModernBertForMaskedLM",
              extra: dict | None = None) -> dict[str, Any]:
  """config.json of the Hugging Face model holding `config`: transformers 5's keys
  (layer_types, rope_parameters) and the 4.x ones (global_attn_every_n_layers,
  global/local_rope_theta), which both versions read. `extra` adds keys (token ids,
  id2label / label2id); bos/eos/cls/sep ids are null unless given. Training-only
  fields Hugging Face lacks are left out: `attention_output_dropout` (with a warning
  when set) and `global_rope_theta_phases` (the model holds its final theta)."""
  if config.attention_output_dropout:
    logging.warning(
        "config.model.attention_output_dropout=%s has no Hugging Face field: config.json "
        "leaves it out (dropout only trains; the released ModernBERT checkpoints have "
        "attention_dropout 0).", config.attention_output_dropout)
  rope = lambda theta: {"rope_type": "default", "rope_theta": theta}
  out = {
      "architectures": [architecture], "model_type": MODEL_TYPE,
      **engine.write_fields(config, KEYS),
      "initializer_cutoff_factor": config.initializer_cutoff_factor,
      "bos_token_id": None, "eos_token_id": None, "cls_token_id": None,
      "sep_token_id": None,
      "layer_types": list(config.layer_types),
      "rope_parameters": {"full_attention": rope(config.global_rope_theta),
                          "sliding_attention": rope(config.local_rope_theta)},
      "global_attn_every_n_layers": config.global_attn_every_n_layers,
      "global_rope_theta": config.global_rope_theta,
      "local_rope_theta": config.local_rope_theta,
      "local_attention": config.local_attention,
      "tie_word_embeddings": True,
  }
  out.update(extra or {})
  return out


# ---- The parameter table ----------------------------------------------------------

def _norm(config, path, key):
  table = [Entry(path + ("scale",), f"{key}.weight", "copy")]
  if config.norm_bias:
    table.append(Entry(path + ("bias",), f"{key}.bias", "copy"))
  return table


def _linear(path, key, bias: bool, kind="dense", bias_kind="copy"):
  table = [Entry(path + ("kernel",), f"{key}.weight", kind)]
  if bias:
    table.append(Entry(path + ("bias",), f"{key}.bias", bias_kind))
  return table


def _transform(config, path, key):
  """A PredictionHead: dense + act + norm."""
  return (_linear(path + ("dense",), f"{key}.dense", config.classifier_bias)
          + _norm(config, path + ("norm",), f"{key}.norm"))


def param_table(config: ModernBertConfig, prefix: str = "model.", mlm: bool = True,
                task: str | None = None) -> list[Entry]:
  """Every bertjax parameter of `config` (unscanned layout) with its Hugging Face key:
  the encoder under `prefix` ('model.' in every ModernBertFor*, '' in a bare
  ModernBertModel), the MLM head when `mlm`, the `task` head (a key of TASK_CLASSES)."""
  p, enc = prefix, ("encoder",)
  table = [Entry(enc + ("embeddings", "tok_embeddings", "embedding"), p + _EMBEDDINGS,
                 "copy")]
  table += _norm(config, enc + ("embeddings", "norm"), f"{p}embeddings.norm")
  for i in range(config.num_layers):
    ours, hf = enc + (f"layer_{i}",), f"{p}layers.{i}"
    if i > 0:
      table += _norm(config, ours + ("attn_norm",), f"{hf}.attn_norm")
    table += _linear(ours + ("attn", "Wqkv"), f"{hf}.attn.Wqkv", config.attention_bias,
                     "wqkv", "wqkv_bias")
    table += _linear(ours + ("attn", "Wo"), f"{hf}.attn.Wo", config.attention_bias,
                     "attn_out")
    table += _norm(config, ours + ("mlp_norm",), f"{hf}.mlp_norm")
    table += _linear(ours + ("mlp", "Wi"), f"{hf}.mlp.Wi", config.mlp_bias, "wi", "wi_bias")
    table += _linear(ours + ("mlp", "Wo"), f"{hf}.mlp.Wo", config.mlp_bias)
  table += _norm(config, enc + ("final_norm",), f"{p}final_norm")
  if mlm:
    table += _transform(config, ("mlm", "transform"), "head")
    if config.decoder_bias:
      table.append(Entry(("mlm", "bias"), "decoder.bias", "copy"))
  if task is not None:
    if task not in TASK_CLASSES:
      raise CheckpointError(f"a {task!r} model has no Hugging Face ModernBERT class; "
                            f"those exist for {sorted(TASK_CLASSES)}.")
    table += _transform(config, ("head", "transform"), "head")
    table += _linear(("head", TASK_CLASSES[task][1]), "classifier", True)
  return table


# ---- State dicts <-> parameters ---------------------------------------------------

def encoder_prefix(state_dict: dict) -> str:
  """'model.' (ModernBertFor*) or '' (a bare ModernBertModel)."""
  return engine.encoder_prefix(state_dict, _EMBEDDINGS, "ModernBERT")


def task_of(hf: dict[str, Any]) -> str | None:
  """The bertjax task of a config.json (`table.task_of`)."""
  return engine.task_of(hf, TASK_CLASSES)


def params_from_hf(state_dict: dict[str, np.ndarray], config: ModernBertConfig,
                   task: str | None = None) -> dict:
  """bertjax params (nested dict of float32 numpy arrays, unscanned) of a Hugging Face
  state dict: 'encoder', 'mlm' when the checkpoint has the MLM head, 'head' for a
  fine-tuned `task` model."""
  prefix = encoder_prefix(state_dict)
  if task is None and "classifier.weight" in state_dict:
    raise CheckpointError("the checkpoint has a task head (classifier.weight): name its "
                          f"task, one of {sorted(TASK_CLASSES)}.")
  mlm = task is None and "head.dense.weight" in state_dict
  engine.check_tied(state_dict, ("decoder.weight",), prefix + _EMBEDDINGS,
                    "the token embeddings")
  return engine.read(state_dict, param_table(config, prefix, mlm, task), config)


def params_to_hf(params: dict, config: ModernBertConfig, task: str | None = None
                 ) -> dict[str, np.ndarray]:
  """A Hugging Face state dict (float32 numpy, either layout in): the
  ModernBertForMaskedLM keys when `params` has 'mlm' (decoder.weight a copy of the
  embedding), a ModernBertFor<task> when `task`, else a bare ModernBertModel's."""
  return engine.params_to_hf(params, config, param_table, "model.", task, _EMBEDDINGS,
                             ("decoder.weight",))


def export(params: dict, config: ModernBertConfig, task: str | None = None,
           labels: Sequence[str] | None = None, extra: dict | None = None
           ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json, state dict) of the Hugging Face model holding `params`
  (ModernBertForMaskedLM with an 'mlm' head, ModernBertFor<task>, else
  ModernBertModel); `labels` name a classifier's outputs (default LABEL_i); `extra`
  adds config.json keys (the tokenizer's special ids)."""
  state = params_to_hf(params, config, task)
  arch = (TASK_CLASSES[task][0] if task else
          "ModernBertForMaskedLM" if "decoder.weight" in state else "ModernBertModel")
  labelled = task in ("classification", "tagging", "squad")  # the classifier's rows
  return engine.exported(hf_config, config, arch, state, labels, extra,
                         "classifier.weight" if labelled else None)


def _token_ids(tokenizer) -> dict[str, int]:
  """The special ids config.json names (ModernBERT's: bos = [CLS], eos = [SEP])."""
  return {"bos_token_id": tokenizer.cls_id, "eos_token_id": tokenizer.sep_id,
          "cls_token_id": tokenizer.cls_id, "sep_token_id": tokenizer.sep_id,
          "pad_token_id": tokenizer.pad_id}


check_supported, load = engine.readers(model_config_from_hf, task_of, params_from_hf)
export_pretrained, export_finetuned = engine.exporters(export, _token_ids)


def pretraining_model(config: ModernBertConfig) -> tuple[dict[str, Any], ModernBertConfig]:
  """The Hugging Face model that pretrains `config` as bertjax does (`benchmark train
  --compare=hf`): its config.json (the class is `architectures[0]`:
  ModernBertForMaskedLM) and `config` as that class computes it (the same heads; it
  computes the MLM logits at every position: transformers' default
  `sparse_prediction=False`)."""
  return hf_config(config), config
