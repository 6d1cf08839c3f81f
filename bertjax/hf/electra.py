"""The 'electra' family's Hugging Face table: ELECTRA checkpoints (model_type
'electra': discriminators, generators, fine-tuned models; a WordPiece vocab.txt) <->
bertjax `ElectraConfig` and parameters.

Classes: `ElectraForPreTraining` (a discriminator: the encoder and the 'rtd' head),
`ElectraForMaskedLM` (a generator: the encoder and the 'mlm' head), `ElectraModel`
(the encoder alone) and the fine-tuned `ElectraForSequenceClassification /
ForTokenClassification / ForQuestionAnswering / ForMultipleChoice`, read (the task
from `architectures`) and written.

The encoder's keys are BERT's (`bertjax.hf.bert.param_table` lists them, under
'electra.' in every ElectraFor*, '' in a bare ElectraModel) plus
`embeddings_project` when the embedding size differs from the hidden size. Heads
(bertjax path: Hugging Face key):

  mlm/transform, mlm/transform_norm, mlm/bias   generator_predictions.dense,
                                                .LayerNorm, generator_lm_head.bias
                                                (its weight: the word embeddings, tied)
  rtd/dense, rtd/dense_prediction               discriminator_predictions.dense,
                                                .dense_prediction
  head/dense, head/classifier                   classifier.dense, classifier.out_proj
  head/tagger                                   classifier         (token classification)
  head/qa                                       qa_outputs
  head/summary, head/scorer                     sequence_summary.summary, classifier
                                                (multiple choice)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from absl import logging
import numpy as np

from bertjax.errors import CheckpointError
from bertjax.hf import bert as bert_table
from bertjax.hf import table as engine
from bertjax.hf.table import Entry
from bertjax.model.electra import ElectraConfig

FAMILY = "electra"  # bertjax.model.FAMILIES
MODEL_TYPES = ("electra",)  # config.json model_type
TOKENIZER_JSON = False  # vocab.txt (ElectraTokenizer is BERT's WordPiece)
_WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"
_DECODER = "generator_lm_head.weight"
PRETRAINING, MASKED_LM, BARE = "ElectraForPreTraining", "ElectraForMaskedLM", "ElectraModel"
# bertjax task -> (Hugging Face class, {bertjax head parameter: Hugging Face key}).
TASK_CLASSES = {
    "classification": ("ElectraForSequenceClassification",
                       {"dense": "classifier.dense", "classifier": "classifier.out_proj"}),
    "tagging": ("ElectraForTokenClassification", {"tagger": "classifier"}),
    "squad": ("ElectraForQuestionAnswering", {"qa": "qa_outputs"}),
    "multiple_choice": ("ElectraForMultipleChoice",
                        {"summary": "sequence_summary.summary", "scorer": "classifier"}),
}
# config.json keys of the heads bertjax builds one way only -> the value it supports.
_FIXED = {"hidden_act": "gelu", "position_embedding_type": "absolute",
          "summary_type": "first", "summary_use_proj": True,
          "summary_activation": "gelu", "summary_first_dropout": 0.0,
          "summary_proj_to_labels": False, "is_decoder": False}


def check_supported(hf: dict[str, Any]) -> None:
  """CheckpointError unless bertjax can represent the Hugging Face model: ELECTRA with
  the exact GELU, absolute positions and the multiple-choice summary of
  ElectraConfig's defaults."""
  if hf.get("model_type") not in MODEL_TYPES:
    raise CheckpointError(f"config.json model_type={hf.get('model_type')!r} is not "
                          "'electra'; convert it with its own family's converter.")
  for key, value in _FIXED.items():
    if hf.get(key) not in (None, value):
      raise CheckpointError(f"config.json {key}={hf[key]!r} is not supported; bertjax's "
                            f"ELECTRA has {key}={value!r}.")


# bertjax field -> config.json key, both ways (absent keys: transformers' ElectraConfig
# defaults, which are ElectraConfig's).
KEYS = {"vocab_size": "vocab_size", "embedding_size": "embedding_size",
        "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
        "num_heads": "num_attention_heads", "intermediate_size": "intermediate_size",
        "max_position_embeddings": "max_position_embeddings",
        "type_vocab_size": "type_vocab_size", "pad_token_id": "pad_token_id",
        "layer_norm_eps": "layer_norm_eps", "dropout_rate": "hidden_dropout_prob",
        "attention_dropout_rate": "attention_probs_dropout_prob",
        "initializer_range": "initializer_range",
        "classifier_dropout_rate": "classifier_dropout",
        "summary_dropout": "summary_last_dropout"}


def model_config_from_hf(hf: dict[str, Any], rtd: bool = False) -> ElectraConfig:
  """ElectraConfig of a Hugging Face config.json (a dict; absent keys at transformers'
  ElectraConfig defaults); `rtd`: the network has the discriminator's head."""
  check_supported(hf)
  return ElectraConfig(**engine.read_fields(hf, KEYS, ElectraConfig), rtd=rtd)


def hf_config(config: ElectraConfig, architecture: str, extra: dict | None = None
              ) -> dict[str, Any]:
  """config.json of the Hugging Face `architecture` holding `config` (`extra` adds
  keys: labels, problem_type)."""
  out = {"architectures": [architecture], "model_type": "electra", "hidden_act": "gelu",
         **engine.write_fields(config, KEYS), "position_embedding_type": "absolute",
         "summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu",
         "tie_word_embeddings": True}
  out.update(extra or {})
  return out


