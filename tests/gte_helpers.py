"""What the GTE and NomicBERT tests share: each family's tiny transformers model (random
weights, every one moved off its initial value), its bertjax config and parameters
through the family's table, and bertjax's encoder / MLM logits on a batch.

The tiny encoder: 2 layers, H=32, 4 heads, a gated MLP of 48, two token types, 97 ids;
NomicBERT's heads are 12 wide (N * D = 48 != E, its `head_dim` field)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.hf import convert
from bertjax.model import family_of
from tests.helpers import perturb

FAMILIES = ("gte", "nomic_bert")
VOCAB, PAD = 97, 0
SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=48, type_vocab_size=2, pad_token_id=PAD)
CLASSES = {"gte": "Gte", "nomic_bert": "NomicBert"}


def hf_config(family: str, **overrides):
  """transformers' config of the tiny encoder of `family`, eager attention."""
  import transformers  # pylint: disable=g-import-not-at-top
  extra = {"head_dim": 12} if family == "nomic_bert" else {}
  cls = getattr(transformers, f"{CLASSES[family]}Config")
  return cls(**{**SIZES, **extra, "attn_implementation": "eager", **overrides})


def hf_model(family: str, head: str = "ForMaskedLM", **overrides):
  """The tiny transformers `<Family><head>` (e.g. 'ForMaskedLM', 'Model'), perturbed."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  cls = getattr(transformers, CLASSES[family] + head)
  return perturb(cls(hf_config(family, **overrides)))


def state(model) -> dict[str, np.ndarray]:
  return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def ours(model, **overrides):
  """(config, params, task) of a transformers model through its family's table."""
  hf = dict(model.config.to_dict(), architectures=[type(model).__name__])
  return convert.table_of(hf).load(hf, state(model), **overrides)


def apply(cfg, params, inputs: dict, scan: bool = False):
  """(hidden states [L+1, B, T, E], MLM logits [B, T, V]) of bertjax's model, jitted."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  cfg = dataclasses.replace(cfg, scan_layers=scan)
  family = family_of(cfg)
  model = family.pretraining(cfg)
  params = jax.tree.map(jnp.asarray, family.to_layout(params, scan))
  hidden = jax.jit(lambda p, i: model.apply(
      {"params": p}, i["input_ids"], i.get("attention_mask"), i.get("token_type_ids"),
      method=lambda m, *a: m.encoder(*a, position_ids=i.get("position_ids"),
                                     segment_ids=i.get("segment_ids"),
                                     output_hidden_states=True)))(params, inputs)
  logits = jax.jit(lambda p, i: model.apply({"params": p}, **i))(params, inputs)
  return np.asarray(hidden["hidden_states"]), np.asarray(logits["mlm_logits"])


def relative(a, b) -> float:
  """max |a - b| over the largest magnitude of b."""
  return float(np.abs(np.asarray(a) - b).max() / np.abs(b).max())
