"""ultrabert_tiny: the UltraBERT family at a CPU's scale on the embedded corpus: 3 layers
(two sliding, a radius of 16 each side, then a full one), H=128, I=256 (SwiGLU), 4 query
heads over 2 key / value heads, a prediction head of 128, rows of 128 tokens (so the
sliding layers see part of each row), a 4,096-token byte-level BPE trained on the
corpus; 30% masking, StableAdamW, WSD (configs/ultrabert_base.py's recipe, one length).
It reproduces no paper table: it is the family's default that runs anywhere.

  python -m bertjax.main --config=configs/ultrabert_tiny.py --workdir=/tmp/ultrabert_tiny
  python -m bertjax.fill_mask --checkpoint=/tmp/ultrabert_tiny "please turn <mask> homework in ."
"""

from configs import model_section, ultrabert_base


def get_config(arg=None):
  c = ultrabert_base.get_config(arg)
  c.seed = 0
  c.model = model_section(
      "ultrabert", vocab_size=4096, hidden_size=128, num_layers=3, num_heads=4,
      num_kv_heads=2, intermediate_size=256, max_position_embeddings=128,
      sliding_window=16, prediction_head_size=128,
      pad_token_id=1)  # <pad> of the byte-level BPE trained on the corpus.
  c.data.corpus = "embedded"
  c.data.max_seq_length = 128
  c.data.length_phases = ()
  c.data.max_predictions_per_seq = 40  # >= round(0.3 * 126)
  c.data.eval_fraction = 0.05
  c.data.tokenizer.vocab_size = 4096
  c.train.batch_size = 32
  c.train.batch_by_tokens = False
  c.train.batch_warmup_tokens = 0
  c.train.batch_warmup_sizes = 0
  c.train.num_steps = 500
  c.train.learning_rate = 3e-3
  c.train.learning_rate_restarts = ()
  c.train.warmup_steps = 30
  c.train.decay_fraction = 0.2
  c.train.log_every = 50
  c.train.eval_every = 250
  c.train.eval_batches = 0
  c.train.checkpoint_every = 250
  return c
