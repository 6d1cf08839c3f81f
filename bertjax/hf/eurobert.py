"""Hugging Face EuroBERT checkpoints <-> bertjax `EuroBertConfig` and parameters.

Covers `EuroBertModel`, `EuroBertForMaskedLM` and the fine-tuned
`EuroBertForSequenceClassification / ForTokenClassification`, and the config.json
variants of the published checkpoints (EuroBERT-210m / 610m / 2.1B): transformers 5's
`rope_parameters` ({'rope_type', 'rope_theta', 'factor'}) and the 4.x `rope_theta` +
`rope_scaling` (the checkpoints' own, written for their remote code), `num_key_value_heads`
and `head_dim` (null: the defaults), `classifier_pooling` ('bos', 'mean', 'late'; the
remote code's `clf_pooling` key is ignored, as transformers 5 ignores it).
Refused with a one-line CheckpointError: another model_type, an activation or rotary
type bertjax does not compute.

The table (`param_table`, rows of the engine `bertjax.hf.table`): q_proj [N*D, E] is
'qkv' ([E, N, D]), k_proj / v_proj [K*D, E] 'kv' ([E, K, D]), o_proj 'attn_out'
([N, D, E]), the SwiGLU projections and lm_head 'dense'.

Task heads (bertjax paths; Hugging Face keys):

  head/dense/{kernel[E, E], bias}          dense        ForSequenceClassification
  head/classifier/{kernel[E, K], bias[K]}  classifier   ForSequenceClassification
  head/tagger/{kernel[E, K], bias[K]}      classifier   ForTokenClassification

With `tie_word_embeddings` the MLM decoder is the token embedding (lm_head.weight is
written as its copy, and a checkpoint whose lm_head differs is refused).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from bertjax.errors import CheckpointError
from bertjax.hf import table as engine
from bertjax.hf.table import Entry
from bertjax.model.eurobert import ACTIVATIONS, EuroBertConfig
from bertjax.model.rotary import ROPE_TYPES

FAMILY = "eurobert"  # bertjax.model.FAMILIES
MODEL_TYPE = "eurobert"
MODEL_TYPES = (MODEL_TYPE,)
# transformers 5's AutoTokenizer reads EuroBERT's (Llama-3's) tokenizer from
# tokenizer.json.
TOKENIZER_JSON = True
_EMBEDDINGS = "embed_tokens.weight"
TASK_CLASSES = {  # bertjax task -> (Hugging Face class, bertjax head name)
    "classification": ("EuroBertForSequenceClassification", "classifier"),
    "tagging": ("EuroBertForTokenClassification", "tagger"),
}
# Hugging Face's classifier_pooling <-> bertjax's.
_POOLING = {"bos": "cls", "mean": "mean", "late": "late"}


# ---- config.json <-> EuroBertConfig -----------------------------------------------

def rope_of(hf: dict, default_theta: float) -> tuple[float, str, float]:
  """(theta, rope_type, factor) of a config.json: `rope_parameters`, else the 4.x
  `rope_theta` / `rope_scaling`; transformers' default theta when neither."""
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  theta = float(rope.get("rope_theta", hf.get("rope_theta") or default_theta))
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in ROPE_TYPES:
    raise CheckpointError(f"config.json rope type {kind!r} is not supported; bertjax "
                          f"computes {list(ROPE_TYPES)}.")
  return theta, kind, float(rope.get("factor", 1.0) if kind == "linear" else 1.0)


def check_model_type(hf: dict, model_type: str) -> None:
  if hf.get("model_type") != model_type:
    raise CheckpointError(f"config.json model_type={hf.get('model_type')!r} is not "
                          f"{model_type!r}; convert it with its own family's converter.")
  if hf.get("hidden_act", "silu") not in ACTIVATIONS:
    raise CheckpointError(f"config.json hidden_act={hf['hidden_act']!r} is not supported; "
                          f"bertjax has {sorted(ACTIVATIONS)}.")


# bertjax field -> config.json key: what EuroBERT and UltraBERT read and write alike.
KEYS = dict(vocab_size="vocab_size", hidden_size="hidden_size",
            num_layers="num_hidden_layers", num_heads="num_attention_heads",
            intermediate_size="intermediate_size",
            max_position_embeddings="max_position_embeddings", pad_token_id="pad_token_id",
            num_kv_heads="num_key_value_heads", head_dim="head_dim", hidden_act="hidden_act",
            rms_norm_eps="rms_norm_eps", attention_bias="attention_bias", mlp_bias="mlp_bias",
            attention_dropout="attention_dropout", tie_word_embeddings="tie_word_embeddings",
            initializer_range="initializer_range")


