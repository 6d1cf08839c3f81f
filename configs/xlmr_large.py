"""XLM-R large (Conneau et al. 2020): L=24, H=1024, A=16, 250k vocabulary, ~560M
parameters; otherwise configs/xlmr_base.py.

Reproduces the pretraining behind the paper's XLM-R rows of Table 1 (XNLI), Table 2
(NER), Table 3 (MLQA) and Table 4 (GLUE dev): batch 8192, 1.5M updates; the paper gives
no learning rate or warm-up, so these are RoBERTa-large's (Table 9 of Liu et al.:
4e-4, 30k steps).

  python -m bertjax.main --config=configs/xlmr_large.py --workdir=gs://bucket/xlmr_large \
      --config.data.languages='en=/data/cc100/en,sw=/data/cc100/sw' \
      --config.data.tokenizer.path=/path/xlm-roberta-large/sentencepiece.bpe.model
"""

from configs import xlmr_base


def get_config(arg=None):
  c = xlmr_base.get_config(arg)
  c.model.hidden_size = 1024
  c.model.num_layers = 24
  c.model.num_heads = 16
  c.model.intermediate_size = 4096
  c.train.learning_rate = 4e-4
  c.train.warmup_steps = 30_000
  return c
