"""modernbert_tiny: the ModernBERT family on the embedded corpus, for a CPU: 4 layers,
H=128, I=192, A=4, a 32-token local window (global attention every third layer),
trained with the family's recipe (30% masking, StableAdamW, a warm-up-stable-decay
schedule, packed rows with documents isolated) for 500 steps of 32 x 128 tokens. It
reproduces no paper table: it is the family's default that runs anywhere.

  python -m bertjax.main --config=configs/modernbert_tiny.py --workdir=/tmp/modernbert_tiny
  python -m bertjax.fill_mask --checkpoint=/tmp/modernbert_tiny "please turn <mask> homework in ."
"""

from configs import modernbert_base


def get_config(arg=None):
  c = modernbert_base.get_config(arg)
  c.model.vocab_size = 4096
  c.model.hidden_size = 128
  c.model.num_layers = 4
  c.model.num_heads = 4
  c.model.intermediate_size = 192
  c.model.max_position_embeddings = 128
  c.model.local_attention = 32
  c.model.pad_token_id = 1  # <pad> of the byte-level BPE trained on the corpus.
  c.data.corpus = "embedded"
  c.data.max_seq_length = 128
  c.data.max_predictions_per_seq = 40  # round(0.3 * 126) = 38 fit.
  c.data.eval_fraction = 0.05
  c.data.tokenizer.vocab_size = 4096
  c.train.batch_size = 32
  c.train.num_steps = 500
  c.train.learning_rate = 3e-3
  c.train.warmup_steps = 50
  c.train.decay_fraction = 0.2
  c.train.log_every = 50
  c.train.eval_every = 250
  c.train.eval_batches = 0
  c.train.checkpoint_every = 250
  return c