def model_config_from_hf(hf: dict[str, Any], **overrides) -> EuroBertConfig:
  """EuroBertConfig of a Hugging Face config.json (a dict); `overrides` set bertjax's
  own fields (attention_impl, scan_layers, remat_policy, dtype, param_dtype)."""
  check_model_type(hf, MODEL_TYPE)
  pooling = hf.get("classifier_pooling") or "late"
  if pooling not in _POOLING:
    raise CheckpointError(f"config.json classifier_pooling={pooling!r}: EuroBERT pools "
                          f"{sorted(_POOLING)}.")
  theta, kind, factor = rope_of(hf, 10_000.0)
  # An absent key: the dataclass's default, Hugging Face's (but the rotary theta:
  # transformers' 10,000, not EuroBERT-210m's 250,000).
  fields = dict(engine.read_fields(hf, KEYS, EuroBertConfig), rope_theta=theta,
                rope_type=kind, rope_factor=factor, classifier_pooling=_POOLING[pooling])
  return EuroBertConfig(**{**fields, **overrides})


def hf_config(config: EuroBertConfig, architecture: str = "EuroBertForMaskedLM",
              extra: dict | None = None) -> dict[str, Any]:
  """config.json of the Hugging Face model holding `config` (transformers 5's
  `rope_parameters` and the 4.x `rope_theta`); `extra` adds keys (token ids,
  id2label / label2id)."""
  rope = {"rope_type": config.rope_type, "rope_theta": config.rope_theta}
  if config.rope_type == "linear":
    rope["factor"] = config.rope_factor
  out = {"architectures": [architecture], "model_type": MODEL_TYPE, **engine.write_fields(config, KEYS),
         "rope_parameters": rope, "rope_theta": config.rope_theta,
         "classifier_pooling": {v: k for k, v in _POOLING.items()}[config.classifier_pooling]}
  out.update(extra or {})
  return out


# ---- The parameter table ----------------------------------------------------------

def linear(path, key, bias: bool, kind="dense", bias_kind="copy") -> list[Entry]:
  table = [Entry(path + ("kernel",), f"{key}.weight", kind)]
  if bias:
    table.append(Entry(path + ("bias",), f"{key}.bias", bias_kind))
  return table


def encoder_table(config, p: str) -> list[Entry]:
  """The encoder of EuroBERT's (and UltraBERT's) layout under the prefix `p`."""
  enc = ("encoder",)
  table = [Entry(enc + ("embeddings", "embed_tokens", "embedding"), p + _EMBEDDINGS,
                 "copy")]
  for i in range(config.num_layers):
    ours, hf = enc + (f"layer_{i}",), f"{p}layers.{i}"
    for norm in ("input_layernorm", "post_attention_layernorm"):
      table.append(Entry(ours + (norm, "scale"), f"{hf}.{norm}.weight", "copy"))
    for name, kind in (("q_proj", "qkv"), ("k_proj", "kv"), ("v_proj", "kv")):
      table += linear(ours + ("self_attn", name), f"{hf}.self_attn.{name}",
                      config.attention_bias, kind, kind + "_bias")
    table += linear(ours + ("self_attn", "o_proj"), f"{hf}.self_attn.o_proj",
                    config.attention_bias, "attn_out")
    for name in ("gate_proj", "up_proj", "down_proj"):
      table += linear(ours + ("mlp", name), f"{hf}.mlp.{name}", config.mlp_bias)
  table.append(Entry(enc + ("final_norm", "scale"), f"{p}norm.weight", "copy"))
  return table


def param_table(config: EuroBertConfig, prefix: str = "model.", mlm: bool = True,
                task: str | None = None) -> list[Entry]:
  """Every bertjax parameter of `config` (unscanned) with its Hugging Face key: the
  encoder under `prefix` ('model.' in every EuroBertFor*, '' in a bare EuroBertModel),
  the MLM decoder when `mlm` (untied), the `task` head (a key of TASK_CLASSES)."""
  table = encoder_table(config, prefix)
  if mlm:
    if not config.tie_word_embeddings:
      table += linear(("mlm", "decoder"), "lm_head", config.mlp_bias)
    elif config.mlp_bias:
      table.append(Entry(("mlm", "bias"), "lm_head.bias", "copy"))
  if task is not None:
    if task not in TASK_CLASSES:
      raise CheckpointError(f"a {task!r} model has no Hugging Face EuroBERT class; those "
                            f"exist for {sorted(TASK_CLASSES)}.")
    if task == "classification":
      table += linear(("head", "dense"), "dense", True)
    table += linear(("head", TASK_CLASSES[task][1]), "classifier", True)
  return table


