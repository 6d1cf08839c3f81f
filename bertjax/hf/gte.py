"""Hugging Face GTE checkpoints (transformers `gte`: GteModel, GteForMaskedLM, the
fine-tuned GteForSequenceClassification / ForTokenClassification) <-> bertjax
`GteConfig` and parameters; `Table` is shared with NomicBERT (`nomic_bert.py`), the
same layout under other names.

Two key layouts are read, and the first is written (`params_to_hf(legacy=True)` gives
the second):
- transformers' modules (`model.state_dict()`): {prefix}layers.{i}.self_attn.q_proj,
  mlp.gate_proj / up_proj / down_proj, post_attention_layernorm, post_mlp_layernorm,
  lm_head.layer_norm, lm_head.decoder.weight (tied);
- the published checkpoints' (Alibaba-NLP's 'new' models), which `save_pretrained`
  writes and `from_pretrained` converts (transformers' conversion_mapping.py):
  {prefix}encoder.layer.{i}.attention.qkv_proj [3*N*D, E] (q|k|v), attention.o_proj,
  attn_ln, mlp.up_gate_proj [2*M, E] (up|gate), mlp.down_proj, mlp_ln, lm_head.norm;
  no decoder weight (tied).
`prefix` is 'gte.' in GteFor*, '' in a bare GteModel, 'new.' in the original remote-code
checkpoints (model_type 'new', read too).

config.json: transformers 5's keys (`rope_parameters`) and the published ones
(`rope_theta` and `rope_scaling` at the top, `position_embedding_type`,
`layer_norm_type`, `logn_attention_scale`); rotary types 'default' and 'linear'; anything
else (gte-*-en-v1.5's 'ntk' scaling, which transformers' GteModel cannot compute either)
is a one-line CheckpointError.

Task heads (bertjax paths; Hugging Face keys):
  encoder/pooler or head/pooler/{kernel, bias}   {prefix}pooler.dense   ForSequenceClassification
  head/classifier/{kernel[E, K], bias[K]}       classifier             ForSequenceClassification
  head/tagger/{kernel[E, K], bias[K]}           classifier             ForTokenClassification
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

from absl import logging
import numpy as np

from bertjax.errors import CheckpointError
from bertjax.hf import table as engine
from bertjax.hf.table import Entry
from bertjax.model import rotary
from bertjax.model.gte import GteConfig
from bertjax.model.layers import ACTIVATIONS

_EMBEDDINGS = "embeddings.word_embeddings.weight"


# ---- config.json helpers both families share ----------------------------------------

def rope_from_hf(hf: dict, default_theta: float) -> dict[str, Any]:
  """{rope_theta, rope_type, rope_factor} of `rope_parameters`, else the published
  `rope_scaling` + top-level `rope_theta`; a type bertjax does not compute is a one-line
  CheckpointError."""
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  theta = rope.get("rope_theta", hf.get("rope_theta", default_theta))
  kind = rope.get("rope_type", rope.get("type", "default"))
  factor = float(rope.get("factor", 1.0))
  if kind not in rotary.ROPE_TYPES or (kind == "default" and factor != 1.0):
    raise CheckpointError(f"config.json rotary scaling {kind!r} (factor {factor}) is not "
                          f"supported: bertjax computes {list(rotary.ROPE_TYPES)}.")
  return {"rope_theta": float(theta), "rope_type": kind, "rope_factor": factor}


def rope_to_hf(config) -> dict[str, Any]:
  rope = {"rope_type": config.rope_type, "rope_theta": config.rope_theta}
  if config.rope_type != "default":
    rope["factor"] = config.rope_factor
  return rope


def refuse(hf: dict, key: str, ok: Callable[[Any], bool], why: str) -> None:
  """One-line CheckpointError when config.json's `key` is present and not `ok`."""
  if key in hf and not ok(hf[key]):
    raise CheckpointError(f"config.json {key}={hf[key]!r} is not supported: {why}.")


def activation(hf: dict, key: str, default: str) -> str:
  name = hf.get(key, default)
  if name not in ACTIVATIONS:
    raise CheckpointError(f"config.json {key}={name!r} is not supported: bertjax has "
                          f"{sorted(ACTIVATIONS)}.")
  return name


def is_classifier(hf: dict) -> bool:
  """Whether config.json's model has a pooler (its ForSequenceClassification)."""
  return any(a.endswith("ForSequenceClassification") for a in hf.get("architectures") or [])


