"""Hugging Face UltraBERT checkpoints <-> bertjax `UltraBertConfig` and parameters.

Covers `UltrabertModel`, `UltrabertForMaskedLM` and the fine-tuned
`UltrabertForSequenceClassification / ForTokenClassification / ForQuestionAnswering`,
and the config.json variants transformers 5 reads: `layer_types` + `rope_parameters`
per layer kind ({'full_attention': {'rope_theta': ..}, 'sliding_attention': ..}) +
`sliding_window`, and the remote-code checkpoints' `attention_windows` (per layer, 0 /
null for a full layer; the first nonzero one is the window) and `rope_theta` (a theta
per layer: the last of each kind wins, as in transformers). Refused with a one-line
CheckpointError: another model_type, an activation bertjax does not compute, a rotary
type other than 'default', a layer kind without rotary parameters.

The encoder's table is EuroBERT's (`bertjax.hf.eurobert.encoder_table`); the MLM head
is head.linear1 / head.linear2 ('dense', no biases) and head.decoder ('dense', no bias;
with `tie_word_embeddings` a copy of the embedding, not a parameter). Checkpoints on
disk (the remote code's, and what transformers' save_pretrained writes) name the
encoder 'ultrabert.' and the decoder 'cls.': read as 'model.' / 'head.decoder.'
(`canonical`); bertjax writes the in-memory names, which from_pretrained loads as
they are.

Task heads (bertjax paths; Hugging Face keys):

  head/classifier/{kernel[E, K], bias[K]}  classifier   ForSequenceClassification
  head/tagger/{kernel[E, K], bias[K]}      classifier   ForTokenClassification
  head/qa/{kernel[E, 2], bias[2]}          qa_outputs   ForQuestionAnswering
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from bertjax.errors import CheckpointError
from bertjax.hf import eurobert as euro, table as engine
from bertjax.hf.table import Entry
from bertjax.model.ultrabert import POOLINGS, UltraBertConfig

FAMILY = "ultrabert"
MODEL_TYPE = "ultrabert"
MODEL_TYPES = (MODEL_TYPE,)
TOKENIZER_JSON = True
_EMBEDDINGS = "embed_tokens.weight"
TASK_CLASSES = {  # bertjax task -> (Hugging Face class, bertjax head name)
    "classification": ("UltrabertForSequenceClassification", "classifier"),
    "tagging": ("UltrabertForTokenClassification", "tagger"),
    "squad": ("UltrabertForQuestionAnswering", "qa"),
}
# bertjax field -> config.json key, beyond EuroBERT's (`euro.KEYS`).
KEYS = dict(euro.KEYS, sliding_window="sliding_window",
            prediction_head_size="prediction_head_size",
            classifier_pooling="classifier_pooling", classifier_dropout="classifier_dropout")
_THETAS = {"full_attention": 2_560_000.0, "sliding_attention": 10_000.0}


# ---- config.json <-> UltraBertConfig ----------------------------------------------

def _layers(hf: dict, num_layers: int) -> tuple[list[str], int]:
  """(layer_types, sliding_window) as transformers reads them."""
  window = hf.get("sliding_window") or UltraBertConfig.sliding_window
  types = hf.get("layer_types")
  windows = hf.get("attention_windows")
  if windows is not None:
    window = next((w for w in windows if w), window)
    if types is None:
      types = ["sliding_attention" if w else "full_attention" for w in windows]
  if types is None:
    types = ["sliding_attention" if (i + 1) % 3 else "full_attention"
             for i in range(num_layers)]
  return list(types), window


def _thetas(hf: dict, types: list[str]) -> dict[str, float]:
  """{layer kind: rotary theta} of `rope_parameters` (per kind, or one for both), else
  the per-layer legacy `rope_theta`, else transformers' defaults."""
  rope = hf.get("rope_parameters")
  legacy = hf.get("rope_theta")
  if rope is None and isinstance(legacy, (list, tuple)):
    rope = {kind: {"rope_type": "default", "rope_theta": t}
            for kind, t in zip(types, legacy)}
  if rope is None:
    rope = {k: {"rope_type": "default", "rope_theta": t} for k, t in _THETAS.items()}
  if "rope_theta" in rope:
    rope = {k: rope for k in _THETAS}
  out = {}
  for kind in _THETAS:
    params = rope.get(kind)
    if params is None:
      if kind in types:
        raise CheckpointError(f"config.json rope_parameters has none for {kind!r} layers.")
      out[kind] = _THETAS[kind]
      continue
    if params.get("rope_type", "default") != "default":
      raise CheckpointError(f"config.json rope_parameters[{kind!r}] rope_type="
                            f"{params['rope_type']!r} is not supported; only 'default'.")
    out[kind] = float(params["rope_theta"])
  return out


def model_config_from_hf(hf: dict[str, Any], **overrides) -> UltraBertConfig:
  """UltraBertConfig of a Hugging Face config.json (a dict); `overrides` set bertjax's
  own fields (attention_impl, scan_layers, remat_policy, dtype, param_dtype)."""
  euro.check_model_type(hf, MODEL_TYPE)
  # An absent key: the dataclass's default, which is Hugging Face's.
  fields = engine.read_fields(hf, KEYS, UltraBertConfig)
  types, window = _layers(hf, fields["num_layers"])
  thetas = _thetas(hf, types)
  pooling = fields["classifier_pooling"]
  if pooling not in POOLINGS:
    raise CheckpointError(f"config.json classifier_pooling={pooling!r}: UltraBERT pools "
                          f"{list(POOLINGS)}.")
  fields.update(layer_types=tuple(types), sliding_window=window,
                full_rope_theta=thetas["full_attention"],
                sliding_rope_theta=thetas["sliding_attention"])
  return UltraBertConfig(**{**fields, **overrides})


