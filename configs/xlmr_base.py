"""XLM-R base (Conneau et al. 2020): L=12, H=768, A=12, 250k SentencePiece unigram
vocabulary (~278M parameters), RoBERTa's objective (configs/roberta_base.py: no NSP,
full-length 512-token rows) on CC-100 in 100 languages.

Reproduces the pretraining behind the paper's XLM-R Base rows of Table 1 (XNLI),
Table 2 (NER) and Table 3 (MLQA) (Table 4, GLUE, is the large model's): the paper's
settings, batch 8192, 1.5M updates, languages sampled with q_i ~ p_i^0.3; the paper
gives no learning rate or warm-up, so these are RoBERTa-base's (Table 9 of Liu et al.:
6e-4, 24k steps).

  python -m bertjax.main --config=configs/xlmr_base.py --workdir=/tmp/xlmr_base \
      --config.data.languages='en=/data/cc100/en,sw=/data/cc100/sw' \
      --config.data.tokenizer.path=/path/xlm-roberta-base/sentencepiece.bpe.model
"""

from configs import roberta_base


def get_config(arg=None):
  c = roberta_base.get_config(arg)
  c.model.vocab_size = 250002
  c.data.tokenizer.kind = "sentencepiece"
  c.data.tokenizer.vocab_size = 250002
  c.train.batch_size = 8192
  c.train.num_steps = 1_500_000
  c.train.learning_rate = 6e-4
  c.train.warmup_steps = 24_000
  return c
