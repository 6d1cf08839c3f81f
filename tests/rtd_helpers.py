"""What the replaced-token-detection tests share: a tiny ELECTRA pair (embeddings of
16 projected to 32; a generator of 3/4 its width, its own projection 16 -> 24) on the
fixtures' 400-id tokenizer."""

from __future__ import annotations

import os

from configs import electra_tiny
from tests.helpers import tiny_config

TOKENIZER = os.path.join(os.path.dirname(__file__), "fixtures", "tokenizer")


def rtd_config(**train):
  """electra_tiny at tiny_config's sizes (20 steps of 8 rows of 16, dropout on), a
  generator of 3/4 the discriminator's width, the stored 400-id tokenizer; a checkpoint
  every 5 steps, metrics every 3, one evaluation at the end."""
  c = electra_tiny.get_config()
  small = tiny_config(num_steps=20, log_every=3, eval_every=20, checkpoint_every=5,
                      eval_batches=1, max_to_keep=3)
  c.train = small.train
  c.data.max_seq_length = small.data.max_seq_length
  c.data.max_predictions_per_seq = small.data.max_predictions_per_seq
  c.data.tokenizer.path = TOKENIZER
  c.data.tokenizer.vocab_size = 400
  m = c.model
  m.vocab_size = 400
  m.embedding_size, m.hidden_size, m.num_heads, m.intermediate_size = 16, 32, 2, 64
  m.max_position_embeddings = 32
  m.dropout_rate = m.attention_dropout_rate = 0.1
  m.dtype = "float32"
  c.generator.hidden_size, c.generator.num_heads, c.generator.intermediate_size = 24, 1, 48
  for k, v in train.items():
    setattr(c.train, k, v)
  return c
