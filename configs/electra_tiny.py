"""electra_tiny: the ELECTRA family at a CPU's size, beside bert_tiny.py: a
discriminator of bert_tiny's shape (L=2, H=128, A=2, FFN 512, 4,096 WordPiece ids;
embeddings of 128, so no projection, and no pooler or NSP) and a generator of 1/4 its
width (H=32, A=1, FFN 128: Table 6's Small multiplier), on the Python documentation
that ships with every Python. It reproduces no paper table: it is the family's recipe
that runs anywhere, with bert_tiny's schedule (1,500 steps of 32 rows of 128, 150
warm-up steps, no dropout) at ELECTRA-Small's learning rate, 5e-4 (Table 6), and
ELECTRA's masking (15%, of which 85% [MASK], 15% unchanged), trained with
replaced-token detection ('rtd', lambda 50, as configs/electra_small.py).

At bert_tiny's 2e-3 the discriminator learns next to nothing: over 1,000 steps
(2026-11-27, `--config.train.num_steps=3000`, one core each) its BCE stays 0.007 below
the entropy of the replaced fraction in training (0.3708 against 0.3777; recall of
"replaced" 0.015), while at 5e-4 it is 0.069 below (0.3345 against 0.4036; recall 0.20)
with a weaker generator (MLM accuracy 0.149 against 0.215).

  python -m bertjax.main --config=configs/electra_tiny.py --workdir=/tmp/electra_tiny
  python -m bertjax.fill_mask --checkpoint=/tmp/electra_tiny "please turn [MASK] homework in ."
"""

from configs import bert_tiny, electra_small


def get_config(arg=None):
  c = electra_small.get_config(arg)
  tiny = bert_tiny.get_config(arg)
  c.train = tiny.train  # bert_tiny's schedule ...
  c.train.learning_rate = 5e-4  # ... at ELECTRA-Small's peak (2e-3: module docstring).
  for k in ("corpus", "max_seq_length", "eval_fraction", "length_phases"):
    c.data[k] = tiny.data[k]  # Its corpus and rows; ELECTRA's masking and packing.
  c.data.tokenizer.vocab_size = c.model.vocab_size = tiny.model.vocab_size
  c.model.embedding_size = c.model.hidden_size = tiny.model.hidden_size
  c.model.num_layers = tiny.model.num_layers
  c.model.num_heads = tiny.model.num_heads
  c.model.intermediate_size = tiny.model.intermediate_size
  c.model.max_position_embeddings = tiny.model.max_position_embeddings
  # A few minutes of training underfits this model: dropout only slows it down here.
  c.model.dropout_rate = c.model.attention_dropout_rate = 0.0
  c.generator.hidden_size = 32
  c.generator.num_heads = 1
  c.generator.intermediate_size = 128
  c.generator.num_layers = 2
  return c
