"""ELECTRA-Large (Clark et al. 2020): the discriminator L=24, H=1024, A=16, FFN 4096,
embeddings of 1024 (~335M parameters) and a generator of 1/4 its width, from the
paper's Table 6 (pre-train hyperparameters):

  layers 24, hidden 1024, FFN 4096, heads 16, embedding size 1024  Table 6 (Large)
  generator size 1/4 (hidden 256, FFN 1024, heads 4)                Table 6
  mask 25%, linear decay, warm-up 10,000 steps, lr 2e-4            Table 6
  Adam eps 1e-6, b1 0.9, b2 0.999, weight decay 0.01               Table 6
  dropout 0.1, attention dropout 0.1, batch 2048, 400k steps       Table 6 (ELECTRA-400K;
                                                                   the released
                                                                   ELECTRA-Large is
                                                                   ELECTRA-1.75M)
  discriminator loss weight lambda = 50                            section 3.2 / appendix A
  sequence length 512                                              configure_pretraining.py's
                                                                   larger-model settings

The generator is google/electra-large-generator's size. The paper trains Large on
XLNet's data (33B tokens), the others on BERT's. Everything else as
configs/electra_small.py says.

  python -m bertjax.main --config=configs/electra_large.py --workdir=/tmp/electra_large \
      --config.data.corpus='/data/*.txt' --config.data.tokenizer.path=vocab.txt
"""

from configs import electra_small


def get_config(arg=None):
  c = electra_small.get_config(arg)
  c.model.embedding_size = 1024
  c.model.hidden_size = 1024
  c.model.num_layers = 24
  c.model.num_heads = 16
  c.model.intermediate_size = 4096
  c.generator.hidden_size = 256  # H / 4.
  c.generator.num_heads = 4  # A / 4.
  c.generator.intermediate_size = 1024  # FFN / 4.
  c.generator.num_layers = 24
  c.data.max_seq_length = 512
  c.data.masked_lm_prob = 0.25  # Table 6: Large masks 25%.
  c.data.max_predictions_per_seq = 130  # int((0.25 + 0.005) * 512), ELECTRA's.
  c.train.batch_size = 2048
  c.train.num_steps = 400_000
  c.train.learning_rate = 2e-4
  return c
