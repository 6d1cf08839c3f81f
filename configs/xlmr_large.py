"""XLM-R large: L=24, H=1024, A=16, 250k vocabulary, ~560M parameters.

  python -m bertjax.main --config=configs/xlmr_large.py --workdir=gs://bucket/xlmr_large \
      --config.data.corpus='/data/cc100/*.txt' \
      --config.data.tokenizer.path=/path/xlm-roberta-large/sentencepiece.bpe.model
"""

from configs import xlmr_base


def get_config(arg=None):
  c = xlmr_base.get_config(arg)
  c.model.hidden_size = 1024
  c.model.num_layers = 24
  c.model.num_heads = 16
  c.model.intermediate_size = 4096
  c.train.learning_rate = 2.5e-4  # Smaller peak for the larger model, as in XLM-R.
  return c
