"""Hugging Face NomicBERT checkpoints (transformers `nomic_bert`: NomicBertModel,
NomicBertForMaskedLM, the fine-tuned NomicBertForSequenceClassification /
ForTokenClassification) <-> bertjax `NomicBertConfig` and parameters: GTE's table
(`gte.Table`) under NomicBERT's names.

Key layouts read (the first is written; `params_to_hf(legacy=True)` the second, as
`save_pretrained` does):
- transformers' modules: {prefix}embeddings.LayerNorm, layers.{i}.self_attn.{q,k,v,o}_proj,
  mlp.{gate,up,down}_proj, post_attention_layernorm, post_mlp_layernorm,
  cls.predictions.{transform.dense, transform.layer_norm, bias, decoder (tied)};
- nomic-ai's published layout: {prefix}emb_ln, encoder.layers.{i}.attn.Wqkv [3*N*D, E]
  (q|k|v), attn.out_proj, mlp.fc11 (up), mlp.fc12 (gate), mlp.fc2 (down), norm1, norm2.
`prefix` is 'nomic_bert.' in NomicBertFor*, '' in a bare NomicBertModel.

config.json: transformers 5's keys, and nomic-ai's remote-code ones (n_embd, n_layer,
n_head, n_inner, n_positions, rotary_emb_base, layer_norm_epsilon, ...); the variants
bertjax cannot represent (partial or interleaved rotary, rotary scaling, pre-norm or
parallel blocks, RMSNorm, biases in the projections) are one-line CheckpointErrors.
"""

from __future__ import annotations

from typing import Any

from bertjax.errors import CheckpointError
from bertjax.hf import gte, table as engine
from bertjax.hf.gte import activation, is_classifier, refuse, rope_from_hf, rope_to_hf
from bertjax.model.nomic_bert import NomicBertConfig

FAMILY = "nomic_bert"  # bertjax.model.FAMILIES
MODEL_TYPE = "nomic_bert"
MODEL_TYPES = (MODEL_TYPE,)  # config.json model_type
TOKENIZER_JSON = False  # BERT's WordPiece: vocab.txt (AutoTokenizer: BertTokenizer)

# nomic-ai's remote-code config.json keys -> transformers'.
_LEGACY_KEYS = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers",
                "n_head": "num_attention_heads", "n_inner": "intermediate_size",
                "n_positions": "max_position_embeddings",
                "layer_norm_epsilon": "layer_norm_eps", "rotary_emb_base": "rope_theta",
                "resid_pdrop": "hidden_dropout_prob", "attn_pdrop": "attention_probs_dropout_prob"}
# Remote-code switches bertjax's NomicBERT cannot represent: key -> (fine?, why).
_FIXED = {
    "rotary_emb_fraction": (lambda v: v in (None, 1.0), "rotary on the whole head only"),
    "rotary_emb_interleaved": (lambda v: not v, "rotate-half rotary only"),
    "rotary_scaling_factor": (lambda v: v is None, "no dynamic NTK rotary scaling"),
    "rotary_emb_scale_base": (lambda v: v is None, "no xPos rotary scaling"),
    "prenorm": (lambda v: not v, "post-LN blocks only"),
    "parallel_block": (lambda v: not v, "sequential blocks only"),
    "use_rms_norm": (lambda v: not v, "LayerNorm only"),
    "qkv_proj_bias": (lambda v: not v, "no q/k/v biases"),
    "mlp_fc1_bias": (lambda v: not v, "no MLP biases"),
    "mlp_fc2_bias": (lambda v: not v, "no MLP biases"),
    "activation_function": (lambda v: v in ("swiglu", "silu"), "SwiGLU only"),
    "causal": (lambda v: not v, "a bidirectional encoder"),
    "tie_word_embeddings": (bool, "bertjax ties NomicBERT's MLM decoder"),
}


# bertjax field -> config.json key, both ways (GTE's; absent keys: transformers'
# NomicBertConfig defaults, which are NomicBertConfig's).
KEYS = {k: v for k, v in gte.KEYS.items() if k != "intermediate_size"}


def model_config_from_hf(hf: dict[str, Any], **overrides) -> NomicBertConfig:
  """NomicBertConfig of a config.json (transformers' or nomic-ai's remote-code keys), or a
  one-line CheckpointError; `overrides` set bertjax fields."""
  if hf.get("model_type") not in MODEL_TYPES:
    raise CheckpointError(f"config.json model_type={hf.get('model_type')!r} is not "
                          f"NomicBERT's {list(MODEL_TYPES)}.")
  for key, (ok, why) in _FIXED.items():
    refuse(hf, key, ok, why)
  hf = {**{new: hf[old] for old, new in _LEGACY_KEYS.items() if old in hf}, **hf}
  fields = engine.read_fields(hf, KEYS, NomicBertConfig)
  return NomicBertConfig(**{
      **fields, "hidden_act": activation(fields, "hidden_act", "silu"),
      # The remote code's n_inner may be null: 4 x the hidden size, as it computes.
      "intermediate_size": hf.get("intermediate_size") or 4 * fields["hidden_size"],
      "head_dim": hf.get("head_dim") or fields["hidden_size"] // fields["num_heads"],
      "pooler": is_classifier(hf), **rope_from_hf(hf, 1000.0), **overrides})


def hf_config(config: NomicBertConfig, architecture: str = "NomicBertForMaskedLM",
              extra: dict | None = None) -> dict[str, Any]:
  """transformers' config.json of `config` (NomicBertConfig's keys) for `architecture`."""
  out = {
      "architectures": [architecture], "model_type": MODEL_TYPE,
      **engine.write_fields(config, KEYS), "head_dim": config.head_dim,
      "intermediate_size": config.intermediate_size,
      "rope_parameters": rope_to_hf(config), "tie_word_embeddings": True,
  }
  out.update(extra or {})
  return out


_LAYER = r"(?P<p>.*)layers\.(?P<i>\d+)\."
TABLE = gte.Table(
    classes="NomicBert", prefix="nomic_bert.",
    mlm={"dense": "cls.predictions.transform.dense",
         "norm": "cls.predictions.transform.layer_norm", "bias": "cls.predictions.bias"},
    tied={"cls.predictions.decoder.weight": "embedding",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    legacy=(
        (_LAYER + r"self_attn\.(?P<part>[qkv])_proj\.weight",
         r"\g<p>encoder.layers.\g<i>.attn.Wqkv.weight", ("q", "k", "v")),
        (_LAYER + r"self_attn\.o_proj\.weight", r"\g<p>encoder.layers.\g<i>.attn.out_proj.weight",
         None),
        (_LAYER + r"mlp\.up_proj\.weight", r"\g<p>encoder.layers.\g<i>.mlp.fc11.weight", None),
        (_LAYER + r"mlp\.gate_proj\.weight", r"\g<p>encoder.layers.\g<i>.mlp.fc12.weight", None),
        (_LAYER + r"mlp\.down_proj\.weight", r"\g<p>encoder.layers.\g<i>.mlp.fc2.weight", None),
        (_LAYER + r"post_attention_layernorm\.(?P<w>.*)", r"\g<p>encoder.layers.\g<i>.norm1.\g<w>",
         None),
        (_LAYER + r"post_mlp_layernorm\.(?P<w>.*)", r"\g<p>encoder.layers.\g<i>.norm2.\g<w>", None),
        (r"(?P<p>.*)embeddings\.LayerNorm\.(?P<w>.*)", r"\g<p>emb_ln.\g<w>", None),
    ),
    config_from_hf=model_config_from_hf, config_to_hf=hf_config)
TABLE.bind(globals())