# ---- The parameter table ----------------------------------------------------------

def _dense(path, key):
  return [Entry(path + ("kernel",), f"{key}.weight", "dense"),
          Entry(path + ("bias",), f"{key}.bias", "copy")]


def _layer_norm(path, key):
  return [Entry(path + ("scale",), f"{key}.weight", "copy"),
          Entry(path + ("bias",), f"{key}.bias", "copy")]


def param_table(config: ElectraConfig, prefix: str, mlm: bool, rtd: bool,
                task: str | None = None) -> list[Entry]:
  """Every bertjax parameter of `config` (unscanned) with its Hugging Face key: the
  encoder under `prefix`, the generator's head when `mlm`, the discriminator's when
  `rtd`, the `task` head (a key of TASK_CLASSES)."""
  table = bert_table.param_table(config, prefix, None)  # BERT's embedding and block keys
  if config.embedding_size != config.hidden_size:
    table += _dense(("encoder", "embeddings", "embeddings_project"),
                    f"{prefix}embeddings_project")
  if mlm:
    table += _dense(("mlm", "transform"), "generator_predictions.dense")
    table += _layer_norm(("mlm", "transform_norm"), "generator_predictions.LayerNorm")
    table.append(Entry(("mlm", "bias"), "generator_lm_head.bias", "copy"))
  if rtd:
    table += _dense(("rtd", "dense"), "discriminator_predictions.dense")
    table += _dense(("rtd", "dense_prediction"), "discriminator_predictions.dense_prediction")
  if task is not None:
    for name, key in TASK_CLASSES[task][1].items():
      table += _dense(("head", name), key)
  return table


def encoder_prefix(state_dict: dict) -> str:
  """'electra.' (ElectraFor*) or '' (a bare ElectraModel)."""
  return engine.encoder_prefix(state_dict, _WORD_EMBEDDINGS, "ELECTRA")


def task_of(hf: dict[str, Any]) -> str | None:
  """The bertjax task of a config.json (`table.task_of`)."""
  return engine.task_of(hf, TASK_CLASSES)


def load(hf: dict[str, Any], state_dict: dict[str, np.ndarray]
         ) -> tuple[ElectraConfig, dict, str | None]:
  """(config, params, task) of a Hugging Face config.json and its weights: 'encoder',
  'mlm' (a generator), 'rtd' (a discriminator; `config.rtd`), and for a fine-tuned
  ElectraFor<Task> (its `architectures`) the task's head in params['head']."""
  task = task_of(hf)
  mlm = task is None and "generator_predictions.dense.weight" in state_dict
  rtd = task is None and "discriminator_predictions.dense.weight" in state_dict
  config = model_config_from_hf(hf, rtd=rtd)
  prefix = encoder_prefix(state_dict)
  engine.check_tied(state_dict, (_DECODER,), prefix + _WORD_EMBEDDINGS)
  return config, engine.read(state_dict, param_table(config, prefix, mlm, rtd, task),
                             config), task


def export(params: dict, config: ElectraConfig, task: str | None = None,
           labels: Sequence[str] | None = None, extra: dict | None = None
           ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(config.json, state dict) of the Hugging Face model holding `params` (either
  layout): ElectraFor<task> with a `task`; else ElectraForPreTraining with an 'rtd'
  head (an 'mlm' head beside it has no place there and is left out, with a warning),
  ElectraForMaskedLM with an 'mlm' head (its decoder a copy of the word embeddings),
  else ElectraModel; `labels` name a classifier's outputs (default LABEL_i); `extra`
  adds config.json keys."""
  params = engine.unscanned(params, config)
  rtd = task is None and "rtd" in params
  mlm = task is None and not rtd and "mlm" in params
  if task is None and rtd and "mlm" in params:
    logging.warning("the model has both ELECTRA heads: exported as %s (the "
                    "discriminator); its MLM head is left out.", PRETRAINING)
  arch = (TASK_CLASSES[task][0] if task else PRETRAINING if rtd else
          MASKED_LM if mlm else BARE)
  prefix = "" if arch == BARE else "electra."
  state = engine.write(params, param_table(config, prefix, mlm, rtd, task))
  if mlm:
    state[_DECODER] = state[prefix + _WORD_EMBEDDINGS].copy()
  classifier = {"classification": "classifier.out_proj.weight",
                "tagging": "classifier.weight", "squad": "qa_outputs.weight"}.get(task)
  return engine.exported(hf_config, config, arch, state, labels, extra, classifier)


def _token_ids(tokenizer) -> dict[str, int]:
  """The special id config.json names (ELECTRA's: the padding)."""
  return {"pad_token_id": tokenizer.pad_id}


export_pretrained, export_finetuned = engine.exporters(export, _token_ids)


def pretraining_model(config: ElectraConfig) -> tuple[dict[str, Any], ElectraConfig]:
  """The Hugging Face model that pretrains `config` as bertjax does today (`benchmark
  train --compare=hf`; the MLM objective: ElectraForMaskedLM) and `config` with the
  heads that class computes (no 'rtd'; the MLM logits at every position)."""
  return hf_config(config, MASKED_LM), dataclasses.replace(config, rtd=False)
