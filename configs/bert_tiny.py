"""bert_tiny: the embedded default. L=2, H=128, A=2 pretrained with MLM + NSP on the
Python documentation that ships with every Python (no download); trains in a few
minutes on 2 CPU cores and clearly beats the most-frequent-token baseline. It
reproduces no paper table: it is the recipe that runs anywhere (README's first command).

  python -m bertjax.main --config=configs/bert_tiny.py --workdir=/tmp/bert_tiny
  python -m bertjax.fill_mask --checkpoint=/tmp/bert_tiny "please turn [MASK] homework in ."
"""

from configs import bert_base


def get_config(arg=None):
  c = bert_base.get_config(arg)
  c.model.vocab_size = 4096
  c.model.hidden_size = 128
  c.model.num_layers = 2
  c.model.num_heads = 2
  c.model.intermediate_size = 512
  c.model.max_position_embeddings = 128
  # A few minutes of training underfits this model: dropout only slows it down here
  # (the full-size recipes keep the paper's 0.1).
  c.model.dropout_rate = 0.0
  c.model.attention_dropout_rate = 0.0
  # An untruncated normal at 0.02 (transformers'), not google-research/bert's truncated
  # one: 1.5 points more held-out MLM over 3 seeds (docs/pretraining.md, difference 6).
  c.model.initializer_cutoff_factor = 0.0
  c.data.corpus = "embedded"
  c.data.max_seq_length = 128
  c.data.max_predictions_per_seq = 20
  c.data.length_phases = ()  # One length: the paper's two phases need longer runs.
  c.data.dupe_factor = 2
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
