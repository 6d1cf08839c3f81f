"""electra_tiny: the ELECTRA family at a CPU's size, beside bert_tiny.py: a
discriminator of bert_tiny's shape (L=2, H=128, A=2, FFN 512, 4,096 WordPiece ids;
embeddings of 128, so no projection, and no pooler or NSP) and a generator of 1/4 its
width (H=32, A=1, FFN 128: Table 6's Small multiplier), on the Python documentation
that ships with every Python. It reproduces no paper table: it is the family's recipe
that runs anywhere, with bert_tiny's schedule (1,500 steps of 32 rows of 128, lr 2e-3,
150 warm-up steps, no dropout) and ELECTRA's masking (15%, of which 85% [MASK], 15%
unchanged). Until the replaced-token-detection objective exists it pretrains the
discriminator's network with the masked-LM objective; the objective becomes 'rtd' with
the replaced-token-detection issue (lambda 50, configs/electra_small.py).

  python -m bertjax.main --config=configs/electra_tiny.py --workdir=/tmp/electra_tiny
  python -m bertjax.fill_mask --checkpoint=/tmp/electra_tiny "please turn [MASK] homework in ."
"""

from configs import electra_small


def get_config(arg=None):
  c = electra_small.get_config(arg)
  c.model.vocab_size = 4096
  c.model.embedding_size = 128
  c.model.hidden_size = 128
  c.model.num_layers = 2
  c.model.num_heads = 2
  c.model.intermediate_size = 512
  c.model.max_position_embeddings = 128
  # A few minutes of training underfits this model: dropout only slows it down here.
  c.model.dropout_rate = 0.0
  c.model.attention_dropout_rate = 0.0
  c.generator.hidden_size = 32
  c.generator.num_heads = 1
  c.generator.intermediate_size = 128
  c.generator.num_layers = 2
  c.data.corpus = "embedded"
  c.data.max_seq_length = 128
  c.data.max_predictions_per_seq = 19
  c.data.eval_fraction = 0.05
  c.data.tokenizer.vocab_size = 4096
  c.train.batch_size = 32
  c.train.num_steps = 1500
  c.train.learning_rate = 2e-3
  c.train.warmup_steps = 150
  c.train.log_every = 50
  c.train.eval_every = 500
  c.train.eval_batches = 0
  c.train.checkpoint_every = 500
  return c
