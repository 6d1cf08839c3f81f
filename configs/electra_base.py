"""ELECTRA-Base (Clark et al. 2020): the discriminator L=12, H=768, A=12, FFN 3072,
embeddings of 768 (no projection; ~110M parameters) and a generator of 1/3 its width,
from the paper's Table 6 (pre-train hyperparameters):

  layers 12, hidden 768, FFN 3072, heads 12, embedding size 768    Table 6 (Base)
  generator size 1/3 (hidden 256, FFN 1024, heads 4)                Table 6
  mask 15%, linear decay, warm-up 10,000 steps, lr 2e-4            Table 6
  Adam eps 1e-6, b1 0.9, b2 0.999, weight decay 0.01               Table 6
  dropout 0.1, attention dropout 0.1, batch 256, 766k steps        Table 6 (ELECTRA-Base;
                                                                   BERT-Base's 1M at equal
                                                                   compute)
  discriminator loss weight lambda = 50                            section 3.2 / appendix A
  sequence length 512                                              configure_pretraining.py's
                                                                   larger-model settings

The generator is google/electra-base-generator's size. Everything else (the masking,
the objective to come, the sources the numbers were checked against) as
configs/electra_small.py says.

  python -m bertjax.main --config=configs/electra_base.py --workdir=/tmp/electra_base \
      --config.data.corpus='/data/wiki/*.txt' --config.data.tokenizer.path=vocab.txt
"""

from configs import electra_small


def get_config(arg=None):
  c = electra_small.get_config(arg)
  c.model.embedding_size = 768
  c.model.hidden_size = 768
  c.model.num_heads = 12
  c.model.intermediate_size = 3072
  c.generator.hidden_size = 256  # H / 3.
  c.generator.num_heads = 4  # A / 3.
  c.generator.intermediate_size = 1024  # FFN / 3.
  c.data.max_seq_length = 512
  c.data.max_predictions_per_seq = 79  # int((0.15 + 0.005) * 512), ELECTRA's.
  c.train.batch_size = 256
  c.train.num_steps = 766_000
  c.train.learning_rate = 2e-4
  return c
