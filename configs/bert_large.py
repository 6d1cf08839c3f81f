"""BERT-large (Devlin et al. 2019): L=24, H=1024, A=16, ~335M parameters.

Reproduces the pretraining behind the paper's BERT-large rows of Table 1 (GLUE test),
Table 2 (SQuAD v1.1), Table 3 (SQuAD v2.0) and Table 4 (SWAG): BERT-base's recipe
(configs/bert_base.py: batch 256, 1M steps, 90% of the steps at 128 tokens then 10% at
512) at the large size.

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
