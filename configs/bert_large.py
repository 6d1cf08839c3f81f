"""BERT-large: L=24, H=1024, A=16, ~335M parameters; otherwise BERT-base's recipe.

  python -m bertjax.main --config=configs/bert_large.py --workdir=gs://bucket/bert_large \
      --config.data.corpus='/data/wiki/*.txt' --config.data.tokenizer.path=vocab.txt
"""

from configs import bert_base


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.model.hidden_size = 1024
  c.model.num_layers = 24
  c.model.num_heads = 16
  c.model.intermediate_size = 4096
  return c
