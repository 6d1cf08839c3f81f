"""Span-based NER (the textbook's §11.5.2): every span of up to `max_span_length` words
is classified from [s_i; e_j; g_ij] (FFN start / end, mean or self-attention pooling)
into NULL or an entity type; nested entities are allowed. Scored by span F1. Data:
JSON lines {'words', 'entities': [{'start', 'end', 'label'}]} or CoNLL BIO files.

  python -m bertjax.finetune --config=configs/finetune/span_ner.py --workdir=/tmp/span_ner \
      --config.init_from=/path/to/bert-base-cased \
      --config.data.train=train.jsonl --config.data.dev=dev.jsonl
"""

from configs.finetune import base


def get_config(arg="attention"):
  c = base.get_config()
  c.task.name = "span_ner"
  c.task.max_span_length = 8  # L: longest candidate span, in words.
  c.task.pooling = arg  # g_ij: 'mean' of the span's tokens or 'attention' (learned).
  c.task.allow_nested = True  # False: a greedy pass keeps non-overlapping spans.
  c.task.tfds_fields = ("tokens", "ner")  # Words and BIO tags of a CoNLL-style tfds: input.
  c.task.metrics = ("f1", "precision", "recall")  # The first selects the best sweep run.
  c.train.learning_rate = 5e-5
  return c
