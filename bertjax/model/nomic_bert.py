"""The 'nomic_bert' family: NomicBERT (nomic-bert-2048, the encoder of
nomic-embed-text-v1 / v1.5), Hugging Face's `NomicBertModel` (transformers
`models/nomic_bert`). It is GTE's layout (`gte.py`: post-LN blocks, rotary positions,
a gated MLP, word + token-type embeddings, a pooler for sequence classification) with
other constants, so it reuses GTE's parts:

- no biases in q / k / v / o, SwiGLU (silu(gate) * up) without biases and without a
  dropout of its own (Gemma's MLP), rotary theta 1000, two token types;
- BERT's MLM head: dense + `hidden_act` (silu) + LayerNorm, the tied word embedding and
  a vocabulary bias (`cls.predictions.bias`);
- `head_dim` a field (Hugging Face's: q / k / v map E -> N * head_dim).

Shapes: B batch, T length, E hidden, N heads, D head size, M intermediate size.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bertjax.model import gte
from bertjax.model.family import Family


@dataclasses.dataclass(frozen=True)
class NomicBertConfig(gte.GteConfig):
  """Hyperparameters of a NomicBERT encoder and its heads; the defaults are
  nomic-embed-text-v1.5's (Hugging Face's `NomicBertConfig` defaults)."""

  family: ClassVar[str] = "nomic_bert"  # config.model.family (bertjax.model.FAMILIES)
  qkv_bias: ClassVar[bool] = False
  mlp_out_bias: ClassVar[bool] = False
  mlp_dropout: ClassVar[bool] = False
  head_activation: ClassVar[str | None] = None  # the MLM transform uses hidden_act
  free_head_dim: ClassVar[bool] = True

  vocab_size: int = 30528
  max_position_embeddings: int = 2048
  pad_token_id: int = 0
  type_vocab_size: int = 2
  hidden_act: str = "silu"
  dropout_rate: float = 0.0
  rope_theta: float = 1000.0
  head_dim: int | None = None  # D; None: hidden_size / num_heads

  def __post_init__(self):
    if self.head_dim is None and self.num_heads >= 1:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
    super().__post_init__()


FAMILY: Family = dataclasses.replace(gte.FAMILY, name="nomic_bert", config=NomicBertConfig)
