"""Hugging Face DeBERTa-v2 / v3 checkpoints (config.json model_type 'deberta-v2') <->
bertjax `DebertaConfig` and parameters.

Covers `DebertaV2Model`, `DebertaV2ForMaskedLM` (both of its MLM heads: the original
DeBERTa's `lm_predictions.lm_head.*`, config.json `legacy: false`, and transformers'
legacy `cls.predictions.*`, the only one that serves an `embedding_size` below the
hidden size) and the fine-tuned `DebertaV2ForSequenceClassification /
ForTokenClassification / ForQuestionAnswering / ForMultipleChoice`. DeBERTa-v3's
released checkpoints hold the replaced-token-detection discriminator: its
`mask_predictions.*` RTD head (microsoft/DeBERTa's LMMaskPredictionHead, which
transformers' classes lack and leave unused) is read as the 'rtd' head (`config.rtd`),
so continuing one with ('rtd',) starts from its detector; there is no MLM head, which
importing logs (a workdir converted from it gets a fresh one, `checkpoint.pretrained`).
An export writes the 'rtd' head back under the same keys.
Refused in one line: DeBERTa-v2-xlarge's convolution (`conv_kernel_size` > 0), a
pooler or head size other than the hidden size's, DeBERTa v1 (model_type 'deberta').

One table, `param_table`, lists every parameter as an `Entry` (bertjax path, Hugging
Face key, kind) of the engine `bertjax.hf.table`. Task heads (bertjax paths; keys):

  head/pooler/dense/{kernel, bias}     pooler.dense     ForSequenceClassification,
                                                        ForMultipleChoice (ContextPooler)
  head/classifier/{kernel, bias}       classifier       ForSequenceClassification
  head/scorer/{kernel, bias}           classifier       ForMultipleChoice
  head/tagger/{kernel, bias}           classifier       ForTokenClassification
  head/qa/{kernel, bias}               qa_outputs       ForQuestionAnswering

The MLM decoder is tied to the token embedding: written as a copy of it (and the
legacy decoder's bias as a copy of `cls.predictions.bias`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from absl import logging
import numpy as np

from bertjax.errors import CheckpointError, ConfigError
from bertjax.hf import table as engine
from bertjax.hf.table import Entry
from bertjax.model.deberta import DebertaConfig

FAMILY = "deberta"  # bertjax.model.FAMILIES
MODEL_TYPE = "deberta-v2"
MODEL_TYPES = (MODEL_TYPE,)  # config.json model_type
TOKENIZER_JSON = False  # spm.model (DebertaV2Tokenizer), vocab.txt or tokenizer.json
_EMBEDDINGS = "embeddings.word_embeddings.weight"
# bertjax task -> (Hugging Face class, bertjax head name).
TASK_CLASSES = {
    "classification": ("DebertaV2ForSequenceClassification", "classifier"),
    "tagging": ("DebertaV2ForTokenClassification", "tagger"),
    "squad": ("DebertaV2ForQuestionAnswering", "qa"),
    "multiple_choice": ("DebertaV2ForMultipleChoice", "scorer"),
}
# The two MLM heads of DebertaV2ForMaskedLM: (dense, LayerNorm, bias) keys.
MLM_HEADS = {
    "lm_predictions": ("lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm",
                       "lm_predictions.lm_head.bias"),
    "cls": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
            "cls.predictions.bias"),
}


# ---- config.json <-> DebertaConfig ------------------------------------------------

def _listed(value, default: str) -> list[str]:
  """A config.json '|'-separated string (or list) as lower-case entries."""
  if value is None:
    value = default
  if isinstance(value, str):
    value = value.lower().split("|")
  return [v.strip() for v in value if v.strip()]


def model_config_from_hf(hf: dict[str, Any], **overrides) -> DebertaConfig:
  """DebertaConfig of a Hugging Face config.json (a dict; keys it lacks take
  `transformers.DebertaV2Config`'s defaults); `overrides` set bertjax's own fields
  (attention_impl, scan_layers, remat_policy, dtype, param_dtype)."""
  if hf.get("model_type") != MODEL_TYPE:
    raise CheckpointError(f"config.json model_type={hf.get('model_type')!r} is not "
                          f"{MODEL_TYPE!r} (DeBERTa-v2 / v3).")
  if (hf.get("conv_kernel_size") or 0) > 0:
    raise CheckpointError(f"config.json conv_kernel_size={hf['conv_kernel_size']}: "
                          "DeBERTa-v2-xlarge's convolution after the first block is not "
                          "supported; bertjax converts DeBERTa-v2 / v3 models without it.")
  hidden, heads = hf.get("hidden_size", 1536), hf.get("num_attention_heads", 24)
  for key, want in (("pooler_hidden_size", hidden), ("attention_head_size", hidden // heads)):
    if hf.get(key, want) != want:
      raise CheckpointError(f"config.json {key}={hf[key]} is not supported; bertjax's "
                            f"DeBERTa has {want} (from hidden_size / num_attention_heads).")
  hidden_dropout = hf.get("hidden_dropout_prob", 0.1)
  fields = dict(
      vocab_size=hf.get("vocab_size", 128100), hidden_size=hidden,
      num_layers=hf.get("num_hidden_layers", 24), num_heads=heads,
      intermediate_size=hf.get("intermediate_size", 6144),
      max_position_embeddings=hf.get("max_position_embeddings", 512),
      type_vocab_size=hf.get("type_vocab_size", 0),
      pad_token_id=hf.get("pad_token_id", 0) or 0,
      embedding_size=0 if hf.get("embedding_size", hidden) == hidden else hf["embedding_size"],
      position_biased_input=hf.get("position_biased_input", True),
      relative_attention=hf.get("relative_attention", False),
      max_relative_positions=hf.get("max_relative_positions", -1),
      position_buckets=hf.get("position_buckets", -1),
      pos_att_type=tuple(_listed(hf.get("pos_att_type"), "")),
      share_att_key=hf.get("share_att_key", False),
      norm_rel_ebd="layer_norm" if "layer_norm" in _listed(hf.get("norm_rel_ebd"), "none")
      else "none",
      layer_norm_eps=hf.get("layer_norm_eps", 1e-7), hidden_act=hf.get("hidden_act", "gelu"),
      dropout_rate=hidden_dropout,
      attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
      pooler_dropout=hf.get("pooler_dropout", 0.0),
      pooler_hidden_act=hf.get("pooler_hidden_act", "gelu"),
      cls_dropout=hidden_dropout if hf.get("cls_dropout") is None else hf["cls_dropout"],
      initializer_range=hf.get("initializer_range", 0.02))
  try:
    return DebertaConfig(**{**fields, **overrides})
  except ConfigError as e:
    raise CheckpointError(f"config.json describes a DeBERTa bertjax cannot represent: "
                          f"{e}") from None


def mlm_head_style(config: DebertaConfig) -> str:
  """The MLM head an export writes: the original DeBERTa's 'lm_predictions'
  (config.json legacy false), or transformers' legacy 'cls' when the embedding is
  narrower than the hidden size (the only one that projects to it)."""
  return "lm_predictions" if config.embed_width == config.hidden_size else "cls"


def hf_config(config: DebertaConfig, architecture: str = "DebertaV2ForMaskedLM",
              extra: dict | None = None) -> dict[str, Any]:
  """config.json of the Hugging Face model holding `config`; `extra` adds keys (the
  tokenizer's special ids, id2label / label2id)."""
  out = {
      "architectures": [architecture], "model_type": MODEL_TYPE,
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
      "intermediate_size": config.intermediate_size, "hidden_act": config.hidden_act,
      "hidden_dropout_prob": config.dropout_rate,
      "attention_probs_dropout_prob": config.attention_dropout_rate,
      "max_position_embeddings": config.max_position_embeddings,
      "type_vocab_size": config.type_vocab_size,
      "initializer_range": config.initializer_range,
      "layer_norm_eps": config.layer_norm_eps,
      "relative_attention": config.relative_attention,
      "max_relative_positions": config.max_relative_positions,
      "position_buckets": config.position_buckets,
      "pos_att_type": list(config.pos_att_type), "share_att_key": config.share_att_key,
      "norm_rel_ebd": config.norm_rel_ebd,
      "position_biased_input": config.position_biased_input,
      "embedding_size": config.embed_width, "pad_token_id": config.pad_token_id,
      "pooler_dropout": config.pooler_dropout,
      "pooler_hidden_act": config.pooler_hidden_act,
      "pooler_hidden_size": config.hidden_size, "cls_dropout": config.cls_dropout,
      "legacy": mlm_head_style(config) == "cls", "tie_word_embeddings": True,
  }
  out.update(extra or {})
  return out


# ---- The parameter table ----------------------------------------------------------

def _norm(path, key):
  return [Entry(path + ("scale",), f"{key}.weight", "copy"),
          Entry(path + ("bias",), f"{key}.bias", "copy")]


def _linear(path, key, kind="dense", bias_kind="copy", bias=True):
  table = [Entry(path + ("kernel",), f"{key}.weight", kind)]
  if bias:
    table.append(Entry(path + ("bias",), f"{key}.bias", bias_kind))
  return table


def _block(config: DebertaConfig, ours: tuple[str, ...], hf: str) -> list[Entry]:
  table = []
  projections = ["query_proj", "key_proj", "value_proj"]
  if config.relative_attention and not config.share_att_key:
    projections += [name for kind, name in (("c2p", "pos_key_proj"),
                                            ("p2c", "pos_query_proj"))
                    if kind in config.pos_att_type]
  for name in projections:
    table += _linear(ours + ("attention", name), f"{hf}.attention.self.{name}", "qkv",
                     "qkv_bias")
  table += _linear(ours + ("attention", "output"), f"{hf}.attention.output.dense",
                   "attn_out")
  table += _norm(ours + ("attention_norm",), f"{hf}.attention.output.LayerNorm")
  table += _linear(ours + ("intermediate",), f"{hf}.intermediate.dense")
  table += _linear(ours + ("output",), f"{hf}.output.dense")
  return table + _norm(ours + ("output_norm",), f"{hf}.output.LayerNorm")


# The released discriminators' replaced-token-detection head: bertjax's 'rtd' module.
RTD_HEAD = "mask_predictions"


def param_table(config: DebertaConfig, prefix: str = "deberta.", mlm: str | None = None,
                task: str | None = None, rtd: bool = False) -> list[Entry]:
  """Every bertjax parameter of `config` (unscanned layout) with its Hugging Face key:
  the encoder under `prefix` ('deberta.' in every DebertaV2For*, '' in a bare
  DebertaV2Model), the MLM head of style `mlm` (a key of MLM_HEADS; None: none), the
  replaced-token detector when `rtd` (`RTD_HEAD`.*), the `task` head (a key of
  TASK_CLASSES)."""
  p, emb = prefix, ("encoder", "embeddings")
  table = [Entry(emb + ("word_embeddings", "embedding"), p + _EMBEDDINGS, "copy")]
  if config.position_biased_input:
    table.append(Entry(emb + ("position_embeddings", "embedding"),
                       f"{p}embeddings.position_embeddings.weight", "copy"))
  if config.type_vocab_size > 0:
    table.append(Entry(emb + ("token_type_embeddings", "embedding"),
                       f"{p}embeddings.token_type_embeddings.weight", "copy"))
  if config.embed_width != config.hidden_size:
    table += _linear(emb + ("embed_proj",), f"{p}embeddings.embed_proj", bias=False)
  table += _norm(emb + ("LayerNorm",), f"{p}embeddings.LayerNorm")
  if config.relative_attention:
    table.append(Entry(emb + ("rel_embeddings", "embedding"),
                       f"{p}encoder.rel_embeddings.weight", "copy"))
    if config.norm_rel_ebd == "layer_norm":
      table += _norm(emb + ("rel_norm",), f"{p}encoder.LayerNorm")
  for i in range(config.num_layers):
    table += _block(config, ("encoder", f"layer_{i}"), f"{p}encoder.layer.{i}")
  if mlm is not None:
    dense, norm, bias = MLM_HEADS[mlm]
    table += _linear(("mlm", "transform"), dense) + _norm(("mlm", "transform_norm"), norm)
    table.append(Entry(("mlm", "bias"), bias, "copy"))
  if rtd:
    table += (_norm(("rtd", "LayerNorm"), f"{RTD_HEAD}.LayerNorm")
              + _linear(("rtd", "dense"), f"{RTD_HEAD}.dense")
              + _linear(("rtd", "classifier"), f"{RTD_HEAD}.classifier"))
  if task is not None:
    if task not in TASK_CLASSES:
      raise CheckpointError(f"a {task!r} model has no Hugging Face DeBERTa class; "
                            f"those exist for {sorted(TASK_CLASSES)}.")
    if task in ("classification", "multiple_choice"):
      table += _linear(("head", "pooler", "dense"), "pooler.dense")
    key = "qa_outputs" if task == "squad" else "classifier"
    table += _linear(("head", TASK_CLASSES[task][1]), key)
  return table


# ---- State dicts <-> parameters ---------------------------------------------------

def encoder_prefix(state_dict: dict) -> str:
  """'deberta.' (DebertaV2For*) or '' (a bare DebertaV2Model)."""
  return engine.encoder_prefix(state_dict, _EMBEDDINGS, "DeBERTa")


def mlm_style(state_dict: dict) -> str | None:
  """The MLM head a state dict holds (a key of MLM_HEADS), None for none."""
  for style, (dense, _, _) in MLM_HEADS.items():
    if f"{dense}.weight" in state_dict:
      return style
  return None


def task_of(hf: dict[str, Any]) -> str | None:
  """The bertjax task of a config.json (`table.task_of`)."""
  return engine.task_of(hf, TASK_CLASSES)


def params_from_hf(state_dict: dict[str, np.ndarray], config: DebertaConfig,
                   task: str | None = None) -> dict:
  """bertjax params (nested dict of float32 numpy arrays, unscanned) of a Hugging Face
  state dict: 'encoder', 'mlm' when the checkpoint has an MLM head (either style; one
  it lacks is logged), 'head' for a fine-tuned `task` model."""
  prefix = encoder_prefix(state_dict)
  if task is None and "classifier.weight" in state_dict:
    raise CheckpointError("the checkpoint has a task head (classifier.weight): name its "
                          f"task, one of {sorted(TASK_CLASSES)}.")
  mlm = mlm_style(state_dict) if task is None else None
  if task is None and mlm is None:
    logging.info("the DeBERTa checkpoint has no MLM head (%s): DeBERTa-v3's releases "
                 "hold the replaced-token-detection discriminator. A workdir converted "
                 "from it starts a fresh MLM head ('mlm').",
                 " / ".join(f"{d}.*" for d, _, _ in MLM_HEADS.values()))
  engine.check_tied(state_dict, ("cls.predictions.decoder.weight",), prefix + _EMBEDDINGS)
  return engine.read(state_dict, param_table(config, prefix, mlm, task, config.rtd),
                     config)


def load(hf: dict[str, Any], state_dict: dict[str, np.ndarray], **overrides
         ) -> tuple[DebertaConfig, dict, str | None]:
  """(config, params, task) of a config.json and its weights (`engine.readers`' load):
  a checkpoint holding the released `RTD_HEAD` is a discriminator (`config.rtd`, its
  head in params['rtd'])."""
  config = model_config_from_hf(hf, **overrides)
  task = task_of(hf)
  if task is None and f"{RTD_HEAD}.dense.weight" in state_dict:
    config = dataclasses.replace(config, rtd=True)
  return config, params_from_hf(state_dict, config, task), task


def params_to_hf(params: dict, config: DebertaConfig, task: str | None = None
                 ) -> dict[str, np.ndarray]:
  """A Hugging Face state dict (float32 numpy, either layout in): DebertaV2ForMaskedLM
  when `params` has 'mlm' (its head in `mlm_head_style`), a DebertaV2For<task> when
  `task`, else a bare DebertaV2Model's."""
  params = engine.unscanned(params, config)
  mlm = mlm_head_style(config) if task is None and "mlm" in params else None
  rtd = task is None and "rtd" in params
  prefix = "deberta." if mlm or task or rtd else ""
  state = engine.write(params, param_table(config, prefix, mlm, task, rtd))
  if mlm == "cls":
    state["cls.predictions.decoder.weight"] = state[prefix + _EMBEDDINGS].copy()
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].copy()
  return state


def export(params: dict, config: DebertaConfig, task: str | None = None,
           labels: Sequence[str] | None = None, extra: dict | None = None
           ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json, state dict) of the Hugging Face model holding `params`
  (DebertaV2ForMaskedLM with an 'mlm' head, DebertaV2For<task>, else DebertaV2Model);
  `labels` name a classifier's outputs (default LABEL_i); `extra` adds config.json
  keys."""
  state = params_to_hf(params, config, task)
  arch = (TASK_CLASSES[task][0] if task else
          "DebertaV2ForMaskedLM" if "mlm" in params else "DebertaV2Model")
  classifier = {"classification": "classifier.weight", "tagging": "classifier.weight",
                "squad": "qa_outputs.weight"}.get(task)
  return engine.exported(hf_config, config, arch, state, labels, extra, classifier)


def _token_ids(tokenizer) -> dict[str, int]:
  """The special ids config.json names (DeBERTa's: bos = [CLS], eos = [SEP])."""
  return {"bos_token_id": tokenizer.cls_id, "eos_token_id": tokenizer.sep_id,
          "pad_token_id": tokenizer.pad_id}


check_supported, _ = engine.readers(model_config_from_hf, task_of, params_from_hf)
export_pretrained, export_finetuned = engine.exporters(export, _token_ids)


def pretraining_model(config: DebertaConfig) -> tuple[dict[str, Any], DebertaConfig]:
  """The Hugging Face model that pretrains `config` as bertjax does (`benchmark train
  --compare=hf`): its config.json (DebertaV2ForMaskedLM) and `config` (the same heads;
  it computes the MLM logits at every position)."""
  return hf_config(config), config
