"""eurobert_tiny: the EuroBERT family and its recipe (configs/eurobert_base.py: 30%
masking, every chosen token the mask token, AdamW beta2 0.95, weight decay 0.1, WSD,
packed rows with documents isolated) at a CPU's scale, on the embedded corpus: 4 layers,
H=128, I=256 (SwiGLU), 4 query heads over 2 key / value heads (grouped-query attention,
as EuroBERT-2.1B), rows of 128 tokens, a 4,096-token byte-level BPE trained on the
corpus. It reproduces no paper table: it is the family's default that runs anywhere.

  python -m bertjax.main --config=configs/eurobert_tiny.py --workdir=/tmp/eurobert_tiny
  python -m bertjax.fill_mask --checkpoint=/tmp/eurobert_tiny "please turn <mask> homework in ."
"""

from configs import eurobert_base, model_section


def get_config(arg=None):
  c = eurobert_base.get_config(arg)
  c.seed = 0
  c.model = model_section(
      "eurobert", vocab_size=4096, hidden_size=128, num_layers=4, num_heads=4,
      num_kv_heads=2, intermediate_size=256, max_position_embeddings=128,
      pad_token_id=1)  # <pad> of the byte-level BPE trained on the corpus.
  c.data.corpus = "embedded"
  c.data.max_seq_length = 128
  c.data.max_predictions_per_seq = 40  # >= round(0.3 * 126)
  c.data.eval_fraction = 0.05
  c.data.tokenizer.vocab_size = 4096
  c.train.batch_size = 32
  c.train.num_steps = 500
  c.train.learning_rate = 3e-3
  c.train.warmup_steps = 30
  c.train.decay_fraction = 0.2
  c.train.log_every = 50
  c.train.eval_every = 250
  c.train.eval_batches = 0
  c.train.checkpoint_every = 250
  return c
