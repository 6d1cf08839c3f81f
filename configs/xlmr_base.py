"""XLM-R base (Conneau et al. 2020): L=12, H=768, A=12, 250k SentencePiece unigram
vocabulary (~278M parameters), RoBERTa's objective on CC-100.

  python -m bertjax.main --config=configs/xlmr_base.py --workdir=/tmp/xlmr_base \
      --config.data.corpus='/data/cc100/*.txt' \
      --config.data.tokenizer.path=/path/xlm-roberta-base/sentencepiece.bpe.model
"""

from configs import roberta_base


def get_config(arg=None):
  c = roberta_base.get_config(arg)
  c.model.vocab_size = 250002
  c.data.tokenizer.vocab_size = 250002
  c.train.batch_size = 8192
  c.train.num_steps = 1_500_000
  c.train.learning_rate = 6e-4
  c.train.warmup_steps = 10_000
  return c