# ---- State dicts <-> parameters ---------------------------------------------------

def task_of(hf: dict[str, Any]) -> str | None:
  """The bertjax task of a config.json (`table.task_of`)."""
  return engine.task_of(hf, TASK_CLASSES)


def params_from_hf(state_dict: dict[str, np.ndarray], config: EuroBertConfig,
                   task: str | None = None) -> dict:
  """bertjax params (nested dict of float32 numpy arrays, unscanned) of a Hugging Face
  state dict: 'encoder', 'mlm' when it has lm_head ({} when tied without bias), 'head'
  for a fine-tuned `task`."""
  prefix = engine.encoder_prefix(state_dict, _EMBEDDINGS, "EuroBERT")
  if task is None and "classifier.weight" in state_dict:
    raise CheckpointError("the checkpoint has a task head (classifier.weight): name its "
                          f"task, one of {sorted(TASK_CLASSES)}.")
  mlm = task is None and "lm_head.weight" in state_dict
  if config.tie_word_embeddings:
    engine.check_tied(state_dict, ("lm_head.weight",), prefix + _EMBEDDINGS,
                      "the token embeddings")
  params = engine.read(state_dict, param_table(config, prefix, mlm, task), config)
  if mlm:  # {}: the MLM head of a tied decoder without bias has no parameter
    params.setdefault("mlm", {})
  return params


def params_to_hf(params: dict, config: EuroBertConfig, task: str | None = None
                 ) -> dict[str, np.ndarray]:
  """A Hugging Face state dict (float32 numpy, either layout in): EuroBertForMaskedLM's
  keys when `params` has 'mlm' ({} for a tied decoder without bias), a
  EuroBertFor<task>'s when `task`, else a bare EuroBertModel's."""
  return engine.params_to_hf(params, config, param_table, "model.", task, _EMBEDDINGS,
                             ("lm_head.weight",) if config.tie_word_embeddings else ())


def export(params: dict, config: EuroBertConfig, task: str | None = None,
           labels: Sequence[str] | None = None, extra: dict | None = None
           ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json, state dict) of the Hugging Face model holding `params`
  (EuroBertForMaskedLM with an 'mlm' head, EuroBertFor<task>, else EuroBertModel)."""
  state = params_to_hf(params, config, task)
  arch = (TASK_CLASSES[task][0] if task else
          "EuroBertForMaskedLM" if "lm_head.weight" in state else "EuroBertModel")
  return engine.exported(hf_config, config, arch, state, labels, extra,
                         "classifier.weight" if task else None)


def token_ids(tokenizer) -> dict[str, int]:
  """The special ids config.json names (bos: the row's first token, eos: its last;
  EuroBERT's <|begin_of_text|> / <|end_of_text|>)."""
  return {"bos_token_id": tokenizer.cls_id, "eos_token_id": tokenizer.sep_id,
          "pad_token_id": tokenizer.pad_id, "mask_token_id": tokenizer.mask_id}


check_supported, load = engine.readers(model_config_from_hf, task_of, params_from_hf)
_export_pretrained, export_finetuned = engine.exporters(export, token_ids)


def export_pretrained(params: dict, config: EuroBertConfig, tokenizer, tokenizer_kind: str):
  """(config.json, state dict) of the Hugging Face model holding pretrained `params`:
  EuroBertForMaskedLM with their MLM head (none of whose parameters exist when the
  decoder is tied and without bias: then always), else EuroBertModel."""
  if config.tie_word_embeddings and not config.decoder_bias:
    params = {"mlm": {}, **params}
  return _export_pretrained(params, config, tokenizer, tokenizer_kind)


def pretraining_model(config: EuroBertConfig) -> tuple[dict[str, Any], EuroBertConfig]:
  """The Hugging Face model that pretrains `config` (EuroBertForMaskedLM: the logits at
  every position) and `config` as it computes it."""
  return hf_config(config), config
