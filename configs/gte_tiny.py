"""gte_tiny: the GTE family at a CPU's size, beside bert_tiny.py: 2 post-LN layers,
H=128, A=2, a GLU of 256 (three matrices: about bert_tiny's FFN of 512 in weights),
rotary positions, 4,096 WordPiece ids trained on the Python documentation that ships
with every Python, 128-token rows. It reproduces no paper table: it is
configs/gte_base.py's recipe (30% masking, MLM alone, documents isolated in packed rows)
at bert_tiny's schedule (1,500 steps of 32 rows, 150 warm-up steps, no dropout, a
linear decay), one length and one rotary theta.

  python -m bertjax.main --config=configs/gte_tiny.py --workdir=/tmp/gte_tiny
  python -m bertjax.fill_mask --checkpoint=/tmp/gte_tiny "please turn [MASK] homework in ."
"""

from configs import bert_tiny, gte_base, model_section


def tiny(base, family: str, arg=None):
  """`base`'s recipe (a configs module) at bert_tiny's sizes, schedule and corpus."""
  c = base.get_config(arg)
  small = bert_tiny.get_config(arg)
  c.train = small.train  # bert_tiny's schedule: 1,500 steps of 32 rows, linear decay.
  for k in ("corpus", "max_seq_length", "length_phases", "dupe_factor", "eval_fraction",
            "tokenizer"):
    c.data[k] = small.data[k]  # Its corpus, rows and a 4,096-id WordPiece trained on it.
  c.data.max_predictions_per_seq = 40  # round(0.3 * 126) = 38 fit.
  c.model = model_section(
      family, vocab_size=4096, hidden_size=128, num_layers=2, num_heads=2,
      intermediate_size=256, max_position_embeddings=128, pad_token_id=0,
      dropout_rate=0.0)
  return c


def get_config(arg=None):
  c = tiny(gte_base, "gte", arg)
  c.data.masked_lm_prob = 0.3
  return c
