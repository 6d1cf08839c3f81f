"""Flax Linen BERT-family encoder and heads."""

from bertjax.model.bert import BertForPreTraining, Encoder, MLMHead
from bertjax.model.config import ModelConfig

__all__ = ["BertForPreTraining", "Encoder", "MLMHead", "ModelConfig"]