def hf_config(config: UltraBertConfig, architecture: str = "UltrabertForMaskedLM",
              extra: dict | None = None) -> dict[str, Any]:
  """config.json of the Hugging Face model holding `config`; `extra` adds keys (token
  ids, id2label / label2id)."""
  rope = lambda theta: {"rope_type": "default", "rope_theta": theta}
  out = {"architectures": [architecture], "model_type": MODEL_TYPE,
         **engine.write_fields(config, KEYS), "layer_types": list(config.layer_types),
         "rope_parameters": {"full_attention": rope(config.full_rope_theta),
                             "sliding_attention": rope(config.sliding_rope_theta)}}
  out.update(extra or {})
  return out


# ---- The parameter table ----------------------------------------------------------

def param_table(config: UltraBertConfig, prefix: str = "model.", mlm: bool = True,
                task: str | None = None) -> list[Entry]:
  """Every bertjax parameter of `config` (unscanned) with its Hugging Face key: the
  encoder under `prefix` ('model.' in every UltrabertFor*, '' in a bare UltrabertModel),
  the MLM head when `mlm`, the `task` head (a key of TASK_CLASSES)."""
  table = euro.encoder_table(config, prefix)
  if mlm:
    for name in ("linear1", "linear2"):
      table += euro.linear(("mlm", "head", name), f"head.{name}", False)
    if not config.tie_word_embeddings:
      table += euro.linear(("mlm", "decoder"), "head.decoder", False)
  if task is not None:
    if task not in TASK_CLASSES:
      raise CheckpointError(f"a {task!r} model has no Hugging Face UltraBERT class; those "
                            f"exist for {sorted(TASK_CLASSES)}.")
    table += euro.linear(("head", TASK_CLASSES[task][1]),
                         "qa_outputs" if task == "squad" else "classifier", True)
  return table


# ---- State dicts <-> parameters ---------------------------------------------------

def task_of(hf: dict[str, Any]) -> str | None:
  """The bertjax task of a config.json (`table.task_of`)."""
  return engine.task_of(hf, TASK_CLASSES)


def canonical(state_dict: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The state dict with transformers 5's in-memory names: the remote-code checkpoints'
  (which transformers' save_pretrained writes too: its conversion_mapping) 'ultrabert.'
  prefix is 'model.', the MLM decoder 'cls.' is 'head.decoder.'."""
  out = {}
  for key, value in state_dict.items():
    if key.startswith("ultrabert."):
      key = "model." + key[len("ultrabert."):]
    elif key.startswith("cls."):
      key = "head.decoder." + key[len("cls."):]
    out[key] = value
  return out


def params_from_hf(state_dict: dict[str, np.ndarray], config: UltraBertConfig,
                   task: str | None = None) -> dict:
  """bertjax params (nested dict of float32 numpy arrays, unscanned) of a Hugging Face
  state dict (on-disk or in-memory names: `canonical`): 'encoder', 'mlm' when it has
  the prediction head, 'head' for `task`."""
  state_dict = canonical(state_dict)
  prefix = engine.encoder_prefix(state_dict, _EMBEDDINGS, "UltraBERT")
  if task is None and ("classifier.weight" in state_dict or "qa_outputs.weight" in state_dict):
    raise CheckpointError("the checkpoint has a task head: name its task, one of "
                          f"{sorted(TASK_CLASSES)}.")
  mlm = task is None and "head.linear1.weight" in state_dict
  if config.tie_word_embeddings:
    engine.check_tied(state_dict, ("head.decoder.weight",), prefix + _EMBEDDINGS,
                      "the token embeddings")
  return engine.read(state_dict, param_table(config, prefix, mlm, task), config)


def params_to_hf(params: dict, config: UltraBertConfig, task: str | None = None
                 ) -> dict[str, np.ndarray]:
  """A Hugging Face state dict (float32 numpy, either layout in): UltrabertForMaskedLM's
  keys when `params` has 'mlm', an UltrabertFor<task>'s when `task`, else a bare
  UltrabertModel's."""
  return engine.params_to_hf(params, config, param_table, "model.", task, _EMBEDDINGS,
                             ("head.decoder.weight",) if config.tie_word_embeddings else ())


def export(params: dict, config: UltraBertConfig, task: str | None = None,
           labels: Sequence[str] | None = None, extra: dict | None = None
           ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json, state dict) of the Hugging Face model holding `params`."""
  state = params_to_hf(params, config, task)
  arch = (TASK_CLASSES[task][0] if task else
          "UltrabertForMaskedLM" if "head.linear1.weight" in state else "UltrabertModel")
  labelled = task in ("classification", "tagging")  # the classifier's rows
  return engine.exported(hf_config, config, arch, state, labels, extra,
                         "classifier.weight" if labelled else None)


def _token_ids(tokenizer) -> dict[str, int]:
  return {"bos_token_id": tokenizer.cls_id, "eos_token_id": tokenizer.sep_id,
          "pad_token_id": tokenizer.pad_id}


check_supported, load = engine.readers(model_config_from_hf, task_of, params_from_hf)
export_pretrained, export_finetuned = engine.exporters(export, _token_ids)


def pretraining_model(config: UltraBertConfig) -> tuple[dict[str, Any], UltraBertConfig]:
  """The Hugging Face model that pretrains `config` (UltrabertForMaskedLM: the logits at
  every position) and `config` as it computes it."""
  return hf_config(config), config