# bertjax field -> config.json key, both ways (absent keys: transformers' GteConfig
# defaults, which are GteConfig's).
KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
        "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
        "intermediate_size": "intermediate_size",
        "max_position_embeddings": "max_position_embeddings",
        "pad_token_id": "pad_token_id", "initializer_range": "initializer_range",
        "type_vocab_size": "type_vocab_size", "layer_norm_eps": "layer_norm_eps",
        "hidden_act": "hidden_act", "dropout_rate": "hidden_dropout_prob",
        "attention_dropout_rate": "attention_probs_dropout_prob",
        "classifier_dropout_rate": "classifier_dropout"}


def model_config_from_hf(hf: dict[str, Any], **overrides) -> GteConfig:
  """GteConfig of a config.json (transformers' `gte` or the published 'new'), or a
  one-line CheckpointError for what bertjax cannot represent; `overrides` set bertjax
  fields (e.g. scan_layers)."""
  if hf.get("model_type") not in MODEL_TYPES:
    raise CheckpointError(f"config.json model_type={hf.get('model_type')!r} is not GTE's "
                          f"{list(MODEL_TYPES)}.")
  refuse(hf, "position_embedding_type", lambda v: v == "rope", "GTE's positions are rotary")
  refuse(hf, "layer_norm_type", lambda v: v == "layer_norm", "bertjax's GTE uses LayerNorm")
  refuse(hf, "logn_attention_scale", lambda v: not v, "no log-n attention scaling")
  refuse(hf, "tie_word_embeddings", bool, "bertjax ties GTE's MLM decoder")
  heads, hidden = hf.get("num_attention_heads", 12), hf.get("hidden_size", 768)
  refuse(hf, "head_dim", lambda v: v in (None, hidden // heads),
         "GTE's head size is hidden_size / num_attention_heads")
  fields = engine.read_fields(hf, KEYS, GteConfig)
  return GteConfig(**{**fields, "hidden_act": activation(hf, "hidden_act", fields["hidden_act"]),
                      "pooler": is_classifier(hf), **rope_from_hf(hf, 160_000.0),
                      **overrides})


def hf_config(config: GteConfig, architecture: str = "GteForMaskedLM",
              extra: dict | None = None) -> dict[str, Any]:
  """transformers' config.json of `config` (GteConfig's keys) for `architecture`;
  `extra` adds keys (token ids, id2label / label2id)."""
  out = {
      "architectures": [architecture], "model_type": MODEL_TYPE,
      **engine.write_fields(config, KEYS),
      "rope_parameters": rope_to_hf(config), "tie_word_embeddings": True,
  }
  out.update(extra or {})
  return out


# ---- The table, shared with NomicBERT -----------------------------------------------

@dataclasses.dataclass(frozen=True)
class Table:
  """A GTE-layout family's Hugging Face table.

  classes: the transformers class prefix ('Gte'); prefix: the encoder's attribute in
  its For* classes ('gte.'); mlm: the MLM head's keys {'dense', 'norm', 'bias'} and
  `tied` (keys Hugging Face ties: the decoder weight to the word embedding, a bias to
  'bias'); legacy: (pattern, replacement, parts) rules from transformers' module keys to
  the published layout (`parts`: the fused key's slices, keyed by the pattern's 'part'
  group, in order); config_from_hf / to_hf: the config.json translation."""

  classes: str
  prefix: str
  mlm: dict[str, str]
  tied: dict[str, str]
  legacy: tuple[tuple[str, str, tuple[str, ...] | None], ...]
  config_from_hf: Callable[..., Any]
  config_to_hf: Callable[..., dict]

  @property
  def task_classes(self) -> dict[str, tuple[str, str]]:
    return {"classification": (f"{self.classes}ForSequenceClassification", "classifier"),
            "tagging": (f"{self.classes}ForTokenClassification", "tagger")}

  # -- key layouts --

  def legacy_key(self, key: str) -> tuple[str, int, int]:
    """The published layout's key of a transformers module `key`, and which of how many
    row slices of it (0, 1 when not fused)."""
    for pattern, repl, parts in self.legacy:
      m = re.fullmatch(pattern, key)
      if m:
        out = m.expand(repl)
        return (out, parts.index(m.group("part")), len(parts)) if parts else (out, 0, 1)
    return key, 0, 1

  def lookup(self, state: dict, key: str) -> np.ndarray:
    """`key` of the state dict, in either layout (a fused key sliced), or a one-line
    CheckpointError."""
    if key in state:
      return state[key]
    old, part, parts = self.legacy_key(key)
    if old not in state:
      raise CheckpointError(f"the checkpoint lacks {key!r} (or {old!r}); it does not "
                            "match its config.json.")
    return np.split(np.asarray(state[old]), parts, axis=0)[part]

  def to_legacy(self, state: dict) -> dict[str, np.ndarray]:
    """transformers' module keys -> the published layout (fused slices concatenated)."""
    out, fused = {}, {}
    for key, value in state.items():
      old, part, parts = self.legacy_key(key)
      if parts == 1:
        out[old] = value
      else:
        fused.setdefault(old, [None] * parts)[part] = value
    for old, pieces in fused.items():
      out[old] = np.ascontiguousarray(np.concatenate(pieces, axis=0))
    return out

  # -- the parameter table --

  def param_table(self, config, prefix: str, mlm: bool = True, task: str | None = None
                  ) -> list[Entry]:
    """Every bertjax parameter of `config` (unscanned) with its transformers module key:
    the encoder under `prefix`, the MLM head when `mlm`, the `task` head."""
    p, enc = prefix, ("encoder",)
    lin = lambda path, key, bias, kind="dense", bias_kind="copy": (
        [Entry(path + ("kernel",), f"{key}.weight", kind)]
        + ([Entry(path + ("bias",), f"{key}.bias", bias_kind)] if bias else []))
    norm = lambda path, key: [Entry(path + ("scale",), f"{key}.weight", "copy"),
                              Entry(path + ("bias",), f"{key}.bias", "copy")]
    emb = enc + ("embeddings",)
    table = [Entry(emb + ("word_embeddings", "embedding"), p + _EMBEDDINGS, "copy")]
    if config.type_vocab_size > 0:
      table.append(Entry(emb + ("token_type_embeddings", "embedding"),
                         f"{p}embeddings.token_type_embeddings.weight", "copy"))
    table += norm(emb + ("LayerNorm",), f"{p}embeddings.LayerNorm")
    for i in range(config.num_layers):
      ours, hf = enc + (f"layer_{i}",), f"{p}layers.{i}"
      for name, kind in (("q_proj", "qkv"), ("k_proj", "kv"), ("v_proj", "kv")):
        table += lin(ours + ("attention", name), f"{hf}.self_attn.{name}", config.qkv_bias,
                     kind, kind + "_bias")
      table += lin(ours + ("attention", "o_proj"), f"{hf}.self_attn.o_proj", config.qkv_bias,
                   "attn_out")
      table += norm(ours + ("attention_norm",), f"{hf}.post_attention_layernorm")
      for name in ("gate_proj", "up_proj"):
        table += lin(ours + ("mlp", name), f"{hf}.mlp.{name}", False)
      table += lin(ours + ("mlp", "down_proj"), f"{hf}.mlp.down_proj", config.mlp_out_bias)
      table += norm(ours + ("output_norm",), f"{hf}.post_mlp_layernorm")
    if mlm:
      table += lin(("mlm", "dense"), self.mlm["dense"], True)
      table += norm(("mlm", "layer_norm"), self.mlm["norm"])
      table.append(Entry(("mlm", "bias"), self.mlm["bias"], "copy"))
    if task is not None:
      if task not in self.task_classes:
        raise CheckpointError(
            f"a {task!r} model has no Hugging Face {self.classes} class; those exist for "
            f"{sorted(self.task_classes)}.")
      if task == "classification":
        table += lin(("encoder" if config.pooler else "head", "pooler"), f"{p}pooler.dense",
                     True)
      table += lin(("head", self.task_classes[task][1]), "classifier", True)
    return table

  # -- state dicts <-> parameters --

  def task_of(self, hf: dict[str, Any]) -> str | None:
    """The bertjax task of config.json's `architectures` (None: Model / ForMaskedLM)."""
    archs = hf.get("architectures") or []
    return next((t for t, (cls, _) in self.task_classes.items() if cls in archs), None)

  def params_from_hf(self, state: dict[str, np.ndarray], config,
                     task: str | None = None) -> dict:
    """bertjax params (float32 numpy, unscanned) of a state dict in either layout:
    'encoder', 'mlm' when it has the MLM head, 'head' for a fine-tuned `task`."""
    prefix = engine.encoder_prefix(state, _EMBEDDINGS, self.classes)
    if task is None and "classifier.weight" in state:
      raise CheckpointError("the checkpoint has a task head (classifier.weight): name its "
                            f"task, one of {sorted(self.task_classes)}.")
    mlm = task is None and f"{self.mlm['dense']}.weight" in state
    for key, to in self.tied.items():
      engine.check_tied(state, (key,), prefix + _EMBEDDINGS if to == "embedding" else to,
                        "the word embeddings" if to == "embedding" else to)
    return engine.read(state, self.param_table(config, prefix, mlm, task), config,
                       self.lookup)

  def params_to_hf(self, params: dict, config, task: str | None = None,
                   legacy: bool = False) -> dict[str, np.ndarray]:
    """A state dict (float32 numpy; either params layout in) of the ForMaskedLM when
    `params` has 'mlm', the For<task> with `task`, else the bare Model: transformers'
    module keys (tied keys included, as `state_dict()`), or with `legacy` the
    published layout `save_pretrained` writes."""
    params = engine.unscanned(params, config)
    mlm = task is None and "mlm" in params
    prefix = self.prefix if mlm or task else ""
    if config.pooler and task != "classification" and "pooler" in params["encoder"]:
      logging.warning("The encoder's pooler has no place in a %sFor%s: it is left out.",
                      self.classes, "MaskedLM" if mlm else "Model")
      params = {**params, "encoder": {k: v for k, v in params["encoder"].items()
                                      if k != "pooler"}}
    state = engine.write(params, self.param_table(config, prefix, mlm, task))
    if legacy:
      return self.to_legacy(state)
    if mlm:
      for key, to in self.tied.items():
        state[key] = state[prefix + _EMBEDDINGS if to == "embedding" else to].copy()
    return state

  def export(self, params: dict, config, task: str | None = None,
             labels: Sequence[str] | None = None, extra: dict | None = None
             ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config.json, state dict: transformers' module keys, which `from_pretrained`
    reads as they are) of the transformers model holding `params`; `labels` name a
    classifier's outputs."""
    state = self.params_to_hf(params, config, task)
    arch = (self.task_classes[task][0] if task else f"{self.classes}ForMaskedLM"
            if f"{self.mlm['dense']}.weight" in state else f"{self.classes}Model")
    return engine.exported(self.config_to_hf, config, arch, state, labels, extra,
                           "classifier.weight" if task else None)

  def pretraining_model(self, config) -> tuple[dict[str, Any], Any]:
    """transformers' class pretraining `config` (ForMaskedLM, no pooler: it computes the
    MLM logits at every position) and the config it computes."""
    config = dataclasses.replace(config, pooler=False)
    return self.config_to_hf(config), config

  def bind(self, namespace: dict) -> None:
    """The module-level names `bertjax.hf.convert` calls, into a table module's
    `namespace`."""
    check_supported, load = engine.readers(self.config_from_hf, self.task_of,
                                           self.params_from_hf)
    export_pretrained, export_finetuned = engine.exporters(self.export, token_ids)
    namespace.update(
        TASK_CLASSES=self.task_classes, param_table=self.param_table,
        params_from_hf=self.params_from_hf, params_to_hf=self.params_to_hf,
        export=self.export, task_of=self.task_of, pretraining_model=self.pretraining_model,
        check_supported=check_supported, load=load, export_pretrained=export_pretrained,
        export_finetuned=export_finetuned)


def token_ids(tokenizer) -> dict[str, int]:
  """The special ids config.json names."""
  return {"pad_token_id": tokenizer.pad_id}


FAMILY = "gte"  # bertjax.model.FAMILIES
MODEL_TYPE = "gte"
MODEL_TYPES = (MODEL_TYPE, "new")  # config.json model_type ('new': Alibaba-NLP's remote code)
TOKENIZER_JSON = False  # vocab.txt (gte-*-en-v1.5) or XLM-R's SentencePiece (mGTE)
_LAYER = r"(?P<p>.*)layers\.(?P<i>\d+)\."
TABLE = Table(
    classes="Gte", prefix="gte.",
    mlm={"dense": "lm_head.dense", "norm": "lm_head.layer_norm", "bias": "lm_head.decoder.bias"},
    tied={"lm_head.decoder.weight": "embedding"},
    legacy=(
        (_LAYER + r"self_attn\.(?P<part>[qkv])_proj\.(?P<w>weight|bias)",
         r"\g<p>encoder.layer.\g<i>.attention.qkv_proj.\g<w>", ("q", "k", "v")),
        (_LAYER + r"self_attn\.o_proj\.(?P<w>.*)", r"\g<p>encoder.layer.\g<i>.attention.o_proj.\g<w>",
         None),
        (_LAYER + r"post_attention_layernorm\.(?P<w>.*)", r"\g<p>encoder.layer.\g<i>.attn_ln.\g<w>",
         None),
        (_LAYER + r"post_mlp_layernorm\.(?P<w>.*)", r"\g<p>encoder.layer.\g<i>.mlp_ln.\g<w>", None),
        (_LAYER + r"mlp\.(?P<part>up|gate)_proj\.weight",
         r"\g<p>encoder.layer.\g<i>.mlp.up_gate_proj.weight", ("up", "gate")),
        (_LAYER + r"mlp\.down_proj\.(?P<w>.*)", r"\g<p>encoder.layer.\g<i>.mlp.down_proj.\g<w>",
         None),
        (r"lm_head\.layer_norm\.(?P<w>.*)", r"lm_head.norm.\g<w>", None),
    ),
    config_from_hf=model_config_from_hf, config_to_hf=hf_config)
TABLE.bind(globals())
