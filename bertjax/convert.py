"""Hugging Face BERT / RoBERTa / XLM-R checkpoints <-> bertjax parameters.

One table, `param_table(config, ...)`, lists every parameter as (bertjax path, Hugging
Face key, kind); `kind` names the layout change between the two (`_to_bertjax` applies
it, and an exporter applies its inverse). Hugging Face stores dense weights as
[out, in]; bertjax stores kernels as [in, out], with attention kernels split per head:
query/key/value [E, N, D] (bias [N, D]) and the attention output [N, D, E].
"""

from __future__ import annotations

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

